"""scripts/synthetic_sweep.py: arguments refused before any work; two writers lose nothing."""

import functools
import json
import math
import pathlib

import jax
import pytest
from conftest import load_script

from kda_lib.models import tiny_lm

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "synthetic_sweep.py"

FAKE_RUN = """
import math, time

def fake_run(task, mixer, seq_len, lr, seed, args):  # best rate 0.003, inside the grid
    time.sleep(0.1)
    scores = dict(accuracy=1 - abs(math.log(lr / 0.003)) / 10, loss=1.0)
    return dict(task=task, mixer=mixer, stop="flat", train_seconds=0.0,
                training=dict(seq_len=seq_len, learning_rate=lr, seed=seed, steps=4),
                validation=scores, test=scores, eval=scores)

script.run_one = fake_run
"""
COMMON = ["--phase", "all", "--tasks", "mqar", "--seq-lens", "mqar=8,16", "--num-pairs", "2"]
COMMON += ["--seeds", "0,1,2"]


@pytest.fixture(scope="module")
def script():
    return load_script("synthetic_sweep.py")


# a model's parameter count (an abstract model built, about 0.1 s), which --match-params asks
# for per mixer and the tests below per preset: computed once per config for this module's
# tests (in this process; the two-process test's processes compute their own)
config_param_count = functools.cache(tiny_lm.config_param_count)


@pytest.fixture(autouse=True)
def _counted_once(script, monkeypatch):
    for module in (tiny_lm, script):  # tiny_lm's match_parameter_count calls it too
        monkeypatch.setattr(module, "config_param_count", config_param_count)


def test_two_processes_on_one_output_lose_nothing(tmp_path, concurrent_writers):
    """One process per mixer, both writing the same --output at once: every run of both
    (3 tuning rates + 3 seeds x 2 lengths per mixer) and both grids end up in the file."""
    output = tmp_path / "sweep.json"
    argvs = [[*COMMON, "--output", str(output), "--only", f"mqar/{m}"] for m in ("kda", "gdn")]
    concurrent_writers(SCRIPT, FAKE_RUN, argvs)
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
    assert len(document["runs"]) == len(keys) == 18
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
        # each of these used to end in a traceback, --mixers kda,bogus after kda's runs
        (["--mixers", "kda,bogus"], "--mixers: unknown ['bogus']"),
        (["--implementation", "bogus"], "--implementation: KDAConfig.implementation must be"),
        (["--chunk-size", "3"], "--chunk-size: KDAConfig.chunk_size must be a power of two"),
        (["--tasks", "bogus", "--seq-lens", "bogus=8"], "--tasks: unknown ['bogus']"),
        (["--seq-lens", "mqar=16,4"], "--seq-lens mqar=4 (--vocab-size, --num-pairs): seq_len"),
        (["--num-pairs", "50"], "--seq-lens mqar=8 (--vocab-size, --num-pairs): vocab_size"),
        (["--only", "mqar/kda,mqar/kdaa"], "--only: ['mqar/kdaa'] are not task/mixer cells"),
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


def test_rising_needs_a_net_gain_over_the_last_fifth(script):
    """Review 2026-12-05: a run that moved by the tolerance over the last fifth of the steps
    but ended no higher is "moving", not "rising" (the label was two-sided)."""
    steps = [40, 80, 90, 100]  # the last fifth: after step 80

    def stop(*accuracy):
        curve = dict(step=steps, loss=[1.0] * 4, accuracy=list(accuracy))
        return script.verdict(curve, 100, 0.99, 0.01)

    assert stop(0.1, 0.2, 0.25, 0.22) == "rising"
    assert stop(0.1, 0.2, 0.25, 0.19) == "moving"  # up, then below where it began
    assert stop(0.1, 0.2, 0.205, 0.2) == "flat"


def test_tuning_runs_are_never_seeds_and_every_cell_gets_five_fresh_seeds(script, tmp_path):
    """The plan of both presets: the conv control and the Mamba2-style mixer on every task,
    >= 5 seeds per cell, none of them a tuning run; the CPU preset reaches MQAR with >= 8 pairs
    at T = 128, the paper preset T = 256 ... 2048 and 20K steps."""
    output = str(tmp_path / "sweep.json")
    for preset in ("cpu", "paper"):
        _, args = script.parse(["--preset", preset, "--phase", "all", "--output", output])
        tuning = script.tuning_plan(args)
        rates = {f"{t}/{m}": 0.003 for t, m, *_ in tuning}
        seeds = script.seed_plan(args, rates)
        assert not set(tuning) & set(seeds)
        assert {seed for *_, seed in tuning} == {args.tune_seed}
        assert args.tune_seed not in {seed for *_, seed in seeds}
        for task in ("mqar", "palindrome", "stack"):
            assert {"kda", "gdn", "mamba2", "conv"} <= {m for t, m, *_ in seeds if t == task}
        for task, mixer in {(t, m) for t, m, *_ in seeds}:
            for seq_len in args.seq_lens[task]:
                cell = [r for r in seeds if r[:3] == (task, mixer, seq_len)]
                assert len({seed for *_, seed in cell}) >= 5
    _, cpu = script.parse(["--phase", "all", "--output", output])
    assert cpu.preset == "cpu" and cpu.num_pairs >= 8 and max(cpu.seq_lens["mqar"]) >= 128
    assert max(cpu.seq_lens["stack"]) >= 128 and max(cpu.seq_lens["palindrome"]) >= 128
    _, paper = script.parse(["--preset", "paper", "--phase", "all", "--output", output])
    assert all(paper.seq_lens[t] == [256, 512, 1024, 2048] for t in paper.seq_lens)
    assert paper.max_steps == 20000
    # a value given on the command line overrides the preset's
    _, mine = script.parse(["--preset", "paper", "--phase", "all", "--output", output,
                            "--max-steps", "7", "--seq-lens", "mqar=96"])  # fmt: skip
    assert mine.max_steps == 7 and mine.seq_lens == {"mqar": [96]}


def test_a_tuning_seed_among_the_seeds_is_refused(script, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(script, "run_one", lambda *a: pytest.fail("trained despite bad args"))
    with pytest.raises(SystemExit) as exit_info:
        script.main([*COMMON, "--output", str(tmp_path / "s.json"), "--tune-seed", "2"])
    assert exit_info.value.code == 2
    assert "--tune-seed 2 is one of --seeds" in capsys.readouterr().err


def test_a_tiny_paper_preset_sweep_records_validation_and_test(script, tmp_path):
    """Two training steps per run (the paper preset shrunk): one tuning run at the tuning
    seed, then fresh seeds; every run scored on validation and once on test, stack with its
    accuracy beyond the conv reach; the document's setting says protocol 2."""
    output = tmp_path / "sweep.json"
    tiny = ["--seq-lens", "stack=24", "--tasks", "stack", "--mixers", "conv", "--vocab-size",
            "8", "--hidden-size", "8", "--num-layers", "1", "--num-heads", "1", "--head-dim",
            "8", "--chunk-size", "8", "--batch-size", "2", "--max-steps", "2", "--eval-every",
            "1", "--eval-batches", "1", "--test-batches", "2", "--grid", "0.003",
            "--max-extensions", "0", "--seeds", "0,1"]  # fmt: skip
    names = ("jax_threefry_partitionable", "jax_default_matmul_precision")
    before = {n: getattr(jax.config, n) for n in names}
    try:
        script.main(["--preset", "paper", "--phase", "all", "--output", str(output), *tiny])
    finally:  # the script's setup() switches jax's random scheme and precision, as notebooks'
        for name, value in before.items():
            jax.config.update(name, value)
    document = json.loads(output.read_text())
    assert document["setting"]["protocol_version"] == 2
    runs = {(r["phase"], r["training"]["seed"]): r for r in document["runs"]}
    assert set(runs) == {("tune", 1000), ("seeds", 0), ("seeds", 1)}
    for run in runs.values():
        assert run["training"]["steps"] <= 2 and run["test"]["batches"] == 2
        assert run["eval"] == run["validation"] and run["conv_reach"] == 3
        assert {"beyond_reach_accuracy", "beyond_reach_scored"} <= set(run["test"])
        assert len(run["curve"]["accuracy"]) == run["training"]["steps"]


def test_train_step_table_writes_its_record(tmp_path, capsys):
    """scripts/train_step_table.py end to end at a tiny size (its main, in this process: no
    interpreter and imports of its own to wait for): one row a mixer and T, written."""
    out = tmp_path / "steps.json"
    load_script("train_step_table.py").main(
        ["--output", str(out), "--seq-lens", "24", "--mixers", "attention", "--batch-size", "2",
         "--hidden-size", "32", "--num-heads", "2", "--head-dim", "16", "--num-pairs", "2"]
    )  # fmt: skip
    assert json.loads(capsys.readouterr().out)["mixer"] == "attention"  # the row, printed
    record = json.loads(out.read_text())
    assert record["kind"] == "train_step_table"
    ((row,),) = [record["rows"]]
    assert row["mixer"] == "attention" and row["T"] == 24 and row["seconds_per_step"] > 0


def _notebook_08_ci_sizes() -> dict:
    """Notebook 08's CI parameters (its parameters cell) that size a model."""
    import ast
    import re

    text = (ROOT / "notebooks" / "08_synthetic_recall.py").read_text()
    cell = text.split('# %% tags=["parameters"]\n')[1].split("\n# %%")[0]
    values = {
        m[1]: ast.literal_eval(m[2]) for m in re.finditer(r"^(\w+): [^=]+= (.+?)  #", cell, re.M)
    }
    names = ("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim")
    return {name: values[name] for name in names}


RECURRENT = ("kda", "gdn", "mamba2", "mamba2_dt")


@pytest.mark.parametrize("preset", ["paper", "cpu", "notebook 08 CI"])
def test_match_params_puts_kda_gdn_and_mamba2_within_two_percent(script, tmp_path, preset):
    """Issue 73 item 1: with --match-params kda the recurrent mixers' models are within 2% of
    each other's parameter count (without it KDA's is 9.5% above GDN's at the CPU preset);
    every mixer of the sweep, the controls too, is matched."""
    argv = ["--phase", "all", "--output", str(tmp_path / "s.json")]
    if preset == "notebook 08 CI":
        sizes = _notebook_08_ci_sizes()
        argv += ["--preset", "cpu"] + [f"--{k.replace('_', '-')}={v}" for k, v in sizes.items()]
    else:
        argv += ["--preset", preset]
    _, plain = script.parse(argv)
    _, matched = script.parse([*argv, "--match-params", "kda"])
    count = {}
    for name, args in (("plain", plain), ("matched", matched)):
        count[name] = {m: config_param_count(script._model_config(m, args))
                       for m in script.MIXERS.split(",") + ["mamba2_dt"]}  # fmt: skip
    target = script.params_target(matched)
    assert target == count["plain"]["kda"] == count["matched"]["kda"]
    assert script.params_target(plain) is None
    for mixer, n in count["matched"].items():
        assert abs(n / target - 1) <= 0.02, (mixer, n, target)
    recurrent = [count["matched"][m] for m in RECURRENT]
    assert max(recurrent) / min(recurrent) - 1 <= 0.02
    unmatched = [count["plain"][m] for m in RECURRENT]
    assert max(unmatched) / min(unmatched) - 1 > 0.05  # the gap the matching closes


def test_match_params_is_recorded_only_when_given_so_old_records_resume(script, tmp_path):
    """The recorded CPU sweep's setting is the CPU preset's without --match-params (the same
    command resumes it); with --match-params the setting says so, and that record is refused
    as made with another setting."""
    recorded = ROOT / "data" / "results" / "synthetic_sweep_protocol2.json"
    setting = json.loads(recorded.read_text())["setting"]
    p, args = script.parse(["--preset", "cpu", "--phase", "all", "--output", str(recorded)])
    script.record_runs.check_seeds_and_grid(p, args)
    assert script.setting_of(args) == setting and "match_params" not in setting
    _, matched = script.parse(["--preset", "cpu", "--phase", "all", "--output", str(recorded),
                               "--match-params", "kda"])  # fmt: skip
    assert script.setting_of(matched) == {**setting, "match_params": "kda"}
    with pytest.raises(SystemExit):
        script.record_runs.check_output(p, matched, script.setting_of(matched))


def test_an_unknown_match_params_mixer_is_refused(script, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(script, "run_one", lambda *a: pytest.fail("trained despite bad args"))
    with pytest.raises(SystemExit) as exit_info:
        script.main([*COMMON, "--output", str(tmp_path / "s.json"), "--match-params", "kdaa"])
    assert exit_info.value.code == 2
    assert "--match-params: unknown mixer 'kdaa'" in capsys.readouterr().err
