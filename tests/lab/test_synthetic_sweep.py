"""scripts/synthetic_sweep.py: arguments refused before any work; two writers lose nothing."""

import importlib.util
import json
import math
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "synthetic_sweep.py"

FAKE_RUN = textwrap.dedent(
    """
    import importlib.util, math, sys, time

    spec = importlib.util.spec_from_file_location("synthetic_sweep", sys.argv[1])
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)

    def fake_run(task, mixer, seq_len, lr, seed, args):  # best rate 0.003, inside the grid
        time.sleep(0.1)
        return dict(task=task, mixer=mixer, stop="flat", train_seconds=0.0,
                    training=dict(seq_len=seq_len, learning_rate=lr, seed=seed, steps=4),
                    eval=dict(accuracy=1 - abs(math.log(lr / 0.003)) / 10, loss=1.0))

    sweep.run_one = fake_run
    sweep.main(sys.argv[2:])
    """
)
COMMON = ["--phase", "all", "--tasks", "mqar", "--seq-lens", "mqar=8,16", "--seeds", "0,1,2"]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("synthetic_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_processes_on_one_output_lose_nothing(tmp_path):
    """One process per mixer, both writing the same --output at once: every run of both
    (3 tuning rates + 5 more seeded runs per mixer) and both grids end up in the file."""
    output = tmp_path / "sweep.json"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                FAKE_RUN,
                str(SCRIPT),
                *COMMON,
                "--output",
                str(output),
                "--only",
                f"mqar/{mixer}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mixer in ("kda", "gdn")
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
    document = json.loads(output.read_text())
    keys = {
        (
            r["mixer"],
            r["training"]["seq_len"],
            r["training"]["learning_rate"],
            r["training"]["seed"],
        )
        for r in document["runs"]
    }
    assert len(document["runs"]) == len(keys) == 16
    assert {mixer for mixer, *_ in keys} == {"kda", "gdn"}
    assert {g["best"] for g in document["grids"].values()} == {0.003}
    assert set(document["grids"]) == {"mqar/kda", "mqar/gdn"}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--max-steps", "0"], "--max-steps must be >= 1"),
        (["--eval-every", "0"], "--eval-every must be >= 1"),
        (["--batch-size", "-1"], "--batch-size must be >= 1"),
        (["--solved", "1.5"], "--solved must be in"),
        (["--seeds", "0,x"], "--seeds must be ints"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    script, tmp_path, monkeypatch, capsys, extra, match
):
    monkeypatch.setattr(script, "run_one", lambda *a: pytest.fail("trained despite bad args"))
    output = tmp_path / "sweep.json"
    with pytest.raises(SystemExit) as exit_info:
        script.main([*COMMON, "--output", str(output), *extra])
    assert exit_info.value.code == 2 and match in capsys.readouterr().err
    assert not output.exists()


def test_a_damaged_or_unwritable_output_is_refused_before_any_work(
    script, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(script, "run_one", lambda *a: pytest.fail("trained despite bad args"))
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"runs": [')
    (tmp_path / "a_file").write_text("")
    for output, match in [
        (damaged, "not a readable JSON record"),
        (tmp_path / "a_file" / "sweep.json", "is a file"),
        (tmp_path, "is a directory"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            script.main([*COMMON, "--output", str(output)])
        assert exit_info.value.code == 2 and match in capsys.readouterr().err
    assert damaged.read_text() == '{"runs": ['  # left as it was


def test_verdict_and_rate_rules_unchanged(script):
    """The stopping verdict and the tuning order (kept from before the lock)."""
    curve = dict(step=[50, 100], loss=[1.0, math.nan], accuracy=[0.1, 0.2])
    assert script.verdict(curve, 100, 0.99, 0.01) == "diverged"
    solved = dict(
        stop="solved",
        training=dict(steps=50, learning_rate=0.01),
        eval=dict(accuracy=1.0, loss=0.1),
    )
    slow = dict(solved, training=dict(steps=90, learning_rate=0.003))
    assert script.best_rate([slow, solved]) == 0.01
