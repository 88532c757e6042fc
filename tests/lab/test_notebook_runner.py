"""scripts/run_notebooks_sandboxed.py: a notebook runs with its kernel on unix sockets (no TCP,
as the lent TPU VM's sandbox requires) and the record says what ran."""

import json
import pathlib
import subprocess
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_notebook_runs_over_unix_sockets_and_is_recorded(tmp_path):
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    transport = ("import json, os, sys\nfrom ipykernel.connect import get_connection_file\n"
                 "print(os.environ['KDA_NONINTERACTIVE'], "
                 "json.load(open(get_connection_file()))['transport'], "
                 "sys.stdout.pub_thread._pipe_flag)")
    for path, source in ((good, transport),
                         (bad, "assert 1 == 2, 'held?'")):  # fmt: skip
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), path)
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_notebooks_sandboxed.py"),
                           "--output", str(out), "--executed", str(tmp_path / "run"), str(good),
                           str(bad)], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu",
                                          "HOME": str(tmp_path)})  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["kind"] == "notebook_run" and record["platform"] == "cpu"
    good_row, bad_row = record["notebooks"]
    assert good_row["completed"] and good_row["error"] is None
    assert not bad_row["completed"] and "held?" in bad_row["error"]
    executed = nbformat.read(tmp_path / "run" / "good.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "1 ipc False\n"  # unix sockets, no IOPub pipe
