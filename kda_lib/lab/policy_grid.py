"""``kda-bench --preset auto-grid``: the grid ``"auto"``'s CPU policy is decided from.

At every point (B*H heads of one sequence, T tokens, K = V channels) one interleaved benchmark
run (:func:`kda_lib.lab.bench.run`) times ``recurrent``, ``chunked`` and ``auto``, forward and
forward + backward; the points' records go into one JSON file, written after each point. A
rerun skips the points already there (resumable: ``--grid-max-s`` stops starting new points
after that many seconds, so a long grid is recorded in pieces). Points run smallest first.
``recurrent``'s forward + backward keeps one ``[B*H, K, V]`` float32 state per token for its
backward; where that exceeds :data:`MAX_SCAN_RESIDUAL_BYTES` the row is skipped, and its
record says so (never in silence).

The file (default ``build/runs/benchmarks/policy/auto-policy-<platform>-<date>.json``; with
``--record`` ``data/benchmarks/policy/...``, the file ``tests/contracts/test_auto_policy_grid.py``
reads) holds ``platform``, ``cpu_count``, ``grid`` (the axes) and ``points``: each
``{"BH", "T", "K", "reps", "records"}`` with the benchmark's records (median, quartiles, min,
max, reps, ``bimodal``).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import jax

from kda_lib.lab.records import RECORDED_DIR, RUNS_DIR, read_json_document, write_json

GRID_BH = (4, 16, 64)
GRID_T = (256, 1024, 4096, 16384)
GRID_KV = (64, 128)
FORMS = ("recurrent", "chunked", "auto")
MODES = ("fwd", "fwd+bwd")
MAX_SCAN_RESIDUAL_BYTES = 2 * 2**30


def grid_path(platform: str, today: datetime.date, *, record: bool) -> Path:
    folder = RECORDED_DIR if record else RUNS_DIR
    return folder / "benchmarks" / "policy" / f"auto-policy-{platform}-{today.isoformat()}.json"


def grid_points(bh=GRID_BH, seq_lens=GRID_T, dims=GRID_KV) -> list[tuple[int, int, int]]:
    """``(BH, T, K)`` for every point, smallest work (BH * T * K^2) first."""
    points = [(h, t, d) for h in bh for t in seq_lens for d in dims]
    return sorted(points, key=lambda p: (p[0] * p[1] * p[2] ** 2, p))


def point_reps(bh: int, seq_len: int, dim: int) -> int:
    """Timed rounds at a point: 15 up to the work of BH = 4, T = 4096, K = 64; fewer above, so
    a round of the largest points stays in minutes (the record keeps the count)."""
    work = bh * seq_len * dim**2
    reference = 4 * 4096 * 64**2
    return 15 if work <= reference else 9 if work <= 8 * reference else 5


def scan_residual_bytes(bh: int, seq_len: int, dim: int) -> int:
    """The float32 states the scan's backward keeps: one ``[BH, K, V]`` per token."""
    return 4 * bh * seq_len * dim * dim


def point_argv(bh: int, seq_len: int, dim: int, dtype: str) -> list[str]:
    shape = ["--batch", "1", "--heads", str(bh), "--key-dim", str(dim), "--value-dim", str(dim)]
    timing = ["--reps", str(point_reps(bh, seq_len, dim)), "--warmup", "1", "--no-roofline"]
    argv = [*shape, "--dtype", dtype, "--seq-lens", str(seq_len), *timing, "--out", "-"]
    argv += ["--impls", *FORMS, "--modes", *MODES]
    if scan_residual_bytes(bh, seq_len, dim) > MAX_SCAN_RESIDUAL_BYTES:
        argv += ["--skip-rows", "recurrent:fwd+bwd"]
    return argv


def load_grid(path) -> dict | None:
    """The grid document at ``path``, None when there is no file; ValueError naming the file
    when it is damaged (not a JSON object with a ``points`` list)."""
    document = read_json_document(path)
    if document is not None and not isinstance(document.get("points"), list):
        raise ValueError(f"{str(path)!r} is damaged: it holds no 'points' list of a grid")
    return document


def run_grid(path: Path, run_point, *, max_seconds, dtype: str = "float32", points=None) -> dict:
    """Record every point of the grid not yet in ``path`` (in order, smallest first), writing
    the file after each; stop starting new points after ``max_seconds``. Returns the document.
    ``run_point(argv)``: the benchmark's ``run`` (its JSON document); ``points``: ``(BH, T, K)``
    to record instead of the whole grid."""
    document = load_grid(path) or dict(
        platform=jax.default_backend(),
        device_kind=jax.devices()[0].device_kind,
        jax_version=jax.__version__,
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        grid=dict(BH=GRID_BH, T=GRID_T, K=GRID_KV, forms=FORMS, modes=MODES, dtype=dtype),
        command="kda-bench --preset auto-grid [--record] [--grid-max-s S]",
        points=[],
    )
    done = {(p["BH"], p["T"], p["K"]) for p in document["points"]}
    start = time.perf_counter()
    for bh, seq_len, dim in points or grid_points():
        if (bh, seq_len, dim) in done:
            continue
        if max_seconds is not None and time.perf_counter() - start >= max_seconds:
            print(f"note: --grid-max-s reached; rerun to go on ({path})", file=sys.stderr)
            break
        print(f"point BH={bh} T={seq_len} K=V={dim}", file=sys.stderr, flush=True)
        run = run_point(point_argv(bh, seq_len, dim, dtype))
        point = dict(BH=bh, T=seq_len, K=dim, reps=point_reps(bh, seq_len, dim))
        point["date"] = run["date"]
        point["records"] = run["records"]
        if scan_residual_bytes(bh, seq_len, dim) > MAX_SCAN_RESIDUAL_BYTES:
            gib = scan_residual_bytes(bh, seq_len, dim) / 2**30
            point["recurrent_fwd_bwd_skipped"] = (
                f"its backward keeps {gib:.1f} GiB of states (one per token)"
            )
        document["points"].append(point)
        write_json(document, path)
    return document
