"""kda_lib.lab.record_runs: presets, settings, merging, runs ensured once; and the two record
scripts built on it still write the settings their documents were made with (a change there
would refuse to resume every recorded or running document)."""

import argparse
import functools
import json
import pathlib

import pytest
from conftest import load_script

from kda_lib.lab import record_runs
from kda_lib.models import tiny_lm

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The settings as the scripts wrote them before kda_lib.lab.record_runs (keys in this order).
SWEEP_SETTINGS = {
    "cpu": {
        "protocol_version": 2, "vocab_size": 64, "num_pairs": 8, "hidden_size": 64,
        "num_layers": 2, "num_heads": 2, "head_dim": 32, "implementation": "chunked",
        "chunk_size": 32, "batch_size": 16, "max_steps": 2000, "eval_every": 100,
        "eval_batches": 8, "test_batches": 16, "solved": 0.99, "flat_tol": 0.01,
        "tune_seed": 1000,
    },
    "paper": {
        "protocol_version": 2, "vocab_size": 256, "num_pairs": 32, "hidden_size": 256,
        "num_layers": 2, "num_heads": 4, "head_dim": 64, "implementation": "chunked",
        "chunk_size": 64, "batch_size": 32, "max_steps": 20000, "eval_every": 500,
        "eval_batches": 16, "test_batches": 32, "solved": 0.99, "flat_tol": 0.01,
        "tune_seed": 1000,
    },
}  # fmt: skip
LM_SETTINGS = {
    "cpu": {
        "protocol_version": 2, "hidden_size": 64, "num_layers": 4, "num_heads": 2,
        "head_dim": 32, "kv_lora_rank": 32, "batch_size": 16,
        "hybrid_layers": ["kda", "kda", "kda", "mla"], "implementation": "auto",
        "seq_len": 128, "steps": 600, "eval_every": 100, "val_windows": 256,
        "test_windows": 512, "probe_reach": 32, "validation_fraction": 0.1,
        "test_fraction": 0.1, "max_bytes": None, "tune_seed": 1000,
    },
    "tiny": {
        "protocol_version": 2, "hidden_size": 16, "num_layers": 2, "num_heads": 1,
        "head_dim": 8, "kv_lora_rank": 8, "batch_size": 2, "hybrid_layers": ["kda", "mla"],
        "implementation": "auto", "seq_len": 16, "steps": 3, "eval_every": 2,
        "val_windows": 8, "test_windows": 8, "probe_reach": 4, "validation_fraction": 0.1,
        "test_fraction": 0.1, "max_bytes": 20000, "tune_seed": 1000,
    },
}  # fmt: skip


def _load(name: str):
    return load_script(f"{name}.py")


@pytest.mark.parametrize(
    ("name", "settings", "extra"),
    [("synthetic_sweep", SWEEP_SETTINGS, ["--phase", "all"]), ("stdlib_lm_seeds", LM_SETTINGS, [])],
)
def test_the_scripts_presets_give_the_settings_recorded_before(
    tmp_path, monkeypatch, name, settings, extra
):
    script = _load(name)
    # the argument checks match every model's size: a parameter count (an abstract model
    # built, ~0.1 s) per model and preset, the same reference count again and again
    param_count = functools.cache(tiny_lm.config_param_count)
    for module in (tiny_lm, script):
        monkeypatch.setattr(module, "config_param_count", param_count)
    for preset, expected in settings.items():
        p, args = script.parse(["--preset", preset, "--output", str(tmp_path / "x.json"), *extra])
        script.check_arguments(p, args)
        setting = script.setting_of(args)
        assert setting == expected and list(setting) == list(expected), preset
        # what the document holds is what its JSON reads back as
        assert json.loads(json.dumps(setting)) == expected


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", choices=["a", "b"], default="a")
    p.add_argument("--lengths", type=lambda text: [int(t) for t in text.split(",")])
    p.add_argument("--steps", type=int)
    p.add_argument("--grid", default="0.001,0.003,0.01")
    p.add_argument("--grid-factor", type=float, default=3.0)
    record_runs.add_seed_arguments(p, seeds="0,1,2")
    return p


PRESETS = {"a": dict(lengths="8,16", steps=5), "b": dict(lengths="32", steps=7)}


def test_a_preset_fills_in_what_the_command_line_left_out():
    _, args = record_runs.parse_with_preset(_parser(), PRESETS, [])
    assert (args.lengths, args.steps, args.tune_seed) == ([8, 16], 5, 1000)
    _, args = record_runs.parse_with_preset(_parser(), PRESETS, ["--preset", "b", "--steps", "9"])
    assert (args.lengths, args.steps) == ([32], 9)  # the type applies to a preset's string
    _, args = record_runs.parse_with_preset(_parser(), PRESETS, ["--lengths", "4"])
    assert (args.lengths, args.steps) == ([4], 5)
    assert record_runs.setting_of(args, ("steps", "protocol_version"), 3) == dict(
        steps=5, protocol_version=3
    )


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--seeds", "0,x"], "--seeds must be ints >= 0 and --grid rates > 0"),
        (["--grid", "0.01,-1"], "--seeds must be ints >= 0 and --grid rates > 0"),
        (["--seeds", "0,-1"], "--seeds must be distinct ints >= 0"),
        (["--seeds", "1,1"], "--seeds must be distinct ints >= 0"),
        (["--tune-seed", "2"], "--tune-seed 2 is one of --seeds [0, 1, 2]"),
        (["--grid-factor", "1"], "--grid-factor must be > 1"),
    ],
)
def test_bad_seeds_and_grids_are_refused_naming_the_option(capsys, argv, match):
    p, args = record_runs.parse_with_preset(_parser(), PRESETS, argv)
    with pytest.raises(SystemExit) as exit_info:
        record_runs.check_seeds_and_grid(p, args)
    assert exit_info.value.code == 2 and match in capsys.readouterr().err


def test_seeds_and_grid_become_lists():
    p, args = record_runs.parse_with_preset(_parser(), PRESETS, ["--grid", "0.01,0.0030000001"])
    record_runs.check_seeds_and_grid(p, args)
    assert args.seeds == [0, 1, 2] and args.grid == [0.003, 0.01]


def key(run: dict) -> tuple:
    return (run["name"], run["seed"])


def test_merge_keeps_what_is_on_disk_and_refuses_another_setting():
    disk = dict(setting={"a": 1}, grids={"x": 1}, runs=[dict(name="m", seed=0, value="disk")])
    ours = dict(
        setting={"a": 1},
        grids={"y": 2},
        runs=[dict(name="m", seed=0, value="ours"), dict(name="a", seed=1, value="ours")],
    )
    merged = record_runs.merge(ours, disk, key)
    assert merged["grids"] == {"x": 1, "y": 2}
    assert [(r["name"], r["value"]) for r in merged["runs"]] == [("m", "disk"), ("a", "ours")]
    ordered = record_runs.merge(ours, disk, key, order=key)
    assert [r["name"] for r in ordered["runs"]] == ["a", "m"]
    assert record_runs.merge(ours, None, key) is ours
    with pytest.raises(SystemExit, match="made with another setting"):
        record_runs.merge(ours, dict(disk, setting={"a": 2}), key)

    def made_with(document):
        return dict(setting=document.get("setting"), corpus=document.get("corpus"))

    with pytest.raises(SystemExit, match="made with another corpus"):
        record_runs.merge(dict(ours, corpus="c1"), dict(disk, corpus="c2"), key, made_with)
    # a document recorded without an entry was made with anything
    assert record_runs.merge(dict(ours, corpus="c1"), disk, key, made_with)["corpus"] == "c1"


def test_a_run_is_trained_once_across_documents_on_one_file(tmp_path):
    """Two documents on one file (as two processes hold): a run either has trained is taken
    from the file by the other, never trained again; both grids end up in the file."""
    path = tmp_path / "runs.json"
    trained, announced = [], []

    def document():
        return dict(protocol="p", setting={"a": 1}, grids={}, runs=[])

    def train(name, seed):
        def run():
            trained.append((name, seed))
            return dict(name=name, seed=seed)

        return run

    first = record_runs.RunDocument(path, document(), key)
    second = record_runs.RunDocument(path, document(), key)
    assert first.ensure(("m", 0), train("m", 0), announced.append) == dict(name="m", seed=0)
    assert json.loads(path.read_text())["runs"] == [dict(name="m", seed=0)]  # saved at once
    assert second.ensure(("m", 0), train("m", 0), announced.append) == dict(name="m", seed=0)
    second.ensure(("m", 1), train("m", 1))
    first.set_grid("g1", {"best": 1})
    second.set_grid("g2", {"best": 2})
    assert trained == [("m", 0), ("m", 1)] and announced == [dict(name="m", seed=0)]
    on_disk = json.loads(path.read_text())
    assert set(on_disk["grids"]) == {"g1", "g2"} and len(on_disk["runs"]) == 2
    with pytest.raises(SystemExit, match="another setting"):
        record_runs.RunDocument(path, dict(document(), setting={"a": 2}), key)


def test_an_output_made_with_another_setting_is_refused(tmp_path, capsys):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(dict(setting={"a": 1}, runs=[])))
    p, args = record_runs.parse_with_preset(_parser(), PRESETS, [])
    args.output = str(path)
    record_runs.check_output(p, args, {"a": 1})
    with pytest.raises(SystemExit) as exit_info:
        record_runs.check_output(p, args, {"a": 2})
    assert exit_info.value.code == 2
    assert f"--output {path} was made with another setting" in capsys.readouterr().err
