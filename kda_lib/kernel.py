"""``kda(...)``: one entry point for every KDA implementation.

Implementations:

* ``"recurrent"``: :func:`kda_lib.kda_recurrent`, token by token (the oracle; decoding).
* ``"chunked"``: :func:`kda_lib.kda_chunked`, kda_lib's portable chunkwise form.
* ``"tokamax_xla"``: tokamax's token-by-token XLA reference.
* ``"tokamax_xla_chunked"``: tokamax's pure-JAX chunked form (needs the fused gate:
  ``a_log`` and ``lower_bound``).
* ``"tokamax_mosaic"``: tokamax's Pallas Mosaic kernel, TPU v6 or newer (on CPU: inside
  :func:`kda_lib.emulate_tpu`, interpreted; for checking, not speed).

``"auto"`` policy (:func:`select_implementation`): tokamax Mosaic on a (real) TPU v6+ when its
constraints hold; otherwise ``"recurrent"`` for T <= 16 (decode steps, where one scan step beats
a padded 64-token chunk) and ``"chunked"`` above. kda_lib's chunked form is faster than
tokamax's ``xla_chunked`` on CPU (fwd+bwd 0.63x at T=4096, data/benchmarks/) and serves
every input (any T, initial/final state, both gates), so it is the portable default. An
explicitly requested implementation never falls back: if it cannot serve the inputs, a
ValueError names the constraint.

Only this module knows tokamax's head-first layout ``[H, B, T, D]`` and its per-segment state
``[B, N, H, K, V]``; tokamax is imported lazily.
"""

from __future__ import annotations

import importlib
import logging
from typing import Literal

import jax
import jax.numpy as jnp

from kda_lib import emulation
from kda_lib._checks import check_kda_inputs
from kda_lib.chunked import kda_chunked
from kda_lib.gating import check_lower_bound, kda_gate
from kda_lib.reference import first_segment_id, kda_recurrent

Implementation = Literal[
    "auto", "recurrent", "chunked", "tokamax_xla", "tokamax_xla_chunked", "tokamax_mosaic"
]
IMPLEMENTATIONS = ("recurrent", "chunked", "tokamax_xla", "tokamax_xla_chunked", "tokamax_mosaic")
TOKAMAX_IMPLEMENTATIONS = {
    "tokamax_xla": "xla",
    "tokamax_xla_chunked": "xla_chunked",
    "tokamax_mosaic": "mosaic",
}
RECURRENT_MAX_AUTO_T = 16
TOKAMAX_CHUNK = 64
TOKAMAX_INSTALL_HINT = "pip install tokamax==0.0.17 (needs Python >= 3.12)"
_TOKAMAX_MODULES = ("tokamax._src.ops.kda.api", "tokamax._src.ops.experimental.kda.api")


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis, computed in float32, cast back."""
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return (xf * jax.lax.rsqrt(jnp.sum(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


class _QuietAutotuneMiss(logging.Filter):
    """tokamax logs a WARNING for every untuned shape; it is noise for users of the adapter."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Autotuning cache miss" not in record.getMessage()


def tokamax_kda_api():
    """tokamax's KDA api module (0.0.17: ``_src.ops.kda``; older: ``_src.ops.experimental.kda``)."""
    errors = []
    for name in _TOKAMAX_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
            continue
        logging.getLogger("absl").addFilter(_QuietAutotuneMiss())
        return module
    raise ImportError(
        "a tokamax implementation was requested but tokamax's KDA could not be imported "
        f"({'; '.join(errors)}). Install it with: {TOKAMAX_INSTALL_HINT}"
    )


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


def select_implementation(*, seq_len: int, key_dim: int, dtype, lower_bound, fused_gate: bool):
    """The ``"auto"`` policy (module docstring), as a function so it can be inspected.

    Only a real TPU gets tokamax Mosaic: an emulated one (:func:`kda_lib.emulate_tpu`) runs the
    kernel interpreted, far slower than ``"chunked"``."""
    if tpu_generation() is not None and not mosaic_problems(
        key_dim=key_dim, dtype=dtype, lower_bound=lower_bound, fused_gate=fused_gate
    ):
        try:
            tokamax_kda_api()
            return "tokamax_mosaic"
        except ImportError:
            pass
    return "recurrent" if seq_len <= RECURRENT_MAX_AUTO_T else "chunked"


def kda(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    segment_ids: jax.Array | None = None,
    max_num_segments: int | None = None,
    a_log: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    lower_bound: float | None = None,
    use_qk_l2norm: bool = False,
    allow_neg_eigval: bool = False,
    chunk_size: int = 64,
    implementation: Implementation = "auto",
) -> tuple[jax.Array, jax.Array | None]:
    """Kimi Delta Attention with a chosen (or automatically selected) implementation.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; beta: ``[B, T, H]``.
      g: ``[B, T, H, K]``: log-space decay (``<= 0``) when ``a_log`` is None, else the raw gate
        input, activated inside by :func:`kda_lib.kda_gate` (fused into tokamax's kernels).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, H, K, V]`` (float32), state entering the row's first segment.
      output_final_state: also return the ``[B, H, K, V]`` state after the last valid token.
      segment_ids: ``[B, T]`` int, 1-based, 0 = padding (see :func:`kda_lib.kda_recurrent`).
      max_num_segments: static bound on segment ids, needed by tokamax backends with segments.
      a_log: ``[H]`` per-head log rate; turns on the fused gate.
      dt_bias: ``[H * K]`` gate bias (fused gate only).
      lower_bound: safe-gate bound in [-5, 0) (fused gate only); None = softplus gate.
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: chunk length of the chunked form (default 64).
      implementation: one of IMPLEMENTATIONS or ``"auto"``.

    Returns:
      ``(o [B, T, H, V] in q's dtype, final_state [B, H, K, V] float32 | None)``.
    """
    fused_gate = a_log is not None
    check_lower_bound(lower_bound)
    if not fused_gate and (dt_bias is not None or lower_bound is not None):
        raise ValueError(
            "dt_bias and lower_bound only apply with the fused gate: pass a_log too "
            "(or activate the gate yourself with kda_lib.kda_gate)"
        )
    if implementation != "auto" and implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be 'auto' or one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    if fused_gate:
        dims = _check_fused(
            q, k, v, g, beta, initial_state, segment_ids, allow_neg_eigval, a_log, dt_bias
        )
    else:
        dims = check_kda_inputs(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            segment_ids=segment_ids,
            allow_neg_eigval=allow_neg_eigval,
        )
    if implementation == "auto":
        implementation = select_implementation(
            seq_len=dims.seq_len,
            key_dim=dims.key_dim,
            dtype=q.dtype,
            lower_bound=lower_bound,
            fused_gate=fused_gate,
        )
    if implementation in TOKAMAX_IMPLEMENTATIONS:
        return _tokamax_kda(
            implementation,
            q,
            k,
            v,
            g,
            beta,
            dims=dims,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            segment_ids=segment_ids,
            max_num_segments=max_num_segments,
            a_log=a_log,
            dt_bias=dt_bias,
            lower_bound=lower_bound,
            use_qk_l2norm=use_qk_l2norm,
            allow_neg_eigval=allow_neg_eigval,
            chunk_size=chunk_size,
        )
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    if fused_gate:
        g = kda_gate(g, a_log, dt_bias, lower_bound=lower_bound)
    kwargs = dict(
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        segment_ids=segment_ids,
        allow_neg_eigval=allow_neg_eigval,
    )
    if implementation == "recurrent":
        return kda_recurrent(q, k, v, g, beta, **kwargs)
    return kda_chunked(q, k, v, g, beta, chunk_size=chunk_size, **kwargs)


def _check_fused(q, k, v, g, beta, initial_state, segment_ids, allow_neg_eigval, a_log, dt_bias):
    # the raw gate may be positive: validate shapes with a zero stand-in for g
    dims = check_kda_inputs(
        q,
        k,
        v,
        jnp.zeros(g.shape, g.dtype) if g.shape == q.shape else g,
        beta,
        initial_state=initial_state,
        segment_ids=segment_ids,
        allow_neg_eigval=allow_neg_eigval,
    )
    if a_log.shape != (dims.num_heads,):
        raise ValueError(f"a_log must have shape [H]=({dims.num_heads},), got {a_log.shape}")
    if dt_bias is not None and dt_bias.shape != (dims.num_heads * dims.key_dim,):
        raise ValueError(
            f"dt_bias must have shape [H*K]=({dims.num_heads * dims.key_dim},), got {dt_bias.shape}"
        )
    return dims


def _tokamax_kda(
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
    tokamax_kda_api()  # fails here, naming the problem, when tokamax cannot be imported
    batch, seq_len, heads, key_dim, value_dim = dims
    if segment_ids is not None:
        if (
            isinstance(max_num_segments, bool)
            or not isinstance(max_num_segments, int)
            or max_num_segments < 1
        ):
            raise ValueError(f"max_num_segments must be a positive int, got {max_num_segments!r}")
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
    if segment_ids is not None:
        num_states = max_num_segments
        tk_segments = _segment_ordinals(segment_ids, max_num_segments)
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
        # instead: part of the segment before it, with no decay, no write and a zero query.
        # -1e30 activates to exactly g = 0 in both gates, with zero (not NaN) gradients
        neutral_gate = -1e30 if fused_gate else 0.0
        g = jnp.where(valid[..., None, None], g, neutral_gate)
        beta = jnp.where(valid[..., None], beta, 0.0)
        q = jnp.where(valid[..., None, None], q, 0.0)
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
    out = out[:, :seq_len]
    if not output_final_state:
        return out, None
    if tk_segments is None:
        return out, final[:, 0].astype(jnp.float32)
    last = tk_segments[:, -1] - 1  # ordinal of the row's last segment
    picked = jnp.take_along_axis(final, last[:, None, None, None, None], axis=1)[:, 0]
    return out, picked.astype(jnp.float32)


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


def fill_padding_ids(segment_ids: jax.Array, fallback: jax.Array) -> jax.Array:
    """``segment_ids [B, T]`` with every padding token (id 0) given the id of the last
    non-padding token before it in its row, or ``fallback [B]`` where there is none."""
    valid = segment_ids != 0
    positions = jnp.arange(segment_ids.shape[1])
    last_valid = jax.lax.cummax(jnp.where(valid, positions, -1), axis=1)
    return jnp.where(
        last_valid >= 0,
        jnp.take_along_axis(segment_ids, jnp.maximum(last_valid, 0), 1),
        fallback[:, None],
    )


def _segment_ordinals(segment_ids: jax.Array, max_num_segments: int) -> jax.Array:
    """Renumber each row's segments 1, 2, ... in order; padding joins the segment before it
    (or the first one). tokamax indexes per-segment states by these ordinals."""
    ids = segment_ids.astype(jnp.int32)
    current = fill_padding_ids(ids, first_segment_id(ids))
    previous = jnp.concatenate([current[:, :1], current[:, :-1]], axis=1)
    ordinals = 1 + jnp.cumsum(current != previous, axis=1)
    if not isinstance(ordinals, jax.core.Tracer):
        most = int(ordinals.max())
        if most > max_num_segments:
            raise ValueError(
                f"segment_ids has a row with {most} segments but max_num_segments="
                f"{max_num_segments}"
            )
    return ordinals.astype(jnp.int32)
