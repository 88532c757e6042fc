"""scripts/stdlib_lm_seeds.py: the notebook's configs, and a sweep that resumes after a cut."""

import importlib.util
import json
import pathlib
import sys

import pytest
import yaml

from kda_lib.models.tiny_lm import ModelConfig, config_param_count

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
        # the recorded config (flat names, written before ModelConfig.mixer_config) reads back
        assert ModelConfig.from_flat(**recorded["models"][name]["config"]) == config, name
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


FAKE_RUN = """
import importlib.util, sys, time

spec = importlib.util.spec_from_file_location("stdlib_lm_seeds", sys.argv[1])
seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeds)

def fake_run(model_name, seed):
    time.sleep(0.1)
    return {"model": model_name, "seed": seed, "bpb": 1.0}

seeds.run = fake_run
seeds.main(sys.argv[2:])
"""


def test_two_processes_on_one_output_lose_nothing(tmp_path):
    """Two processes, different seeds, one --output: every row of both is in the file."""
    import subprocess

    output = tmp_path / "seeds.json"
    script_path = ROOT / "scripts" / "stdlib_lm_seeds.py"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                FAKE_RUN,
                str(script_path),
                "--models",
                *MODELS_ARG,
                "--seeds",
                *seeds,
                "--output",
                str(output),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        for seeds in (["1", "2", "3"], ["4", "5", "6"])
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
    rows = json.loads(output.read_text())["runs"]
    assert sorted((r["model"], r["seed"]) for r in rows) == sorted(
        (m, s) for m in MODELS_ARG for s in range(1, 7)
    )


MODELS_ARG = ["kda", "gdn", "attention"]


def test_a_damaged_or_unwritable_output_is_refused_before_any_work(
    script, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(script, "run", lambda *a: pytest.fail("trained despite a bad --output"))
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"runs": [')
    (tmp_path / "a_file").write_text("")
    for output, match in [
        (damaged, "not a readable JSON record"),
        (tmp_path / "a_file" / "seeds.json", "is a file"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            script.main(["--seeds", "1", "--output", str(output)])
        assert exit_info.value.code == 2 and match in capsys.readouterr().err
    assert damaged.read_text() == '{"runs": ['
