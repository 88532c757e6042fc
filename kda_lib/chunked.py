"""Chunkwise KDA: the same recurrence, computed a chunk of C tokens at a time with matmuls.

Within a chunk every step ``S_t = (I - beta_t k_t k_t^T) diag(exp g_t) S_{t-1} + beta_t k_t v_t^T``
is linear in the state entering the chunk, so the whole chunk is an affine map

    S_out = M @ S_in + S_ext          M [K, K], S_ext [K, V]

and its outputs are ``O = Q_eff @ S_in + O_intra``. All four come from one unit-lower-triangular
solve per chunk (the WY/UT form), computed for every chunk in parallel; only the cheap affine maps
are chained across chunks, either by a sequential scan or by ``lax.associative_scan``
(log depth, more flops). Context parallelism (kda_lib.context_parallel) chains the same maps
across devices.

Numerical safety: decay ratios ``exp(G_i - G_j)`` (G = in-chunk cumulative log decay) are never
formed as ``exp(G_i) * exp(-G_j)``, which overflows for strong gates. Keys in earlier blocks of 8
rows factor through the log decay just before the row block (two factors <= 1, one matmul);
pairs inside a block use the exact ratio. Every exponent is summed over exactly its own range.
Any ``g <= 0`` is safe, the unbounded softplus gate included, and float32 results stay as close
to the float64 oracle as the float32 recurrence is.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from kda_lib._checks import accumulation_dtype, check_kda_inputs, resolve_scale
from kda_lib.reference import first_segment_id

ScanMode = Literal["sequential", "associative"]
HIGHEST = jax.lax.Precision.HIGHEST


class ChunkMaps(NamedTuple):
    """Per-chunk affine summaries, each with leading dims ``[B, H, N]`` (N = number of chunks).

    ``S_out = transition @ S_in + state_ext`` and ``O = q_eff @ S_in + o_intra``.
    """

    transition: jax.Array  # [B, H, N, K, K]
    state_ext: jax.Array  # [B, H, N, K, V]
    q_eff: jax.Array  # [B, H, N, C, K]
    o_intra: jax.Array  # [B, H, N, C, V]


def default_scan_mode() -> ScanMode:
    """Sequential on CPU (measured faster there); associative where steps cost kernel launches."""
    return "sequential" if jax.default_backend() == "cpu" else "associative"


def _mm(subscripts: str, *operands):
    return jnp.einsum(subscripts, *operands, precision=HIGHEST)


def unit_lower_inverse(a: jax.Array, base: int = 16) -> jax.Array:
    """``(I + a)^-1`` for strictly lower-triangular ``a`` ``[..., C, C]``, with matmuls only.

    Diagonal blocks of size ``base`` are inverted by the finite Neumann product
    ``(I - X)(I + X^2)(I + X^4)...``; blocks are then merged pairwise with the exact formula
    ``[[X1, 0], [L21, X2]]^-1 = [[X1^-1, 0], [-X2^-1 L21 X1^-1, X2^-1]]``.
    """
    size = a.shape[-1]
    lead = a.shape[:-2]
    block = min(base, size)
    if size % block or block & (block - 1) or (size // block) & (size // block - 1):
        raise ValueError(
            f"unit_lower_inverse needs C = base * 2^j with base a power of 2, got C={size}"
        )
    n = size // block
    x = jnp.moveaxis(jnp.diagonal(a.reshape(*lead, n, block, n, block), axis1=-4, axis2=-2), -1, -3)
    eye = jnp.eye(block, dtype=a.dtype)
    inv = eye - x
    power = x
    for _ in range(int(math.log2(block)) - 1):
        power = _mm("...ij,...jk->...ik", power, power)
        inv = _mm("...ij,...jk->...ik", inv, eye + power)
    m = block
    while m < size:
        pairs = size // (2 * m)
        inv = inv.reshape(*lead, pairs, 2, m, m)
        x1, x2 = inv[..., 0, :, :], inv[..., 1, :, :]
        a_blocks = a.reshape(*lead, pairs, 2 * m, pairs, 2 * m)
        diag = jnp.moveaxis(jnp.diagonal(a_blocks, axis1=-4, axis2=-2), -1, -3)
        l21 = diag[..., m:, :m]
        lower = -_mm("...ij,...jk,...kl->...il", x2, l21, x1)
        top = jnp.concatenate([x1, jnp.zeros_like(x1)], axis=-1)
        bottom = jnp.concatenate([lower, x2], axis=-1)
        inv = jnp.concatenate([top, bottom], axis=-2)
        m *= 2
    return inv.reshape(*lead, size, size)


SUB_CHUNK = 8  # rows per score block


def _suffix_sum(x, axis):
    """``sum_{m > i} x_m`` along ``axis`` (exclusive), summed directly, not as a difference."""
    rev = jnp.flip(jnp.cumsum(jnp.flip(x, axis), axis), axis)
    zero = jnp.zeros_like(jax.lax.slice_in_dim(rev, 0, 1, axis=axis))
    return jnp.concatenate([jax.lax.slice_in_dim(rev, 1, None, axis=axis), zero], axis)


class ScoreDecays(NamedTuple):
    """Decay factors for :func:`_decayed_scores`, shared by the q.k and k.k scores.

    For row block I (rows lo..hi-1, s = SUB_CHUNK, n = C / s blocks):
      row[..., I, i, K]      = exp(G_i - G_{lo-1})       rows from the block start, <= 1
      keys[I]  [..., lo, K]  = exp(G_{lo-1} - G_j)       earlier keys up to the block start, <= 1
      within[..., I, i, j, K] = exp(G_i - G_j), j <= i    the exact ratio inside the block
    Every exponent is a sum of same-sign terms over exactly its own range, so its rounding error
    is eps * |exponent|; differences of prefix sums would cost eps * |G| instead, i.e. relative
    precision of decay factors in chunks with strong gates.
    """

    row: jax.Array
    keys: tuple
    within: jax.Array


def _score_decays(g) -> ScoreDecays:
    """g: ``[..., C, K]`` per-step log decays ``<= 0``."""
    *lead, size, dim = g.shape
    s = min(SUB_CHUNK, size)
    n = size // s
    gb = g.reshape(*lead, n, s, dim)
    row = jnp.exp(jnp.cumsum(gb, axis=-2))
    tail = _suffix_sum(gb, axis=-2)  # [..., n, s, K]: sum over (j, block end]
    totals = jnp.sum(gb, axis=-2)  # [..., n, K]
    idx = jnp.arange(n)
    between = (idx[None, None, :] > idx[None, :, None]) & (idx[None, None, :] < idx[:, None, None])
    span = _mm("...mk,IJm->...IJk", totals, between.astype(g.dtype))  # blocks J < m < I
    keys = tuple(
        jnp.exp(tail[..., :block, :, :] + span[..., block, :block, None, :]).reshape(
            *lead, block * s, dim
        )
        for block in range(n)
    )
    # exact in-block ratios: sum_{j < m <= i} g_m as a cumulative sum along i for each j
    pos = jnp.arange(s)
    after_j = jnp.where(pos[:, None, None] < pos[None, :, None], gb[..., None, :, :], 0.0)
    ratio_log = jnp.cumsum(after_j, axis=-2)  # [..., n, j, i, K]
    lower = (pos[:, None] <= pos[None, :])[..., None]  # [j, i, 1]: j <= i
    within = jnp.exp(jnp.where(lower, ratio_log, -jnp.inf))
    return ScoreDecays(row, keys, jnp.swapaxes(within, -3, -2))  # [..., n, i, j, K]


def _decayed_scores(x, k, decays: ScoreDecays, strict: bool):
    """``S[i, j] = sum_c x[i, c] k[j, c] exp(G[i, c] - G[j, c])`` for j <= i (j < i if strict).

    x, k: ``[..., C, K]``. Returns ``[..., C, C]``, zero above (on) the diagonal. Keys in earlier
    row blocks factor through the log decay just before the block (both factors <= 1, a
    matmul); keys in the same block use the exact ratio.
    """
    *lead, size, dim = x.shape
    n = decays.row.shape[-3]
    s = size // n
    xb = x.reshape(*lead, n, s, dim)
    kb = k.reshape(*lead, n, s, dim)
    within = _mm("...Iik,...Ijk,...Iijk->...Iij", xb, kb, decays.within)
    if strict:
        within = jnp.where(jnp.tril(jnp.ones((s, s), bool), -1), within, 0.0)
    x_dec = xb * decays.row
    pad = [(0, 0)] * len(lead)
    rows = [jnp.pad(within[..., 0, :, :], pad + [(0, 0), (0, size - s)])]
    for block in range(1, n):
        lo = block * s
        earlier = _mm(
            "...ik,...jk->...ij", x_dec[..., block, :, :], k[..., :lo, :] * decays.keys[block]
        )
        rows.append(
            jnp.concatenate(
                [earlier, within[..., block, :, :], jnp.zeros((*lead, s, size - lo - s), x.dtype)],
                -1,
            )
        )
    return jnp.concatenate(rows, axis=-2)


def chunk_affine_maps(q, k, v, g, beta, *, scale: float, segments=None) -> ChunkMaps:
    """Affine summaries of every chunk, computed in parallel.

    Args:
      q, k, g: ``[B, H, N, C, K]``; v: ``[B, H, N, C, V]``; beta: ``[B, H, N, C]`` (all in the
        accumulation dtype; padding tokens must already have g = 0 and beta = 0).
      segments: None, or ``(same [B,1,N,C,C] bool, sees_in [B,1,N,C] bool,
        in_last [B,1,N,C] bool, keeps_in [B,1,N] bool)``: which token pairs share a segment,
        which tokens continue the segment entering the chunk, which belong to the segment
        leaving it, and whether the entering segment is also the leaving one.
    """
    decays = _score_decays(g)
    attn_kk = beta[..., None] * _decayed_scores(k, k, decays, strict=True)
    attn_qk = scale * _decayed_scores(q, k, decays, strict=False)
    cum_g = jnp.cumsum(g, axis=-2)
    decay_in = jnp.exp(cum_g)  # chunk start -> token, <= 1
    last_g = cum_g[..., -1, :]
    decay_out = jnp.exp(_suffix_sum(g, axis=-2))  # token -> chunk end, <= 1
    k_in = k * decay_in
    q_in = scale * q * decay_in
    k_out = k * decay_out
    keep = jnp.exp(last_g)
    if segments is not None:
        same, sees_in, in_last, keeps_in = segments
        attn_kk = jnp.where(same, attn_kk, 0.0)
        attn_qk = jnp.where(same, attn_qk, 0.0)
        k_in = jnp.where(sees_in[..., None], k_in, 0.0)
        q_in = jnp.where(sees_in[..., None], q_in, 0.0)
        k_out = jnp.where(in_last[..., None], k_out, 0.0)
        keep = jnp.where(keeps_in[..., None], keep, 0.0)
    solve = unit_lower_inverse(attn_kk, base=min(16, q.shape[-2]))
    w = _mm("...ij,...jk->...ik", solve, beta[..., None] * k_in)  # [.., C, K]
    u = _mm("...ij,...jv->...iv", solve, beta[..., None] * v)  # [.., C, V]
    q_eff = q_in - _mm("...ij,...jk->...ik", attn_qk, w)
    o_intra = _mm("...ij,...jv->...iv", attn_qk, u)
    transition = keep[..., :, None] * jnp.eye(k.shape[-1], dtype=k.dtype) - _mm(
        "...ck,...cl->...kl", k_out, w
    )
    state_ext = _mm("...ck,...cv->...kv", k_out, u)
    return ChunkMaps(transition, state_ext, q_eff, o_intra)


def compose_affine(first, second):
    """Apply ``first`` then ``second``: ``(M2 M1, M2 E1 + E2)``. Works on stacked maps."""
    m1, e1 = first
    m2, e2 = second
    return _mm("...ij,...jk->...ik", m2, m1), _mm("...ij,...jv->...iv", m2, e1) + e2


def chain_states(transition, state_ext, initial_state, mode: ScanMode):
    """States entering each chunk and the final state.

    transition ``[B, H, N, K, K]``, state_ext ``[B, H, N, K, V]``, initial_state ``[B, H, K, V]``.
    Returns ``(entering [B, H, N, K, V], final [B, H, K, V])``.
    """
    if mode == "sequential":

        def step(state, maps):
            m, e = maps
            return _mm("bhij,bhjv->bhiv", m, state) + e, state

        final, entering = jax.lax.scan(
            step, initial_state, (jnp.moveaxis(transition, 2, 0), jnp.moveaxis(state_ext, 2, 0))
        )
        return jnp.moveaxis(entering, 0, 2), final
    if mode == "associative":
        m_cum, e_cum = jax.lax.associative_scan(compose_affine, (transition, state_ext), axis=2)
        after = _mm("bhnij,bhjv->bhniv", m_cum, initial_state) + e_cum  # state after each chunk
        entering = jnp.concatenate([initial_state[:, :, None], after[:, :, :-1]], axis=2)
        return entering, after[:, :, -1]
    raise ValueError(f"scan must be 'sequential', 'associative' or None, got {mode!r}")


def segment_masks(segment_ids: jax.Array, chunk_size: int):
    """Masks for :func:`chunk_affine_maps` from padded ``segment_ids`` ``[B, T]`` (T % C == 0)."""
    batch, seq_len = segment_ids.shape
    num_chunks = seq_len // chunk_size
    ids = segment_ids.astype(jnp.int32)
    valid = ids != 0
    positions = jnp.arange(seq_len)
    last_valid = jax.lax.cummax(jnp.where(valid, positions, -1), axis=1)
    first = first_segment_id(ids)
    # id of the segment the state belongs to after each token (the row's first id before any)
    current = jnp.where(
        last_valid >= 0, jnp.take_along_axis(ids, jnp.maximum(last_valid, 0), 1), first[:, None]
    )
    leaving = current[:, chunk_size - 1 :: chunk_size]  # [B, N]
    entering = jnp.concatenate([first[:, None], leaving[:, :-1]], axis=1)
    ids_c = ids.reshape(batch, num_chunks, chunk_size)
    valid_c = valid.reshape(batch, num_chunks, chunk_size)
    same = (ids_c[..., :, None] == ids_c[..., None, :]) & valid_c[..., :, None]
    sees_in = valid_c & (ids_c == entering[..., None])
    in_last = valid_c & (ids_c == leaving[..., None])
    keeps_in = leaving == entering
    return tuple(x[:, None] for x in (same, sees_in, in_last, keeps_in))  # head axis


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
) -> tuple[jax.Array, jax.Array | None]:
    """KDA in chunkwise (WY/UT) form; same results as :func:`kda_lib.kda_recurrent`.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: ``[B, T, H, K]`` log decay ``<= 0``;
        beta: ``[B, T, H]``. Any float dtype; all arithmetic is float32 (float64 for float64
        inputs), outputs are cast back to q's dtype.
      scale, initial_state, output_final_state, segment_ids, allow_neg_eigval: as in
        :func:`kda_lib.kda_recurrent`.
      chunk_size: tokens per chunk, a power of two (default 64). Any T works (padded inside).
      scan: how chunk maps are chained: ``"sequential"``, ``"associative"``, or None for the
        platform default (:func:`default_scan_mode`).

    Returns:
      ``(o [B, T, H, V], final_state [B, H, K, V] float32 | None)``.
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
    if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two, got {chunk_size!r}")
    mode = scan or default_scan_mode()
    scale = resolve_scale(scale, dims.key_dim)
    acc = accumulation_dtype(q.dtype)
    batch, seq_len, heads, key_dim, value_dim = dims
    num_chunks = -(-seq_len // chunk_size)
    padded = num_chunks * chunk_size

    out_dtype = q.dtype
    q, k, v, g, beta = (x.astype(acc) for x in (q, k, v, g, beta))
    if segment_ids is not None:
        valid = segment_ids != 0
        g = jnp.where(valid[..., None, None], g, 0.0)
        beta = jnp.where(valid[..., None], beta, 0.0)
    if padded != seq_len:  # padding tokens: no decay, no write, outputs dropped
        pad = [(0, 0), (0, padded - seq_len)]
        q, k, v, g = (jnp.pad(x, pad + [(0, 0), (0, 0)]) for x in (q, k, v, g))
        beta = jnp.pad(beta, pad + [(0, 0)])
        if segment_ids is not None:
            segment_ids = jnp.pad(segment_ids, pad)

    def to_chunks(x):  # [B, T, H, D] -> [B, H, N, C, D]
        x = x.reshape(batch, num_chunks, chunk_size, heads, *x.shape[3:])
        return jnp.moveaxis(x, 3, 1)

    segments = None if segment_ids is None else segment_masks(segment_ids, chunk_size)
    maps = chunk_affine_maps(
        to_chunks(q),
        to_chunks(k),
        to_chunks(v),
        to_chunks(g),
        to_chunks(beta),
        scale=scale,
        segments=segments,
    )
    state0 = (
        jnp.zeros((batch, heads, key_dim, value_dim), acc)
        if initial_state is None
        else initial_state.astype(acc)
    )
    entering, final_state = chain_states(maps.transition, maps.state_ext, state0, mode)
    o = _mm("bhnck,bhnkv->bhncv", maps.q_eff, entering) + maps.o_intra
    o = jnp.moveaxis(o, 1, 3).reshape(batch, padded, heads, value_dim)[:, :seq_len]
    return o.astype(out_dtype), (final_state if output_final_state else None)
