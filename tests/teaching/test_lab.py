"""`make lab`: each notebook pair (``NN_name.ipynb`` and its jupytext ``NN_name.py``) shows as one
notebook. jupytext.toml names the pairing the notebooks carry in their metadata (and
``jupytext --sync`` still leaves a synced pair as it is); the lab command hides the ``.py`` twins
from the file browser (jupyter_server's ``ContentsManager.hide_globs``, matched with ``fnmatch``
against each file's name) and nothing else the notebooks folder holds. No server is started."""

from __future__ import annotations

import fnmatch
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tomllib

import jupytext
import pytest
from jupytext.config import load_jupytext_configuration_file
from jupytext.paired_paths import paired_paths

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
CONFIG = ROOT / "jupytext.toml"


@pytest.fixture(scope="module")
def lab_command() -> list[str]:
    """The `jupyter lab` command line `make lab` runs (make -n: nothing is run or installed)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    run = subprocess.run(
        ["make", "-n", "--no-print-directory", "lab"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    script = run.stdout.replace("\\\n", " ")
    (line,) = [line for line in script.splitlines() if "/bin/jupyter lab" in line]
    return shlex.split(line)


def _hidden(name: str, globs: list[str]) -> bool:
    """jupyter_server's rule (ContentsManager.should_list, negated)."""
    return any(fnmatch.fnmatch(name, glob) for glob in globs)


def test_the_lab_hides_every_notebook_twin_and_nothing_else(lab_command):
    flag = "--ContentsManager.hide_globs="
    globs = [arg.removeprefix(flag) for arg in lab_command if arg.startswith(flag)]
    assert lab_command[-1] == "notebooks/", lab_command
    assert SOURCES and all(_hidden(p.name, globs) for p in SOURCES), globs
    shown = [
        p
        for p in NOTEBOOKS.rglob("*")
        if p.is_file() and p not in SOURCES and "__pycache__" not in p.parts
    ]
    solutions = [p for p in shown if p.parent.name == "solutions" and p.suffix == ".py"]
    assert solutions and {p.with_suffix(".ipynb") for p in SOURCES} <= set(shown)
    wrongly_hidden = [p.relative_to(ROOT) for p in shown if _hidden(p.name, globs)]
    assert not wrongly_hidden, f"hidden from the lab: {wrongly_hidden}"
    # jupyter_server's own defaults are kept (setting the list replaces them)
    assert {"__pycache__", "*.pyc", ".DS_Store"} <= set(globs)


def test_jupytext_toml_names_the_pairing_the_notebooks_use():
    tomllib.loads(CONFIG.read_text())
    config = load_jupytext_configuration_file(str(CONFIG))
    for source in SOURCES:
        ipynb = f"notebooks/{source.stem}.ipynb"
        own = jupytext.read(source).metadata["jupytext"]["formats"]
        assert own == "ipynb,py:percent", f"{source.name} pairs as {own}"
        configured = config.default_formats(ipynb)
        assert configured, f"jupytext.toml does not pair {ipynb}"
        pairs = [path for path, _ in paired_paths(ipynb, "ipynb", configured)]
        assert pairs == [path for path, _ in paired_paths(ipynb, "ipynb", own)]
        assert pairs == [ipynb, f"notebooks/{source.name}"]
    # the pairing stays in notebooks/: a notebook elsewhere is not paired
    assert config.default_formats("scripts/scratch.ipynb") is None


def test_jupytext_sync_leaves_a_synced_pair_as_it_is(tmp_path):
    source = SOURCES[0]
    shutil.copy2(CONFIG, tmp_path / CONFIG.name)
    (tmp_path / "notebooks").mkdir()
    copies = [tmp_path / "notebooks" / p.name for p in (source, source.with_suffix(".ipynb"))]
    for copy in copies:
        shutil.copy2(NOTEBOOKS / copy.name, copy)
    run = subprocess.run(
        [sys.executable, "-m", "jupytext", "--sync", str(copies[0])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for copy in copies:
        assert copy.read_bytes() == (NOTEBOOKS / copy.name).read_bytes(), f"{copy.name} changed"
