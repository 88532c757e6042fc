"""scripts/recall_capacity.py: one sweep document per pairs count, seed by seed, resumed, merged."""

import json

import numpy as np
import pytest
from conftest import load_script

from kda_lib.teaching import recall_sweep as rs


@pytest.fixture
def script(monkeypatch):
    module = load_script("recall_capacity.py")
    trained = []

    def fake_run(task, mixer, seq_len, lr, seed, args):  # recall falls with the pairs
        trained.append((args.num_pairs, mixer, seed))
        scores = dict(accuracy=1 / args.num_pairs + 0.01 * seed, loss=1.0)
        return dict(task=task, mixer=mixer, stop="flat", train_seconds=0.0,
                    training=dict(seq_len=seq_len, learning_rate=lr, seed=seed, steps=4),
                    validation=scores, test=scores, eval=scores)

    monkeypatch.setattr(module.sweep, "run_one", fake_run)
    module.trained = trained
    return module


def test_each_count_its_own_document_seed_by_seed_merged_and_read(script, tmp_path, capsys):
    out, parts = tmp_path / "capacity.json", tmp_path / "parts"
    argv = ["--output", str(out), "--parts", str(parts), "--pairs", "2,4", "--mixers",
            "kda,conv", "--seeds", "0,1", "--max-steps", "3"]
    script.main([*argv, "--time-limit", "1e-9"])  # no run starts; the (empty) merge is written
    assert script.trained == [] and "0 runs trained" in capsys.readouterr().out
    script.main(argv)
    assert script.trained == [(n, m, s) for s in (0, 1) for n in (2, 4) for m in ("kda", "conv")]
    assert sorted(p.name for p in parts.glob("*.json")) == ["pairs_2.json", "pairs_4.json"]
    record = json.loads(out.read_text())
    assert [p["setting"]["num_pairs"] for p in record["parts"]] == [2, 4]
    assert {p["setting"]["max_steps"] for p in record["parts"]} == {3}
    assert record["rate"] == 0.01 and record["options"]["head_dim"] == 8
    grid = record["parts"][1]["grids"]["mqar/kda"]
    assert grid["fixed"] and grid["rates"] == [0.01] and grid["seq_len"] == 16  # T = 4 n
    pairs, acc, stops = rs.capacity_curve(record)
    assert pairs == [2, 4] and set(acc) == {"kda", "conv"}
    np.testing.assert_allclose(acc["kda"][4], [0.25, 0.26])
    assert stops["conv"][2] == ["flat", "flat"]
    script.trained.clear()
    script.main(argv)  # resumed: every run is there
    assert script.trained == [] and json.loads(out.read_text()) == record


def test_the_capacity_figure_draws_every_mixer_and_the_key_dimension():
    record = {"parts": [
        {"setting": {"num_pairs": n, "flat_tol": 0.01}, "runs": [
            dict(mixer=m, phase="seeds", stop="flat", training=dict(seed=s),
                 test=dict(accuracy=min(1.0, 8 / n) - 0.01 * s)) for m in ("kda", "gdn")
            for s in (0, 1, 2)]} for n in (16, 4, 64)]}
    pairs, acc, _ = rs.capacity_curve(record)
    assert pairs == [4, 16, 64]
    vote = {n: round(rs.vote_accuracy(n, 32), 3) for n in pairs}  # as capacity_reading's
    fig = rs.plot_capacity(pairs, acc, head_dim=8, num_heads=2, chance=1 / 32, vote=vote)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert {"kda", "gdn", "$d_k$ = 8: exact recall's limit, one head",
            "vote level (no key bound)"} <= set(labels), labels
    (line,) = [x for x in ax.get_lines() if x.get_label() == "vote level (no key bound)"]
    assert line.get_ydata().tolist() == [0.295, 0.15, 0.085], line.get_ydata()
