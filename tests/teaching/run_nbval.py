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
* with ``KDA_NAMESPACE_ATTACK_REPORT=<path>`` in the environment (tests/teaching/test_notebooks.py
  sets it; ``make notebooks`` and users do not), just before the first exercise cell runs,
  :mod:`namespace_attack` runs in the kernel and feeds every value and function the notebook
  built to each of its exercises: one accepted fails that cell, naming exercise and name; the
  count tried is written to ``<path>`` as JSON;
* the kernel runs with ``KDA_NONINTERACTIVE=1``: no widget starts (a notebook draws its static
  figure instead, :func:`kda_lib.teaching.notebook.interactive`).

The rules live in a plugin object passed to :func:`pytest.main` rather than a conftest.py, so
the kernel's ``sys.path`` and environment stay the user's: run as a script, this file's folder
is on the runner's path only.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import sys

import pytest

CELL_TIMEOUT_S = 1200  # 07's sweep, the longest CI cell, takes minutes on two busy cores
KERNEL_STARTUP_TIMEOUT_S = 180
NONINTERACTIVE_ENV = "KDA_NONINTERACTIVE"  # kda_lib.teaching.notebook's (not imported: jax)
ATTACK_ENV = "KDA_NAMESPACE_ATTACK_REPORT"
ATTACK_FILE = pathlib.Path(__file__).resolve().with_name("namespace_attack.py")
ATTACK_TIME_LIMIT_S = 20  # one checker call with a namespace value
_CHECK = re.compile(r"\bcheck\(\s*[\"']\d\d\.\d")


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


def exercise_checks(sources: list[str]) -> tuple[dict, str]:
    """The ``check("NN.M", answer, key=expr, ...)`` calls of the exercise cells ``sources``:
    ``{exercise id: {key: expr}}``, and their top-level assignments other than ``answer``
    (source text, so a context expression can use them)."""
    checks, prelude = {}, []
    for source in sources:
        code = "\n".join(line for line in source.splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        tree = ast.parse(code)
        for node in tree.body:
            if isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id != "answer" for t in node.targets
            ):
                prelude.append(ast.unparse(node))
        for node in ast.walk(tree):
            func = getattr(node, "func", None)
            name = getattr(func, "attr", None) or getattr(func, "id", None)
            if isinstance(node, ast.Call) and name == "check" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    checks[first.value] = {k.arg: ast.unparse(k.value) for k in node.keywords}
    return checks, "\n".join(prelude)


class NamespaceAttack:
    """Before a notebook's first exercise cell, attacks its exercises with the namespace in its
    kernel (:mod:`namespace_attack`); fails that cell if an attack is accepted, and writes
    ``{"notebook", "exercises", "tried", "accepted", "slowest"}`` to ``report``."""

    def __init__(self, report: str):
        self.report = pathlib.Path(report)
        self.done: set = set()

    def _run(self, item) -> dict:
        cells = [c.source for c in item.parent.nb.cells
                 if c.cell_type == "code" and _CHECK.search(c.source)]
        checks, prelude = exercise_checks(cells)
        init = (f"{{'NOTEBOOK': globals(), 'CHECKS': {checks!r}, 'PRELUDE': {prelude!r}, "
                f"'TIME_LIMIT_S': {ATTACK_TIME_LIMIT_S}}}")
        code = (f"(lambda: __import__('runpy').run_path({str(ATTACK_FILE)!r}, "
                f"init_globals={init}) and None)()")
        kernel = item.parent.kernel
        msg_id = kernel.execute_cell_input(code, allow_stdin=False)
        timeout = item.config.option.nbval_cell_timeout
        kernel.await_reply(msg_id, timeout=timeout)
        stdout, errors = [], []
        while True:
            msg = kernel.get_message(stream="iopub", timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content.get("name") == "stdout":
                stdout.append(content["text"])
            elif kind == "error":
                errors.append("\n".join(content.get("traceback", [])))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        lines = [line for line in "".join(stdout).splitlines()
                 if line.startswith("NAMESPACE_ATTACK ")]
        if errors or not lines:
            pytest.fail(f"{item.nodeid}: the namespace attack did not run:\n"
                        + "\n".join(errors) + "".join(stdout), pytrace=False)
        report = json.loads(lines[-1].split(" ", 1)[1])
        return {"notebook": str(item.parent.path), "exercises": sorted(checks), **report}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        parent = getattr(item, "parent", None)
        cell = getattr(item, "cell", None)
        if cell is None or parent in self.done or not _CHECK.search(cell.source):
            return
        self.done.add(parent)
        report = self._run(item)
        self.report.write_text(json.dumps(report))
        if report["accepted"]:
            pytest.fail(
                f"{item.nodeid}: red team: exercise(s) accepted the notebook's own names as "
                f"answers, (exercise, name): {report['accepted']}",
                pytrace=False,
            )


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
    plugins: list = [CleanStderr()]
    if os.environ.get(ATTACK_ENV):
        plugins.append(NamespaceAttack(os.environ[ATTACK_ENV]))
    return int(pytest.main(nbval_args(argv), plugins=plugins))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
