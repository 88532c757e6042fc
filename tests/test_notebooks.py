"""Notebooks: every ``notebooks/NN_*.py`` (jupytext py:percent, the source of truth) has a
committed ``.ipynb`` twin that is in sync, output-free and well-formed (fast checks), and each
notebook executes with its CI parameters under papermill (one test per notebook, so
``pytest -n 2`` spreads them). Execution times are printed (``pytest -s``) and collected in
``build/notebook_times.json``.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import pathlib
import re
import time

import jupytext
import nbformat
import pytest
import yaml
from conftest import USER_XLA_FLAGS

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
FULL_PARAMS_DIR = NOTEBOOK_DIR / "params" / "full"
SOURCES = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
TIMES_FILE = ROOT / "build" / "notebook_times.json"
KERNEL = "python3"
# a cell that runs longer has hung (07's sweep, the longest CI cell, takes ~5 min here)
CELL_TIMEOUT_S = 1200
COLAB = "https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks"
# `name: type = value  # meaning`, one per line
PARAMETER_LINE = re.compile(
    r"^(?P<name>[a-z_][a-z0-9_]*): (?P<type>[\w\[\], |]+) = (?P<value>.+?)"
    r"  # (?P<meaning>\S.*)$"
)


def _ids(paths):
    return [p.stem for p in paths]


def _cells(nb):
    return [(cell.cell_type, cell.source.strip()) for cell in nb.cells]


def _parameters_cells(nb):
    return [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]


def _parameters(nb) -> dict:
    """Parse the parameters cell: name -> literal value; asserts the line format."""
    (cell,) = _parameters_cells(nb)
    values = {}
    for line in cell.source.strip().splitlines():
        match = PARAMETER_LINE.match(line)
        assert match, f"parameters line {line!r} is not `name: type = value  # meaning`"
        assert "=" not in match["meaning"], (
            f"parameters line {line!r}: papermill cannot parse an '=' inside the comment"
        )
        try:
            values[match["name"]] = ast.literal_eval(match["value"])
        except (ValueError, SyntaxError) as e:
            raise AssertionError(f"parameter {match['name']} is not a literal: {line!r}") from e
    return values


def test_notebooks_exist():
    assert SOURCES, f"no notebooks/NN_*.py found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_pair_in_sync_and_clean(source):
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make sync` (jupytext --sync)"
    from_py = jupytext.read(source)
    from_ipynb = nbformat.read(ipynb, as_version=4)
    assert _cells(from_ipynb) == _cells(from_py), (
        f"{ipynb.name} is out of sync with {source.name}: run `make sync` "
        f"(jupytext --sync notebooks/{source.name})"
    )
    for cell in from_ipynb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, f"{ipynb.name}: stored outputs in a code cell"
            assert cell.execution_count is None, f"{ipynb.name}: stored execution count"
    for name, nb in ((source.name, from_py), (ipynb.name, from_ipynb)):
        assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL, (
            f"{name}: kernelspec name must be {KERNEL!r}"
        )
        tagged = _parameters_cells(nb)
        assert len(tagged) == 1, f"{name}: {len(tagged)} cells tagged 'parameters', want 1"
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert first_code is tagged[0], f"{name}: the parameters cell must be the first code cell"
    assert from_ipynb.cells[0].cell_type == "markdown" and from_ipynb.cells[0].source.startswith(
        "# "
    ), f"{ipynb.name}: must open with a markdown title"
    badge = f"{COLAB}/{ipynb.name}"
    assert any(badge in c.source for c in from_ipynb.cells if c.cell_type == "markdown"), (
        f"{ipynb.name}: Colab badge linking to notebooks/{ipynb.name} is missing"
    )


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_parameters_cell(source):
    params = _parameters(jupytext.read(source))
    assert "seed" in params and isinstance(params["seed"], int), "a `seed: int` parameter"
    full = FULL_PARAMS_DIR / f"{source.stem}.yaml"
    if full.exists():
        overrides = yaml.safe_load(full.read_text()) or {}
        unknown = set(overrides) - set(params)
        assert not unknown, f"{full.name} sets parameters the notebook lacks: {sorted(unknown)}"
        for name, value in overrides.items():
            default = params[name]
            assert isinstance(value, type(default)) or (
                isinstance(default, float) and isinstance(value, int)
            ), f"{full.name}: {name}={value!r} has another type than the default {default!r}"


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _record_time(name: str, seconds: float) -> None:
    """Merge one notebook's wall time into build/notebook_times.json (xdist-safe)."""
    with _locked(TIMES_FILE):
        try:
            times = json.loads(TIMES_FILE.read_text())
        except (OSError, ValueError):
            times = {}
        times[name] = round(seconds, 2)
        TIMES_FILE.write_text(json.dumps(dict(sorted(times.items())), indent=2) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_notebook_executes(source, tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    # the kernel inherits this environment: give it the user's XLA flags, not the suite's
    if USER_XLA_FLAGS is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", USER_XLA_FLAGS)
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.fail(f"{ipynb.name} is missing: run `make sync`")
    output = tmp_path / ipynb.name
    start = time.perf_counter()
    papermill.execute_notebook(
        str(ipynb),
        str(output),
        kernel_name=KERNEL,
        cwd=str(ROOT),
        progress_bar=False,
        log_output=False,
        execution_timeout=CELL_TIMEOUT_S,
    )
    elapsed = time.perf_counter() - start
    _record_time(source.stem, elapsed)
    print(f"\n{source.stem}: executed in {elapsed:.1f} s (CI parameters)")
    executed = nbformat.read(output, as_version=4)
    stderr = [
        "".join(out.get("text", ""))
        for cell in executed.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream" and out.get("name") == "stderr"
    ]
    assert not stderr, f"{source.stem} wrote to stderr (warnings leak into outputs):\n" + "\n".join(
        stderr
    )
