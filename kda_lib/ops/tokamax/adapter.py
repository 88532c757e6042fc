"""tokamax's KDA kernels behind kda_lib's conventions. tokamax is head-first (``[H, B, T, D]``),
keeps a state slot per segment (``[B, N, H, K, V]``), pads T to its 64-token chunk and runs
Mosaic on a TPU v6+ only (or under :func:`kda_lib.emulate_tpu`)."""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import re
import sys
from collections import namedtuple

import jax
import jax.numpy as jnp

from kda_lib.checks import allocation_problem
from kda_lib.ops.contract import Dims, KDAOptions, accumulation_dtype, repeat_qk_heads
from kda_lib.ops.segments import (
    NEUTRAL_RAW_GATE,
    fill_padding_ids,
    first_segment_id,
    isolate_non_finite,
    overflowing_keys_as_nan,
    pad_time,
    rank_segment_links,
    restore_non_finite,
    segment_ordinals,
    zero_padding,
)

TOKAMAX_CHUNK = 64
TOKAMAX_INSTALL = "pip install 'kda-lib[tokamax]'"


# a tokamax kernel: api_name: tokamax's name for it; chunked: T padded to TOKAMAX_CHUNK (its
# only chunk_size); float32: bf16/fp16 inputs run in float32; mosaic: Pallas Mosaic (TPU v6+)
TokamaxVariant = namedtuple("TokamaxVariant", "name api_name chunked float32 mosaic")


TOKAMAX_VARIANTS = {v.name: v for v in (
    TokamaxVariant("tokamax_xla", "xla", chunked=False, float32=False, mosaic=False),
    TokamaxVariant("tokamax_xla_chunked", "xla_chunked", chunked=True, float32=True, mosaic=False),
    TokamaxVariant("tokamax_mosaic", "mosaic", chunked=True, float32=False, mosaic=True),
)}  # fmt: skip
MOSAIC = TOKAMAX_VARIANTS["tokamax_mosaic"]


def tokamax_install_hint(python: tuple[int, ...] | None = None) -> str:
    """How to get tokamax: the extra, and where ``python`` (default: this interpreter's
    version) is older than 3.12, that tokamax's releases need Python >= 3.12 (the extra's
    marker skips tokamax there, so installing it here would not help)."""
    major, minor = (sys.version_info if python is None else python)[:2]
    if (major, minor) >= (3, 12):
        return TOKAMAX_INSTALL
    return (
        f"{TOKAMAX_INSTALL} on Python >= 3.12 (tokamax's releases need Python >= 3.12; this is "
        f"Python {major}.{minor}, where the extra installs without it)"
    )


def missing_tokamax_problem(what: str, python: tuple[int, ...] | None = None) -> str | None:
    """Why ``what`` cannot run for want of tokamax, naming the extra (and, on Python < 3.12,
    why it is missing: :func:`tokamax_install_hint`); None if installed."""
    if importlib.util.find_spec("tokamax") is not None:
        return None
    return (
        f"{what} needs tokamax, which is not installed: {tokamax_install_hint(python)} "
        "(kda_lib's own implementations, 'chunked' and 'recurrent', need no tokamax)"
    )


def require_tokamax(what: str) -> None:
    """ModuleNotFoundError naming the extra when tokamax is missing."""
    if problem := missing_tokamax_problem(what):
        raise ModuleNotFoundError(problem, name="tokamax")


def emulated_tpu() -> tuple[int, object] | None:
    """``(generation, mosaic_op)`` under :func:`kda_lib.emulate_tpu` (lab/emulation.py) or None."""
    return None


@functools.cache
def tokamax_kda_api():  # with its untuned-shape warnings filtered out
    require_tokamax("kda_lib's tokamax adapter")
    from tokamax._src.ops.kda import api

    logging.getLogger("absl").addFilter(lambda r: "Autotuning cache miss" not in r.getMessage())
    return api


def tpu_generation() -> int | None:
    """TPU generation of the default device (6 for ``"TPU v6 lite"``), or None off TPU."""
    device = jax.devices()[0]
    digits = re.findall(r"\d+", device.device_kind)
    return int(digits[0]) if device.platform == "tpu" and digits else None


# ------------------------------------------------------------------ what a kernel cannot serve
def tokamax_problems(variant: TokamaxVariant, o: KDAOptions, here: bool = True, *,
                     slots_checked: bool = False) -> list[str]:  # fmt: skip
    """Why ``variant`` cannot serve the checked call ``o`` (``here``: on this machine too;
    ``slots_checked``: the caller, the KDA layer at its entry, checked that the per-segment
    states of the bound fit, which is at least as strict as the count's check here)."""
    name, dims, mosaic, segments = variant.name, o.dims, variant.mosaic, o.has_segments
    emulated, _ = (mosaic and here and emulated_tpu()) or (None, None)  # Mosaic here only
    tpu = (tpu_generation() or emulated) if mosaic and here else 6
    on = f"this is TPU v{tpu}{' (emulated)' if emulated else ''}" if tpu else (
        f"the default device is {jax.devices()[0].platform} (to run it in Pallas interpret mode "
        "anyway, wrap the call in kda_lib.emulate_tpu())")  # fmt: skip
    bound = o.max_num_segments
    found = [problem for bad, problem in [
        (here, missing_tokamax_problem(f"implementation={name!r}")),
        ((tpu or 0) < 6, f"tokamax_mosaic needs a TPU v6 or newer; {on}"),
        (mosaic and dims.key_dim > 256, f"tokamax_mosaic supports K <= 256, got K={dims.key_dim}"),
        (mosaic and jnp.dtype(o.dtype) not in (jnp.float32, jnp.bfloat16),
         f"tokamax_mosaic supports float32/bfloat16 inputs, got {o.dtype}"),
        (mosaic and o.fused_gate and o.lower_bound is None,
         "tokamax_mosaic with a fused gate (a_log given) needs lower_bound"),
        (o.allow_neg_eigval, f"{name} requires beta in [0, 1]; allow_neg_eigval is not supported"),
        (variant.api_name == "xla_chunked" and not (o.fused_gate and o.lower_bound is not None),
         f"{name} needs the fused safe gate (it needs the safe gate's lower_bound, with or without "
         "a_log, and a raw gate input g); use implementation='chunked' for log-space gates"),
        (o.precision is not None, f"precision={o.precision!r} applies to kda_lib's 'chunked' "
         f"implementation; {name!r} chooses its own matmul precision (pass precision=None)"),
        *[(getattr(o, flag), f"{name} returns no interior states ({flag}); use kda_lib's "
           "'chunked' or 'recurrent' implementation")
          for flag in ("output_chunk_states", "output_token_states")],
        (variant.chunked and o.chunk_size != TOKAMAX_CHUNK,
         f"{name} supports chunk_size={TOKAMAX_CHUNK} only, got {o.chunk_size}"),
        (segments and bound is None,
         f"{name} with segment_ids needs max_num_segments (a static bound on the ids)"),
        (segments and bound is not None and (o.segments_per_row or 0) > bound,
         f"segment_ids has a row with {o.segments_per_row} segments but max_num_segments={bound}"),
    ] if bad and problem]  # fmt: skip
    if segments and bound is not None and (o.segments_per_row or 0) <= bound and not slots_checked:
        found += filter(None, [segment_slots_problem(name, dims, bound,
                                                     segments_per_row=o.segments_per_row)])
    return found


def segment_slot_count(
    variant: TokamaxVariant, max_num_segments: int, seq_len: int, *, segments_per_row=None
) -> int:
    """The state slots tokamax gets: the bound, at most T (Mosaic: its chunk; counted ids)."""
    if not variant.mosaic:
        return min(max_num_segments, seq_len)
    count = min(max_num_segments, -(-seq_len // TOKAMAX_CHUNK) * TOKAMAX_CHUNK)
    return count if segments_per_row is None else min(count, max(segments_per_row, 1))


def segment_slots_problem(
    implementation: str, dims: Dims, max_num_segments: int, *,
    segments_per_row: int | None = None, name: str = "max_num_segments",
) -> str | None:  # fmt: skip
    """Why tokamax's float32 per-segment states cannot fit in memory, naming ``name``, or None."""
    variant = TOKAMAX_VARIANTS.get(implementation)
    if variant is None:
        return None
    slots = segment_slot_count(variant, max_num_segments, dims.seq_len,
                               segments_per_row=segments_per_row)  # fmt: skip
    shape = [dims.batch, slots, dims.num_heads, dims.key_dim, dims.value_dim]
    what = (f"{implementation}'s per-segment states [B, slots, HV, K, V] = {shape} "
            "(float32; a slot per segment the bound allows, at most about T)")
    problem = allocation_problem(what, 4 * math.prod(shape))
    return f"{name}={max_num_segments}: {problem}" if problem else None


# ------------------------------------------------------------------ running a kernel
def tokamax_kda(variant: TokamaxVariant, arrays, options: KDAOptions):
    """tokamax's ``variant`` on a checked :func:`kda_lib.kda` call -> ``(o, final_state)``."""
    o, dims, ids = options, options.dims, arrays.segment_ids
    q, k = repeat_qk_heads(arrays.q, arrays.k, dims.groups)  # tokamax has no grouped heads
    if not o.use_qk_l2norm:  # (normalised keys cannot overflow)
        k = overflowing_keys_as_nan(k)  # kept in its segment from its token on, as in chunked
    *inputs, state, non_finite = isolate_non_finite(
        q, k, arrays.v, arrays.g, arrays.beta, arrays.initial_state, ids, raw_gate=o.fused_gate
    )
    if variant.float32 and any(x.dtype.itemsize < 4 for x in inputs[:3]):  # bf16, fp16
        inputs = [x.astype(jnp.float32) for x in inputs]  # its chunked form computes in them
    slots, too_many = 1, None
    if ids is not None:
        slots = segment_slot_count(variant, o.max_num_segments, dims.seq_len,
                                   segments_per_row=o.segments_per_row)  # fmt: skip
        if o.segments_per_row is None:  # traced ids: such a row would be silently wrong
            too_many = segment_ordinals(ids).max(axis=1) > o.max_num_segments
    chunk = TOKAMAX_CHUNK if variant.chunked else 1
    if ids is None and dims.seq_len % chunk:  # the chunk's padding: a segment's tail
        ids = jnp.ones((dims.batch, dims.seq_len), jnp.int32)
    (q, k, v, g, beta), ids, _ = pad_time(chunk, *inputs, segment_ids=ids)
    if ids is not None:  # padding neutral: part of the segment before it
        neutral = NEUTRAL_RAW_GATE if o.fused_gate else 0.0
        q, k, v, g, beta = zero_padding(ids, q, k, v, g, beta, neutral_gate=neutral)
        ids = segment_ordinals(ids)
    if state is not None:  # the row's first segment's slot
        state = jnp.pad(state.astype(jnp.float32)[:, None], [(0, 0), (0, slots - 1)] + [(0, 0)] * 3)
    out, final = call_tokamax(
        variant, q, k, v, g, beta, use_gate_in_kernel=o.fused_gate, a_log=arrays.a_log,
        dt_bias=arrays.dt_bias, scale=o.scale, initial_state=state, segment_ids=ids,
        output_final_state=o.output_final_state, use_qk_l2norm=o.use_qk_l2norm,
        lower_bound=o.lower_bound, max_num_segments=None if ids is None else slots,
    )  # fmt: skip
    if o.output_final_state:  # the state of each row's last segment
        last = 0 if ids is None else jnp.clip(ids[:, -1] - 1, 0, slots - 1)
        final = final[jnp.arange(dims.batch), last].astype(accumulation_dtype(o.dtype))
    out, final = restore_non_finite(out[:, : dims.seq_len].astype(o.dtype),
                                    final if o.output_final_state else None, non_finite)
    if too_many is not None:
        nan = lambda x: jnp.where(too_many[:, None, None, None], jnp.nan, x)  # noqa: E731
        out, final = nan(out), (None if final is None else nan(final))
    return out, final


def call_tokamax(variant: TokamaxVariant, q, k, v, g, beta, *, use_gate_in_kernel: bool,
                 a_log=None, dt_bias=None, **kw):  # fmt: skip
    """tokamax's ``variant`` on batch-first arrays, q/k heads repeated: ``(o, final_state)``."""
    if use_gate_in_kernel and a_log is None:  # the fused gate with A = 1
        a_log = jnp.zeros((v.shape[2],), jnp.float32)
    f32 = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
    kw.update(a_log=f32(a_log), delta_time_bias=f32(dt_bias), use_gate_in_kernel=use_gate_in_kernel)
    args = [jnp.moveaxis(x, 2, 0) for x in (q, k, v, g, beta)]  # tokamax's [H, B, T, D]
    if variant.mosaic and (emulated := emulated_tpu()):  # (never on a real TPU)
        _, mosaic_op = emulated
        out, final = mosaic_op(*args, **kw)
    else:
        run = tokamax_kda_api().kimi_delta_attention
        out, final = run(*args, implementation=variant.api_name, **kw)
    return jnp.moveaxis(out, 0, 2), final


# ------------------------------------------------------------------ tokamax's own CP
def tokamax_mosaic_context_parallel(q, k, v, g, beta, options: KDAOptions, *, axis_name, mesh,
                                    segment_ids=None, a_log=None, dt_bias=None,
                                    initial_state=None, output_final_state=False, **_):  # fmt: skip
    """tokamax's context parallelism for its Mosaic kernel, inside a ``shard_map`` over
    ``axis_name`` with ``check_vma=False``: a rank's slices checked as ``options`` -> o ``[B, T,
    HV, V]``. K and V multiples of 128, no initial/final state."""
    dims, fused, max_num_segments = options.dims, options.fused_gate, options.max_num_segments
    given = {"initial_state": initial_state is not None, "output_final_state": output_final_state}
    problems = [f"context parallelism does not support {arg}" for arg in given if given[arg]]
    if dims.key_dim % 128 or dims.value_dim % 128:
        problems.insert(0, f"its context parallelism needs K and V multiples of 128, got "
                           f"K={dims.key_dim}, V={dims.value_dim}")  # fmt: skip
    if why := "; ".join(problems):
        raise ValueError(f"'tokamax_mosaic' cannot run inside shard_map here: {why}")
    if axis_name in jax.typeof(q).mat.varying:  # q's varying axes (as in constraints.txt's jax)
        raise ValueError("'tokamax_mosaic' context parallelism needs jax.shard_map(..., "
                         "check_vma=False): tokamax's CP kernels build loop carries that do not "
                         "vary over the mesh axis, which the vma check rejects")  # fmt: skip
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if axis_name not in mesh.axis_names:
        raise ValueError(f"'tokamax_mosaic' context parallelism needs the shard_map's mesh "
                         f"(mesh=...); {axis_name!r} is not one of its axes {mesh.axis_names}")
    q, k = repeat_qk_heads(q, k, dims.groups)
    if segment_ids is None:
        ids, max_num_segments = jnp.ones((dims.batch, dims.seq_len), jnp.int32), 1
    else:  # padding: the last real id before it across ranks (else the row's first id, or 1)
        before, _, rank = rank_segment_links(segment_ids, axis_name)
        ids = fill_padding_ids(segment_ids, jnp.take(before, rank, axis=0))
        ids = jnp.where(ids == 0, first_segment_id(segment_ids)[:, None], ids)
        ids = jnp.where(ids == 0, 1, ids).astype(jnp.int32)
        neutral = NEUTRAL_RAW_GATE if fused else 0.0  # padding's k, v zeroed too: by selection
        q, k, v, g, beta = zero_padding(segment_ids, q, k, v, g, beta, neutral_gate=neutral)
        # Mosaic pads every segment slot to a 64-token chunk: a bound of this slice
        max_num_segments = min(max_num_segments, dims.seq_len)
    out, _ = call_tokamax(
        MOSAIC, q, k, v, g, beta, use_gate_in_kernel=fused, a_log=a_log, dt_bias=dt_bias,
        scale=options.scale, use_qk_l2norm=options.use_qk_l2norm, segment_ids=ids,
        lower_bound=options.lower_bound, max_num_segments=max_num_segments,
        context_parallel_metadata=tokamax_kda_api().ContextParallelMetadata(mesh, axis_name),
    )  # fmt: skip
    return out.astype(q.dtype)
