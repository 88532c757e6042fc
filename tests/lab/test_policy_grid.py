"""``kda-bench --preset auto-grid``: the points, their order and reps, and a resumable file
(the benchmark itself replaced by a fake: nothing is timed here)."""

from __future__ import annotations

import datetime
import json

import pytest

from kda_lib.lab import bench, policy_grid


def test_the_grid_covers_the_issue_axes_smallest_first():
    points = policy_grid.grid_points()
    assert len(points) == 3 * 4 * 2
    assert {p[0] for p in points} == {4, 16, 64} and {p[1] for p in points} == {
        256,
        1024,
        4096,
        16384,
    }
    assert {p[2] for p in points} == {64, 128}
    work = [bh * t * k * k for bh, t, k in points]
    assert work == sorted(work)
    assert policy_grid.point_reps(4, 256, 64) >= 15 and policy_grid.point_reps(4, 4096, 64) >= 15
    path = policy_grid.grid_path("cpu", datetime.date(2026, 12, 2), record=True)
    assert str(path) == "data/benchmarks/policy/auto-policy-cpu-2026-12-02.json"


def test_the_scan_backward_is_skipped_only_where_its_states_do_not_fit():
    small = policy_grid.point_argv(4, 4096, 64, "float32")
    large = policy_grid.point_argv(64, 16384, 128, "float32")
    assert "--skip-rows" not in small and large[-2:] == ["--skip-rows", "recurrent:fwd+bwd"]
    assert bench.parse_args(large).impls == ["recurrent", "chunked", "auto"]


def test_a_grid_run_resumes_where_it_stopped(tmp_path):
    calls = []

    def fake_run(argv):
        args = bench.parse_args(argv)
        calls.append((args.heads, args.seq_lens[0], args.key_dim))
        records = [dict(impl="chunked", T=args.seq_lens[0], mode="fwd", median_ms=1.0)]
        return dict(date="2026-12-02", records=records)

    path = tmp_path / "grid.json"
    points = policy_grid.grid_points()[:2]
    policy_grid.run_grid(path, fake_run, max_seconds=-1.0, points=points)  # out of time: no point
    assert calls == []
    policy_grid.run_grid(path, fake_run, max_seconds=None, points=points[:1])
    policy_grid.run_grid(
        path, fake_run, max_seconds=None, points=points
    )  # the first is not run again
    assert calls == points
    document = json.loads(path.read_text())
    assert [(p["BH"], p["T"], p["K"]) for p in document["points"]] == points
    assert document["points"][0]["records"][0]["median_ms"] == 1.0


def test_a_grid_file_that_holds_no_grid_is_refused_naming_it(tmp_path):
    path = tmp_path / "grid.json"
    path.write_text('{"platform": "cpu"}')
    with pytest.raises(ValueError, match="grid.json' is damaged: it holds no 'points' list"):
        policy_grid.run_grid(path, lambda argv: pytest.fail("ran a point"), max_seconds=None)
    assert path.read_text() == '{"platform": "cpu"}'
