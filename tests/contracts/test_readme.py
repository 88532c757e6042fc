"""Every Python snippet of the README and of docs/LIBRARY.md runs as written (a reader pastes
them), except the multi-host one, which needs several processes:
tests/parallel/test_multihost.py runs that one; the README's first runs as written in
tests/contracts/test_packaging.py's plain install of the wheel. The README stays a front door
(at most 200 lines) and its facts agree with the code: the number of notebooks, the mixers
`kda-train` offers, notebook 05's devices, `make check-browser`'s time."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LIBRARY = (ROOT / "docs" / "LIBRARY.md").read_text()
SNIPPETS = [
    (name, snippet)
    for name, text in (("README.md", README), ("docs/LIBRARY.md", LIBRARY))
    for snippet in re.findall(r"```python\n(.*?)```", text, re.S)
]
MULTI_HOST = "jax.distributed.initialize()"
RUN = [(name, s) for name, s in SNIPPETS if MULTI_HOST not in s]


def test_the_readme_has_its_snippets_and_at_most_200_lines():
    assert sum(name == "README.md" for name, _ in RUN) == 3  # layer, train and decode, fla
    assert len(SNIPPETS) - len(RUN) == 1
    assert len(README.splitlines()) <= 200


def test_the_readmes_first_snippet_is_the_one_the_plain_install_runs():
    """test_packaging's plain install runs the README's first snippet as written (a fresh venv,
    the core requirements, no tokamax): it is not run a second time here."""
    assert RUN[0] == ("README.md", README.split("```python\n", 1)[1].split("```", 1)[0])


@pytest.mark.parametrize("where,snippet", RUN[1:], ids=[f"snippet{i}" for i in range(1, len(RUN))])
def test_readme_snippet_runs(where, snippet):
    namespace: dict = {}
    exec(compile(snippet, where, "exec"), namespace)  # noqa: S102
    assert "y" in namespace and namespace["y"] is not None


def test_the_readme_counts_the_notebooks_and_the_library_page_lists_every_mixer():
    from kda_lib.models.tiny_lm import MIXERS

    count = len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.py")))
    words = {10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen", 14: "fourteen"}
    assert f"{words.get(count, count)} notebooks" in README
    assert README.count("](https://colab.research.google.com/github/") == count
    listed = re.search(r"`kda_lib\.models\.tiny_lm\.MIXERS`: (.*?)\s*;", LIBRARY, re.S).group(1)
    assert sorted(re.findall(r"`(\w+)`", listed)) == sorted(MIXERS)


def test_readme_states_notebook_05s_simulated_devices_as_its_parameters_set_them():
    ci, full = map(
        int, re.search(r"CPU \((\d+) simulated devices at CI size, (\d+) with", README).groups()
    )
    source = (ROOT / "notebooks" / "05_context_parallel.py").read_text()
    assert ci == int(re.search(r"^num_devices: int = (\d+)", source, re.M).group(1))
    params = (ROOT / "notebooks" / "params" / "full" / "05_context_parallel.yaml").read_text()
    assert full == int(re.search(r"^num_devices: (\d+)", params, re.M).group(1))


def test_docs_and_makefile_give_check_browser_the_same_time():
    running = re.search(
        r"`make check-browser` \(after `make notebooks`; about ([^;]+);",
        (ROOT / "docs" / "RUNNING.md").read_text(),
    )
    makefile = re.search(
        r"Needs `make notebooks` first; about ([^;]+);", (ROOT / "Makefile").read_text()
    )
    assert running and makefile and running.group(1) == makefile.group(1)
