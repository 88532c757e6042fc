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
