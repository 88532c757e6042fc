"""``python -m kda_lib.lab.bench``: time every KDA implementation, softmax attention and the layer.

Everything runs in one process at the same shapes, so the ratios between rows are meaningful
even on a noisy machine (absolute times are only comparable on a quiet one). Each function is
jitted and compiled ahead of time (compile time is reported separately) and warmed up; then
every function is timed once per round for ``--reps`` rounds (15 by default; interleaved in a
new random order each round, so a change of load, or the after-effects of one call on the next,
hit all of them alike; rows whose programs need over 256 MiB are interleaved among themselves
after the others, since the calls after them pay to fault their freed memory back in;
``--no-interleave`` times each one's reps back to back instead; ``--calls N`` makes a rep the
mean of N calls dispatched back to back, the device's time without the host's wait per call). The
table shows the median, the quartiles, the minimum and the reps; a row whose
minimum is under half its median is flagged ``bimodal`` (and warned about: its median is no
typical call's time). A JSON file keeps everything. ``--preset auto-grid`` records the grid
``"auto"``'s CPU policy is decided from (:mod:`kda_lib.lab.policy_grid`).

Entries (``--impls``; default: all that run on this platform):

* ``chunked``, ``recurrent``, ``tokamax_xla``, ``tokamax_xla_chunked``, ``tokamax_mosaic``:
  :func:`kda_lib.kda` with that implementation. All get the same fused-gate inputs (raw gate
  ``f``, ``a_log``, ``dt_bias``, ``lower_bound=-5``) because tokamax's chunked form needs them.
  ``auto`` (only when named) times what ``kda(..., implementation="auto")`` runs. The
  token-by-token forms (``recurrent``, ``tokamax_xla``) run above T = 2048
  (``--sequential-max-t``) only when named in ``--impls``, or in the modes ``auto`` runs them in
  at that T (the scan's forward on CPU); every skipped row gets a record (``skipped``) and a note
  with its estimated time (linear in T from the longest timed row). Mosaic only on TPU v6+.
* ``softmax``: causal softmax attention, same B, T, H and head dim K: on a TPU JAX's Pallas
  ``flash_attention``, elsewhere ``jax.nn.dot_product_attention`` (``implementation=None``:
  the fastest backend available).
* ``pallas_tpu`` (kda_lib's Pallas TPU kernels) runs by default on a TPU only (the
  accelerator preset leaves it out elsewhere). The softmax row on a TPU uses flash_attention's
  default block sizes.
* ``layer``: the full :class:`kda_lib.layers.kda_layer.KimiDeltaAttention` (hidden = H * K, safe
gate),
  and, as separate rows, its kernel call alone (``layer_kernel``) and everything around the
  kernel (``layer_projections``: projections, convs, gates, output norm and projection), so the
  layer's overhead is ``layer / (layer_kernel + layer_projections)``.

Every row also gets ``io_bytes`` (its arguments' and results' bytes) and, where the device
kind's HBM bandwidth is known (:data:`HBM_BYTES_PER_S`), ``hbm_roofline_fraction``: those
bytes over the median time, over the bandwidth (1.0: the call moved no more than its inputs
and outputs, at the chip's full bandwidth).

Every run also times a ``2048 x 2048`` float32 matmul (row ``matmul``): each row whose program
has matrix products gets ``matmul_flops`` (:func:`kda_lib.lab.costs.matmul_flops`: every
``dot_general`` of the traced program, a scan's body times its length), ``achieved_gflops``
(those flops per second) and ``roofline_fraction`` (achieved over the matmul's GFLOP/s, measured
in the same run). XLA's cost analysis is kept beside it (``flops``, ``bytes_per_token``: bytes
accessed per token) but counts a loop's body once, so it undercounts every form that loops
over tokens or chunks (the recurrence, the streaming chunked scan).

``--train`` adds training-step rows (``train_<model>``: one AdamW step of a 4-layer
byte-level TinyLM with KDA, Gated DeltaNet, softmax attention or the 3:1 hybrid) with
``tokens_per_s``.

Modes: ``fwd`` (outputs only) and ``fwd+bwd`` (``jax.grad`` of ``sum(outputs * fixed random
cotangents)`` with respect to every input, parameters included).

Usage::

    python -m kda_lib.lab.bench                                   # T = 1024 4096, both modes
    python -m kda_lib.lab.bench --seq-lens 2048 8192 --heads 16 --key-dim 128 --value-dim 128 \\
        --dtype bfloat16 --impls chunked tokamax_xla_chunked softmax
    python -m kda_lib.lab.bench --impls recurrent --seq-lens 4096 # force a sequential form
    python -m kda_lib.lab.bench --modes fwd --reps 5 --out -      # print only, no JSON
    python -m kda_lib.lab.bench --preset accelerator   # on a GPU or TPU (docs/RUNNING.md)

The JSON (default ``build/runs/benchmarks/<platform>-<YYYY-MM-DD>.json``; with ``--record`` the
recorded ``data/benchmarks/<platform>-<YYYY-MM-DD>.json``, relative to the working
directory) holds ``platform``, ``device_kind``, versions, ``date``, ``config``, ``records``
(one per implementation, T and mode: ``median_ms``, ``min_ms``, ``max_ms``, ``p25_ms``,
``p75_ms``, ``reps``, ``bimodal``, ``compile_s``, ``compiled_bytes`` from XLA's memory
analysis, and on GPU and TPU ``peak_bytes_in_use``) and ``ratios`` (medians divided, per mode
and T). ``--preset
accelerator`` sets the published GPU shapes; on an H200 the JSON adds ``vs_h200_anchors``
(chunked fwd+bwd over fla's Triton kernel and tokamax's xla_chunked, as measured by others).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import allocation_problem, dominant_size
from kda_lib.lab import policy_grid
from kda_lib.lab.costs import matmul_flops
from kda_lib.lab.measure import timed_call, xla_cost
from kda_lib.lab.record_runs import check_option_minimums, check_seed_option
from kda_lib.lab.records import (
    RECORDED_DIR,
    RUNS_DIR,
    dumps,
    exit_on_broken_pipe,
    output_path_problem,
    replace_problem,
    write_json,
)
from kda_lib.lab.tasks import TaskBatch
from kda_lib.lab.train import make_optimizer, train_step
from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.models.tiny_lm import ModelConfig, TinyLM
from kda_lib.ops.api import IMPLEMENTATIONS, REGISTRY, kda, portable_forms, refusals
from kda_lib.testing import random_kda_inputs

MODES = ("fwd", "fwd+bwd")
# O(T) dependent steps: slow at large T (recurrent, tokamax_xla)
SEQUENTIAL_IMPLS = ("recurrent", "tokamax_xla")
LAYER_ENTRIES = ("layer", "layer_kernel", "layer_projections")
LOWER_BOUND = -5.0  # safe gate: tokamax's chunked form needs it
# ratios reported in the JSON and after the table: (numerator, denominator entries)
RATIOS = (
    ("pallas_tpu", ("softmax",)),
    ("pallas_tpu", ("chunked",)),
    ("chunked", ("tokamax_xla_chunked",)),
    ("chunked", ("softmax",)),
    ("chunked", ("recurrent",)),
    ("tokamax_xla_chunked", ("softmax",)),
    ("layer", ("layer_kernel", "layer_projections")),
)


# --preset accelerator: the shapes of the published GPU numbers (bf16, B = 1, H = 16,
# K = V = 128, T = 2K / 8K / 32K); explicit flags override any of these
PRESETS = {
    "accelerator": dict(
        seq_lens=[2048, 8192, 32768],
        batch=1,
        heads=16,
        key_dim=128,
        value_dim=128,
        dtype="bfloat16",
        impls=["pallas_tpu", "chunked", "tokamax_xla_chunked", "tokamax_mosaic", "softmax"],
        reps=10,
    ),
}
# --preset auto-grid: the grid of kda_lib.lab.policy_grid (its own loop over shapes)
PRESETS["auto-grid"] = {}
# HBM bandwidth by device kind (bytes/s; vendors' figures): the roofline of io_bytes
HBM_BYTES_PER_S = {"TPU v5 lite": 819e9, "TPU v5e": 819e9, "TPU v6 lite": 1640e9,
                   "TPU v5p": 2765e9, "TPU v4": 1200e9, "NVIDIA H200": 4.8e12,
                   "NVIDIA H100 80GB HBM3": 3.35e12}  # fmt: skip
# fwd+bwd milliseconds on one H200 at the accelerator preset's shapes (the issue tracker's
# anchors, measured by others): fla's Triton chunk_kda and tokamax's xla_chunked
H200_ANCHORS_MS = {
    "fla_chunk_kda": {2048: 3.72, 8192: 4.10, 32768: 9.66},
    "tokamax_xla_chunked": {2048: 7.27, 8192: 23.1, 32768: 81.8},
}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    batch: int
    heads: int
    key_dim: int
    value_dim: int
    dtype: str


def default_out_path(platform: str, today: datetime.date, *, record: bool = False) -> Path:
    """``build/runs/benchmarks/<platform>-<date>.json``, or with ``record`` the recorded file
    ``data/benchmarks/<platform>-<date>.json`` that the README and notebooks read."""
    folder = RECORDED_DIR if record else RUNS_DIR
    return folder / "benchmarks" / f"{platform}-{today.isoformat()}.json"


def default_impls(platform_ok: Callable[[str], str | None]) -> list[str]:
    """Every entry that can run here (``platform_ok(name)`` is None when it can); the Pallas
    TPU kernels on a TPU only (elsewhere Pallas's interpreter runs them, slowly)."""
    tpu = jax.default_backend() == "tpu"
    names = [n for n in IMPLEMENTATIONS if platform_ok(n) is None and (tpu or n != "pallas_tpu")]
    return names + ["softmax", "layer"]


def kernel_problem(name: str, cfg: BenchConfig) -> str | None:
    """Why a kda implementation cannot run this configuration here (None: it can), as its
    backend says (:func:`kda_lib.ops.api.refusals`)."""
    if name == "auto":
        return None  # it picks one that can
    problems = refusals(name, key_dim=cfg.key_dim, dtype=cfg.dtype, lower_bound=LOWER_BOUND,
                        fused_gate=True)  # fmt: skip
    return "; ".join(problems) or None


# ------------------------------------------------------------------------------- inputs


def kernel_inputs(cfg: BenchConfig, seq_len: int, key: jax.Array) -> dict:
    """Fused-gate KDA inputs: L2-normalised q/k, raw gate f, beta in (0, 1), a_log, dt_bias."""
    x = random_kda_inputs(
        key, cfg.batch, seq_len, cfg.heads, cfg.key_dim, cfg.value_dim, dtype=cfg.dtype, gate="raw"
    )
    return dict(
        q=x["q"],
        k=x["k"],
        v=x["v"],
        f=x["g"],
        beta=x["beta"],
        a_log=x["a_log"],
        dt_bias=x["dt_bias"],
    )


def kda_entry(implementation: str):
    def run(q, k, v, f, beta, a_log, dt_bias):
        o, _ = kda(
            q,
            k,
            v,
            f,
            beta,
            a_log=a_log,
            dt_bias=dt_bias,
            lower_bound=LOWER_BOUND,
            use_gate_in_kernel=True,
            implementation=implementation,
        )
        return o

    return run


def softmax_entry(cfg: BenchConfig, seq_len: int, key: jax.Array):
    """Causal softmax attention as a user of this platform runs it: JAX's Pallas TPU
    ``flash_attention`` (heads-major, default blocks) on a TPU, else
    ``jax.nn.dot_product_attention`` (the fastest backend available)."""
    shape = (cfg.batch, seq_len, cfg.heads, cfg.key_dim)
    dtype = jnp.dtype(cfg.dtype)
    args = tuple(
        jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in jax.random.split(key, 3)
    )
    if jax.default_backend() == "tpu":
        from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

        heads_major = tuple(jnp.moveaxis(x, 1, 2) for x in args)  # [B, H, T, K]

        def flash(q, k, v):
            return flash_attention(q, k, v, causal=True, sm_scale=cfg.key_dim**-0.5)

        return flash, heads_major

    def run(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=None)

    return run, args


def layer_entries(cfg: BenchConfig, seq_len: int, key: jax.Array, implementation: str):
    """``{name: (fn, args)}`` for the full layer, its kernel call and the rest of it.

    Every function takes its parameters as explicit arguments, so fwd+bwd differentiates them.
    """
    dtype = jnp.dtype(cfg.dtype)
    config = KDAConfig(
        hidden_size=cfg.heads * cfg.key_dim,
        num_heads=cfg.heads,
        head_dim=cfg.key_dim,
        value_head_dim=cfg.value_dim,
        lower_bound=LOWER_BOUND,
        dtype=dtype,
        implementation=implementation,
    )
    k_init, k_x = jax.random.split(key)
    layer = KimiDeltaAttention(config, rngs=nnx.Rngs(k_init))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    x = jax.random.normal(k_x, (cfg.batch, seq_len, config.hidden_size), jnp.float32).astype(dtype)

    def full(params, x):
        return nnx.merge(graphdef, params, rest)(x)

    entries = {"layer": (full, (params, x))}

    def around_kernel(params, x, o):
        model = nnx.merge(graphdef, params, rest)
        q, k, v, f, beta, _ = model.project(x)
        return model.project_output(x, o), q, k, v, f, beta

    q, k, v, f, beta, _ = layer.project(x)
    kwargs = layer.kernel_kwargs()
    gate = (kwargs.pop("a_log"), kwargs.pop("dt_bias"))
    o = jnp.zeros((*v.shape[:3], cfg.value_dim), dtype)

    def kernel(q, k, v, f, beta, a_log, dt_bias):
        out, _ = kda(
            q,
            k,
            v,
            f,
            beta,
            a_log=a_log,
            dt_bias=dt_bias,
            **kwargs,
            chunk_size=config.chunk_size,
            implementation=implementation,
        )
        return out

    entries["layer_kernel"] = (kernel, (q, k, v, f, beta, *gate))
    entries["layer_projections"] = (around_kernel, (params, x, o))
    return entries


# ------------------------------------------------------------------------------- timing


def with_gradients(fn: Callable, args: tuple, key: jax.Array) -> Callable:
    """``grad`` of ``sum(outputs * fixed random cotangents)`` w.r.t. every argument."""
    leaves = jax.tree.leaves(jax.eval_shape(fn, *args))
    keys = jax.random.split(key, len(leaves))
    cotangents = [
        jax.random.normal(k, leaf.shape, jnp.float32).astype(leaf.dtype)
        for k, leaf in zip(keys, leaves, strict=True)
    ]

    def loss(*args):
        outs = jax.tree.leaves(fn(*args))
        return sum(
            jnp.sum(o.astype(jnp.float32) * c.astype(jnp.float32))
            for o, c in zip(outs, cotangents, strict=True)
        )

    return jax.grad(loss, argnums=tuple(range(len(args))))


@dataclasses.dataclass
class TimedProgram:
    """One timed function: an entry at one T in one mode."""

    impl: str
    seq_len: int
    mode: str
    fn: Callable
    args: tuple
    compiled: Callable | None = None
    tokens: int = 0  # tokens per call (B * T): bytes and training throughput per token
    times_ms: list = dataclasses.field(default_factory=list)
    info: dict = dataclasses.field(default_factory=dict)
    error: str | None = None

    def prepare(self, warmup: int) -> None:
        """Compile ahead of time (timed separately), then warm up."""
        start = time.perf_counter()
        self.compiled = jax.jit(self.fn).lower(*self.args).compile()
        self.info["compile_s"] = time.perf_counter() - start
        memory = self.compiled.memory_analysis()
        if memory is not None:
            self.info["compiled_bytes"] = int(
                memory.temp_size_in_bytes
                + memory.argument_size_in_bytes
                + memory.output_size_in_bytes
                - memory.alias_size_in_bytes
            )
        results = jax.eval_shape(self.fn, *self.args)
        self.info["io_bytes"] = int(sum(x.size * x.dtype.itemsize
                                        for x in jax.tree.leaves((self.args, results))))
        matmuls = matmul_flops(self.fn, *self.args)
        if matmuls > 0:  # a Pallas kernel's products are inside a custom call: none counted
            self.info["matmul_flops"] = matmuls
        cost = xla_cost(self.compiled)
        if cost["flops"] > 0:
            # XLA's count for the compiled program (a loop's body once; a custom call such as
            # a Pallas kernel counts nothing)
            self.info["flops"] = cost["flops"]
            if cost["bytes accessed"]:
                self.info["bytes_accessed"] = cost["bytes accessed"]
        for _ in range(warmup):
            jax.block_until_ready(self.compiled(*self.args))
        if jax.default_backend() in ("gpu", "tpu"):
            stats = jax.devices()[0].memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                # the process-wide peak so far (jobs are prepared in order, smallest T first
                # within each entry); compiled_bytes is this function's own footprint
                self.info["peak_bytes_in_use"] = int(stats["peak_bytes_in_use"])

    def time_once(self, calls: int = 1) -> None:
        seconds, _ = timed_call(self.compiled, *self.args, calls=calls)
        self.times_ms.append(1e3 * seconds)

    def record(self) -> dict:
        record = dict(impl=self.impl, T=self.seq_len, mode=self.mode)
        if self.error is not None:
            return record | dict(median_ms=None, error=self.error)
        times = self.times_ms
        p25, p75 = np.percentile(times, [25, 75]).tolist()
        median_s = statistics.median(times) / 1e3
        derived = {}
        if "matmul_flops" in self.info:
            derived["achieved_gflops"] = self.info["matmul_flops"] / median_s / 1e9
        if "bytes_accessed" in self.info and self.tokens:
            derived["bytes_per_token"] = self.info["bytes_accessed"] / self.tokens
        if self.mode == "train" and self.tokens:
            derived["tokens_per_s"] = self.tokens / median_s
        bandwidth = HBM_BYTES_PER_S.get(jax.devices()[0].device_kind)
        if bandwidth and "io_bytes" in self.info:
            derived["hbm_roofline_fraction"] = self.info["io_bytes"] / median_s / bandwidth
        stats = dict(
            median_ms=statistics.median(times),
            min_ms=min(times),
            max_ms=max(times),
            p25_ms=p25,
            p75_ms=p75,
            reps=len(times),
        )
        return record | derived | stats | dict(bimodal=is_bimodal(stats), **self.info)


def is_bimodal(record: dict) -> bool:
    """Whether a row's times look like two populations: the fastest call under half the median
    (a median then says little about either; rerun on a quieter machine, or compare minima)."""
    return record["min_ms"] < record["median_ms"] / 2


def distribution_warnings(records: list[dict]) -> list[str]:
    """One line per bimodal row (:func:`is_bimodal`)."""
    return [
        f"warning: {r['impl']} T={r['T']} {r['mode']}: bimodal times (min {r['min_ms']:.2f} ms "
        f"< median {r['median_ms']:.2f} ms / 2, {r['reps']} reps): its median is not a typical "
        "call's time"
        for r in records
        if r.get("median_ms") is not None and "min_ms" in r and is_bimodal(r)
    ]


def skip_estimates(records: list[dict]) -> list[str]:
    """For each skipped row (``skipped`` set), the estimated time of one call, scaled linearly
    in T from the longest timed row of the same entry and mode (written into the record as
    ``estimated_ms``); one line each."""
    lines = []
    for r in records:
        if not r.get("skipped"):
            continue
        timed = [
            t
            for t in records
            if (t["impl"], t["mode"]) == (r["impl"], r["mode"]) and t.get("median_ms")
        ]
        if timed:
            base = max(timed, key=lambda t: t["T"])
            r["estimated_ms"] = base["median_ms"] * r["T"] / base["T"]
            estimate = f"about {r['estimated_ms'] / 1e3:.2f} s a call (from T={base['T']})"
        else:
            estimate = "no timed row to estimate its time from"
        lines.append(
            f"note: {r['impl']} T={r['T']} {r['mode']} skipped ({r['skipped']}): {estimate}"
        )
    return lines


# ------------------------------------------------------------------------------- driver

MATMUL_ENTRY = "matmul"
MATMUL_SIZE = 2048
RATIOS_HEADER = (
    "ratios of median times, numerator / denominator, per mode and T (below 1: the numerator "
    "is faster):"
)


# the smallest value of each integer option
OPTION_MINIMUMS = dict(
    batch=1,
    heads=1,
    key_dim=1,
    value_dim=1,
    reps=1,
    calls=1,
    warmup=0,
    sequential_max_t=0,
    train_batch=1,
)


# the rows --skip-rows can name: each kernel or layer entry in each mode
SKIPPABLE_ROWS = tuple(
    f"{name}:{mode}"
    for name in (*IMPLEMENTATIONS, "auto", "softmax", *LAYER_ENTRIES)
    for mode in MODES
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's options, checked before anything is timed (argparse's error, exit
    status 2, naming the option); ``--preset`` sets defaults that explicit flags override.
    ``args.out_path`` is the JSON path, checked writable (None for ``--out -``)."""
    parser = _parser()
    preset, _ = parser.parse_known_args(argv)
    if preset.preset:
        parser.set_defaults(**PRESETS[preset.preset])
    args = parser.parse_args(argv)
    _check_args(parser, args)
    return args


def _parser() -> argparse.ArgumentParser:
    """The options: shapes, entries and modes, timing, output."""
    parser = argparse.ArgumentParser(
        prog="kda-bench",
        description="Time KDA implementations, softmax attention and the KDA layer.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default=None,
        help="defaults for a GPU or TPU (accelerator: bf16, H=16, K=V=128, T=2K/8K/32K, "
        "chunked vs tokamax; rows that cannot run here are skipped with a note); explicit "
        "flags win. auto-grid: record the grid auto's CPU policy is decided from "
        "(kda_lib/lab/policy_grid.py; resumable)",
    )
    _add_shape_options(parser)
    _add_entry_options(parser)
    _add_timing_options(parser)
    _add_grid_options(parser)
    parser.add_argument(
        "--out",
        default=None,
        help="JSON path ('-': no file, the JSON alone on stdout, the table on stderr; default "
        "build/runs/benchmarks/"
        "<platform>-<date>.json); a file holding anything but a benchmark table is kept, refused",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write data/benchmarks/<platform>-<date>.json instead: the recorded benchmark the "
        "README and notebooks 03, 07 and 10 read (replaces a file of that name)",
    )
    return parser


def _add_shape_options(parser: argparse.ArgumentParser) -> None:
    """``--seq-lens``, ``--batch``, ``--heads``, ``--key-dim``, ``--value-dim``, ``--dtype``."""
    parser.add_argument(
        "--seq-lens", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T to time"
    )
    parser.add_argument("--batch", type=int, default=1, help="sequences per call B")
    parser.add_argument("--heads", type=int, default=4, help="heads H")
    parser.add_argument("--key-dim", type=int, default=64, help="key channels per head K")
    parser.add_argument("--value-dim", type=int, default=64, help="value channels per head V")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="dtype of q, k, v (gates and state stay float32)",
    )


def _add_entry_options(parser: argparse.ArgumentParser) -> None:
    """What is timed: ``--impls``, ``--sequential-max-t``, ``--layer-impl``, ``--modes`` and
    the training-step rows (``--train``, ``--train-mixers``, ``--train-batch``)."""
    parser.add_argument(
        "--impls",
        nargs="+",
        default=None,
        choices=(*IMPLEMENTATIONS, "auto", "softmax", "layer"),
        help="entries to time (default: every one that runs here); naming a sequential form "
        "runs it at every T",
    )
    parser.add_argument(
        "--sequential-max-t",
        type=int,
        default=2048,
        help="default entries skip recurrent / tokamax_xla above this T",
    )
    parser.add_argument(
        "--layer-impl",
        default="auto",
        choices=("auto", *IMPLEMENTATIONS),
        help="kernel implementation inside the layer",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="fwd: the forward call; fwd+bwd: forward and the gradients of all inputs",
    )
    parser.add_argument(
        "--train",
        action="store_true",
        help="also time TinyLM training steps (tokens/s) with the mixers of --train-mixers",
    )
    parser.add_argument(
        "--train-mixers",
        nargs="+",
        default=list(TRAIN_MODELS),
        choices=list(TRAIN_MODELS),
        help="models of the training-step rows (hybrid: kda, kda, kda, attention)",
    )
    parser.add_argument("--train-batch", type=int, default=4, help="sequences per training step")


def _add_grid_options(parser: argparse.ArgumentParser) -> None:
    """``--skip-rows`` and ``--grid-max-s`` (``--preset auto-grid``)."""
    parser.add_argument(
        "--skip-rows",
        nargs="+",
        default=[],
        metavar="ENTRY:MODE",
        help="rows not to time (e.g. recurrent:fwd+bwd); each gets a record that says so",
    )
    parser.add_argument(
        "--grid-max-s",
        type=float,
        default=None,
        help="--preset auto-grid: start no new grid point after this many seconds (rerun to "
        "resume; points already in the file are skipped)",
    )


def _add_timing_options(parser: argparse.ArgumentParser) -> None:
    """How rows are timed: ``--reps``, ``--calls``, ``--no-interleave``, ``--warmup``, ``--seed``,
    ``--no-roofline``."""
    parser.add_argument(
        "--reps",
        type=int,
        default=15,
        help="timed calls per row (the table shows their median and quartiles)",
    )
    parser.add_argument(
        "--calls",
        type=int,
        default=1,
        help="calls per timed rep, dispatched back to back with one wait at the end; a rep is "
        "their mean (default 1: each call waits for its result, which on a TPU host adds about "
        "0.5 ms; more calls time the device alone)",
    )
    parser.add_argument(
        "--no-interleave",
        action="store_true",
        help="time each function's reps back to back (default: one rep of every function per "
        "round, so load changes on a busy machine hit all of them alike; needs all inputs alive)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed calls per row after compiling (0 times first calls: a warning says so)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random inputs and of each round's order"
    )
    parser.add_argument(
        "--no-roofline",
        action="store_true",
        help=f"skip the {MATMUL_SIZE} x {MATMUL_SIZE} matmul row that measures the machine's "
        "matmul GFLOP/s (most of a small run's time); rows then have no roofline_fraction",
    )


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Option values before any work; sets ``args.out_path`` (the output path, checked and its
    folder created, or None for ``--out -``)."""
    check_option_minimums(parser, args, OPTION_MINIMUMS)
    if min(args.seq_lens) < 1:
        parser.error(f"--seq-lens must all be >= 1, got {args.seq_lens}")
    problem = _memory_problem(args)
    if problem:
        parser.error(problem)
    if args.warmup == 0:
        print(
            "warning: --warmup 0 times each row's first calls, which carry one-off costs "
            "(allocations, autotuning, caches): the first T's rows are not comparable to the rest",
            file=sys.stderr,
            flush=True,
        )
    unknown = [row for row in args.skip_rows if row not in SKIPPABLE_ROWS]
    if unknown:
        parser.error(f"--skip-rows: unknown rows {unknown}; known: {', '.join(SKIPPABLE_ROWS)}")
    if args.grid_max_s is not None and not args.grid_max_s > 0:
        parser.error(f"--grid-max-s must be > 0, got {args.grid_max_s}")
    if args.grid_max_s is not None and args.preset != "auto-grid":
        parser.error("--grid-max-s applies to --preset auto-grid only")
    check_seed_option(parser, args)
    args.out_path = _out_path(parser, args)


def _out_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Path | None:
    """The output path, checked (and its folder created) before anything is timed; None for
    ``--out -``. An auto-grid file to resume must hold a grid (a damaged one is refused)."""
    if args.record and args.out is not None:
        parser.error("--record writes the recorded data/benchmarks/ file: give --out or --record")
    grid = args.preset == "auto-grid"
    if args.out == "-":
        if grid:
            parser.error("--out -: --preset auto-grid records its grid in a file; give a path")
        return None
    today, platform = datetime.date.today(), jax.default_backend()
    default = policy_grid.grid_path if grid else default_out_path
    out = default(platform, today, record=args.record) if args.out is None else args.out
    problem = output_path_problem(out)
    if not grid:  # a grid file is resumed (checked below); any other is replaced if a table
        problem = problem or replace_problem(out, "benchmark table", DOCUMENT_KEYS)
    if problem:
        parser.error(f"--out: {problem}")
    if grid:
        try:
            policy_grid.load_grid(out)
        except ValueError as error:
            parser.error(f"--out: {error}; move it away or give another path to record anew")
    return Path(out)


def input_bytes(args: argparse.Namespace) -> int:
    """A lower bound on the bytes of the inputs every row is planned with (all of them are
    built before the first is timed, see :func:`run`): per T, a kda entry's q, k, v, f, beta
    (f and beta float32), softmax's q, k, v, the layer entries' input, parameters (a layer per
    T, float32) and kernel inputs, and the training rows' tokens (``--train``). An unnamed
    ``--impls`` counts one kda entry (the default list holds at least one)."""
    batch, heads, key_dim, value_dim = args.batch, args.heads, args.key_dim, args.value_dim
    item = jnp.dtype(args.dtype).itemsize
    names = args.impls or ["chunked"]
    kernels = sum(name not in ("softmax", "layer") for name in names)
    hidden = heads * key_dim
    params = 4 * hidden * heads * (2 * key_dim + 3 * value_dim)  # q, k, v, g, o projections
    total = 0
    for seq_len in args.seq_lens:
        rows = batch * seq_len * heads
        kernel = rows * ((2 * key_dim + value_dim) * item + 4 * key_dim + 4)
        total += kernels * kernel
        total += ("softmax" in names) * 3 * rows * key_dim * item
        total += ("layer" in names) * (rows * key_dim * item + params + kernel)
        total += args.train * len(args.train_mixers) * 8 * args.train_batch * (seq_len + 1)
    return total


def _memory_problem(args: argparse.Namespace) -> str | None:
    """Why the planned inputs (:func:`input_bytes`) cannot fit this machine's memory, naming
    the shape option behind most of the bytes (:func:`kda_lib.checks.dominant_size`), or None."""
    sizes = {
        "--seq-lens": max(args.seq_lens),
        "--batch": args.batch,
        "--heads": args.heads,
        "--key-dim": args.key_dim,
        "--value-dim": args.value_dim,
    }
    if args.train:
        sizes["--train-batch"] = args.train_batch
    nbytes = input_bytes(args)
    problem = allocation_problem("the rows' inputs (all built before timing)", nbytes)
    if problem is None:
        return None
    with_sizes = lambda s: argparse.Namespace(**{**vars(args), **{  # noqa: E731
        n[2:].replace("-", "_"): [v] if n == "--seq-lens" else v
        for n, v in s.items() if v != sizes[n]}})  # fmt: skip
    name = dominant_size(sizes, lambda s: input_bytes(with_sizes(s)))
    shown = {**sizes, "--seq-lens": " ".join(map(str, args.seq_lens))}
    others = ", ".join(f"{n} {v}" for n, v in shown.items() if n != name)
    return f"{name} {shown[name]} (with {others}, --dtype {args.dtype}): {problem}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def compute_ratios(records: list[dict]) -> dict:
    """``{"a/b": {mode: {T: median_a / median_b}}}``; ``a/(b+c)`` sums the denominators."""
    median = {
        (r["impl"], r["T"], r["mode"]): r["median_ms"]
        for r in records
        if r.get("median_ms") is not None
    }
    ratios = {}
    for top, bottom in RATIOS:
        name = f"{top}/{bottom[0]}" if len(bottom) == 1 else f"{top}/({'+'.join(bottom)})"
        per_mode = {}
        for (impl, seq_len, mode), value in sorted(median.items()):
            parts = [median.get((b, seq_len, mode)) for b in bottom]
            if impl == top and None not in parts:
                per_mode.setdefault(mode, {})[str(seq_len)] = value / sum(parts)
        if per_mode:
            ratios[name] = per_mode
    return ratios


def compare_with_anchors(records: list[dict]) -> dict:
    """``chunked`` fwd+bwd over each anchor of :data:`H200_ANCHORS_MS`, per T it has (the goal:
    <= 1.5 over fla's kernel, <= 1/3 of tokamax's xla_chunked)."""
    ours = {
        r["T"]: r["median_ms"]
        for r in records
        if r["impl"] == REGISTRY["chunked"].name and r["mode"] == "fwd+bwd" and r.get("median_ms")
    }
    return {
        f"chunked / {name}": {t: ours[t] / ms for t, ms in anchors.items() if t in ours}
        for name, anchors in H200_ANCHORS_MS.items()
    }


def format_table(records: list[dict]) -> str:
    header = f"{'impl':<22}{'T':>7}  {'mode':<8}{'median ms':>11}{'p25 ms':>10}{'p75 ms':>10}"
    header += f"{'min ms':>10}{'reps':>6}{'compile s':>11}"
    if any("hbm_roofline_fraction" in r for r in records):  # a device kind of known bandwidth
        header += f"{'HBM roof':>9}"
    lines = [header, "-" * len(header)]
    for r in records:
        if r.get("median_ms") is None:
            why = f"error: {r['error']}" if r.get("error") else f"skipped: {r.get('skipped')}"
            lines.append(f"{r['impl']:<22}{r['T']:>7}  {r['mode']:<8}  {why}")
            continue
        lines.append(
            f"{r['impl']:<22}{r['T']:>7}  {r['mode']:<8}{r['median_ms']:>11.2f}"
            f"{r['p25_ms']:>10.2f}{r['p75_ms']:>10.2f}{r['min_ms']:>10.2f}{r['reps']:>6}"
            f"{r['compile_s']:>11.2f}"
            + (f"{r['hbm_roofline_fraction']:>9.1%}" if "hbm_roofline_fraction" in r else "")
            + ("  bimodal" if r.get("bimodal") else "")
        )
    return "\n".join(lines)


def run(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON document (also written unless ``--out -``).

    Every row is planned first (a :class:`TimedProgram` per entry, T and mode; rows that cannot run
    here become error records with a note), then compiled, then timed (interleaved unless
    ``--no-interleave``); the document is written before the table is printed."""
    args = parse_args(argv)
    if args.preset == "auto-grid":
        return policy_grid.run_grid(
            args.out_path, run, max_seconds=args.grid_max_s, dtype=args.dtype
        )
    cfg = BenchConfig(args.batch, args.heads, args.key_dim, args.value_dim, args.dtype)
    impls = args.impls or default_impls(lambda n: kernel_problem(n, cfg))
    if args.preset == "accelerator" and jax.default_backend() != "tpu" and "pallas_tpu" in impls:
        impls = [n for n in impls if n != "pallas_tpu"]  # the interpreter, at 32K: not a row
        _note("pallas_tpu: left out of the accelerator preset off a TPU")
    key = jax.random.key(args.seed)
    jobs, records = _plan_jobs(args, cfg, impls, key)
    _time_jobs(jobs, args)
    records.extend(job.record() for job in jobs)
    for line in skip_estimates(records) + distribution_warnings(records):
        print(line, file=sys.stderr, flush=True)
    matmul_gflops = add_roofline(records)
    document = _document(args, cfg, impls, records, matmul_gflops, argv)
    _write_and_print(document, args.out_path)
    return document


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def _plan_jobs(
    args, cfg: BenchConfig, impls, key: jax.Array
) -> tuple[list[TimedProgram], list[dict]]:
    """The jobs to time, in order (the matmul row, the training steps, then each entry at
    each T), and the error records of the kernel rows that cannot run here."""
    jobs, records = [], []

    def add(name, seq_len, fn, fn_args, modes=None):
        for mode in modes or args.modes:
            if f"{name}:{mode}" in args.skip_rows:
                reason = "named in --skip-rows"
                records.append(
                    dict(impl=name, T=seq_len, mode=mode, median_ms=None, skipped=reason)
                )
                continue
            timed = fn if mode == "fwd" else with_gradients(fn, fn_args, jax.random.fold_in(key, 1))
            tokens = cfg.batch * seq_len
            jobs.append(TimedProgram(name, seq_len, mode, timed, fn_args, tokens=tokens))

    # the machine's matmul throughput, measured beside the entries: the roofline's ceiling
    if not args.no_roofline:
        jobs.append(TimedProgram(MATMUL_ENTRY, MATMUL_SIZE, "fwd", *matmul_entry(key)))
    if args.train:
        for mixer in args.train_mixers:
            for seq_len in args.seq_lens:
                fn, fn_args = train_step_entry(mixer, args.train_batch, seq_len, key)
                tokens = args.train_batch * seq_len
                name = f"train_{mixer}"
                jobs.append(TimedProgram(name, seq_len, "train", fn, fn_args, tokens=tokens))
    for name in impls:
        for seq_len in args.seq_lens:
            inputs_key = jax.random.fold_in(key, seq_len)
            too_long = name in SEQUENTIAL_IMPLS and seq_len > args.sequential_max_t
            if name == "softmax":
                add(name, seq_len, *softmax_entry(cfg, seq_len, inputs_key))
            elif name == "layer":
                entries = layer_entries(cfg, seq_len, inputs_key, args.layer_impl)
                for entry in LAYER_ENTRIES:
                    add(entry, seq_len, *entries[entry])
            elif too_long and args.impls is None:  # a named entry runs at every T
                records.extend(_skipped(name, seq_len, args, cfg, inputs_key, add))
            elif (problem := kernel_problem(name, cfg)) is not None:
                records.extend(
                    dict(impl=name, T=seq_len, mode=m, median_ms=None, error=problem)
                    for m in args.modes
                )
                _note(f"{name}: {problem}")
            else:
                inputs = kernel_inputs(cfg, seq_len, inputs_key)
                add(name, seq_len, kda_entry(name), tuple(inputs.values()))
    return jobs, records


def _skipped(name, seq_len, args, cfg, inputs_key, add) -> list[dict]:
    """A token-by-token entry above ``--sequential-max-t`` that was not named: the modes in
    which ``auto`` runs it at this T are timed anyway (the policy needs them); the others
    become ``skipped`` records (their estimated time is noted after the run)."""
    state_size = cfg.batch * cfg.heads * cfg.key_dim * cfg.value_dim
    forward, training = portable_forms(seq_len, state_size)
    needed = [m for m in args.modes if (forward if m == "fwd" else training) == name]
    if needed:
        inputs = kernel_inputs(cfg, seq_len, inputs_key)
        add(name, seq_len, kda_entry(name), tuple(inputs.values()), modes=needed)
    reason = f"token by token above --sequential-max-t {args.sequential_max_t}; name it to force"
    return [
        dict(impl=name, T=seq_len, mode=m, median_ms=None, skipped=reason)
        for m in args.modes
        if m not in needed
    ]


# rows whose compiled programs need more memory than this are timed apart (see _time_jobs)
HEAVY_BYTES = 256 * 2**20


def _time_jobs(jobs: list[TimedProgram], args) -> None:
    """Compile and warm up every job, then time ``args.reps`` calls of each: one call of every
    job per round (interleaved), or each job's calls back to back with ``--no-interleave``. A
    job that raises keeps its error and is not called again; the others go on."""

    def attempt(job, step):
        if job.error is None:
            try:
                step()
            except Exception as e:  # noqa: BLE001  one failing entry must not stop the rest
                job.error = f"{type(e).__name__}: {e}"[:500]
                job.compiled = job.args = None
                _note(f"{job.impl} T={job.seq_len} {job.mode} failed: {job.error}")

    for job in jobs:
        attempt(job, lambda job=job: job.prepare(args.warmup))
        if args.no_interleave:
            for _ in range(args.reps):
                attempt(job, lambda job=job: job.time_once(args.calls))
            job.args = job.compiled = None  # free its inputs before the next one
        print(f"compiled {job.impl} T={job.seq_len} {job.mode}", file=sys.stderr, flush=True)
    if not args.no_interleave:
        # a new order every round (seeded): a fixed order would make one row always follow the
        # same neighbour. And the rows whose programs need over HEAVY_BYTES (the scan's forward
        # + backward keeps a state per token) are timed after the others, among themselves:
        # the calls after such a one pay to fault its freed memory back in (measured: the
        # chunked forward after the scan's forward + backward, 57 ms against 34; with random
        # order, a row's median could still land among those calls)
        order = np.random.default_rng(args.seed)
        heavy = [job for job in jobs if job.info.get("compiled_bytes", 0) > HEAVY_BYTES]
        for group in ([job for job in jobs if job not in heavy], heavy):
            for _ in range(args.reps):
                for index in order.permutation(len(group)):
                    attempt(group[index], lambda job=group[index]: job.time_once(args.calls))


# the keys of a benchmark table (_document's): --out replaces only such a file
DOCUMENT_KEYS = ("platform", "config", "records")


def _document(args, cfg: BenchConfig, impls, records, matmul_gflops, argv) -> dict:
    """The JSON document of a run: machine, versions, the configuration, records, ratios."""
    device = jax.devices()[0]
    document = dict(
        platform=jax.default_backend(),
        device_kind=device.device_kind,
        jax_version=jax.__version__,
        tokamax_version=_version("tokamax"),
        date=datetime.date.today().isoformat(),
        config=dict(
            dataclasses.asdict(cfg),
            seq_lens=args.seq_lens,
            modes=args.modes,
            impls=impls,
            reps=args.reps,
            calls=args.calls,
            warmup=args.warmup,
            interleaved=not args.no_interleave,
            roofline=not args.no_roofline,
            lower_bound=LOWER_BOUND,
            layer_impl=args.layer_impl,
            sequential_max_t=args.sequential_max_t,
            seed=args.seed,
            preset=args.preset,
            cpu_count=_cpu_count(),
            argv=list(sys.argv[1:] if argv is None else argv),
        ),
        matmul_gflops=matmul_gflops,
        records=records,
        ratios=compute_ratios(records),
    )
    if args.preset == "accelerator" and "H200" in device.device_kind:
        document["vs_h200_anchors"] = compare_with_anchors(records)
    return document


def _write_and_print(document: dict, path: Path | None) -> None:
    """Write the JSON first (a failure to write it prints the document instead of losing it),
    then print the table and the ratios; ``--out -`` (``path`` None): the JSON alone on
    stdout, the table and the ratios on stderr (as ``kda-train --output -``)."""
    table = sys.stdout
    if path is None:
        print(dumps(document), end="", flush=True)
        table = sys.stderr
    else:
        try:
            write_json(document, path)
        except OSError as error:
            print(dumps(document), end="")
            raise SystemExit(
                f"error: could not write {path} ({error}); the JSON document is printed above"
            ) from error
    print(file=table)
    print(format_table(document["records"]), file=table)
    if document["ratios"]:
        print(file=table)
        print(RATIOS_HEADER, file=table)
    for name, per_mode in document["ratios"].items():
        for mode, per_t in per_mode.items():
            values = "  ".join(f"T={t}: {r:.3f}" for t, r in per_t.items())
            print(f"{name:<45} {mode:<8} {values}", file=table)
    if path is not None:
        print(f"wrote {path}")


def matmul_entry(key: jax.Array):
    """A ``2048 x 2048`` float32 ``jnp.dot`` at HIGHEST precision (as the kernels' matmuls):
    what this machine's matmuls reach, the roofline's ceiling."""
    a, b = (jax.random.normal(k, (MATMUL_SIZE, MATMUL_SIZE)) for k in jax.random.split(key))
    return (lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)), (a, b)


def add_roofline(records: list[dict]) -> float | None:
    """Add ``roofline_fraction`` (achieved GFLOP/s over the matmul row's) to every record with
    a FLOP count; returns the matmul row's GFLOP/s (None if it failed)."""
    matmul = next((r for r in records if r["impl"] == MATMUL_ENTRY and r.get("median_ms")), None)
    if matmul is None:
        return None
    ceiling = 2 * MATMUL_SIZE**3 / (matmul["median_ms"] / 1e3) / 1e9
    for record in records:
        if "achieved_gflops" in record:
            record["roofline_fraction"] = record["achieved_gflops"] / ceiling
    return ceiling


TRAIN_MODELS = {
    "kda": dict(mixer="kda"),
    "gdn": dict(mixer="gdn"),
    "attention": dict(mixer="attention"),
    "hybrid": dict(layers=("kda", "kda", "kda", "attention")),
}


def train_step_entry(model: str, batch: int, seq_len: int, key: jax.Array):
    """``(step, args)``: one AdamW step of a 4-layer byte-level TinyLM (hidden 128, 2 heads of
    64) with the mixers of ``TRAIN_MODELS[model]``; ``step(state, batch)`` returns the loss."""
    config = ModelConfig(
        vocab_size=256,
        num_layers=4,
        mixer_config=KDAConfig(hidden_size=128, num_heads=2, head_dim=64),
        **TRAIN_MODELS[model],
    )
    model_ = TinyLM(config, rngs=nnx.Rngs(0))
    optimizer = make_optimizer(model_, steps=1000, learning_rate=1e-3)
    graphdef, state = nnx.split((model_, optimizer))
    tokens = jax.random.randint(key, (batch, seq_len + 1), 0, 256)
    data = TaskBatch(tokens[:, :-1], tokens[:, 1:], jnp.ones((batch, seq_len), bool))

    def step(state, data):
        model, optimizer = nnx.merge(graphdef, state)
        loss, _ = train_step(model, optimizer, data)
        return loss, nnx.state((model, optimizer))

    return step, (state, data)


def _cpu_count() -> int | None:

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


@exit_on_broken_pipe
def main(argv: Sequence[str] | None = None) -> None:
    """The command line (:func:`run`); a closed stdout ends it with status 1, no traceback."""
    run(argv)


if __name__ == "__main__":
    main()
