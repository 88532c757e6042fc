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
a padded 64-token chunk) and ``"chunked"`` above. On CPU (:func:`scan_forward`), that
``"chunked"`` computes calls that are not differentiated with the scan and takes the chunked
form's value and gradient under ``jax.grad``. (The recorded CPU benchmark,
``data/benchmarks/cpu-2026-12-01.json``, has the chunked forward at 0.86x the scan's time at
T = 256 and 0.98x at T = 1024: the scan is not the faster forward there.)
kda_lib's chunked form is the portable default: it is faster than tokamax's ``xla_chunked``
on CPU (see the recorded runs in ``data/benchmarks/``) and serves every input (any T,
initial/final state, both gates). An explicitly requested implementation never falls back: if
it cannot serve the inputs, a ValueError names the constraint.

``precision`` (the chunked form's matmul policy, :func:`kda_lib.kda_chunked`): None, the
default, lets every implementation compute as it does. ``"highest"`` or ``"input"`` apply to
``"chunked"``; ``"recurrent"`` computes in float32 (float64) anyway, so it honours
``"highest"`` and rejects ``"input"``; tokamax's kernels choose their own matmul precision, so
they reject both. With ``"auto"``, a precision keeps the choice on kda_lib's own forms (never
tokamax), and a decode-sized call (``"recurrent"``) is float32 whatever it says.

tokamax's layout and quirks live in :mod:`kda_lib.tokamax_backend`; this module only validates
and dispatches.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from kda_lib._checks import (
    check_chunk_size,
    check_fused_inputs,
    check_kda_inputs,
    check_precision,
    repeat_qk_heads,
    resolve_scale,
)
from kda_lib.chunked import Precision, kda_chunked
from kda_lib.gating import check_lower_bound, kda_gate
from kda_lib.norms import l2_normalize
from kda_lib.reference import kda_recurrent
from kda_lib.segments import NEUTRAL_RAW_GATE, canonical_segment_ids, zero_padding
from kda_lib.tokamax_backend import (
    TOKAMAX_IMPLEMENTATIONS,
    mosaic_problems,
    tokamax_kda,
    tpu_generation,
)

Implementation = Literal[
    "auto", "recurrent", "chunked", "tokamax_xla", "tokamax_xla_chunked", "tokamax_mosaic"
]
IMPLEMENTATIONS = ("recurrent", "chunked", "tokamax_xla", "tokamax_xla_chunked", "tokamax_mosaic")
RECURRENT_MAX_AUTO_T = 16
# platforms where "auto"'s chunked choice runs forward-only calls through the scan. On CPU the
# recorded benchmark (data/benchmarks/cpu-2026-12-01.json) has the two forwards level or the
# chunked one faster (0.86x at T = 256, 0.98x at T = 1024), while the scan's gradient is far
# slower than the chunked form's
SCAN_FORWARD_PLATFORMS = ("cpu",)
CHUNKED_ONLY = ("chunk_size", "precision")  # options the scan does not take


def select_implementation(*, seq_len: int, key_dim: int, dtype, lower_bound, fused_gate: bool):
    """The ``"auto"`` policy (module docstring), as a function so it can be inspected.

    Only a real TPU gets tokamax Mosaic: an emulated one (:func:`kda_lib.emulate_tpu`) runs the
    kernel interpreted, far slower than ``"chunked"``."""
    if tpu_generation() is not None and not mosaic_problems(
        key_dim=key_dim, dtype=dtype, lower_bound=lower_bound, fused_gate=fused_gate
    ):
        return "tokamax_mosaic"
    return portable_implementation(seq_len)


def portable_implementation(seq_len: int) -> str:
    """kda_lib's own form for ``seq_len`` tokens: ``"recurrent"`` for decode-sized calls
    (T <= RECURRENT_MAX_AUTO_T), ``"chunked"`` above."""
    return "recurrent" if seq_len <= RECURRENT_MAX_AUTO_T else "chunked"


def scan_forward(platform: str | None = None) -> bool:
    """Whether ``"auto"``, having chosen ``"chunked"``, computes forward-only calls with the
    scan on ``platform`` (default: JAX's default backend). Differentiated calls always take the
    chunked form's forward and gradient (:func:`_scan_forward_chunked_gradient`)."""
    return (platform or jax.default_backend()) in SCAN_FORWARD_PLATFORMS


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan_forward_chunked_gradient(options, q, k, v, g, beta, initial_state, segment_ids):
    """``kda_recurrent`` when only the value is needed; under ``jax.grad``/``jax.vjp`` the
    value and the gradient of ``kda_chunked`` (the two agree to float32 rounding; both are
    tested against the float64 oracle). ``options``: hashable ``(name, value)`` pairs of the
    static keyword arguments. Reverse mode only, like ``kda_chunked``."""
    scan_options = {name: value for name, value in options if name not in CHUNKED_ONLY}
    return kda_recurrent(
        q, k, v, g, beta, initial_state=initial_state, segment_ids=segment_ids, **scan_options
    )


def _chunked_with_vjp(options, q, k, v, g, beta, initial_state, segment_ids):
    def chunked(q, k, v, g, beta, initial_state):
        return kda_chunked(
            q, k, v, g, beta, initial_state=initial_state, segment_ids=segment_ids, **dict(options)
        )

    return jax.vjp(chunked, q, k, v, g, beta, initial_state)


def _chunked_gradient(options, vjp, cotangents):
    return (*vjp(cotangents), None)  # no gradient for the integer segment ids


_scan_forward_chunked_gradient.defvjp(_chunked_with_vjp, _chunked_gradient)


def _check_precision_supported(implementation: str, precision: str) -> None:
    """An explicitly chosen implementation must honour an explicit ``precision``."""
    if implementation in TOKAMAX_IMPLEMENTATIONS:
        raise ValueError(
            f"precision={precision!r} applies to kda_lib's 'chunked' implementation; "
            f"{implementation!r} chooses its own matmul precision (pass precision=None)"
        )
    if implementation == "recurrent" and precision != "highest":
        raise ValueError(
            f"precision={precision!r} applies to the 'chunked' implementation; 'recurrent' "
            "computes in float32 throughout (pass precision=None or 'highest')"
        )


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
    precision: Precision | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Kimi Delta Attention with a chosen (or automatically selected) implementation.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; beta: ``[B, T, HV]``, HV a positive
        multiple of H (grouped value heads, fla's ``num_v_heads``: value head j reads q/k head
        ``j // (HV // H)``; HV = H without). ``"recurrent"`` maps heads natively; the chunked
        form and tokamax's kernels repeat the q/k heads.
      g: ``[B, T, HV, K]``: log-space decay (``<= 0``) when ``a_log`` and ``lower_bound`` are
        None, else the raw gate input, activated inside by :func:`kda_lib.kda_gate` (fused
        into tokamax's kernels).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` (float32), state entering the row's first segment.
      output_final_state: also return the ``[B, HV, K, V]`` state after the last valid token.
      segment_ids: ``[B, T]`` int, 1-based, 0 = padding (see :mod:`kda_lib.segments`: a new
        segment wherever a real token's id differs from the previous real token's).
      max_num_segments: static bound on the segments in one row, needed by tokamax backends
        with segments. Eager calls check it; under ``jit`` a row with more segments comes out
        NaN (outputs and final state), never silently wrong.
      a_log: ``[HV]`` per-head log rate; turns on the fused gate.
      dt_bias: ``[HV * K]`` or ``[HV, K]`` gate bias (fused gate only).
      lower_bound: safe-gate bound in [-5, 0); turns on the fused gate too. With ``a_log``
        None it is the safe gate without a rate, ``g = lower_bound * sigmoid(g + dt_bias)``
        (fla's ``A_log=None``); with ``a_log`` and None it is the softplus gate. ``dt_bias``
        with neither is refused (fla has no rate-free softplus gate).
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: chunk length of the chunked form, a power of two (default 64; validated for
        every implementation; tokamax's chunked backends take 64 only).
      implementation: one of IMPLEMENTATIONS or ``"auto"``.
      precision: the chunked form's matmul policy, ``"highest"``, ``"input"`` or None (see
        :func:`kda_lib.kda_chunked`; None: ``"input"``, i.e. bfloat16/float16 operands with
        float32 accumulation for bfloat16/float16 inputs). What the other implementations do
        with it: module docstring (a value one cannot honour raises ValueError).

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``.
    """
    fused_gate = a_log is not None or lower_bound is not None
    check_lower_bound(lower_bound)
    if not fused_gate and dt_bias is not None:
        raise ValueError(
            "dt_bias and lower_bound only apply with the fused gate: pass a_log (softplus gate) "
            "or lower_bound (safe gate) too, or activate the gate yourself with kda_lib.kda_gate"
        )
    if implementation != "auto" and implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be 'auto' or one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    if fused_gate:
        dims = check_fused_inputs(
            q,
            k,
            v,
            g,
            beta,
            a_log,
            dt_bias,
            initial_state=initial_state,
            segment_ids=segment_ids,
            allow_neg_eigval=allow_neg_eigval,
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
    q, k, v, g, beta = (jnp.asarray(x) for x in (q, k, v, g, beta))
    scale = resolve_scale(scale, dims.key_dim)
    chunk_size = check_chunk_size(chunk_size)
    check_precision(precision)
    if implementation != "auto" and precision is not None:
        _check_precision_supported(implementation, precision)
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state must be a bool, got {output_final_state!r}")
    if initial_state is not None:
        initial_state = jnp.asarray(initial_state)
    if a_log is not None:
        a_log = jnp.asarray(a_log)
    if fused_gate:
        if dt_bias is not None:
            dt_bias = jnp.asarray(dt_bias).reshape(dims.num_heads * dims.key_dim)
    if segment_ids is not None:
        # one rule for every implementation: a new segment wherever a real token's id differs
        # from the previous real token's (reused or int64 ids included); padding by selection
        segment_ids = canonical_segment_ids(jnp.asarray(segment_ids))
        q, k, v, g, beta = zero_padding(
            segment_ids, q, k, v, g, beta, neutral_gate=NEUTRAL_RAW_GATE if fused_gate else 0.0
        )
    scan_on_forward = False
    if implementation == "auto":
        implementation = (
            select_implementation(
                seq_len=dims.seq_len,
                key_dim=dims.key_dim,
                dtype=q.dtype,
                lower_bound=lower_bound,
                fused_gate=fused_gate,
            )
            if precision is None
            else portable_implementation(dims.seq_len)
        )
        scan_on_forward = implementation == "chunked" and precision is None and scan_forward()
    if implementation in TOKAMAX_IMPLEMENTATIONS:
        # tokamax has no grouped value heads (repeated here) and no rate-free safe gate
        # (a_log = 0 is exactly A = 1)
        q_rep, k_rep = repeat_qk_heads(q, k, dims.groups)
        if fused_gate and a_log is None:
            a_log = jnp.zeros((dims.num_heads,), jnp.float32)
        return tokamax_kda(
            implementation,
            q_rep,
            k_rep,
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
    out_dtype = q.dtype
    if use_qk_l2norm:  # normalised q/k stay float32: the kernel computes in float32 anyway
        q, k = l2_normalize(q, keep_float32=True), l2_normalize(k, keep_float32=True)
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
        out, final = kda_recurrent(q, k, v, g, beta, **kwargs)
    elif scan_on_forward:
        static = dict(kwargs, chunk_size=chunk_size, precision=precision)
        initial_state, segment_ids = static.pop("initial_state"), static.pop("segment_ids")
        out, final = _scan_forward_chunked_gradient(
            tuple(sorted(static.items())), q, k, v, g, beta, initial_state, segment_ids
        )
    else:
        out, final = kda_chunked(
            q, k, v, g, beta, chunk_size=chunk_size, precision=precision, **kwargs
        )
    return out.astype(out_dtype), final
