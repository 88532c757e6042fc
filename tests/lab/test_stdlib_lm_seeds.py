"""scripts/stdlib_lm_seeds.py: notebook 09's configs, issue 39's protocol (a rate per model on
validation with a tuning seed apart, fresh seeds, test scored once), bad arguments refused
before any work, resuming, and two writers on one output."""

import functools
import json
import math
import pathlib

import jax
import pytest
import yaml
from conftest import load_script

from kda_lib.lab import corpus
from kda_lib.models import tiny_lm
from kda_lib.models.tiny_lm import ModelConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "stdlib_lm_seeds.py"
TINY = ["--preset", "tiny"]

# validation bits per byte lowest at the rate 0.003 (inside 0.001, 0.003, 0.01)
FAKE_RUN = """
import math, time

def fake_run(model_name, lr, seed, args, data):
    time.sleep(0.05)
    scores = dict(bpb=2 + abs(math.log(lr / 0.003)), bpb_se=0.01)
    return dict(model=model_name, learning_rate=lr, seed=seed, validation=scores, test=scores,
                training=dict(steps=args.steps), seconds=0.0)

script.run_one = fake_run
"""


@pytest.fixture(scope="module")
def script():
    return load_script("stdlib_lm_seeds.py")


# Pure functions of their arguments that every command of the script calls again: a model's
# parameter count (an abstract model built, about 0.1 s; the argument checks match every model's
# size) and the standard library's file list (a walk of some 5,000 files). Each is computed once
# per argument for this module's tests (in this process; the two-process test's own processes
# compute them as a user's command does).
config_param_count = functools.cache(tiny_lm.config_param_count)
_source_files = functools.cache(corpus.source_files)


@pytest.fixture(autouse=True)
def _computed_once(script, monkeypatch):
    for module in (tiny_lm, script):  # tiny_lm's match_parameter_count calls it too
        monkeypatch.setattr(module, "config_param_count", config_param_count)
    monkeypatch.setattr(corpus, "source_files", _source_files)


@pytest.fixture
def fake(script, monkeypatch):
    """Training replaced by :data:`FAKE_RUN`'s fake; the list of runs it was asked for (each
    call checks that the runs asked for before it are in ``--output`` already)."""
    namespace = {"script": script}
    exec(FAKE_RUN, namespace)
    namespace["time"] = type("NoSleep", (), {"sleep": staticmethod(lambda s: None)})
    calls = []  # (in one process the runs need no spacing: it interleaves two processes' writes)

    def counted(model_name, lr, seed, args, data):
        output = pathlib.Path(args.output)
        on_disk = json.loads(output.read_text())["runs"] if output.exists() else []
        assert len(on_disk) >= len(calls)  # every run asked for before is written already
        calls.append((model_name, lr, seed))
        return namespace["fake_run"](model_name, lr, seed, args, data)

    monkeypatch.setattr(script, "run_one", counted)
    return calls


@pytest.fixture(autouse=True)
def _jax_random_scheme_restored():
    """The script's setup() switches jax's random scheme and matmul precision, as the notebooks'
    does: give them back after each test (a leak would change later tests on this worker)."""
    names = ("jax_threefry_partitionable", "jax_default_matmul_precision")
    before = {n: getattr(jax.config, n) for n in names}
    yield
    for name, value in before.items():
        jax.config.update(name, value)


def test_configs_are_the_recorded_ones(script):
    """The script builds every model as the recorded full run did (layers, size)."""
    params = yaml.safe_load(script.PARAMS.read_text())
    recorded = json.loads((ROOT / "data" / "results" / "stdlib_lm_full.json").read_text())
    for name in script.MODELS:
        config = script.model_config(params, name)
        # the recorded config (flat names, written before ModelConfig.mixer_config) reads back
        assert ModelConfig.from_flat(**recorded["models"][name]["config"]) == config, name
        assert config_param_count(config) == recorded["models"][name]["params"]
    assert script.model_config(params, "hybrid").layer_mixers[-1] == "mla"
    assert script.model_config(params, "hybrid_mha").layer_mixers[-1] == "attention"


def test_the_cpu_preset_is_notebook_09s_full_setting_with_five_fresh_seeds(script, tmp_path):
    params = yaml.safe_load(script.PARAMS.read_text())
    p, args = script.parse(["--output", str(tmp_path / "x.json")])
    script.check_arguments(p, args)
    assert args.preset == "cpu" and script.sizes(args) == {k: params[k] for k in script.sizes(args)}
    assert (args.seq_len, args.batch_size) == (params["seq_len"], params["batch_size"])
    assert args.models == list(script.MODELS) and len(args.seeds) >= 5
    assert args.tune_seed not in args.seeds and 3 <= len(args.grid) <= 5
    assert args.grid[0] < params["learning_rate"] < args.grid[-1]  # the old rate inside
    _, mine = script.parse(["--output", "x.json", "--steps", "7", "--preset", "tiny"])
    assert mine.steps == 7 and mine.seq_len == 16  # the command line overrides the preset


def test_a_tiny_run_records_validation_test_and_bits_by_position(script, tmp_path):
    """End to end at the tiny preset (3 steps, width 16, 16-byte windows): one tuning run per
    rate at the tuning seed, then a fresh seed at the chosen rate; every run holds the
    validation curve, validation and test bits per byte with standard errors, the bits at
    each of the 16 positions and the long-range probe; a second call trains nothing."""
    output = tmp_path / "lm.json"
    argv = [*TINY, "--models", "attention", "--seeds", "0", "--grid", "0.003,0.01",
            "--max-extensions", "0", "--output", str(output)]  # fmt: skip
    script.main(argv)
    document = json.loads(output.read_text())
    assert document["setting"]["protocol_version"] == 2 and document["corpus"]["test_files"]
    assert document["protocol"].startswith("- **Three disjoint streams**")
    assert "Time, " not in document["protocol"] and "**Seeds**" in document["protocol"]
    runs = {(r["model"], r["phase"], r["learning_rate"], r["seed"]) for r in document["runs"]}
    for model in ("attention",):  # the protocol is the same for every model: one here
        grid = document["grids"][model]
        assert grid["rates"] == [0.003, 0.01] and grid["seed"] == 1000
        assert {(model, "tune", lr, 1000) for lr in grid["rates"]} <= runs
        assert (model, "seeds", grid["best"], 0) in runs  # several seeds: with the fake below
    assert len(runs) == 3
    for run in document["runs"]:
        assert run["curve"]["step"] == [2, 3] and run["training"]["steps"] == 3
        assert len(run["curve"]["validation_bpb"]) == 2
        assert run["curve"]["validation_bpb"][-1] == run["validation"]["bpb"]
        for split, windows in (("validation", 8), ("test", 8)):
            scores = run[split]
            assert scores["windows"] == windows and 0 < scores["bpb_se"] < scores["bpb"] < 9
            assert len(scores["bits_by_position"]) == len(scores["bits_by_position_se"]) == 16
            mean = sum(scores["bits_by_position"]) / 16
            assert math.isclose(mean, scores["bpb"], rel_tol=1e-5)
        probe = run["probe"]  # the long-range probe on the test split: 8-byte repeats
        assert (probe["reach"], probe["distance"], probe["windows"]) == (4, 8, 8)
        assert probe["scored"] == [12, 16] and probe["gain_se"] > 0
        assert math.isclose(probe["gain_bpb"], probe["control_bpb"] - probe["copy_bpb"],
                            rel_tol=1e-4, abs_tol=1e-6)  # fmt: skip
    before = output.read_text()
    script.main(argv)  # resumes: everything recorded, nothing trained
    assert json.loads(output.read_text())["runs"] == json.loads(before)["runs"]


def test_the_best_rate_ends_inside_the_grid_by_extension(script, tmp_path, fake):
    """The fake's best rate is 0.003: a grid starting above it is extended downwards until the
    best lies strictly inside; seeds then run at 0.003 only, never at the tuning seed."""
    output = tmp_path / "lm.json"
    script.main([*TINY, "--models", "kda", "--seeds", "0,1,2,3,4", "--grid", "0.01,0.03",
                 "--output", str(output)])  # fmt: skip
    grid = json.loads(output.read_text())["grids"]["kda"]
    assert grid["rates"] == [0.00111, 0.00333, 0.01, 0.03] and grid["inside"]
    assert grid["extensions"] == {"low": 2, "high": 0} and grid["best"] == 0.00333
    assert [lr for _, lr, seed in fake if seed == 1000] == [0.01, 0.03, 0.00333, 0.00111]
    assert [(lr, seed) for _, lr, seed in fake if seed != 1000] == [(0.00333, s) for s in range(5)]


def test_resuming_skips_recorded_runs_and_writes_after_each_run(script, tmp_path, fake):
    output = tmp_path / "lm.json"
    argv = [*TINY, "--models", "kda,gdn", "--output", str(output)]
    script.main([*argv, "--seeds", "0"])
    assert len(fake) == 2 * 3 + 2  # three tuning rates and one seed per model
    first = json.loads(output.read_text())
    assert len(first["runs"]) == 8 and set(first["grids"]) == {"kda", "gdn"}
    fake.clear()
    script.main([*argv, "--seeds", "0,1"])  # only seed 1 is new
    assert fake == [("kda", 0.003, 1), ("gdn", 0.003, 1)]
    fake.clear()
    script.main([*argv, "--seeds", "0,1"])
    assert fake == []
    assert len(json.loads(output.read_text())["runs"]) == 10


def test_two_processes_on_one_output_lose_nothing(tmp_path, concurrent_writers):
    """One process per model, both writing the same --output at once: every run of both
    (3 tuning rates + 5 seeds each) and both grids end up in the file."""
    output = tmp_path / "lm.json"
    argvs = [[*TINY, "--models", m, "--output", str(output)] for m in ("kda", "attention")]
    concurrent_writers(SCRIPT, FAKE_RUN, argvs)
    document = json.loads(output.read_text())
    keys = {(r["model"], r["learning_rate"], r["seed"]) for r in document["runs"]}
    assert len(document["runs"]) == len(keys) == 16
    assert {model for model, *_ in keys} == {"kda", "attention"}
    assert {g["best"] for g in document["grids"].values()} == {0.003}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--steps", "0"], "--steps must be >= 1"),
        (["--eval-every", "0"], "--eval-every must be >= 1"),
        (["--val-windows", "1"], "--val-windows must be >= 2"),
        (["--seeds", "0,x"], "--seeds must be ints"),
        (["--seeds", "0,0"], "--seeds must be distinct"),
        (["--grid", "0.01,-1"], "--grid rates > 0"),
        (["--grid-factor", "1"], "--grid-factor must be > 1"),
        (["--models", "kda,lstm"], "--models must be distinct names"),
        (["--hybrid-layers", "kda,kda,kda"], "--hybrid-layers must be mixers"),
        (["--tune-seed", "1"], "--tune-seed 1 is one of --seeds"),
        (["--test-windows", "5000"], "the test split (20000 bytes) is too small"),
        (["--test-fraction", "0.95"], "the corpus: test_fraction must be in"),
        (["--probe-reach", "8"], "--probe-reach must be below --seq-len // 2 = 8"),
        (["--probe-reach", "0"], "--probe-reach must be >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    script, tmp_path, monkeypatch, capsys, extra, match
):
    monkeypatch.setattr(script, "run_one", lambda *a: pytest.fail("trained despite bad args"))
    output = tmp_path / "lm.json"
    with pytest.raises(SystemExit) as exit_info:
        script.main([*TINY, "--seeds", "0,1", "--output", str(output), *extra])
    assert exit_info.value.code == 2 and match in capsys.readouterr().err
    assert not output.exists()


def test_a_damaged_unwritable_or_other_output_is_refused_before_any_work(
    script, tmp_path, monkeypatch, capsys, fake
):
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"runs": [')
    (tmp_path / "a_file").write_text("")
    other = tmp_path / "other.json"
    script.main([*TINY, "--models", "kda", "--seeds", "0", "--output", str(other)])
    fake.clear()
    for output, extra, match in [
        (damaged, [], "not a readable JSON record"),
        (tmp_path / "a_file" / "lm.json", [], "is a file"),
        (tmp_path, [], "is a directory"),
        (other, ["--steps", "5"], "was made with another setting"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            script.main([*TINY, "--output", str(output), *extra])
        assert exit_info.value.code == 2 and match in capsys.readouterr().err
    assert damaged.read_text() == '{"runs": ['  # left as it was
    assert fake == []
