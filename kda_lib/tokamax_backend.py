"""tokamax's KDA behind kda_lib's conventions: every tokamax quirk lives here.

tokamax (``tokamax._src.ops.kda``) is head-first (``[H, B, T, D]``), keeps one state slot per
segment (``[B, N, H, K, V]``, indexed by segment ordinals), needs T padded to its 64-token
chunk for its chunked backends, disagrees between backends on padding (id 0) inside a row,
and runs its Mosaic kernel on a TPU v6+ only (or in Pallas interpret mode under
:func:`kda_lib.emulate_tpu`), with its own context-parallel route. This module adapts all of
that to kda_lib's batch-first call (:func:`tokamax_kda`, used by :func:`kda_lib.kda`) and to
kda_lib's context-parallel call (:func:`tokamax_mosaic_context_parallel`, used by
:func:`kda_lib.context_parallel.kda_context_parallel`).
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from kda_lib import emulation
from kda_lib._checks import check_fused_inputs, check_kda_inputs, repeat_qk_heads
from kda_lib.segments import (
    check_max_num_segments,
    fill_padding_ids_across_ranks,
    isolate_non_finite,
    neutral_padding,
    overflowing_keys_as_nan,
    restore_non_finite,
    segment_ordinals,
)

TOKAMAX_IMPLEMENTATIONS = {
    "tokamax_xla": "xla",
    "tokamax_xla_chunked": "xla_chunked",
    "tokamax_mosaic": "mosaic",
}
TOKAMAX_CHUNK = 64


class _QuietAutotuneMiss(logging.Filter):
    """tokamax logs a WARNING for every untuned shape; it is noise for users of the adapter."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Autotuning cache miss" not in record.getMessage()


@functools.cache
def tokamax_kda_api():
    """tokamax's KDA api module (``tokamax._src.ops.kda.api``; tokamax is a dependency)."""
    from tokamax._src.ops.kda import api

    logging.getLogger("absl").addFilter(_QuietAutotuneMiss())
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
    """Why tokamax Mosaic cannot serve these inputs here (empty list: it can).

    Inside :func:`kda_lib.emulate_tpu` (or with ``KDA_EMULATE_TPU`` set) a CPU counts as the
    emulated TPU; :func:`select_implementation` still never picks the emulated kernel.
    """
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


def tokamax_kda(
    implementation,
    q,
    k,
    v,
    g,
    beta,
    *,
    dims,
    scale,
    initial_state,
    output_final_state,
    segment_ids,
    max_num_segments,
    a_log,
    dt_bias,
    lower_bound,
    use_qk_l2norm,
    allow_neg_eigval,
    chunk_size,
):
    fused_gate = a_log is not None
    name = implementation
    if allow_neg_eigval:
        raise ValueError(f"{name} requires beta in [0, 1]; allow_neg_eigval is not supported")
    if implementation == "tokamax_xla_chunked" and not (fused_gate and lower_bound is not None):
        raise ValueError(
            "tokamax_xla_chunked needs the fused safe gate: pass a_log and lower_bound "
            "(and a raw gate input g); use implementation='chunked' for log-space gates"
        )
    if implementation == "tokamax_mosaic":
        problems = mosaic_problems(
            key_dim=dims.key_dim, dtype=q.dtype, lower_bound=lower_bound, fused_gate=fused_gate
        )
        if problems:
            raise ValueError("; ".join(problems))
    if implementation != "tokamax_xla" and chunk_size != TOKAMAX_CHUNK:
        raise ValueError(f"{name} supports chunk_size={TOKAMAX_CHUNK} only, got {chunk_size}")
    if segment_ids is not None and max_num_segments is None:
        raise ValueError(
            f"{name} with segment_ids needs max_num_segments (a static bound on the ids)"
        )
    batch, seq_len, heads, key_dim, value_dim, _ = dims
    if segment_ids is not None:
        check_max_num_segments(max_num_segments)
    # tokamax's chunked kernels mix a chunk's tokens in matmuls: compute on finite stand-ins and
    # put NaN back exactly where the recurrence has it
    if not use_qk_l2norm:  # (normalised keys cannot overflow)
        k = overflowing_keys_as_nan(k)  # kept in its segment from its token on, as in chunked
    q, k, v, g, beta, initial_state, non_finite = isolate_non_finite(
        q, k, v, g, beta, initial_state, segment_ids, raw_gate=fused_gate
    )
    out_dtype = q.dtype
    if implementation == "tokamax_xla_chunked" and any(
        jnp.dtype(x.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)) for x in (q, k, v)
    ):
        # tokamax's pure-JAX chunked form computes in its inputs' dtype: on fla's
        # context-parallel inputs (issue 30) bf16 gave relative errors of 1.05e-2 against the
        # float64 oracle, above fla's 8e-3; in float32 it matches the recurrence (1.7e-3, the
        # rounding of the bf16 output). It is a portable reference, not a fast path: float32.
        q, k, v, g, beta = (x.astype(jnp.float32) for x in (q, k, v, g, beta))
    # tokamax's chunked kernels need T % 64 == 0
    pad = (-seq_len) % TOKAMAX_CHUNK if implementation != "tokamax_xla" else 0
    if pad:
        widths = [(0, 0), (0, pad)]
        q, k, v, g = (jnp.pad(x, widths + [(0, 0), (0, 0)]) for x in (q, k, v, g))
        beta = jnp.pad(beta, widths + [(0, 0)])
        valid = jnp.pad(
            jnp.ones((batch, seq_len), bool) if segment_ids is None else segment_ids != 0, widths
        )
        if segment_ids is not None:
            segment_ids = jnp.pad(segment_ids, widths)
    elif segment_ids is not None:
        valid = segment_ids != 0
    else:
        valid = None

    num_states = 1
    tk_segments = None
    too_many = None  # [B]: rows with more segments than max_num_segments (traced ids only)
    if segment_ids is not None:
        num_states = max_num_segments
        tk_segments = segment_ordinals(segment_ids)
        if not isinstance(tk_segments, jax.core.Tracer):
            most = int(tk_segments.max())
            if most > max_num_segments:
                raise ValueError(
                    f"segment_ids has a row with {most} segments but max_num_segments="
                    f"{max_num_segments}"
                )
        else:  # under jit: such a row would be silently wrong; make it unmistakably NaN
            too_many = tk_segments.max(axis=1) > max_num_segments
        if implementation == "tokamax_mosaic":
            # Mosaic aligns every segment slot to a 64-token chunk, so its work grows with the
            # slot count: keep it tight (a row has at most T segments; concrete ids: the count)
            num_states = min(num_states, seq_len + pad)
            if not isinstance(tk_segments, jax.core.Tracer):
                num_states = min(num_states, int(tk_segments.max()))
    elif pad:
        tk_segments = jnp.ones((batch, seq_len + pad), jnp.int32)
    if valid is not None:
        # tokamax's backends disagree on padding (id 0) inside a row, so padding is made neutral
        # instead: part of the segment before it, with no decay, no write and a zero query
        q, g, beta = neutral_padding(q, g, beta, valid, raw_gate=fused_gate)
    tk_state = None
    if initial_state is not None:
        state = initial_state.astype(jnp.float32)[:, None]  # state of the row's first segment
        tk_state = (
            state
            if num_states == 1
            else jnp.pad(state, [(0, 0), (0, num_states - 1), (0, 0), (0, 0), (0, 0)])
        )

    out, final = call_tokamax_batch_first(
        implementation,
        q,
        k,
        v,
        g,
        beta,
        a_log=a_log,
        dt_bias=dt_bias,
        scale=scale,
        initial_state=tk_state,
        output_final_state=output_final_state,
        use_qk_l2norm=use_qk_l2norm,
        segment_ids=tk_segments,
        lower_bound=lower_bound,
        max_num_segments=None if tk_segments is None else num_states,
    )
    out = out[:, :seq_len].astype(out_dtype)
    if not output_final_state:
        final = None
    elif tk_segments is None:
        final = final[:, 0].astype(jnp.float32)
    else:
        last = tk_segments[:, -1] - 1  # ordinal of the row's last segment
        last = jnp.clip(last, 0, num_states - 1)
        final = jnp.take_along_axis(final, last[:, None, None, None, None], axis=1)[:, 0]
        final = final.astype(jnp.float32)
    out, final = restore_non_finite(out, final, non_finite)
    if too_many is not None:
        out = jnp.where(too_many[:, None, None, None], jnp.nan, out)
        if final is not None:
            final = jnp.where(too_many[:, None, None, None], jnp.nan, final)
    return out, final


def call_tokamax_batch_first(
    implementation: str, q, k, v, g, beta, *, a_log=None, dt_bias=None, **kwargs
):
    """tokamax's KDA on kda_lib's batch-first layout: ``q, k, g [B, T, H, K]``,
    ``v [B, T, H, V]``, ``beta [B, T, H]`` -> ``(out [B, T, H, V], final_state)``.

    Moves the head axis first (tokamax's ``[H, B, T, D]``) and back, and passes the fused
    gate's ``a_log`` and ``dt_bias`` (tokamax's ``delta_time_bias``) in float32, with
    ``use_gate_in_kernel`` set when ``a_log`` is given. ``kwargs`` go to tokamax as they are.
    """

    def head_first(x):
        return jnp.moveaxis(x, 2, 0)

    out, final = call_tokamax(
        tokamax_kda_api(),
        implementation,
        *(head_first(x) for x in (q, k, v, g, beta)),
        a_log=None if a_log is None else a_log.astype(jnp.float32),
        delta_time_bias=None if dt_bias is None else dt_bias.astype(jnp.float32),
        use_gate_in_kernel=a_log is not None,
        **kwargs,
    )
    return jnp.moveaxis(out, 0, 2), final


def call_tokamax(api, implementation: str, *args, **kwargs):
    """``api.kimi_delta_attention(*args, **kwargs)`` with kda_lib's implementation name; under
    TPU emulation, tokamax Mosaic goes through its op with the device check bypassed."""
    if implementation == "tokamax_mosaic" and tpu_generation() is None and emulation.is_emulating():
        return emulation.tokamax_mosaic_op()(*args, **kwargs)
    return api.kimi_delta_attention(
        *args, implementation=TOKAMAX_IMPLEMENTATIONS[implementation], **kwargs
    )


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
    use_qk_l2norm=False,
    allow_neg_eigval=False,
    chunk_size=TOKAMAX_CHUNK,
    max_num_segments=None,
    **unsupported,
):
    """tokamax's own CP for its Mosaic kernel: ``ContextParallelMetadata(mesh, axis_name)``.

    tokamax all-gathers per-rank ``(S_ext, M)`` summaries like kda_lib's path, but derives the
    chain from rank-local segment ids: padding (id 0) is filled with the id of the segment it
    follows (so the chain sees through it) and made neutral (no decay, no write, zero output);
    without ids every token gets id 1 and ``max_num_segments=1``. Its constraints: a TPU v6+
    (or :func:`kda_lib.emulate_tpu`), K and V multiples of 128 (and K <= 256), float32/bfloat16,
    the fused gate with ``lower_bound``, no initial/final state, beta in [0, 1], chunk_size 64,
    and a ``shard_map`` with ``check_vma=False``. Grouped value heads (v, g, beta with HV a
    multiple of q's H) are served by repeating the q/k heads; ``a_log=None`` with
    ``lower_bound`` by ``a_log = 0`` (tokamax's CP loops carry values that do not
    vary over the mesh axis).
    """
    fused_gate = a_log is not None or lower_bound is not None
    name = "'tokamax_mosaic'"
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
    if problems:
        raise ValueError(f"{name} cannot run inside shard_map here: " + "; ".join(problems))
    if axis_name in _varying_axes(q):
        raise ValueError(
            f"{name} context parallelism needs jax.shard_map(..., check_vma=False): tokamax's CP "
            "kernels build loop carries that do not vary over the mesh axis, which the vma "
            "check rejects"
        )
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if axis_name not in mesh.axis_names:
        raise ValueError(
            f"{name} context parallelism needs the shard_map's mesh (mesh=...); "
            f"{axis_name!r} is not one of its axes {mesh.axis_names}"
        )
    if fused_gate:
        dims = check_fused_inputs(q, k, v, g, beta, a_log, dt_bias, segment_ids=segment_ids)
    else:
        dims = check_kda_inputs(q, k, v, g, beta, segment_ids=segment_ids)
    batch, seq_len = dims.batch, dims.seq_len
    # tokamax has no grouped value heads (q/k heads repeated) and no rate-free safe gate
    # (a_log = 0 is exactly A = 1)
    q, k = repeat_qk_heads(q, k, dims.groups)
    if fused_gate and a_log is None:
        a_log = jnp.zeros((dims.num_heads,), jnp.float32)
    if segment_ids is None:
        ids = jnp.ones((batch, seq_len), jnp.int32)
        max_num_segments = 1
    else:
        ids = fill_padding_ids_across_ranks(segment_ids, axis_name)
        q, g, beta = neutral_padding(q, g, beta, segment_ids != 0, raw_gate=fused_gate)
        # a bound on the segments of one slice; Mosaic pads every slot to a 64-token chunk
        max_num_segments = min(max_num_segments or seq_len, seq_len)

    metadata = tokamax_kda_api().ContextParallelMetadata(mesh, axis_name)
    out, _ = call_tokamax_batch_first(
        "tokamax_mosaic",
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


def _varying_axes(x) -> frozenset:
    """Mesh axes ``x`` varies over (empty unless shard_map checks vma): ``typeof(x).mat.varying``
    in jax 0.12, ``typeof(x).vma`` before."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())
