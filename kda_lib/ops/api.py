"""``kda(...)``: one entry point for every KDA implementation.

Implementations:

* ``"recurrent"``: :func:`kda_lib.kda_recurrent`, token by token (the oracle; decoding).
* ``"chunked"``: :func:`kda_lib.kda_chunked`, kda_lib's portable chunkwise form.
* ``"tokamax_xla"``: tokamax's token-by-token XLA reference.
* ``"tokamax_xla_chunked"``: tokamax's pure-JAX chunked form (needs the fused safe gate:
  ``lower_bound``, with or without ``a_log``).
* ``"tokamax_mosaic"``: tokamax's Pallas Mosaic kernel, TPU v6 or newer (on CPU: inside
  :func:`kda_lib.emulate_tpu`, interpreted; for checking, not speed).

The three ``tokamax_*`` need tokamax, an extra (``pip install 'kda-lib[tokamax]'``; part of
``[tpu]``, ``[notebook]`` and ``[dev]``): asked for without it, they raise
:class:`ModuleNotFoundError` naming the extra, before any work.

``"auto"`` policy (:func:`kda_lib.ops.registry.choose`): tokamax Mosaic on a (real) TPU v6+ when
tokamax is installed and its constraints hold; otherwise ``"recurrent"`` for T <= 16 (decode
steps, where one scan step beats a padded 64-token chunk); above, on CPU, the scan for a call
that is not differentiated (while the state updated per token, ``B * HV * K * V``, is under
65536 numbers; the chunked form from there) and exactly the chunked form's forward and backward
for one that is (a ``custom_vjp``, :class:`kda_lib.ops.registry.Routed`); ``"chunked"`` on other
platforms. The rules come from a recorded grid (``docs/DESIGN.md`` section 4 names the file and
what it holds).
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

The implementations are objects in :mod:`kda_lib.ops.registry` (the registry, with ``"auto"``'s
policy); tokamax's layout and quirks live in :mod:`kda_lib.ops.tokamax.adapter`. This module is the
entry point: it checks the call once (:func:`kda_lib.ops.registry.check_call`) and calls the
backend.
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
        multiple of H (grouped value heads, fla's ``num_v_heads``: value head j reads q/k head
        ``j // (HV // H)``; HV = H without). ``"recurrent"`` maps heads natively; the chunked
        form and tokamax's kernels repeat the q/k heads.
      g: ``[B, T, HV, K]``: log-space decay (``<= 0``) when ``a_log`` and ``lower_bound`` are
        None, else the raw gate input, activated inside by :func:`kda_lib.kda_gate` (fused
        into tokamax's kernels).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` (float32), state entering the row's first segment.
      output_final_state: also return the ``[B, HV, K, V]`` state after the last valid token.
      segment_ids: ``[B, T]`` int, 1-based, 0 = padding (see :mod:`kda_lib.ops.segments`: a new
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
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``, the
        state after every full chunk of ``chunk_size`` tokens (prefix caching; default False).
        Served by ``"chunked"`` (from the states its chunk scan carries, no second pass) and
        ``"recurrent"`` (a scan over chunks of steps); tokamax's kernels refuse it by name.
      output_token_states: also return ``token_states [B, T, HV, K, V]``, the state after
        every token (speculative decoding; default False). Served by ``"recurrent"`` only;
        ``"auto"`` picks it.

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` or ``output_token_states`` a :class:`KDAResult` ``(output,
      final_state, chunk_states, token_states)`` (None where not asked; its docstring says
      what a boundary state is with an initial state and with segment ids).
    """
    # every parameter by name, before any other local exists (check_call takes them all)
    backend, arrays, options = check_call(**locals())
    result = run(backend, arrays, options)
    return kda_result(*result, asked=options.output_chunk_states or options.output_token_states)
