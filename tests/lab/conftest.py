"""Shared by the tests of the resumable record scripts (``scripts/synthetic_sweep.py``,
``scripts/stdlib_lm_seeds.py``): several processes writing one ``--output`` at once."""

import subprocess
import sys
import textwrap

import pytest

# loads the script by path (argv[1]) as ``script``, runs the patch source (argv[2]: replaces
# its training with a fast fake), then the script's main on the remaining arguments
_WRITER = textwrap.dedent(
    """
    import importlib.util, sys

    spec = importlib.util.spec_from_file_location("script_under_test", sys.argv[1])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    exec(sys.argv[2])
    script.main(sys.argv[3:])
    """
)


@pytest.fixture
def concurrent_writers():
    """``run(script_path, patch, argvs)``: one process per argument list of ``argvs``, all
    started at once, each running ``script_path``'s ``main`` after ``patch`` (Python source
    that sees the loaded module as ``script``, e.g. ``script.run_one = fake``); fails the test
    with a process's stderr unless every one exits 0."""

    def run(script_path, patch: str, argvs: list[list[str]], timeout: float = 300) -> None:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(script_path), textwrap.dedent(patch), *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for argv in argvs
        ]
        for process in processes:
            _, stderr = process.communicate(timeout=timeout)
            assert process.returncode == 0, stderr[-3000:]

    return run
