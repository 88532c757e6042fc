"""Every Python snippet of the README runs as written (a reader pastes them), except the
multi-host one, which needs several processes: tests/parallel/test_multihost.py runs that one."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
MULTI_HOST = "jax.distributed.initialize()"
RUN = [s for s in SNIPPETS if MULTI_HOST not in s]


def test_the_readme_has_its_snippets():
    assert len(RUN) >= 3 and len(SNIPPETS) - len(RUN) == 1


@pytest.mark.parametrize("snippet", RUN, ids=[f"snippet{i}" for i in range(len(RUN))])
def test_readme_snippet_runs(snippet):
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # noqa: S102
    assert "y" in namespace and namespace["y"] is not None


def test_readme_states_notebook_05s_simulated_devices_as_its_parameters_set_them():
    readme = (ROOT / "README.md").read_text()
    ci, full = map(
        int, re.search(r"CPU \((\d+) simulated devices at CI size, (\d+) with", readme).groups()
    )
    source = (ROOT / "notebooks" / "05_context_parallel.py").read_text()
    assert ci == int(re.search(r"^num_devices: int = (\d+)", source, re.M).group(1))
    params = (ROOT / "notebooks" / "params" / "full" / "05_context_parallel.yaml").read_text()
    assert full == int(re.search(r"^num_devices: (\d+)", params, re.M).group(1))


def test_readme_and_makefile_give_check_browser_the_same_time():
    readme = re.search(
        r"`make check-browser` \(after `make notebooks`; about ([^;]+);",
        (ROOT / "README.md").read_text(),
    )
    makefile = re.search(
        r"Needs `make notebooks` first; about ([^;]+);", (ROOT / "Makefile").read_text()
    )
    assert readme and makefile and readme.group(1) == makefile.group(1)
