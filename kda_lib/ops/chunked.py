"""Chunkwise KDA: the recurrence of :func:`kda_lib.kda_recurrent`, C tokens at a time.

Per value head, ``S [K, V]`` the state entering a chunk and ``G_i = g_1 + ... + g_i`` the
chunk's cumulative log decay (per channel), the chunk's C tokens are computed in three steps:

1. decayed scores ``A[i, j] = sum_c k_ic k_jc exp(G_ic - G_jc)`` and ``P[i, j]`` (``q_i`` in
   place of ``k_i``, times ``scale``) for ``j <= i`` (:func:`_decayed_scores`);
2. the UT transform: ``T = (I + strictly_lower(diag(beta) A))^-1`` (:func:`unit_lower_inverse`),
   ``W = T diag(beta) (k * exp(G))``, ``U = T diag(beta) v``;
3. the state: ``U' = U - W S``, outputs ``O = scale (q * exp(G)) S + P U'``, and the state
   leaving the chunk ``exp(G_C) * S + (k * exp(G_C - G))^T U'``.

Steps 1 and 2 need no state; step 3 is a scan over chunks (``scan=``): ``"streaming"`` (the CPU
default) runs steps 1 to 3 in one ``lax.scan`` step per chunk; ``"sequential"`` runs steps 1-2
for every chunk at once, then scans; ``"associative"`` (the default elsewhere) writes each chunk
as an affine map ``S -> M S + E`` and composes the maps with ``lax.associative_scan`` (log
depth, more flops; context parallelism chains the same maps across devices).

Decay ratios are products of ``exp(g) <= 1`` over exactly their own range, never
``exp(G_i) * exp(-G_j)``: any ``g <= 0`` is safe. Under ``precision="input"`` with
bfloat16/float16 inputs, only the scores' cross blocks (inputs times decays <= 1) take operands in
that dtype; everything else is float32. Why, and measurements: docs/DESIGN.md section 4.
"""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from kda_lib.ops.contract import (
    accumulation_dtype,
    check_chunk_size,
    check_flag,
    check_kda_inputs,
    check_precision,
    kda_result,
    repeat_qk_heads,
    resolve_scale,
)
from kda_lib.ops.segments import (
    NonFinite,
    canonical_segment_ids,
    isolate_non_finite,
    overflowing_keys_as_nan,
    pad_time,
    restore_non_finite,
    restore_non_finite_chunk_states,
    segment_masks,
    zero_padding,
)

ScanMode = Literal["streaming", "sequential", "associative"]
SCAN_MODES = ("streaming", "sequential", "associative")
Precision = Literal["highest", "input"]
LOW_PRECISION_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
HIGHEST = jax.lax.Precision.HIGHEST


def kda_chunked(
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
    allow_neg_eigval: bool = False,
    chunk_size: int = 64,
    scan: ScanMode | None = None,
    precision: Precision | None = None,
    output_chunk_states: bool = False,
):
    """KDA in chunkwise (WY/UT) form; the same results as :func:`kda_lib.kda_recurrent`.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV, K]`` log decay ``<= 0``;
        beta: ``[B, T, HV]``, HV a positive multiple of H (value head j reads q/k head
        ``j // (HV // H)``). Any float dtype; computed in float32 (float64 for float64
        inputs), outputs in q's dtype.
      scale, initial_state, output_final_state, segment_ids, allow_neg_eigval: as in
        :func:`kda_lib.kda_recurrent`.
      chunk_size: tokens per chunk, a power of two (default 64); any T works (padded inside).
      scan: ``"streaming"``, ``"sequential"``, ``"associative"`` (module docstring; the same
        values up to rounding) or None, the platform's default (:func:`default_scan_mode`).
      precision: ``"highest"``: every matmul in float32 (float64) at ``Precision.HIGHEST``.
        ``"input"`` or None (default): for bfloat16/float16 inputs the scores' cross blocks
        take operands in that dtype, accumulated in float32; otherwise ``"highest"``.
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``, the
        state after every full chunk (default False; see
        :class:`kda_lib.ops.contract.KDAResult`).

    Returns:
      ``(o [B, T, HV, V], final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` a :class:`kda_lib.ops.contract.KDAResult`.

    Reverse-mode differentiable (hand-written gradients inside); forward mode (``jax.jvp``)
    needs :func:`kda_lib.kda_recurrent`.
    """
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
    chunk_size = check_chunk_size(chunk_size)
    mode = scan or default_scan_mode()
    if mode not in SCAN_MODES:
        raise ValueError(f"scan must be one of {SCAN_MODES} or None, got {scan!r}")
    check_precision(precision)
    check_flag("output_chunk_states", output_chunk_states)
    if segment_ids is not None:  # compared in their own dtype (on the host for host ids)
        segment_ids = canonical_segment_ids(segment_ids)
    # padding by selection: its values never reach an output or a gradient
    q, k, v, g, beta = zero_padding(segment_ids, q, k, v, g, beta)
    result = chunked_core(
        q,
        k,
        v,
        g,
        beta,
        dims=dims,
        scale=resolve_scale(scale, dims.key_dim),
        initial_state=initial_state,
        output_final_state=output_final_state,
        segment_ids=segment_ids,
        chunk_size=chunk_size,
        scan=mode,
        precision=precision,
        output_chunk_states=output_chunk_states,
    )
    return kda_result(*result, asked=output_chunk_states)


# chunked_core is traced once per static options and shapes (api.run compiles one program)
_STATIC = "dims scale output_final_state chunk_size scan precision output_chunk_states"


@functools.partial(jax.jit, static_argnames=_STATIC.split())
def chunked_core(
    q,
    k,
    v,
    g,
    beta,
    *,
    dims,
    scale: float,
    initial_state,
    output_final_state: bool,
    segment_ids,
    chunk_size: int,
    scan: ScanMode | None = None,
    precision: Precision | None = None,
    output_chunk_states: bool = False,
):
    """:func:`kda_chunked` on checked inputs (canonical ids, padding zeroed, ``dims`` from the
    check). Returns ``(o, final_state | None, chunk_states [B, T // C, HV, K, V] | None)``."""
    low = _operand_dtype(precision, q, k, v)
    acc = accumulation_dtype(q.dtype)
    batch, seq_len, heads, key_dim, value_dim, _ = dims
    out_dtype = q.dtype
    q, k, v, g, beta = (x.astype(acc) for x in (q, k, v, g, beta))
    q, k = repeat_qk_heads(q, k, dims.groups)
    # non-finite tokens are computed as zeros and restored as NaN where the recurrence has
    # them (matmuls would spread them); an overflowing key counts as NaN
    k = overflowing_keys_as_nan(k)
    q, k, v, g, beta, initial_state, non_finite = isolate_non_finite_if_any(
        q, k, v, g, beta, initial_state, segment_ids
    )
    # padding tokens: no decay, no write, outputs dropped
    (q, k, v, g, beta), segment_ids, pad = pad_time(
        chunk_size, q, k, v, g, beta, segment_ids=segment_ids
    )
    chunks = tuple(_to_chunks(x, chunk_size) for x in (q, k, v, g, beta))
    segments = None
    if segment_ids is not None:  # chunk-major: [B, 1, N, ...] -> [N, B, 1, ...]
        segments = tuple(jnp.moveaxis(x, 2, 0) for x in segment_masks(segment_ids, chunk_size))
    state0 = jnp.zeros((batch, heads, key_dim, value_dim), acc)
    if initial_state is not None:
        state0 = initial_state.astype(acc)
    mode = scan or default_scan_mode()
    o, final_state, entering = _scan_chunks(chunks, segments, state0, scale, mode, low)
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(batch, seq_len + pad, heads, value_dim)
    chunk_states = None
    if output_chunk_states:  # the state leaving chunk i enters chunk i + 1; the last: final
        after = jnp.concatenate([entering[1:], final_state[None]], axis=0)[: seq_len // chunk_size]
        chunk_states = restore_non_finite_chunk_states(
            jnp.moveaxis(after, 0, 1), non_finite, chunk_size
        )
    o, final_state = restore_non_finite(o[:, :seq_len], final_state, non_finite)
    return o.astype(out_dtype), (final_state if output_final_state else None), chunk_states


class IntraChunk(NamedTuple):
    """Steps 1 and 2 of every chunk (module docstring), leading dims those of the inputs.

    With ``S`` the state entering the chunk: ``U' = u - w @ S``, outputs
    ``q_in @ S + attn_qk @ U'`` and the leaving state ``keep * S + k_out^T @ U'``.
    """

    attn_qk: jax.Array  # [..., C, C] scaled, decayed, causal q.k scores (P)
    w: jax.Array  # [..., C, K]
    u: jax.Array  # [..., C, V]
    q_in: jax.Array  # [..., C, K] scaled queries decayed from the chunk start
    k_out: jax.Array  # [..., C, K] keys decayed to the chunk end
    keep: jax.Array  # [..., K] decay over the whole chunk


def _intra_chunk(q, k, v, g, beta, *, scale: float, segments=None, operand_dtype=None):
    """Steps 1 and 2 for every chunk at once: q, k, g ``[..., C, K]``, v ``[..., C, V]``, beta
    ``[..., C]``; ``segments`` as in :func:`chunk_affine_maps`; ``operand_dtype`` the scores'
    low-precision operand dtype (None: float32)."""
    (scores_kk, scores_qk), decay_in, decay_out = _decayed_scores((k, q), k, g, operand_dtype)
    strict = jnp.tril(jnp.ones(scores_kk.shape[-2:], bool), -1)
    attn_kk = beta[..., None] * jnp.where(strict, scores_kk, 0.0)
    attn_qk = scale * scores_qk
    keep = decay_in[..., -1, :]  # through the whole chunk
    k_in = k * decay_in
    q_in = scale * q * decay_in
    k_out = k * decay_out
    if segments is not None:
        same, sees_in, in_last, keeps_in = segments
        attn_kk = jnp.where(same, attn_kk, 0.0)
        attn_qk = jnp.where(same, attn_qk, 0.0)
        k_in = jnp.where(sees_in[..., None], k_in, 0.0)
        q_in = jnp.where(sees_in[..., None], q_in, 0.0)
        k_out = jnp.where(in_last[..., None], k_out, 0.0)
        keep = jnp.where(keeps_in[..., None], keep, 0.0)
    solve = unit_lower_inverse(attn_kk, base=min(16, q.shape[-2]))
    w = _mm("...ij,...jk->...ik", solve, beta[..., None] * k_in)
    u = _mm("...ij,...jv->...iv", solve, beta[..., None] * v)
    return IntraChunk(attn_qk, w, u, q_in, k_out, keep)


def _scan_chunks(chunks, segments, state0, scale, mode: ScanMode, low):
    """Step 3 over chunk-major ``chunks = (q, k, v, g, beta)`` (leading dims ``[N, B, H]``):
    outputs ``[N, B, H, C, V]``, the final state and the states entering each chunk."""
    intra = functools.partial(_intra_chunk, scale=scale, operand_dtype=low)
    if mode == "associative":
        maps = _affine_maps(intra(*chunks, segments=segments))
        entering, final = chain_states(*(jnp.moveaxis(m, 0, 2) for m in maps[:2]), state0)
        o = _mm("nbhck,bhnkv->nbhcv", maps.q_eff, entering) + maps.o_intra
        return o, final, jnp.moveaxis(entering, 2, 0)
    # inside shard_map the carry must vary over the same mesh axes as the chunks
    state0 = state0 + jnp.zeros_like(chunks[2][0, ..., :1, :])
    streaming = mode == "streaming"  # else steps 1-2 for all chunks first
    xs = (chunks, segments) if streaming else intra(*chunks, segments=segments)

    def step(state, x):
        x = intra(*x[0], segments=x[1]) if streaming else x
        corrected = x.u - _mm("...ck,...kv->...cv", x.w, state)
        k_out_t = jnp.swapaxes(x.k_out, -1, -2)
        new = x.keep[..., None] * state + _mm("...kc,...cv->...kv", k_out_t, corrected)
        o = _mm("...ck,...kv->...cv", x.q_in, state)
        return new, (o + _mm("...ij,...jv->...iv", x.attn_qk, corrected), state)

    # where the blocks all steps would save for the backward are large, each streaming step is
    # recomputed in the backward from the carried state (DESIGN section 6)
    if streaming and stream_saved_bytes(chunks) > REMAT_MIN_BYTES:
        step = jax.checkpoint(step, prevent_cse=False)
    final, (o, entering) = jax.lax.scan(step, state0, xs)
    return o, final, entering


def default_scan_mode() -> ScanMode:
    """``"streaming"`` on CPU (measured faster there: docs/DESIGN.md section 4), else
    ``"associative"`` (scan steps cost kernel launches)."""
    return "streaming" if jax.default_backend() == "cpu" else "associative"


# the streaming scan rematerialises its step under differentiation above this many saved bytes
REMAT_MIN_BYTES = 16 * 2**20


def stream_saved_bytes(chunks) -> int:
    """About the bytes the streaming scan's plain autodiff saves, over all N steps:
    ``N B H (2 C^2 + 3 C K + 2 C V)`` floats. ``chunks``: ``(q, k, v, ...)``
    ``[N, B, H, C, K]``."""
    n, b, h, c, k = chunks[0].shape
    v = chunks[2].shape[-1]
    return chunks[0].dtype.itemsize * n * b * h * (2 * c * c + 3 * c * k + 2 * c * v)


# ------------------------------------------------------------------ chunks as affine maps


class ChunkMaps(NamedTuple):
    """Each chunk as an affine map, leading dims ``[B, H, N]``: ``S_out = transition @ S_in +
    state_ext`` and ``O = q_eff @ S_in + o_intra``."""

    transition: jax.Array  # [B, H, N, K, K]
    state_ext: jax.Array  # [B, H, N, K, V]
    q_eff: jax.Array  # [B, H, N, C, K]
    o_intra: jax.Array  # [B, H, N, C, V]


def chunk_affine_maps(q, k, v, g, beta, *, scale: float, segments=None) -> ChunkMaps:
    """Every chunk's affine map, in parallel.

    Args:
      q, k, g: ``[B, H, N, C, K]``; v: ``[B, H, N, C, V]``; beta: ``[B, H, N, C]`` (float32 or
        float64; padding tokens with g = 0 and beta = 0).
      segments: None, or ``(same [B,1,N,C,C], sees_in [B,1,N,C], in_last [B,1,N,C],
        keeps_in [B,1,N])`` bool masks from :func:`kda_lib.ops.segments.segment_masks`.
    """
    return _affine_maps(_intra_chunk(q, k, v, g, beta, scale=scale, segments=segments))


def _affine_maps(intra: IntraChunk) -> ChunkMaps:
    attn_qk, w, u, q_in, k_out, keep = intra
    q_eff = q_in - _mm("...ij,...jk->...ik", attn_qk, w)
    o_intra = _mm("...ij,...jv->...iv", attn_qk, u)
    eye = jnp.eye(w.shape[-1], dtype=w.dtype)
    transition = keep[..., :, None] * eye - _mm("...ck,...cl->...kl", k_out, w)
    state_ext = _mm("...ck,...cv->...kv", k_out, u)
    return ChunkMaps(transition, state_ext, q_eff, o_intra)


def chain_states(transition, state_ext, initial_state):
    """The states entering each chunk ``[B, H, N, K, V]`` and the final state ``[B, H, K, V]``,
    by ``lax.associative_scan`` over the maps: transition ``[B, H, N, K, K]``, state_ext
    ``[B, H, N, K, V]``, initial_state ``[B, H, K, V]``."""
    # inside shard_map the carry must vary over the same mesh axes as the maps
    initial_state = initial_state + jnp.zeros_like(state_ext[:, :, 0])
    m_cum, e_cum = jax.lax.associative_scan(_compose, (transition, state_ext), axis=2)
    after = _mm("bhnij,bhjv->bhniv", m_cum, initial_state) + e_cum  # after each chunk
    entering = jnp.concatenate([initial_state[:, :, None], after[:, :, :-1]], axis=2)
    return entering, after[:, :, -1]


def _compose(first, second):
    """``first`` then ``second``: ``(M2 M1, M2 E1 + E2)``, on stacked maps."""
    (m1, e1), (m2, e2) = first, second
    return _mm("...ij,...jk->...ik", m2, m1), _mm("...ij,...jv->...iv", m2, e1) + e2


# ------------------------------------------------------------------ precision and plumbing


def _mm(subscripts: str, *operands, low=None):
    """The one place the chunked form multiplies matrices: an einsum at ``Precision.HIGHEST``;
    with ``low`` (bfloat16/float16, the ``"input"`` policy) the two operands are cast to
    ``low`` and accumulated in their own dtype (float32) at ``Precision.DEFAULT``."""
    if low is None:
        return jnp.einsum(subscripts, *operands, precision=HIGHEST)
    a, b = operands
    return jnp.einsum(
        subscripts,
        a.astype(low),
        b.astype(low),
        preferred_element_type=jnp.result_type(a, b),
        precision=jax.lax.Precision.DEFAULT,
    )


def _operand_dtype(precision: Precision | None, q, k, v):
    """The scores' operand dtype: None for ``"highest"``; for ``"input"``/None the one
    low-precision dtype among q, k, v (float32 q/k with bfloat16 v count as bfloat16), or
    None when there is none (or both kinds)."""
    if precision == "highest":
        return None
    low = {jnp.dtype(x.dtype) for x in (q, k, v)} & set(LOW_PRECISION_DTYPES)
    return low.pop() if len(low) == 1 else None


def _to_chunks(x, chunk_size):
    """``[B, T, H, ...] -> [N, B, H, C, ...]``: chunk-major, for the state scan."""
    batch, seq_len, heads = x.shape[:3]
    x = x.reshape(batch, seq_len // chunk_size, chunk_size, heads, *x.shape[3:])
    return jnp.moveaxis(x, (1, 3), (0, 2))


def isolate_non_finite_if_any(q, k, v, g, beta, initial_state, segment_ids):
    """:func:`kda_lib.ops.segments.isolate_non_finite`, skipped when every input is finite
    (its segment-wise running maximum is a large part of the CPU forward).

    The ``lax.cond`` only yields booleans (where an input is replaced, and the flags); the
    replacements are selections outside it, so gradients never go through the cond.
    """
    operands = (q, k, v, g, beta, initial_state)

    def finite(x):
        return jnp.max(jnp.abs(x)) < jnp.inf  # False for inf or NaN: max propagates NaN

    clean = finite(q) & finite(k) & finite(v) & finite(beta) & (jnp.max(g) < jnp.inf)
    if initial_state is not None:
        clean = clean & finite(initial_state)

    def unchanged(xs):
        # zeros_like: inside shard_map the flags vary over the same mesh axes as v
        flags = NonFinite(*(jnp.zeros_like(x, bool) for x in (v, v[:, 0], v)))
        return tuple(None if x is None else jnp.zeros_like(x, bool) for x in xs), flags

    def isolate(xs):
        # it decides from finiteness alone and replaces by 0: with every finite value set to
        # 1, the zeros it returns are exactly where it replaces
        probes = jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), 1, x), xs)
        *replaced, flags = isolate_non_finite(*probes, segment_ids)
        return tuple(None if y is None else y == 0 for y in replaced), flags

    changed, flags = jax.lax.cond(
        clean, unchanged, isolate, jax.tree.map(jax.lax.stop_gradient, operands)
    )
    replaced = tuple(
        None if x is None else jnp.where(c, jnp.zeros_like(x), x)
        for x, c in zip(operands, changed, strict=True)
    )
    return (*replaced, flags)


# ------------------------------------------------------------------ hand-written gradients


def unit_lower_inverse(a: jax.Array, base: int = 16) -> jax.Array:
    """``(I + a)^-1`` for strictly lower-triangular ``a [..., C, C]``, by matmuls only.

    Diagonal blocks of ``base`` by the finite Neumann product ``(I - X)(I + X^2)(I + X^4)...``,
    then merged pairwise: ``[[X1, 0], [L21, X2]]^-1 = [[X1^-1, 0], [-X2^-1 L21 X1^-1, X2^-1]]``.
    C must be ``base * 2^j``. Gradient: ``da = -X^T dX X^T`` (strictly lower part).
    """
    return _unit_lower_inverse(a, base)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _unit_lower_inverse(a, base):
    size = a.shape[-1]
    lead = a.shape[:-2]
    block = min(base, size)
    if size % block or block & (block - 1) or (size // block) & (size // block - 1):
        raise ValueError(
            f"unit_lower_inverse needs C = base * 2^j with base a power of 2, got C={size}"
        )
    # one flat batch dimension and slices (not jnp.diagonal): XLA's CPU simplifier aborted on
    # diagonal + moveaxis + batched dot with several batch dimensions under jit
    a = a.reshape(-1, size, size)

    def blocks(rows, cols, width):  # [N, count, width, width] from block offsets
        return jnp.stack(
            [a[:, r : r + width, c : c + width] for r, c in zip(rows, cols, strict=True)], axis=1
        )

    starts = list(range(0, size, block))
    x = blocks(starts, starts, block)
    eye = jnp.eye(block, dtype=a.dtype)
    inv, power = eye - x, x
    for _ in range(int(math.log2(block)) - 1):
        power = _mm("...ij,...jk->...ik", power, power)
        inv = _mm("...ij,...jk->...ik", inv, eye + power)
    m = block
    while m < size:
        pairs = size // (2 * m)
        inv = inv.reshape(-1, pairs, 2, m, m)
        x1, x2 = inv[:, :, 0], inv[:, :, 1]
        l21 = blocks([(2 * p + 1) * m for p in range(pairs)], [2 * p * m for p in range(pairs)], m)
        lower = -_mm("...ij,...jk,...kl->...il", x2, l21, x1)
        top = jnp.concatenate([x1, jnp.zeros_like(x1)], axis=-1)
        inv = jnp.concatenate([top, jnp.concatenate([lower, x2], axis=-1)], axis=-2)
        m *= 2
    return inv.reshape(*lead, size, size)


def _unit_lower_inverse_fwd(a, base):
    inv = _unit_lower_inverse(a, base)
    return inv, inv


def _unit_lower_inverse_bwd(base, inv, d_inv):
    inv_t = jnp.swapaxes(inv, -1, -2)
    d_a = -_mm("...ij,...jk->...ik", inv_t, _mm("...ij,...jk->...ik", d_inv, inv_t))
    return (jnp.tril(d_a, -1),)


_unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _decayed_scores(xs, k, g, operand_dtype=None):
    """Step 1: ``S_x[i, j] = sum_c x_ic k_jc exp(G_ic - G_jc)`` for j <= i (zero above), for
    each row set x in ``xs`` (e.g. ``(k, q)``); xs, k, g ``[..., C, K]``.

    Returns ``(tuple of S_x [..., C, C], decay_in, decay_out)``, ``decay_in_i = exp(G_i)`` and
    ``decay_out_j = exp(G_C - G_j)``, both ``[..., C, K]``. Built by merging neighbouring
    segments (1 + 1 tokens, 2 + 2, ...): a merge's cross block (rows in the later half, keys in
    the earlier one) is one matmul of factors <= 1 (:func:`_segment_decays`), with operands in
    ``operand_dtype`` when given.
    """
    levels = _segment_decays(g)
    size = k.shape[-2]
    crosses = [[] for _ in xs]
    width = 1
    for head, tail in levels[:-1]:
        keys = _split_pairs(k, width)[..., 0, :, :] * _split_pairs(tail, width)[..., 0, :, :]
        later_head = _split_pairs(head, width)[..., 1, :, :]
        for x, cross in zip(xs, crosses, strict=True):
            rows = _split_pairs(x, width)[..., 1, :, :] * later_head
            cross.append(_mm("...pik,...pjk->...pij", rows, keys, low=operand_dtype))
        width *= 2
    scores = []
    for x, cross in zip(xs, crosses, strict=True):
        merged = jnp.sum(x * k, axis=-1)[..., None, None]  # [..., C, 1, 1]: ratio 1 on the diagonal
        width = 1
        for block in cross:
            merged = merged.reshape(*block.shape[:-3], block.shape[-3], 2, width, width)
            top = jnp.concatenate([merged[..., 0, :, :], jnp.zeros_like(block)], axis=-1)
            bottom = jnp.concatenate([block, merged[..., 1, :, :]], axis=-1)
            merged = jnp.concatenate([top, bottom], axis=-2)
            width *= 2
        scores.append(merged.reshape(*merged.shape[:-3], size, size))
    decay_in, decay_out = levels[-1]
    return tuple(scores), decay_in, decay_out


def _decayed_scores_fwd(xs, k, g, operand_dtype):
    return _decayed_scores(xs, k, g, operand_dtype), (xs, k, g)


def _decayed_scores_bwd(_, residuals, cotangents):
    """Row and key gradients walk the merge levels again (two float32 matmuls per level and row
    set). ``g`` enters only through ``exp(G_i - G_j)``, whose derivative in ``g_m`` is itself
    for ``j < m <= i``, so ``dg`` is the reverse cumulative sum of ``sum_x x * dx - k * dk``
    (off the diagonal) plus the boundary decays' terms."""
    xs, k, g = residuals
    d_scores, d_in, d_out = cotangents
    size = k.shape[-2]
    levels = _segment_decays(g)
    below = jnp.tril(jnp.ones((size, size), bool), -1)
    d_xs_levels = [jnp.zeros_like(x) for x in xs]
    d_k_levels = jnp.zeros_like(k)
    splits = [_cross_blocks(jnp.where(below, d, 0.0)) for d in d_scores]
    width = 1
    for head, tail in levels[:-1]:
        later_head = _split_pairs(head, width)[..., 1, :, :]
        earlier_tail = _split_pairs(tail, width)[..., 0, :, :]
        keys = _split_pairs(k, width)[..., 0, :, :] * earlier_tail
        d_keys = jnp.zeros_like(keys)
        for n, x in enumerate(xs):
            rows = _split_pairs(x, width)[..., 1, :, :] * later_head
            d_cross = splits[n][width]  # [..., pairs, w(i), w(j)]
            d_rows = _mm("...pij,...pjc->...pic", d_cross, keys)
            d_keys = d_keys + _mm("...pij,...pic->...pjc", d_cross, rows)
            d_xs_levels[n] = d_xs_levels[n] + _merge_pairs(
                jnp.stack([jnp.zeros_like(d_rows), d_rows * later_head], axis=-3)
            )
        d_k_levels = d_k_levels + _merge_pairs(
            jnp.stack([d_keys * earlier_tail, jnp.zeros_like(d_keys)], axis=-3)
        )
        width *= 2
    row_terms = sum(x * d for x, d in zip(xs, d_xs_levels, strict=True))
    decay_in, decay_out = levels[-1]
    # decay_in_i covers g over [0, i], decay_out_j over (j, C)
    d_g = _sum_from(row_terms - k * d_k_levels + d_in * decay_in) + _sum_before(d_out * decay_out)
    # the diagonal (ratio 1) adds to the row and key gradients only
    d_xs, d_k = [], d_k_levels
    for x, d, d_level in zip(xs, d_scores, d_xs_levels, strict=True):
        diagonal = jnp.diagonal(d, axis1=-2, axis2=-1)[..., None]
        d_xs.append(d_level + diagonal * k)
        d_k = d_k + diagonal * x
    return tuple(d_xs), d_k, d_g


_decayed_scores.defvjp(_decayed_scores_fwd, _decayed_scores_bwd)


def _segment_decays(g) -> list[tuple[jax.Array, jax.Array]]:
    """Decay factors of aligned segments of width 1, 2, 4, ..., C, from g ``[..., C, K]``.

    Entry ``l`` (width ``2^l``) is ``(head, tail)``, both ``[..., C, K]``: per token the product
    of ``exp(g_m) <= 1`` from its segment's start through the token, and after the token
    through its segment's end. The last entry is ``(exp(G_i), exp(G_C - G_i))``. One ``exp``
    per token and channel; no ratios, no differences of long prefix sums.
    """
    size = g.shape[-2]
    head, tail = jnp.exp(g), jnp.ones_like(g)
    levels = [(head, tail)]
    width = 1
    while width < size:
        head, tail = _split_pairs(head, width), _split_pairs(tail, width)
        totals = head[..., -1:, :]  # [..., pairs, 2, 1, K]: each half's product
        ones = jnp.ones_like(totals[..., :1, :, :])
        # the later half's heads times the earlier half's total, the earlier half's tails
        # times the later half's total
        head = _merge_pairs(head * jnp.concatenate([ones, totals[..., :1, :, :]], axis=-3))
        tail = _merge_pairs(tail * jnp.concatenate([totals[..., 1:, :, :], ones], axis=-3))
        levels.append((head, tail))
        width *= 2
    return levels


def _split_pairs(x, width):
    """``[..., C, D] -> [..., C / (2 width), 2, width, D]``: neighbouring segments in pairs."""
    size, dim = x.shape[-2:]
    return x.reshape(*x.shape[:-2], size // (2 * width), 2, width, dim)


def _merge_pairs(x):
    """Inverse of :func:`_split_pairs`."""
    return x.reshape(*x.shape[:-4], -1, x.shape[-1])


def _sum_from(x):
    """``out[m] = sum_{i >= m} x[i]`` along axis -2."""
    return _triangular_sum(x, lambda m, i: i >= m)


def _sum_before(x):
    """``out[m] = sum_{j < m} x[j]`` along axis -2."""
    return _triangular_sum(x, lambda m, j: j < m)


def _triangular_sum(x, keep):
    # one batched matmul with a 0/1 mask broadcast over the batch: on CPU, jnp.cumsum (a reduce
    # window) and an unbatched constant operand both cost layout copies of x
    size = x.shape[-2]
    pos = jnp.arange(size)
    mask = keep(pos[:, None], pos[None, :]).astype(x.dtype)
    return _mm("...mi,...ic->...mc", jnp.broadcast_to(mask, (*x.shape[:-2], size, size)), x)


def _cross_blocks(d_scores) -> dict:
    """``{w: [..., C / 2w, w, w]}``: the lower-left block of every 2w x 2w diagonal block."""
    size = d_scores.shape[-1]
    blocks = d_scores[..., None, :, :]  # [..., 1, C, C]
    crosses = {}
    width = size // 2
    while width >= 1:
        split = blocks.reshape(*blocks.shape[:-2], 2, width, 2, width)
        crosses[width] = split[..., 1, :, 0, :]
        blocks = jnp.stack([split[..., 0, :, 0, :], split[..., 1, :, 1, :]], axis=-3)
        blocks = blocks.reshape(*blocks.shape[:-4], -1, width, width)
        width //= 2
    return crosses
