"""``-`` as the output path means one thing in both command lines: the JSON document alone on
stdout, everything else on stderr, no file (round-6 review: progress lines and kda-bench's
table went to stdout, so ``| jq`` broke)."""

import json

from kda_lib.lab import bench, train, train_cli

RECORD = dict(task="stack", mixer="kda", training=dict(seq_len=8, seed=0),
              history=dict(step=[1], loss=[1.0]), test=dict(accuracy=0.5, loss=1.0),
              validation=dict(accuracy=0.5, loss=1.0), chance_accuracy=0.25,
              train_seconds=1.0, diverged=False)  # fmt: skip


def test_kda_train_output_dash_keeps_progress_lines_off_stdout(tmp_path, monkeypatch, capsys):
    """``--progress lines`` (what ``auto`` picks when stdout is a pipe) with ``--output -``:
    the training's lines on stderr, stdout the record alone; with a file, on stdout as before."""

    def run_experiment(*args, progress, **kwargs):  # reports as kda_lib.lab.train.train does
        report = train.print_record if progress is True else progress
        report(dict(step=1, loss=1.0, accuracy=0.5, seconds=0.1))
        return RECORD

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_cli, "run_experiment", run_experiment)
    train_cli.main(["stack", "--steps", "1", "--output", "-", "--progress", "lines"])
    printed = capsys.readouterr()
    assert json.loads(printed.out) == RECORD
    assert "step      1  loss 1.0000" in printed.err
    train_cli.main(["stack", "--steps", "1", "--output", "r.json", "--progress", "lines"])
    assert "step      1  loss 1.0000" in capsys.readouterr().out


def test_kda_bench_out_dash_prints_the_json_alone_and_the_table_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(bench, "_plan_jobs", lambda *args: ([], []))  # nothing to time
    bench.main(["--batch", "1", "--heads", "2", "--seq-lens", "8", "--no-roofline",
                "--out", "-"])  # fmt: skip
    printed = capsys.readouterr()
    assert json.loads(printed.out)["records"] == []
    assert "median ms" in printed.err
