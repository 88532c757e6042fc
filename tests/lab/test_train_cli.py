"""The command lines as a user meets them: the console scripts, and retired module paths."""

import importlib.metadata
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = {"kda-bench": "kda_lib.lab.bench:main", "kda-train": "kda_lib.lab.train_cli:command"}


def _run(*command):
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_console_scripts_are_declared_and_load():
    declared = {
        ep.name: ep
        for ep in importlib.metadata.entry_points(group="console_scripts")
        if ep.dist is not None and ep.dist.name == "kda-lib"
    }
    assert {name: ep.value for name, ep in declared.items()} == SCRIPTS
    for ep in declared.values():
        assert callable(ep.load())


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_console_script_explains_itself(script):
    """`kda-bench --help` and `kda-train --help` from the environment's bin folder."""
    run = _run(str(pathlib.Path(sys.executable).parent / script), "--help")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"usage: {script}" in run.stdout


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("kda_lib.train", "No module named kda_lib.train"),  # the pre-layout path
        ("kda_lib.bench", "No module named kda_lib.bench"),
        ("kda_lib.lab.train", "kda-train"),  # a library module run as a command
    ],
)
def test_a_retired_or_library_module_path_never_exits_silently(module, says):
    """`python -m kda_lib.train mqar ...` exited 0 having done nothing before the layout."""
    run = _run(sys.executable, "-m", module, "mqar", "--steps", "1")
    assert run.returncode != 0
    assert says in run.stderr, run.stderr[-2000:]
