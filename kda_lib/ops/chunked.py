"""Chunkwise KDA: the recurrence of :func:`kda_lib.kda_recurrent`, C tokens at a time.

Per value head, ``S [K, V]`` the state entering a chunk and ``G_i = g_1 + ... + g_i`` the
chunk's cumulative log decay (per channel), the chunk's C tokens are computed in three steps:

1. decayed scores ``A[i, j] = sum_c k_ic k_jc exp(G_ic - G_jc)`` and ``P[i, j]`` (``q_i`` in
   place of ``k_i``, times ``scale``) for ``j <= i`` (:func:`_decayed_scores`);
2. the UT transform: ``T = (I + strictly_lower(diag(beta) A))^-1`` (:func:`unit_lower_inverse`),
   ``W = T diag(beta) (k * exp(G))``, ``U = T diag(beta) v``;
3. the state: ``U' = U - W S``, outputs ``O = scale (q * exp(G)) S + P U'``, and the state
   leaving the chunk ``exp(G_C) * S + (k * exp(G_C - G))^T U'``.

Steps 1 and 2 need no state; step 3 chains the chunks (``scan=``): ``"streaming"`` (the
default) runs steps 1 to 3 in one ``lax.scan`` step per chunk; ``"associative"`` writes each
chunk as an affine map ``S -> M S + E`` and composes the maps with ``lax.associative_scan``
(K x K maps the state never needs: 3x slower on a TPU v5e, DESIGN section 4; context
parallelism builds one map per rank itself).

Decay ratios are products of ``exp(g) <= 1`` over exactly their own range, never
``exp(G_i) * exp(-G_j)``: any ``g <= 0`` is safe. Precision: docs/DESIGN.md section 4.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from typing import Literal

import jax
import jax.numpy as jnp

from kda_lib.ops import contract
from kda_lib.ops.segments import (
    NonFinite,
    isolate_non_finite,
    overflowing_keys_as_nan,
    pad_time,
    restore_non_finite,
    segment_masks,
    varying_like,
)

ScanMode = Literal["streaming", "associative"]
Precision = Literal["highest", "input"]


# traced once per static options and shapes (api.run compiles one program)
_STATIC = "dims scale output_final_state chunk_size scan precision output_chunk_states"


@functools.partial(jax.jit, static_argnames=_STATIC.split())
def chunked_core(q, k, v, g, beta, *, dims, scale: float, initial_state, output_final_state: bool,
                 segment_ids, chunk_size: int, scan: ScanMode | None = None,
                 precision: Precision | None = None,
                 output_chunk_states: bool = False):  # fmt: skip
    """:func:`kda_lib.kda_chunked` on checked inputs: ``(o, final_state, chunk_states)``."""
    # the scores' operand dtype: the one low-precision dtype among q, k, v (none: None)
    low = {jnp.dtype(x.dtype) for x in (q, k, v)} & {jnp.dtype("bfloat16"), jnp.dtype("float16")}
    low = low.pop() if len(low) == 1 and precision != "highest" else None
    acc = contract.accumulation_dtype(q.dtype)
    batch, seq_len, heads, key_dim, value_dim, _ = dims
    out_dtype, (q, k, v, g, beta) = q.dtype, (x.astype(acc) for x in (q, k, v, g, beta))
    q, k = contract.repeat_qk_heads(q, k, dims.groups)
    # non-finite inputs run as zeros, NaN restored where the recurrence has it (DESIGN section 3)
    k = overflowing_keys_as_nan(k)
    *inputs, non_finite = isolate_non_finite_if_any(q, k, v, g, beta, initial_state, segment_ids)
    q, k, v, g, beta, initial_state = inputs
    # padding tokens: no decay, no write, outputs dropped
    (q, k, v, g, beta), segment_ids, pad = pad_time(chunk_size, q, k, v, g, beta,
                                                    segment_ids=segment_ids)  # fmt: skip
    chunks = tuple(  # chunk-major [N, B, H, C, ...]
        jnp.moveaxis(x.reshape(batch, -1, chunk_size, heads, *x.shape[3:]), (1, 3), (0, 2))
        for x in (q, k, v, g, beta)
    )  # fmt: skip
    segments = None
    if segment_ids is not None:  # chunk-major: [B, 1, N, ...] -> [N, B, 1, ...]
        segments = tuple(jnp.moveaxis(x, 2, 0) for x in segment_masks(segment_ids, chunk_size))
    state0 = jnp.zeros((batch, heads, key_dim, value_dim), acc)
    state0 = state0 if initial_state is None else initial_state.astype(acc)
    scan = scan or "streaming"
    o, final_state, entering = _scan_chunks(chunks, segments, state0, scale, scan, low)
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(batch, seq_len + pad, heads, value_dim)
    chunk_states = None
    if output_chunk_states:  # the state leaving chunk i enters chunk i + 1; the last: final
        after = jnp.concatenate([entering[1:], final_state[None]], axis=0)[: seq_len // chunk_size]
        bad = non_finite.states[:, chunk_size - 1 :: chunk_size][:, : len(after)]  # [B, N, H, V]
        chunk_states = jnp.where(bad[:, :, :, None], jnp.nan, jnp.moveaxis(after, 0, 1))
    o, final_state = restore_non_finite(o[:, :seq_len], final_state, non_finite)
    return o.astype(out_dtype), (final_state if output_final_state else None), chunk_states


def _intra_chunk(q, k, v, g, beta, *, scale: float, segments=None, operand_dtype=None):
    """Steps 1 and 2 for every chunk at once (shapes as in :func:`chunk_affine_maps`): ``(P
    [..., C, C], w [..., C, K], u [..., C, V], q_in, k_out [..., C, K], keep [..., K])``; with
    ``U' = u - w S``: outputs ``q_in S + P U'``, the state leaving ``keep * S + k_out^T U'``."""
    (scores_kk, scores_qk), decay_in, decay_out = _decayed_scores((k, q), k, g, operand_dtype)
    strict = jnp.tril(jnp.ones(scores_kk.shape[-2:], bool), -1)
    attn_kk = beta[..., None] * jnp.where(strict, scores_kk, 0.0)
    attn_qk = scale * scores_qk
    keep = decay_in[..., -1, :]  # through the whole chunk
    k_in, q_in, k_out = k * decay_in, scale * q * decay_in, k * decay_out
    if segments is not None:
        same, sees_in, in_last, keeps_in = segments
        attn_kk, attn_qk = (jnp.where(same, x, 0.0) for x in (attn_kk, attn_qk))
        k_in, q_in = (jnp.where(sees_in[..., None], x, 0.0) for x in (k_in, q_in))
        k_out = jnp.where(in_last[..., None], k_out, 0.0)
        keep = jnp.where(keeps_in[..., None], keep, 0.0)
    solve = unit_lower_inverse(attn_kk)
    w = _mm("...ij,...jk->...ik", solve, beta[..., None] * k_in)
    u = _mm("...ij,...jv->...iv", solve, beta[..., None] * v)
    return attn_qk, w, u, q_in, k_out, keep


def _scan_chunks(chunks, segments, state0, scale, scan: ScanMode, low):
    """Step 3 over chunk-major ``chunks = (q, k, v, g, beta)`` (leading dims ``[N, B, H]``):
    outputs ``[N, B, H, C, V]``, the final state and the states entering each chunk."""
    if scan == "associative":
        maps = chunk_affine_maps(*chunks, scale=scale, segments=segments, operand_dtype=low)
        entering, final = chain_states(*(jnp.moveaxis(m, 0, 2) for m in maps[:2]), state0)
        o = _mm("nbhck,bhnkv->nbhcv", maps.q_eff, entering) + maps.o_intra
        return o, final, jnp.moveaxis(entering, 2, 0)

    def step(state, x):  # steps 1 to 3 of one chunk
        attn_qk, w, u, q_in, k_out, keep = _intra_chunk(*x[0], scale=scale, segments=x[1],
                                                        operand_dtype=low)  # fmt: skip
        corrected = u - _mm("...ck,...kv->...cv", w, state)
        new = keep[..., None] * state + _mm("...ck,...cv->...kv", k_out, corrected)
        o = _mm("...ck,...kv->...cv", q_in, state)
        return new, (o + _mm("...ij,...jv->...iv", attn_qk, corrected), state)

    # past REMAT_MIN_BYTES saved, the backward recomputes each step (DESIGN section 6)
    if stream_saved_bytes(chunks) > REMAT_MIN_BYTES:
        step = jax.checkpoint(step, prevent_cse=False)
    state0 = varying_like(state0, chunks[2][0, ..., :1, :])
    final, (o, entering) = jax.lax.scan(step, state0, (chunks, segments))
    return o, final, entering


REMAT_MIN_BYTES = 16 * 2**20


def stream_saved_bytes(chunks) -> int:
    """About the bytes the streaming scan's plain autodiff saves: ``N B H (2 C^2 + 3 C K + 2 C
    V)`` floats, ``chunks = (q, k, v, ...)`` ``[N, B, H, C, K]``."""
    (n, b, h, c, k), v = chunks[0].shape, chunks[2].shape[-1]
    return chunks[0].dtype.itemsize * n * b * h * (2 * c * c + 3 * c * k + 2 * c * v)


# each chunk as an affine map, S_out = transition S_in + state_ext and O = q_eff S_in + o_intra:
# transition [B, H, N, K, K], state_ext [B, H, N, K, V], q_eff [B, H, N, C, K], o_intra [.., C, V]
ChunkMaps = namedtuple("ChunkMaps", "transition state_ext q_eff o_intra")


def chunk_affine_maps(q, k, v, g, beta, *, scale: float, segments=None,
                      operand_dtype=None) -> ChunkMaps:  # fmt: skip
    """Every chunk's affine map: q, k, g ``[B, H, N, C, K]``, v ``[B, H, N, C, V]``, beta ``[B, H,
    N, C]`` (float32 or float64), ``segments`` None or :func:`~.segments.segment_masks`'s."""
    attn_qk, w, u, q_in, k_out, keep = _intra_chunk(q, k, v, g, beta, scale=scale,
                                                    segments=segments,
                                                    operand_dtype=operand_dtype)  # fmt: skip
    eye = jnp.eye(w.shape[-1], dtype=w.dtype)
    return ChunkMaps(
        transition=keep[..., :, None] * eye - _mm("...ck,...cl->...kl", k_out, w),
        state_ext=_mm("...ck,...cv->...kv", k_out, u),
        q_eff=q_in - _mm("...ij,...jk->...ik", attn_qk, w),
        o_intra=_mm("...ij,...jv->...iv", attn_qk, u),
    )


def chain_states(transition, state_ext, initial_state):
    """The states entering each chunk ``[B, H, N, K, V]`` and the final state ``[B, H, K, V]``
    from ``initial_state``, by ``lax.associative_scan`` over the maps (:data:`ChunkMaps`)."""
    initial_state = varying_like(initial_state, state_ext[:, :, 0])

    def compose(first, second):  # first then second: (M2 M1, M2 E1 + E2)
        (m1, e1), (m2, e2) = first, second
        return _mm("...ij,...jk->...ik", m2, m1), _mm("...ij,...jv->...iv", m2, e1) + e2

    m_cum, e_cum = jax.lax.associative_scan(compose, (transition, state_ext), axis=2)
    after = _mm("bhnij,bhjv->bhniv", m_cum, initial_state) + e_cum  # after each chunk
    entering = jnp.concatenate([initial_state[:, :, None], after[:, :, :-1]], axis=2)
    return entering, after[:, :, -1]


# ------------------------------------------------------------------ precision and plumbing
def _mm(subscripts: str, *operands, low=None):
    """Every matmul: an einsum at ``HIGHEST``, or of operands in ``low`` accumulated in float32."""
    if low is None:
        return jnp.einsum(subscripts, *operands, precision=jax.lax.Precision.HIGHEST)
    a, b = operands
    return jnp.einsum(subscripts, a.astype(low), b.astype(low),
                      preferred_element_type=jnp.result_type(a, b))  # fmt: skip


def isolate_non_finite_if_any(q, k, v, g, beta, initial_state, segment_ids):
    """:func:`kda_lib.ops.segments.isolate_non_finite`, skipped when every input is finite (the
    cond yields booleans only: gradients never go through it)."""
    operands = (q, k, v, g, beta, initial_state)
    clean = jnp.max(g) < jnp.inf  # False for +inf or NaN (max propagates NaN); -inf is a gate
    for x in (q, k, v, beta, initial_state):
        if x is not None:
            clean = clean & (jnp.max(jnp.abs(x)) < jnp.inf)

    def unchanged(xs):  # zeros_like: as varying_like, the flags vary over v's mesh axes
        flags = NonFinite(*(jnp.zeros_like(x, bool) for x in (v, v[:, 0], v)))
        return tuple(None if x is None else jnp.zeros_like(x, bool) for x in xs), flags

    def isolate(xs):  # finite values set to 1: the zeros returned are exactly the replacements
        probes = jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), 1, x), xs)
        *replaced, flags = isolate_non_finite(*probes, segment_ids)
        return tuple(None if y is None else y == 0 for y in replaced), flags

    changed, flags = jax.lax.cond(clean, unchanged, isolate,
                                  jax.tree.map(jax.lax.stop_gradient, operands))  # fmt: skip
    replaced = tuple(None if x is None else jnp.where(c, jnp.zeros_like(x), x)
                     for x, c in zip(operands, changed, strict=True))  # fmt: skip
    return (*replaced, flags)


# ------------------------------------------------------------------ hand-written gradients
@jax.custom_vjp
def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """``(I + a)^-1`` for strictly lower-triangular ``a [..., C, C]``, C a power of two, by
    matmuls only: the 2 x 2 diagonal blocks ``[[1, 0], [x, 1]]^-1 = [[1, 0], [-x, 1]]``, merged
    pairwise (``[[X1, 0], [L, X2]]^-1 = [[X1^-1, 0], [-X2^-1 L X1^-1, X2^-1]]``): products of
    inverses and of ``a``'s own entries. Gradient: ``da = -X^T dX X^T`` (strictly lower part)."""
    size, lead = a.shape[-1], a.shape[:-2]
    if a.ndim < 2 or a.shape[-2] != size or size < 1 or size & (size - 1):
        raise ValueError(f"unit_lower_inverse needs a [..., C, C] with C a power of two, got shape "
                         f"{a.shape}")  # fmt: skip
    a = a.reshape(-1, size, size)  # one flat batch dimension (DESIGN section 6)

    def blocks(m):  # [N, C / m, m, m]: the diagonal blocks of m rows, gathered
        x = a.reshape(-1, size // m, m, size // m, m)
        return jnp.moveaxis(jnp.diagonal(x, axis1=1, axis2=3), -1, 1)

    m = min(2, size)
    inv = jnp.eye(m, dtype=a.dtype) - blocks(m)  # exact: a 2 x 2 strictly lower block squares to 0
    while m < size:
        pairs = size // (2 * m)
        inv = inv.reshape(-1, pairs, 2, m, m)
        x1, x2 = inv[:, :, 0], inv[:, :, 1]
        lower = -_mm("...ij,...jk,...kl->...il", x2, blocks(2 * m)[..., m:, :m], x1)
        top = jnp.concatenate([x1, jnp.zeros_like(x1)], axis=-1)
        inv = jnp.concatenate([top, jnp.concatenate([lower, x2], axis=-1)], axis=-2)
        m *= 2
    return inv.reshape(*lead, size, size)


def _unit_lower_inverse_bwd(inv, d_inv):
    inv_t = jnp.swapaxes(inv, -1, -2)
    return (jnp.tril(-_mm("...ij,...jk,...kl->...il", inv_t, d_inv, inv_t), -1),)


# the forward rule runs the plain body (as _decayed_scores' does, below): a custom_vjp call
# left inside it would meet the outer jvp of forward over reverse (jax.hessian, jvp of grad)
unit_lower_inverse.defvjp(lambda a: (unit_lower_inverse.fun(a),) * 2, _unit_lower_inverse_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _decayed_scores(xs, k, g, operand_dtype=None):
    """Step 1: ``S_x[i, j] = sum_c x_ic k_jc exp(G_ic - G_jc)`` for j <= i (zero above), for
    each row set x in ``xs`` (e.g. ``(k, q)``); xs, k, g ``[..., C, K]``. Returns ``(tuple of
    S_x [..., C, C], decay_in = exp(G_i), decay_out = exp(G_C - G_j))``. Built by merging
    neighbouring segments (1 + 1 tokens, 2 + 2, ...): a merge's cross block (later rows,
    earlier keys) is one matmul of factors <= 1, operands in ``operand_dtype`` when given."""
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
    return tuple(scores), *levels[-1]


def _decayed_scores_bwd(_, residuals, cotangents):
    """Row and key gradients walk the merge levels again. ``g`` enters only through
    ``exp(G_i - G_j)``, whose derivative in ``g_m`` is itself for ``j < m <= i``, so ``dg`` is
    the reverse cumulative sum of ``sum_x x * dx - k * dk`` (off the diagonal) plus the
    boundary decays' terms."""
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

    def masked_sum(x, mask):  # out[m] = sum of x[i] over mask[m, i], one batched matmul
        mask = jnp.broadcast_to(mask.astype(x.dtype), (*x.shape[:-2], size, size))
        return _mm("...mi,...ic->...mc", mask, x)

    # decay_in_i covers g over [0, i], decay_out_j over (j, C)
    d_g = (masked_sum(row_terms - k * d_k_levels + d_in * decay_in, ~below)
           + masked_sum(d_out * decay_out, below))  # fmt: skip
    d_xs, d_k = [], d_k_levels  # the diagonal (ratio 1) adds to the row and key gradients only
    for x, d, d_level in zip(xs, d_scores, d_xs_levels, strict=True):
        diagonal = jnp.diagonal(d, axis1=-2, axis2=-1)[..., None]
        d_xs.append(d_level + diagonal * k)
        d_k = d_k + diagonal * x
    return tuple(d_xs), d_k, d_g


# the forward rule runs the plain body, not _decayed_scores itself: a custom_vjp call whose
# residuals are its own inputs, left in a scan's forward program, gets other values as residuals
# when that program is differentiated again (JAX's partial evaluation prepends the body's
# input-free constants, ones_like and the like, to its arguments without moving the indices of
# forwarded residuals; DESIGN section 4). The same operations run: first order is unchanged.
_decayed_scores.defvjp(lambda xs, k, g, low: (_decayed_scores.fun(xs, k, g, low), (xs, k, g)),
                       _decayed_scores_bwd)  # fmt: skip


def _segment_decays(g) -> list[tuple[jax.Array, jax.Array]]:
    """Decay factors of aligned segments of width 1, 2, 4, ..., C, from g ``[..., C, K]``:
    entry ``l`` is ``(head, tail)`` ``[..., C, K]``, per token the product of ``exp(g_m) <= 1``
    from its segment's start through the token, and after the token through its segment's
    end; the last entry is ``(exp(G_i), exp(G_C - G_i))``. No ratios, no prefix differences."""
    size = g.shape[-2]
    head, tail = jnp.exp(g), jnp.ones_like(g)
    levels = [(head, tail)]
    width = 1
    while width < size:
        head, tail = _split_pairs(head, width), _split_pairs(tail, width)
        totals = head[..., -1:, :]  # [..., pairs, 2, 1, K]: each half's product
        ones = jnp.ones_like(totals[..., :1, :, :])
        # later heads times the earlier half's total, earlier tails times the later half's
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
    return x.reshape(*x.shape[:-4], -1, x.shape[-1])


def _cross_blocks(d_scores) -> dict:
    """``{w: [..., C / 2w, w, w]}``: the lower-left block of every 2w x 2w diagonal block."""
    blocks = d_scores[..., None, :, :]  # [..., 1, C, C]
    crosses = {}
    width = d_scores.shape[-1] // 2
    while width >= 1:
        split = blocks.reshape(*blocks.shape[:-2], 2, width, 2, width)
        crosses[width] = split[..., 1, :, 0, :]
        blocks = jnp.stack([split[..., 0, :, 0, :], split[..., 1, :, 1, :]], axis=-3)
        blocks = blocks.reshape(*blocks.shape[:-4], -1, width, width)
        width //= 2
    return crosses
