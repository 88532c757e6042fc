"""Run notebooks under nbval with the project's rules; tests/teaching/test_notebooks.py runs one
each.

    python tests/teaching/run_nbval.py notebooks/00_quickstart.ipynb [more notebooks] [pytest
    options]

``pytest --nbval-lax`` executes each notebook as it is stored (its parameters cell holds the CI
defaults), one test item per cell in one kernel, and on top of nbval's own checks:

* a cell that writes to stderr fails (warnings must not leak into the rendered notebooks);
* a cell running longer than ``CELL_TIMEOUT_S`` has hung and fails (nbval interrupts it, and
  pytest-timeout, configured in pyproject.toml, dumps every thread's stack);
* the first failing cell stops the run (``-x``), instead of every later cell failing on names
  it never defined;
* the kernel runs with ``KDA_NONINTERACTIVE=1``: no widget starts (a notebook draws its static
  figure instead, :func:`kda_lib.teaching.notebook.interactive`).

The rules live in a plugin object passed to :func:`pytest.main` rather than a conftest.py, so
the kernel's ``sys.path`` and environment stay the user's: run as a script, this file's folder
is on the runner's path only.
"""

from __future__ import annotations

import os
import sys

import pytest

CELL_TIMEOUT_S = 1200  # 07's sweep, the longest CI cell, takes minutes on two busy cores
KERNEL_STARTUP_TIMEOUT_S = 180
NONINTERACTIVE_ENV = "KDA_NONINTERACTIVE"  # kda_lib.teaching.notebook's (not imported: jax)


class CleanStderr:
    """Fails a notebook cell whose outputs include a stderr stream, showing what it wrote."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        result = yield
        outputs = getattr(item, "test_outputs", None) or []
        stderr = [
            out.get("text", "")
            for out in outputs
            if out.get("output_type") == "stream" and out.get("name") == "stderr"
        ]
        if stderr:
            pytest.fail(
                f"{item.nodeid} wrote to stderr (warnings leak into outputs):\n" + "".join(stderr),
                pytrace=False,
            )
        return result


def nbval_args(notebooks: list[str]) -> list[str]:
    """pytest's arguments to run ``notebooks`` under nbval with this module's rules."""
    return [
        "--nbval-lax",
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        f"--nbval-kernel-startup-timeout={KERNEL_STARTUP_TIMEOUT_S}",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        # plugins a notebook run never uses; hypothesis alone takes a second to import
        *("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:jaxtyping"),
        *("-p", "no:platformdirs", "-p", "no:xdist.looponfail"),
        *notebooks,
    ]


def main(argv: list[str]) -> int:
    if not any(arg.endswith(".ipynb") for arg in argv):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    os.environ[NONINTERACTIVE_ENV] = "1"  # the kernel inherits it
    return int(pytest.main(nbval_args(argv), plugins=[CleanStderr()]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
