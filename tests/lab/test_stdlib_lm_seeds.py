"""scripts/stdlib_lm_seeds.py: the notebook's configs, and a sweep that resumes after a cut."""

import dataclasses
import importlib.util
import json
import pathlib
import sys

import pytest
import yaml

from kda_lib.models.tiny_lm import config_param_count

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "stdlib_lm_seeds", ROOT / "scripts" / "stdlib_lm_seeds.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configs_are_the_recorded_ones(script):
    """The script builds every model as the recorded full run did (layers, size)."""
    params = yaml.safe_load(script.PARAMS.read_text())
    recorded = json.loads((ROOT / "data" / "results" / "stdlib_lm_full.json").read_text())
    for name in script.MODELS:
        config = script.model_config(params, name)
        as_json = json.loads(json.dumps(dataclasses.asdict(config)))
        assert as_json == recorded["models"][name]["config"], name
        assert config_param_count(config) == recorded["models"][name]["params"]
    assert script.model_config(params, "hybrid").layer_mixers[-1] == "mla"
    assert script.model_config(params, "hybrid_mha").layer_mixers[-1] == "attention"


def test_sweep_skips_recorded_rows_and_writes_after_each_run(script, tmp_path, monkeypatch):
    output = tmp_path / "seeds.json"
    output.write_text(json.dumps({"runs": [{"model": "kda", "seed": 1, "bpb": 2.0}]}))
    trained = []

    def fake_run(model_name, seed):
        rows = json.loads(output.read_text())["runs"]  # every earlier run is already written
        assert len(rows) == 1 + len(trained)
        trained.append((model_name, seed))
        return {"model": model_name, "seed": seed, "bpb": 1.0}

    monkeypatch.setattr(script, "run", fake_run)
    argv = ["x", "--models", "kda", "gdn", "--seeds", "1", "2", "--output", str(output)]
    monkeypatch.setattr(sys, "argv", argv)
    script.main()
    assert trained == [("gdn", 1), ("kda", 2), ("gdn", 2)]  # kda seed 1 was recorded
    rows = json.loads(output.read_text())["runs"]
    assert [(r["model"], r["seed"]) for r in rows] == [
        ("gdn", 1),
        ("gdn", 2),
        ("kda", 1),
        ("kda", 2),
    ]
    assert rows[2]["bpb"] == 2.0  # the recorded row is kept, not retrained
