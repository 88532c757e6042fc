"""The command lines as a user meets them: the console scripts, and retired module paths."""

import importlib.metadata
import json
import pathlib
import subprocess
import sys

import pytest
from conftest import closed_stdout

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


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("", "--output: the path is empty"),  # was: the default path, written in silence
        ("link.json", "--output: '{tmp}/afile' is a file, so 'link.json' cannot be created"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_training(
    tmp_path, monkeypatch, capsys, output, message
):
    """A symlink is checked where it points (its target folder cannot be made under a file:
    the run used to fail after training); an empty --output is not the default path."""
    from kda_lib.lab import train_cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "link.json").symlink_to(tmp_path / "afile" / "runs" / "run.json")
    monkeypatch.setattr(train_cli, "run_experiment", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit) as exit_info:
        train_cli.main(["stack", "--steps", "1", "--output", output])
    assert exit_info.value.code == 2
    assert f"kda-train: error: {message.format(tmp=tmp_path)}" in capsys.readouterr().err
    assert not (tmp_path / "build").exists()


# what run_experiment returns, as much as the command line reads of it
FAKE_RECORD = dict(task="stack", mixer="kda", training=dict(seq_len=8, seed=0),
                   history=dict(step=[1], loss=[1.0]), test=dict(accuracy=0.5, loss=1.0),
                   validation=dict(accuracy=0.5, loss=1.0), chance_accuracy=0.25,
                   train_seconds=1.0, diverged=False)  # fmt: skip


def test_output_dash_is_stdout_as_kda_bench_s_out_dash(tmp_path, monkeypatch, capsys):
    """Issue 75.4: ``--output -`` prints the record on stdout and writes no file (it wrote a
    file named '-'); the closing line goes to stderr, so stdout is the JSON alone."""
    from kda_lib.lab import train_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_cli, "run_experiment", lambda *a, **k: FAKE_RECORD)
    record = train_cli.main(["stack", "--steps", "1", "--output", "-", "--progress", "none"])
    printed = capsys.readouterr()
    assert json.loads(printed.out) == record == FAKE_RECORD
    assert "the record is on stdout" in printed.err
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stdout_ends_kda_train_with_status_1_and_no_traceback(tmp_path, monkeypatch):
    """Issue 75.4: ``kda-train --output - | true`` ended in a BrokenPipeError traceback."""
    from kda_lib.lab import train_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_cli, "run_experiment", lambda *a, **k: FAKE_RECORD)
    with closed_stdout(), pytest.raises(SystemExit) as exit_info:
        train_cli.main(["stack", "--steps", "1", "--output", "-", "--progress", "none"])
    assert exit_info.value.code == 1
