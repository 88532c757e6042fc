"""``kda(...)``: one entry point for every KDA implementation.

``"recurrent"`` (:func:`kda_lib.kda_recurrent`, the oracle), ``"chunked"``
(:func:`kda_lib.kda_chunked`), and tokamax's ``"tokamax_xla"``, ``"tokamax_xla_chunked"`` (the
in-kernel safe gate only) and ``"tokamax_mosaic"`` (TPU v6+, or :func:`kda_lib.emulate_tpu`),
which need the ``tokamax`` extra (ModuleNotFoundError naming it, before any work). ``"auto"``
picks one (:func:`kda_lib.ops.registry.choose`; the policy and its measurements:
docs/DESIGN.md section 4). A named implementation never falls back: if it cannot serve the
call, a ValueError names the constraint.
"""

from __future__ import annotations

import jax

from kda_lib.ops.chunked import Precision
from kda_lib.ops.contract import KDAResult, kda_result
from kda_lib.ops.registry import (
    IMPLEMENTATIONS,
    RECURRENT_MAX_AUTO_T,
    check_call,
    portable_implementation,
    run,
    select_implementation,
)

__all__ = [
    "IMPLEMENTATIONS",
    "KDAResult",
    "RECURRENT_MAX_AUTO_T",
    "kda",
    "portable_implementation",
    "select_implementation",
]


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
    use_gate_in_kernel: bool = False,
    use_qk_l2norm: bool = False,
    allow_neg_eigval: bool = False,
    chunk_size: int = 64,
    implementation: str = "auto",
    precision: Precision | None = None,
    output_chunk_states: bool = False,
    output_token_states: bool = False,
):
    """Kimi Delta Attention with a chosen (or automatically selected) implementation.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; beta: ``[B, T, HV]``, HV a positive
        multiple of H (grouped value heads: value head j reads q/k head ``j // (HV // H)``).
      g: ``[B, T, HV, K]``: log-space decay (``<= 0``), or with ``use_gate_in_kernel`` the raw
        gate input, activated inside by :func:`kda_lib.kda_gate` (fused into tokamax's
        kernels).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` (float32), state entering the row's first segment.
      output_final_state: also return the ``[B, HV, K, V]`` state after the last valid token.
      segment_ids: ``[B, T]`` int, 0 = padding; a new segment wherever a real token's id
        differs from the previous real token's (:mod:`kda_lib.ops.segments`).
      max_num_segments: static bound on the segments in one row (tokamax with segments);
        checked when eager, under ``jit`` a row with more comes out NaN.
      a_log: ``[HV]`` per-head log rate of the in-kernel gate (``use_gate_in_kernel`` only).
      dt_bias: ``[HV * K]`` or ``[HV, K]`` gate bias (``use_gate_in_kernel`` only).
      lower_bound: a bound in [-5, 0). With ``use_gate_in_kernel`` it selects the safe gate
        ``lower_bound * sigmoid(exp(a_log) * (g + dt_bias))`` (``a_log`` None: rate 1, fla's
        ``A_log=None``; ``lower_bound`` None: the softplus gate, which needs ``a_log``).
        Without, as in fla, it is a promise that the log-space ``g >= lower_bound``, checked
        when ``g`` is concrete (ValueError naming both); it never switches the gate on.
      use_gate_in_kernel: activate the raw ``g`` inside (default False; fla's and tokamax's
        name). ``a_log`` or ``dt_bias`` without it is refused.
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: the chunked form's chunk length, a power of two (default 64; checked for
        every implementation; tokamax's chunked kernels take 64 only).
      implementation: one of IMPLEMENTATIONS or ``"auto"``.
      precision: the chunked form's matmul policy, ``"highest"``, ``"input"`` or None (see
        :func:`kda_lib.kda_chunked`); ``"recurrent"`` honours ``"highest"`` only, tokamax none.
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``, the
        state after every full chunk (default False; ``"chunked"`` and ``"recurrent"``).
      output_token_states: also return ``token_states [B, T, HV, K, V]``, the state after
        every token (default False; ``"recurrent"``, which ``"auto"`` picks). Either refused,
        naming it, when the states cannot fit in this device's memory.

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` or ``output_token_states`` the 4-tuple :class:`KDAResult`
      ``(output, final_state, chunk_states, token_states)`` (None where not asked), so that
      ``o, state = kda(..., output_chunk_states=True)`` fails loudly on unpacking.
    """
    # every parameter by name, before any other local exists (check_call takes them all)
    backend, arrays, options = check_call(**locals())
    result = run(backend, arrays, options)
    return kda_result(*result, asked=options.output_chunk_states or options.output_token_states)
