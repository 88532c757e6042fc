"""Notebooks run without a frontend (``make notebooks``' papermill, the nbval runner, any
nbclient run) start no widget, and a cell stalled until the cell timeout fails
``make notebooks`` even where papermill records it as completed (jupyter/nbclient#312)."""

from __future__ import annotations

import pathlib
import re
import sys
import types

import nbformat
import run_nbval

from kda_lib.teaching import notebook

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import check_cell_times  # noqa: E402  (scripts/ is no package)


def _ipython(monkeypatch, shell):
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))


def test_widgets_need_a_frontend_that_answers_input_and_no_batch_switch(monkeypatch):
    monkeypatch.setenv(notebook.NONINTERACTIVE_ENV, "0")
    _ipython(monkeypatch, types.SimpleNamespace(kernel=types.SimpleNamespace(_allow_stdin=True)))
    assert notebook.interactive() and not notebook.interactive(False)
    monkeypatch.setenv(notebook.NONINTERACTIVE_ENV, "1")  # make notebooks, run_nbval.py
    assert not notebook.interactive()
    monkeypatch.setenv(notebook.NONINTERACTIVE_ENV, "0")
    _ipython(monkeypatch, types.SimpleNamespace(kernel=types.SimpleNamespace(_allow_stdin=False)))
    assert not notebook.interactive()  # nbclient (papermill, nbconvert) sends allow_stdin=False
    _ipython(monkeypatch, None)
    assert not notebook.interactive()  # plain Python: no kernel


def test_notebook_02s_sliders_ask_first():
    source = (ROOT / "notebooks" / "02_gating_and_decay.py").read_text()
    (call,) = re.findall(r"gates\.explore\(.*?\)\)\n", source, re.S)
    assert "interactive=kda_lib.teaching.notebook.interactive(interactive)" in call


def test_make_notebooks_and_the_nbval_runner_switch_widgets_off_and_catch_stalls(monkeypatch):
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nnotebooks:") : makefile.index("\nsite:")]
    assert "KDA_NONINTERACTIVE=1 $(VENV)/bin/papermill " in recipe
    assert re.search(r"--execution-timeout \$\(CELL_TIMEOUT\) [^|]*\|\| exit 1", recipe)
    assert "scripts/check_cell_times.py $(CELL_TIMEOUT) $$out || exit 1" in recipe
    assert run_nbval.NONINTERACTIVE_ENV == notebook.NONINTERACTIVE_ENV
    monkeypatch.setenv(notebook.NONINTERACTIVE_ENV, "0")  # restored after the test
    seen = []
    monkeypatch.setattr(
        run_nbval.pytest, "main", lambda *a, **k: seen.append(run_nbval.os.environ.copy()) or 0
    )
    assert run_nbval.main(["x.ipynb"]) == 0
    assert seen[0][notebook.NONINTERACTIVE_ENV] == "1"  # the kernel inherits it


def test_a_cell_that_ran_the_whole_timeout_fails_the_check(tmp_path, capsys):
    cells = [nbformat.v4.new_markdown_cell("# title")]
    for source, duration in (("x = 1", 0.5), ("display(sliders)", 1200.02)):
        cells.append(nbformat.v4.new_code_cell(source))
        cells[-1].metadata["papermill"] = {"duration": duration, "status": "completed"}
    nb = nbformat.v4.new_notebook(cells=cells)
    assert check_cell_times.stalled_cells(nb, 1200) == ["cell 2 (1200 s): display(sliders)"]
    assert check_cell_times.stalled_cells(nb, 1201) == []
    nbformat.write(nb, tmp_path / "nb.ipynb")
    assert check_cell_times.main(["1200", str(tmp_path / "nb.ipynb")]) == 1
    assert "cell 2 (1200 s): display(sliders) reached the 1200 s" in capsys.readouterr().err
    assert check_cell_times.main(["1201", str(tmp_path / "nb.ipynb")]) == 0
