"""tokamax's KDA behind kda_lib's conventions: every tokamax quirk lives here.

tokamax (``tokamax._src.ops.kda``) is head-first (``[H, B, T, D]``), keeps one state slot per
segment (``[B, N, H, K, V]``), pads T to its 64-token chunk, disagrees between backends on
padding (id 0) inside a row, and runs Mosaic on a TPU v6+ only (or under
:func:`kda_lib.emulate_tpu`). :func:`tokamax_kda` serves :func:`kda_lib.kda`;
:func:`tokamax_mosaic_context_parallel` serves kda_context_parallel.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kda_lib.ops.contract import check_fused_inputs, check_kda_inputs, repeat_qk_heads
from kda_lib.ops.segments import (
    check_max_num_segments,
    fill_padding_ids_across_ranks,
    isolate_non_finite,
    neutral_padding,
    overflowing_keys_as_nan,
    pad_time,
    restore_non_finite,
    segment_ordinals,
)
from kda_lib.ops.tokamax import emulation

TOKAMAX_CHUNK = 64


# tokamax is optional: the extra that brings it, named by every error about its absence
TOKAMAX_INSTALL = "pip install 'kda-lib[tokamax]'"


def missing_tokamax_problem(what: str) -> str | None:
    """Why ``what`` (e.g. ``"implementation='tokamax_xla'"``) cannot run here for want of
    tokamax, naming the extra to install; None where tokamax is installed."""
    if importlib.util.find_spec("tokamax") is not None:
        return None
    return (
        f"{what} needs tokamax, which is not installed: {TOKAMAX_INSTALL} (kda_lib's own "
        "implementations, 'chunked' and 'recurrent', need no tokamax)"
    )


def require_tokamax(what: str) -> None:
    """Raise :class:`ModuleNotFoundError` naming the extra to install when tokamax is missing
    (before any work: called where a tokamax implementation is chosen)."""
    problem = missing_tokamax_problem(what)
    if problem:
        raise ModuleNotFoundError(problem, name="tokamax")


@functools.cache
def tokamax_kda_api():
    """tokamax's KDA api module (``tokamax._src.ops.kda.api``; tokamax comes with the
    ``tokamax`` extra: :func:`require_tokamax` says so where it is missing)."""
    require_tokamax("kda_lib's tokamax adapter")
    from tokamax._src.ops.kda import api

    # tokamax logs a WARNING for every untuned shape: noise for users of the adapter
    logging.getLogger("absl").addFilter(lambda r: "Autotuning cache miss" not in r.getMessage())
    return api


def tpu_generation() -> int | None:
    """TPU generation of the default device (e.g. 6 for v6e), or None off TPU."""
    device = jax.devices()[0]
    if device.platform != "tpu":
        return None
    kind = device.device_kind.lower()  # e.g. "tpu v6 lite", "tpu v5p", "tpu7x"
    digits = "".join(c if c.isdigit() else " " for c in kind.replace("tpu", " ")).split()
    return int(digits[0]) if digits else None


def mosaic_problems(*, key_dim: int, dtype, lower_bound, fused_gate: bool) -> list[str]:
    """Why tokamax Mosaic cannot serve these inputs here (empty list: it can); under
    :func:`kda_lib.emulate_tpu` a CPU counts as the emulated TPU."""
    problems = []
    generation = tpu_generation()
    emulated = ""
    if generation is None:
        generation = emulation.emulated_tpu_generation()
        emulated = " (emulated)"
    if generation is None:
        problems.append(
            f"tokamax_mosaic needs a TPU v6 or newer; the default device is "
            f"{jax.devices()[0].platform} (to run it in Pallas interpret mode anyway, "
            f"wrap the call in kda_lib.emulate_tpu())"
        )
    elif generation < 6:
        problems.append(
            f"tokamax_mosaic needs a TPU v6 or newer; this is TPU v{generation}{emulated}"
        )
    if key_dim > 256:
        problems.append(f"tokamax_mosaic supports K <= 256, got K={key_dim}")
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        problems.append(f"tokamax_mosaic supports float32/bfloat16 inputs, got {jnp.dtype(dtype)}")
    if fused_gate and lower_bound is None:
        problems.append("tokamax_mosaic with a fused gate (a_log given) needs lower_bound")
    return problems


class TokamaxVariant(NamedTuple):
    """One of tokamax's KDA kernels, as the adapter needs to know it."""

    api_name: str  # tokamax's ``implementation=`` name
    chunked: bool  # T padded to TOKAMAX_CHUNK, chunk_size fixed at TOKAMAX_CHUNK
    float32: bool  # computes in its inputs' dtype, so bf16/fp16 inputs run in float32
    mosaic: bool  # the Pallas Mosaic kernel (TPU v6+, or emulated)


TOKAMAX_VARIANTS = {
    "tokamax_xla": TokamaxVariant("xla", chunked=False, float32=False, mosaic=False),
    "tokamax_xla_chunked": TokamaxVariant("xla_chunked", chunked=True, float32=True, mosaic=False),
    "tokamax_mosaic": TokamaxVariant("mosaic", chunked=True, float32=False, mosaic=True),
}


def tokamax_kda(
    variant: TokamaxVariant, q, k, v, g, beta, initial_state, segment_ids, gate, options
):
    """tokamax's ``variant`` on kda_lib's checked call: q, k ``[B, T, HV, K]`` (q/k heads
    repeated), v ``[B, T, HV, V]``, g ``[B, T, HV, K]`` (raw with the fused gate), beta
    ``[B, T, HV]``, padding zeroed; initial_state ``[B, HV, K, V]`` | None; canonical
    segment_ids | None; gate ``(a_log | None, dt_bias | None)``; options a checked
    :class:`kda_lib.ops.contract.KDAOptions`.

    Returns ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``, NaN
    exactly where the recurrence has it, and for rows over ``max_num_segments`` under jit.
    """
    seq_len = options.dims.seq_len
    if not options.use_qk_l2norm:  # (normalised keys cannot overflow)
        k = overflowing_keys_as_nan(k)  # kept in its segment from its token on, as in chunked
    q, k, v, g, beta, initial_state, non_finite = isolate_non_finite(
        q, k, v, g, beta, initial_state, segment_ids, raw_gate=options.fused_gate
    )
    if variant.float32 and any(jnp.dtype(x.dtype) in LOW_PRECISION for x in (q, k, v)):
        # tokamax's pure-JAX chunked form computes in its inputs' dtype, which misses fla's
        # tolerance in bf16 (DESIGN section 4): a portable reference, so float32
        q, k, v, g, beta = (x.astype(jnp.float32) for x in (q, k, v, g, beta))
    slots = _segment_slots(variant, segment_ids, options)
    q, k, v, g, beta, tk_segments = _padded_for_tokamax(
        variant, (q, k, v, g, beta), segment_ids, options.fused_gate
    )
    out, final = call_tokamax(
        variant,
        q,
        k,
        v,
        g,
        beta,
        a_log=gate[0],
        dt_bias=gate[1],
        scale=options.scale,
        initial_state=_slot_state(initial_state, slots.count),
        output_final_state=options.output_final_state,
        use_qk_l2norm=options.use_qk_l2norm,
        segment_ids=tk_segments,
        lower_bound=options.lower_bound,
        max_num_segments=None if tk_segments is None else slots.count,
    )
    out = out[:, :seq_len].astype(options.dtype)
    final = _final_slot(final, tk_segments, slots.count) if options.output_final_state else None
    out, final = restore_non_finite(out, final, non_finite)
    if slots.too_many is not None:
        out = jnp.where(slots.too_many[:, None, None, None], jnp.nan, out)
        if final is not None:
            final = jnp.where(slots.too_many[:, None, None, None], jnp.nan, final)
    return out, final


LOW_PRECISION = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


class SegmentSlots(NamedTuple):
    count: int  # state slots handed to tokamax (1 without segments)
    too_many: jax.Array | None  # [B]: rows over max_num_segments (traced ids only)


def _segment_slots(variant: TokamaxVariant, segment_ids, options) -> SegmentSlots:
    """tokamax keeps one state slot per segment: how many to give it. Concrete ids were counted
    by the check (``options.segments_per_row``); traced ids get a NaN flag per row instead."""
    if segment_ids is None:
        return SegmentSlots(1, None)
    count, too_many = options.max_num_segments, None
    if options.segments_per_row is None:  # under jit: such a row would be silently wrong
        too_many = segment_ordinals(segment_ids).max(axis=1) > count
    count = segment_slot_count(
        variant, count, options.dims.seq_len, segments_per_row=options.segments_per_row
    )
    return SegmentSlots(count, too_many)


def segment_slot_count(
    variant: TokamaxVariant, max_num_segments: int, seq_len: int, *, segments_per_row=None
) -> int:
    """The state slots ``[B, slots, H, K, V]`` (float32) tokamax gets for ``max_num_segments``.

    A row of T tokens has at most T segments, so a larger bound gives T slots (the XLA forms),
    and tokamax never allocates for segments that cannot exist. Mosaic aligns every segment
    slot to a 64-token chunk, so its work grows with the slot count: it gets T rounded up to
    the chunk, and with concrete ids (``segments_per_row``) only the counted segments."""
    if not variant.mosaic:
        return min(max_num_segments, seq_len)
    count = min(max_num_segments, -(-seq_len // TOKAMAX_CHUNK) * TOKAMAX_CHUNK)
    if segments_per_row is not None:
        count = min(count, max(segments_per_row, 1))
    return count


def _padded_for_tokamax(variant: TokamaxVariant, arrays, segment_ids, fused_gate: bool):
    """T padded to tokamax's chunk (chunked variants) and padding made neutral (tokamax's
    backends disagree on padding, id 0, inside a row): part of the segment before it, with no
    decay, no write and a zero query. Returns ``(q, k, v, g, beta, tokamax segment ordinals)``."""
    batch, seq_len = arrays[0].shape[:2]
    valid = None if segment_ids is None else segment_ids != 0
    (q, k, v, g, beta), padded_ids, pad = pad_time(
        TOKAMAX_CHUNK if variant.chunked else 1, *arrays, segment_ids=segment_ids
    )
    if pad:
        valid = jnp.ones((batch, seq_len), bool) if valid is None else valid
        valid = jnp.pad(valid, [(0, 0), (0, pad)])
    if valid is not None:
        q, g, beta = neutral_padding(q, g, beta, valid, raw_gate=fused_gate)
    if padded_ids is not None:
        return q, k, v, g, beta, segment_ordinals(padded_ids)
    return q, k, v, g, beta, (jnp.ones((batch, seq_len + pad), jnp.int32) if pad else None)


def _slot_state(initial_state, slots: int):
    """The initial state ``[B, HV, K, V]`` as tokamax's per-segment ``[B, slots, HV, K, V]``:
    it belongs to the row's first segment."""
    if initial_state is None:
        return None
    state = initial_state.astype(jnp.float32)[:, None]
    return jnp.pad(state, [(0, 0), (0, slots - 1), (0, 0), (0, 0), (0, 0)])


def _final_slot(final, tk_segments, slots: int):
    """The state of each row's last segment, ``[B, HV, K, V]`` float32."""
    if tk_segments is None:
        return final[:, 0].astype(jnp.float32)
    last = jnp.clip(tk_segments[:, -1] - 1, 0, slots - 1)  # ordinal of the row's last segment
    final = jnp.take_along_axis(final, last[:, None, None, None, None], axis=1)[:, 0]
    return final.astype(jnp.float32)


def call_tokamax(variant: TokamaxVariant, q, k, v, g, beta, *, a_log=None, dt_bias=None, **kw):
    """tokamax's ``variant`` on kda_lib's batch-first layout: ``q, k, g [B, T, H, K]``,
    ``v [B, T, H, V]``, ``beta [B, T, H]`` -> ``(out [B, T, H, V], final_state)``.

    Moves the head axis first (tokamax's ``[H, B, T, D]``) and back, and passes the fused
    gate's ``a_log`` and ``dt_bias`` (tokamax's ``delta_time_bias``) in float32, with
    ``use_gate_in_kernel`` set when ``a_log`` is given; ``kw`` go to tokamax as they are. Under
    TPU emulation, Mosaic runs through its op with the device check bypassed."""
    args = [jnp.moveaxis(x, 2, 0) for x in (q, k, v, g, beta)]
    kw.update(
        a_log=None if a_log is None else a_log.astype(jnp.float32),
        delta_time_bias=None if dt_bias is None else dt_bias.astype(jnp.float32),
        use_gate_in_kernel=a_log is not None,
    )
    api = tokamax_kda_api()
    if variant.mosaic and tpu_generation() is None and emulation.is_emulating():
        out, final = emulation.emulated_mosaic_op()(*args, **kw)
    else:
        out, final = api.kimi_delta_attention(*args, implementation=variant.api_name, **kw)
    return jnp.moveaxis(out, 0, 2), final


def tokamax_mosaic_context_parallel(
    q,
    k,
    v,
    g,
    beta,
    *,
    axis_name,
    mesh,
    scale=None,
    segment_ids=None,
    a_log=None,
    dt_bias=None,
    lower_bound=None,
    use_gate_in_kernel=False,
    use_qk_l2norm=False,
    allow_neg_eigval=False,
    chunk_size=TOKAMAX_CHUNK,
    max_num_segments=None,
    **unsupported,
):
    """tokamax's own context parallelism for its Mosaic kernel, inside a ``shard_map`` over
    ``axis_name`` (``ContextParallelMetadata(mesh, axis_name)``): one rank's q, k, g
    ``[B, T, H, K]``, v ``[B, T, HV, V]``, beta ``[B, T, HV]`` -> o ``[B, T, HV, V]``.

    Constraints (:func:`_mosaic_cp_problems`, a ValueError naming each): a TPU v6+ (or
    :func:`kda_lib.emulate_tpu`), K and V multiples of 128 (K <= 256), float32/bfloat16, the
    fused gate with ``lower_bound``, no initial/final state, beta in [0, 1], chunk_size 64, and
    ``shard_map(..., check_vma=False)``. Padding (id 0) takes the id of the segment it follows
    across ranks; why: docs/DESIGN.md section 5.
    """
    fused_gate = use_gate_in_kernel
    problems = _mosaic_cp_problems(
        q, v, unsupported, fused_gate, lower_bound, allow_neg_eigval, chunk_size, max_num_segments
    )
    if problems:
        raise ValueError(
            "'tokamax_mosaic' cannot run inside shard_map here: " + "; ".join(problems)
        )
    mesh = _mosaic_cp_mesh(q, axis_name, mesh)
    q, k, g, beta, a_log, ids, max_num_segments = _mosaic_cp_inputs(
        (q, k, v, g, beta), a_log, dt_bias, segment_ids, max_num_segments, fused_gate, axis_name
    )
    metadata = tokamax_kda_api().ContextParallelMetadata(mesh, axis_name)
    out, _ = call_tokamax(
        TOKAMAX_VARIANTS["tokamax_mosaic"],
        q,
        k,
        v,
        g,
        beta,
        a_log=a_log,
        dt_bias=dt_bias,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
        segment_ids=ids,
        lower_bound=lower_bound,
        max_num_segments=max_num_segments,
        context_parallel_metadata=metadata,
    )
    return out.astype(q.dtype)


def _mosaic_cp_inputs(
    arrays, a_log, dt_bias, segment_ids, max_num_segments, fused_gate: bool, axis_name
):
    """One rank's inputs, checked, as tokamax's CP takes them: ``(q, k, g, beta, a_log, ids,
    max_num_segments)``. tokamax has no grouped value heads (q/k heads repeated) and no
    rate-free safe gate (a_log = 0 is exactly A = 1); without segment ids every token is in
    segment 1, with them padding takes the id of the segment it follows across ranks and is
    made neutral."""
    if fused_gate:
        dims = check_fused_inputs(*arrays, a_log, dt_bias, segment_ids=segment_ids)
    else:
        dims = check_kda_inputs(*arrays, segment_ids=segment_ids)
    q, k, _, g, beta = arrays
    q, k = repeat_qk_heads(q, k, dims.groups)
    if fused_gate and a_log is None:
        a_log = jnp.zeros((dims.num_heads,), jnp.float32)
    if segment_ids is None:
        return q, k, g, beta, a_log, jnp.ones((dims.batch, dims.seq_len), jnp.int32), 1
    ids = fill_padding_ids_across_ranks(segment_ids, axis_name)
    q, g, beta = neutral_padding(q, g, beta, segment_ids != 0, raw_gate=fused_gate)
    # a bound on the segments of one slice; Mosaic pads every slot to a 64-token chunk
    max_num_segments = min(max_num_segments or dims.seq_len, dims.seq_len)
    return q, k, g, beta, a_log, ids, max_num_segments


def _mosaic_cp_problems(
    q, v, unsupported, fused_gate, lower_bound, allow_neg_eigval, chunk_size, max_num_segments
) -> list[str]:
    """Why tokamax's Mosaic CP cannot serve these arguments (TypeError for unknown ones)."""
    problems = mosaic_problems(
        key_dim=q.shape[-1], dtype=q.dtype, lower_bound=lower_bound, fused_gate=fused_gate
    )
    key_dim, value_dim = q.shape[-1], v.shape[-1]
    if key_dim % 128 or value_dim % 128:
        problems.append(
            f"tokamax_mosaic context parallelism needs K and V multiples of 128, "
            f"got K={key_dim}, V={value_dim}"
        )
    for arg in ("initial_state", "output_final_state"):
        value = unsupported.pop(arg, None)
        if value is not None and value is not False:
            problems.append(f"tokamax_mosaic context parallelism does not support {arg}")
    if unsupported:
        raise TypeError(f"kda_context_parallel got unexpected arguments {sorted(unsupported)}")
    if allow_neg_eigval:
        problems.append("tokamax_mosaic requires beta in [0, 1]; allow_neg_eigval is not supported")
    if chunk_size != TOKAMAX_CHUNK:
        problems.append(
            f"tokamax_mosaic supports chunk_size={TOKAMAX_CHUNK} only, got {chunk_size}"
        )
    try:
        check_max_num_segments(max_num_segments, optional=True)
    except ValueError as e:
        problems.append(str(e))
    return problems


def _mosaic_cp_mesh(q, axis_name, mesh):
    """The shard_map's mesh for ``ContextParallelMetadata`` (default: the abstract mesh), after
    checking the shard_map does not check vma and has ``axis_name``."""
    if axis_name in _varying_axes(q):
        raise ValueError(
            "'tokamax_mosaic' context parallelism needs jax.shard_map(..., check_vma=False): "
            "tokamax's CP kernels build loop carries that do not vary over the mesh axis, which "
            "the vma check rejects"
        )
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if axis_name not in mesh.axis_names:
        raise ValueError(
            f"'tokamax_mosaic' context parallelism needs the shard_map's mesh (mesh=...); "
            f"{axis_name!r} is not one of its axes {mesh.axis_names}"
        )
    return mesh


def _varying_axes(x) -> frozenset:
    """Mesh axes ``x`` varies over (empty unless shard_map checks vma): ``typeof(x).mat.varying``
    in jax 0.12, ``typeof(x).vma`` before."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())
