"""Honest timing in the benchmark, with fake times (nothing is timed here): every row records
its distribution (median, quartiles, min, max, reps), a bimodal row is flagged and warned
about, and a token-by-token form is never skipped in silence (the modes ``auto`` runs it in
are timed at every T; the others get a record and an estimate)."""

from __future__ import annotations

import pytest

from kda_lib.lab import bench

TINY = ["--batch", "1", "--heads", "2", "--key-dim", "16", "--value-dim", "16", "--out", "-"]


def _job(times):
    job = bench.TimedProgram("chunked", 64, "fwd", fn=None, args=())
    job.times_ms = list(times)
    job.info["compile_s"] = 1.0
    return job


def test_a_record_holds_the_distribution():
    record = _job([6.0, 2.0, 3.0, 5.0, 4.0]).record()
    assert record["median_ms"] == 4.0 and record["min_ms"] == 2.0 and record["max_ms"] == 6.0
    assert (record["p25_ms"], record["p75_ms"], record["reps"]) == (3.0, 5.0, 5)
    assert record["bimodal"] is False  # min = median / 2 exactly: not under it


def test_the_default_is_at_least_15_reps():
    assert bench.parse_args(TINY).reps >= 15


def test_a_bimodal_row_is_flagged_and_warned_about():
    """min < median / 2: two populations (the issue's T = 256 scan: min 2.78, median 8.46)."""
    bimodal = _job([2.78, 2.9, 8.46, 8.5, 9.0]).record()
    steady = _job([8.0, 8.2, 8.46, 8.5, 9.0]).record()
    assert bimodal["bimodal"] is True and steady["bimodal"] is False
    (line,) = bench.distribution_warnings([bimodal, steady])
    assert line.startswith("warning: chunked T=64 fwd: bimodal") and "5 reps" in line
    assert "bimodal" in bench.format_table([bimodal]) and "p25 ms" in bench.format_table([steady])


def test_a_skipped_row_says_how_long_it_would_take():
    records = [
        dict(impl="tokamax_xla", T=1024, mode="fwd", median_ms=100.0),
        dict(impl="tokamax_xla", T=2048, mode="fwd", median_ms=210.0),
        dict(impl="tokamax_xla", T=8192, mode="fwd", median_ms=None, skipped="too long"),
        dict(impl="tokamax_xla", T=8192, mode="fwd+bwd", median_ms=None, skipped="too long"),
    ]
    lines = bench.skip_estimates(records)
    assert records[2]["estimated_ms"] == pytest.approx(840.0)  # linear in T from T = 2048
    assert "about 0.84 s a call (from T=2048)" in lines[0]
    assert "no timed row" in lines[1] and "estimated_ms" not in records[3]


def test_the_recurrence_is_timed_wherever_auto_runs_it():
    """Above --sequential-max-t the default entries still time the scan's forward (auto's
    forward on CPU) and record its forward + backward as skipped; tokamax_xla is skipped in
    both modes, with records."""
    args = bench.parse_args([*TINY, "--seq-lens", "32", "--sequential-max-t", "16"])
    cfg = bench.BenchConfig(1, 2, 16, 16, "float32")
    jobs, records = bench._plan_jobs(
        args, cfg, ["recurrent", "tokamax_xla"], bench.jax.random.key(0)
    )
    assert [(j.impl, j.mode) for j in jobs] == [("matmul", "fwd"), ("recurrent", "fwd")]
    skipped = {(r["impl"], r["mode"]) for r in records if r.get("skipped")}
    assert skipped == {("recurrent", "fwd+bwd"), ("tokamax_xla", "fwd"), ("tokamax_xla", "fwd+bwd")}


def test_named_rows_can_be_skipped_with_a_record():
    args = bench.parse_args([*TINY, "--seq-lens", "32", "--skip-rows", "recurrent:fwd+bwd"])
    cfg = bench.BenchConfig(1, 2, 16, 16, "float32")
    jobs, records = bench._plan_jobs(args, cfg, ["recurrent"], bench.jax.random.key(0))
    assert [(j.impl, j.mode) for j in jobs][1:] == [("recurrent", "fwd")]
    assert records == [
        dict(impl="recurrent", T=32, mode="fwd+bwd", median_ms=None, skipped="named in --skip-rows")
    ]


def test_each_round_times_the_rows_in_a_new_seeded_order(monkeypatch):
    """A fixed order makes one row always follow the same neighbour (a call after a
    memory-hungry one pays for its freed pages); the order changes each round, from --seed."""
    calls = []
    monkeypatch.setattr(bench.TimedProgram, "prepare", lambda self, warmup: None)
    monkeypatch.setattr(bench.TimedProgram, "time_once", lambda self, n=1: calls.append(self.impl))

    def rounds(seed):
        calls.clear()
        jobs = [bench.TimedProgram(name, 64, "fwd", fn=None, args=()) for name in "abcde"]
        bench._time_jobs(jobs, bench.parse_args([*TINY, "--reps", "6", "--seed", str(seed)]))
        return [tuple(calls[i : i + 5]) for i in range(0, 30, 5)]

    first = rounds(0)
    assert all(sorted(r) == list("abcde") for r in first) and len(set(first)) > 1
    assert rounds(0) == first and rounds(1) != first


def test_rows_needing_much_memory_are_timed_after_the_others(monkeypatch):
    """The calls after a program that needs a lot of memory pay to fault it back in: such rows
    are interleaved among themselves, after every other row's rounds."""
    calls = []
    monkeypatch.setattr(bench.TimedProgram, "prepare", lambda self, warmup: None)
    monkeypatch.setattr(bench.TimedProgram, "time_once", lambda self, n=1: calls.append(self.impl))
    jobs = [bench.TimedProgram(name, 64, "fwd", fn=None, args=()) for name in "abcd"]
    for job, nbytes in zip(jobs, (1, bench.HEAVY_BYTES + 1, 2, bench.HEAVY_BYTES * 4), strict=True):
        job.info["compiled_bytes"] = nbytes
    bench._time_jobs(jobs, bench.parse_args([*TINY, "--reps", "4"]))
    assert sorted(calls[:8]) == sorted("ac" * 4) and sorted(calls[8:]) == sorted("bd" * 4)


def test_calls_time_a_rep_as_the_mean_of_back_to_back_calls(monkeypatch):
    """``--calls 3``: each rep dispatches the program three times and waits once (the device's
    time per call, without the host's wait for each result); the record says so."""
    seen = []

    def program(x):
        seen.append(x)
        return x

    monkeypatch.setattr(bench.TimedProgram, "prepare", lambda self, warmup: None)
    job = bench.TimedProgram("a", 64, "fwd", fn=None, args=(1,), compiled=program)
    bench._time_jobs([job], bench.parse_args([*TINY, "--reps", "2", "--calls", "3"]))
    assert len(seen) == 6 and len(job.times_ms) == 2
