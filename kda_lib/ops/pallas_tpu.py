"""KDA's chunked form as two Pallas TPU kernels (forward, and a reverse-chunk backward).

One program per (batch row, block of ``BLOCK_T`` tokens, up to :data:`HEADS` value heads); the
blocks run in order (forward) or in reverse (backward), ``chunk_size`` tokens at a time inside a
block, with the states ``S [heads, K, V]`` (or their cotangents) in float32 in VMEM between blocks.
q, k, v, g are read once from the batch-first layout (``[B, T, H, D]`` viewed as ``[B, T * H * D /
128, 128]``, the same bytes at D = 128: a block holds every head of its tokens, unpacked head-major
by strided loads in VMEM; past :data:`ROW_BYTES` a token and lane, calls of fewer heads) and o is
written once. One chunk's math is :func:`chunk_intra` (every chunk of a block and every head at
once) then :func:`state_forward` (chunk by chunk; the steps of :mod:`kda_lib.ops.chunked`'s
docstring); the backward kernel recomputes :func:`chunk_intra` under ``jax.vjp`` from the states the
forward saved at chunk boundaries and carries the states' cotangents by :func:`state_backward`.

Decay ratios are exponentials of sums of ``g <= 0`` over exactly their own range
(:func:`_level_sums`): any ``g <= 0`` is safe. Matmuls of float32 operands are split into bfloat16
pieces (:func:`_dot`: 1, 3 or 6 passes), the same numerics on a chip and in Pallas's interpret mode
on a CPU. K and V are padded to multiples of 128 (K <= 128, V <= 256); no segment ids, no interior
states (:func:`problems`); non-finite results: the recurrence's (:func:`kda_pallas`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kda_lib.ops.contract import Dims, not_differentiated
from kda_lib.ops.reference import recurrent_core

LANES = 128  # the TPU's lane width: K and V are padded to multiples of it
MIN_CHUNK = 16  # the smallest chunk_size served: a bfloat16 (16, 128) tile (tested up to BLOCK_T)
BLOCK_T = 256  # tokens per grid step (a multiple of the chunk; beta's row tile: 256 lanes)
VMEM_LIMIT = 64 * 2**20  # the scoped-VMEM cap asked for (v5e/v6e have 128 MiB, v7x 64 MiB)
# bfloat16 inputs: passes of the scores, of the inverse and w, u, of the state's products
# (one pass for the scores or the state's products fails where keys correlate: DESIGN section 4)
LOW_PASSES = (3, 3, 3)
KERNELS = "the Pallas TPU kernels (implementation='pallas_tpu')"
HEADS = (4, 2)  # at most this many value heads per program (forward, backward)
# at most this many bytes a token and lane in one kernel call: its value heads' 128-lane rows
# times the widest item of q, k, v (VMEM holds every head of a block: 16 bfloat16 or 8 float32
# rows compiled on the v5e at every chunk size, DESIGN section 4); more heads are split into
# calls over a batch axis by one XLA copy (:func:`kda_pallas`)
ROW_BYTES = 32


# ------------------------------------------------------------------ matmuls, exact or not
def _pieces(x, count: int):
    """``x`` float32 as ``count`` bfloat16 pieces summing to it (to 8, 16, 24 bits)."""
    out = []
    for _ in range(count):
        hi = x.astype(jnp.bfloat16)
        out.append(hi)
        x = x - hi.astype(jnp.float32)
    return out


def _dot_fwd_impl(a, b, passes: int, dims):
    """``dot_general(a, b, dims)`` accumulated in float32 from bfloat16 pieces: 1 pass (bf16
    operands), 3 (pieces 2 + 2, ``hi hi + hi lo + lo hi``) or 6 (pieces 3 + 3, orders <= 2)."""
    f32 = jnp.float32
    batch = ((0,), (0,)) if a.ndim == 3 else ((), ())
    # every piece is one bfloat16 pass: precision named, so that a caller's
    # jax.default_matmul_precision("highest") cannot ask Mosaic for float32 bf16 matmuls
    dot = functools.partial(jax.lax.dot_general, dimension_numbers=(dims, batch),
                            precision=jax.lax.Precision.DEFAULT,
                            preferred_element_type=f32)  # fmt: skip
    if passes == 1 or (a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16):
        return dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
    count = {3: 2, 6: 3}[passes]
    pa = [a.astype(jnp.bfloat16)] if a.dtype == jnp.bfloat16 else _pieces(a.astype(f32), count)
    pb = [b.astype(jnp.bfloat16)] if b.dtype == jnp.bfloat16 else _pieces(b.astype(f32), count)
    out = None
    for i, x in enumerate(pa):
        for j, y in enumerate(pb):
            if i + j < count:
                term = dot(x, y)
                out = term if out is None else out + term
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dot(a, b, passes: int, trans_b: bool = False):
    """``a @ b`` (``a @ b.T`` with ``trans_b``) in float32 by :func:`_dot_fwd_impl`, batched
    over a leading axis of 3-d operands; its gradients at the same number of passes."""
    n = a.ndim
    return _dot_fwd_impl(a, b, passes, ((n - 1,), (n - 1,) if trans_b else (n - 2,)))


def _dot_t(a, b, passes: int):
    """``a.T @ b`` (a float32 transpose first: it lowers everywhere)."""
    return _dot(_t(a.astype(jnp.float32)), b, passes)


def _t(x):
    return jnp.swapaxes(x, -1, -2)


def _dot_vjp_fwd(a, b, passes, trans_b):  # the plain body, as chunked.py's rules (DESIGN 4)
    return _dot.fun(a, b, passes, trans_b), (a, b)


def _dot_vjp_bwd(passes, trans_b, residuals, d_out):
    a, b = residuals  # out = a @ op(b)
    d_a = _dot(d_out, b, passes, not trans_b)  # d_out @ op(b).T
    d_b = _dot_t(a, d_out, passes)  # d op(b) = a.T @ d_out
    return d_a.astype(a.dtype), (_t(d_b) if trans_b else d_b).astype(b.dtype)


_dot.defvjp(_dot_vjp_fwd, _dot_vjp_bwd)


# ------------------------------------------------------------------ shifts and scans
@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _roll(x, shift: int):
    """``jnp.roll(x, shift)`` along the rows (axis -2), ``0 <= shift < rows``, as the TPU
    rotates."""
    return pltpu.roll(x, jnp.int32(shift), x.ndim - 2) if shift else x


_roll.defvjp(lambda x, s: (_roll(x, s), None),
             lambda s, _, d: (_roll(d, (d.shape[-2] - s) % d.shape[-2]),))  # fmt: skip


@jax.custom_vjp
def _halves(x):
    """``x [..., 2n, D]`` as its first and last ``n`` rows (the pullback concatenates: a
    slice's own transpose is a pad)."""
    n = x.shape[-2] // 2
    return x[..., :n, :], x[..., n:, :]


_halves.defvjp(lambda x: (_halves(x), None),
               lambda _, d: (jnp.concatenate(d, axis=-2),))  # fmt: skip


# typed: no 64-bit constants under jax_enable_x64 (Mosaic has none)
_ZERO, _ONE, _I0 = np.float32(0), np.float32(1), np.int32(0)


def _div(x, n: int):  # floor division of non-negative ints (jnp's // lowers through sign)
    return jax.lax.div(x, jnp.asarray(n, x.dtype))


def _rem(x, n: int):
    return jax.lax.rem(x, jnp.asarray(n, x.dtype))


def _rows(shape):
    return jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 2)


def _cols(shape):
    return jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)


# ------------------------------------------------------------------ one chunk
def _eye(size):
    return _rows((size, size)) == _cols((size, size))


def _row(x, i: int):
    """Row ``i`` of ``x [..., C, D]`` as ``[..., 1, D]``, by a masked sum (slices' transposes
    are pads)."""
    return jnp.sum(jnp.where(_rows(x.shape) == i, x, _ZERO), axis=-2, keepdims=True)


def _column(row):
    """``[..., 1, D]`` -> ``[..., D, 1]`` by a masked sum."""
    return jnp.sum(jnp.where(_eye(row.shape[-1]), row, _ZERO), axis=-1, keepdims=True)


def _passes(low: bool):
    """``(scores, inverse and w/u, state)`` matmul passes."""
    return LOW_PASSES if low else (6, 6, 6)


def _fill(x, h: int, *, first: bool):
    """Within aligned segments of ``2h`` rows of ``x [..., C, D]``: the segment's last row on its
    first ``h`` rows (``first``), or its row ``h - 1`` on its last ``h`` rows; 0 elsewhere."""
    size, width, lanes = x.shape[-2], 2 * h, x.shape[-1]
    source, keep = (width - 1, lambda r: r < h) if first else (h - 1, lambda r: r >= h)
    if h >= 8:  # whole (8, 128) tiles: a masked sum over each segment's rows, broadcast back
        seg = x.reshape(-1, width, lanes)
        rows = _rows(seg.shape[-2:])
        row = jnp.sum(jnp.where(rows == source, seg, _ZERO), axis=-2, keepdims=True)
        return jnp.where(keep(rows), row, _ZERO).reshape(x.shape)
    rows = _rem(_rows(x.shape[-2:]), width)
    y, shift = jnp.where(rows == source, x, _ZERO), 1
    while shift <= h:  # spread by doubling (over 2h rows: the last segment's spill is dropped)
        y = y + _roll(y, size - shift if first else shift)
        shift *= 2
    return jnp.where(keep(rows), y, _ZERO)


def _level_sums(g):
    """``[(h, inclusive, exclusive)]`` for ``h = 1, 2, 4, ..., C``: the sums of ``g [..., C, K]``
    within aligned segments of ``h`` rows from the segment's start through row i, and from after
    row j through the segment's end (None for h = 1: 0), each over exactly its own range."""
    levels, inclusive, exclusive, h = [], g, None, 1
    while True:
        levels.append((h, inclusive, exclusive))
        if h == g.shape[-2]:
            return levels
        after = _fill(inclusive, h, first=True)  # the second half's total, on the first half
        exclusive = after if exclusive is None else exclusive + after
        inclusive = inclusive + _fill(inclusive, h, first=False)
        h *= 2


def chunk_intra(q, k, v, g, beta, *, scale: float, low: bool):
    """Steps 1 and 2 of chunks ``[..., C, .]`` (q, k, v any float dtype; g ``[..., C, K]`` and
    beta ``[..., C, 1]`` float32): ``(attn_qk [.., C, C], w, u, q_in, k_out, keep [.., K,
    1])``; with ``U' = u - w S``, the outputs are ``q_in S + attn_qk U'``, the state leaving
    ``keep * S + k_out^T U'``. ``low``: bfloat16 inputs (fewer passes, :data:`LOW_PASSES`)."""
    f32 = jnp.float32
    size = q.shape[-2]
    p_score, p_inner, _ = _passes(low)
    k32, q32 = k.astype(f32), q.astype(f32) * scale
    levels = _level_sums(g)
    _, last_in, last_out = levels.pop()
    decay_in, decay_out = jnp.exp(last_in), jnp.exp(last_out)  # exp(G_i), exp(G_C - G_j)
    # decayed scores, pair (i > j) at the level h where i and j part: both halves of their
    # 2h-segment, the decay split at its middle m into exp(G_i - G_m) exp(G_m - G_j) <= 1 each;
    # one product per level, the keys against queries and keys stacked ([C, 2C]: the MXU's
    # whole width at C = 64), transposed once; the diagonal q_i . k_i on the vector unit
    j, i = _rows((size, 2 * size)), _rem(_cols((size, 2 * size)), size)  # key j, row i
    scores_t = jnp.zeros((*q.shape[:-2], size, 2 * size), f32)
    for h, inclusive, exclusive in levels:  # i in the h rows right after j's, j's 2h-aligned
        mine = (_div(i, h) - _div(j, h) == 1) & (_rem(_div(j, h), 2) == 0)
        row_f = jnp.exp(inclusive)
        keys = k32 if exclusive is None else k32 * jnp.exp(exclusive)
        both = jnp.concatenate([q32 * row_f, k32 * row_f], axis=-2)
        scores_t = scores_t + jnp.where(mine, _dot(keys, both, p_score, True), _ZERO)
    attn_qk, attn_kk = _halves(_t(scores_t))
    attn_qk = attn_qk + jnp.where(_eye(size), jnp.sum(q32 * k32, -1, keepdims=True), _ZERO)
    attn_kk = beta * attn_kk
    solve = _unit_lower_inverse(attn_kk, p_inner)
    w = _dot(solve, beta * k32 * decay_in, p_inner)
    u = _dot(solve, beta * v.astype(f32), p_inner)
    keep = _column(_row(decay_in, size - 1))  # exp(G_C) [.., K, 1]
    return attn_qk, w, u, q32 * decay_in, k32 * decay_out, keep


def state_forward(intra, state, low: bool):
    """Step 3 of one chunk from its :func:`chunk_intra` (2-d): ``(o [C, V], state after)``."""
    attn_qk, w, u, q_in, k_out, keep = intra
    p_score, _, p_state = _passes(low)
    corrected = u - _dot(w, state, p_state)
    o = _dot(q_in, state, p_state) + _dot(attn_qk, corrected, p_score)
    return o, keep * state + _dot_t(k_out, corrected, p_state)


def state_backward(intra, state, d_o, d_after, low: bool):
    """The cotangents of :func:`state_forward`'s inputs: ``(d intra, d state)``."""
    attn_qk, w, u, q_in, k_out, keep = intra
    p_score, _, p_state = _passes(low)
    corrected = u - _dot(w, state, p_state)
    d_corrected = _dot_t(attn_qk, d_o, p_score) + _dot(k_out, d_after, p_state)
    d_intra = (_dot(d_o, corrected, p_score, True),  # attn_qk
               -_dot(d_corrected, state, p_state, True),  # w
               d_corrected,  # u
               _dot(d_o, state, p_state, True),  # q_in
               _dot(corrected, d_after, p_state, True),  # k_out
               jnp.sum(state * d_after, axis=-1, keepdims=True))  # keep  # fmt: skip
    d_state = keep * d_after + _dot_t(q_in, d_o, p_state) - _dot_t(w, d_corrected, p_state)
    return d_intra, d_state


def _unit_lower_inverse(attn, passes: int):
    """``(I + attn)^-1`` for strictly lower ``attn [..., C, C]``: the 2 x 2 diagonal blocks
    ``[[1, 0], [a, 1]]^-1 = [[1, 0], [-a, 1]]``, then blocks of h rows merged into 2h,
    ``[[X1, 0], [A21, X2]]^-1 = [[X1, 0], [-X2 A21 X1, X2]]``: products of inverses and of
    ``attn``'s own entries only (DESIGN section 4)."""
    size = attn.shape[-1]
    rows, cols = _rows(attn.shape[-2:]), _cols(attn.shape[-2:])
    pairs = jnp.where(_div(rows, 2) == _div(cols, 2), attn, _ZERO)  # a_(2i+1, 2i)
    inv = jnp.where(_eye(size), _ONE, _ZERO) - pairs
    h = 2
    while h < size:  # rows of a 2h-segment's second half, columns of its first: -X2 A21 X1
        lower = ((_div(rows, 2 * h) == _div(cols, 2 * h)) & (_rem(rows, 2 * h) >= h)
                 & (_rem(cols, 2 * h) < h))  # fmt: skip
        inv = inv - _dot(_dot(inv, jnp.where(lower, attn, _ZERO), passes), inv, passes)
        h *= 2
    return inv


# ------------------------------------------------------------------ the kernels
def _compiler_params(semantics):
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=VMEM_LIMIT)


def _heads_per_program(heads: int, most: int) -> int:
    """Value heads per program: the largest power of two up to ``most`` that divides ``heads``."""
    m = most
    while heads % m:
        m //= 2
    return m


def _rows_of(ref, head: int, heads: int, interpret: bool):
    """Head ``head``'s rows ``[BLOCK_T, W]`` of a block ``[1, BLOCK_T * heads * parts, 128]`` of a
    ``[B, T * heads * parts, 128]`` array (``[B, T, heads, W = parts * 128]``; the same bytes at
    ``parts = 1``), in the block's dtype: per part a load with a stride of ``heads * parts`` rows
    from a static start (Mosaic compiles no other, and only 128-lane rows). 16-bit rows pair up in
    32-bit words (:func:`pltpu.bitcast`'s packing, the even row in the low half: Mosaic loads
    32-bit rows only), so ``heads * parts`` is even for them (:func:`kda_pallas` widens others)."""
    n = ref.shape[1] // BLOCK_T  # heads * parts
    parts = n // heads
    assert ref.dtype.itemsize == 4 or n % 2 == 0, "odd 16-bit rows: kda_pallas widens them"
    if interpret:  # Pallas's interpreter has no strided slices: the same rows by a reshape
        return ref[0].reshape(BLOCK_T, heads, parts * LANES)[:, head]
    pieces = []
    for row in range(head * parts, (head + 1) * parts):
        if ref.dtype.itemsize == 4:
            pieces.append(ref[0, pl.ds(row, BLOCK_T, stride=n), :])
            continue
        words = ref.bitcast(jnp.uint32)[0, pl.ds(row // 2, BLOCK_T, stride=n // 2), :]
        pieces.append(_half(words, row % 2).astype(ref.dtype))
    return pieces[0] if parts == 1 else jnp.concatenate(pieces, axis=-1)


def _unpack(ref, scratch, interpret: bool):
    """Every head's rows of a block ``ref`` (:func:`_rows_of`) into ``scratch [H, BLOCK_T, W]``
    (head-major: a program then takes its heads at a dynamic index)."""
    heads = scratch.shape[0]
    for h in range(heads):
        scratch[h] = _rows_of(ref, h, heads, interpret).astype(scratch.dtype)


def _pack(scratch, ref, interpret: bool):
    """``scratch [H, BLOCK_T, W]`` (every head) into the rows of ``ref`` (:func:`_rows_of`'s
    layout; strided stores, 16-bit rows two to a word, the even row's bits low)."""
    heads, _, width = scratch.shape
    if interpret:
        ref[0] = jnp.swapaxes(scratch[...], 0, 1).reshape(-1, LANES).astype(ref.dtype)
        return
    n = ref.shape[1] // BLOCK_T
    parts = n // heads
    assert ref.dtype.itemsize == 4 or n % 2 == 0, "odd 16-bit rows: kda_pallas widens them"
    row = lambda r: scratch[r // parts, :, (r % parts) * LANES : (r % parts + 1) * LANES]  # noqa: E731
    if ref.dtype.itemsize == 4:
        for r in range(n):
            ref[0, pl.ds(r, BLOCK_T, stride=n), :] = row(r).astype(ref.dtype)
        return
    words = ref.bitcast(jnp.uint32)
    for r in range(0, n, 2):
        pair = _word(row(r).astype(ref.dtype), row(r + 1).astype(ref.dtype))
        words[0, pl.ds(r // 2, BLOCK_T, stride=n // 2), :] = pair


def _half(words, odd: int):
    """The float32 values of the 16-bit rows packed in uint32 ``words`` (:func:`pltpu.bitcast`'s
    packing: the even row in the low half, the odd one in the high half)."""
    bits = words & np.uint32(0xFFFF0000) if odd else words << 16
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _word(even, odd):
    """bfloat16 rows ``even`` and ``odd`` as one uint32 array (:func:`_half`'s inverse)."""
    bits = [jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32) for x in (even, odd)]
    return (bits[0] >> 16) | (bits[1] & np.uint32(0xFFFF0000))


def _mine(scratch, first, count: int, chunk: int, groups: int = 1, dtype=None):
    """Value heads ``first, ..., first + count - 1`` of ``scratch [H, BLOCK_T, D]`` as ``[count *
    BLOCK_T / chunk, chunk, D]`` (head-major, one row per chunk); with ``groups``, value head j
    reads head ``j // groups`` (grouped value heads share a q/k head)."""
    if groups == 1:
        x = scratch[pl.ds(first, count)]
    else:
        x = jnp.stack([scratch[_div(first + i, groups)] for i in range(count)])
    x = x if dtype is None else x.astype(dtype)
    return x.reshape(-1, chunk, x.shape[-1])


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, s0_ref, o_ref, final_ref, *rest,
                    chunk: int, scale: float, low: bool, save: bool, m: int,
                    interpret: bool):  # fmt: skip
    """One (row, block, m heads): every chunk's intra part at once, then the states chunk by
    chunk (the heads' together). The block's first program unpacks every head's rows into
    head-major scratch; its last packs every head's outputs."""
    states_ref = rest[0] if save else None
    state_ref, beta_col, qs, ks, vs, gs, outs = rest[-7:]
    heads, key_dim, value_dim = state_ref.shape
    per_block = BLOCK_T // chunk
    group, first = pl.program_id(2), pl.program_id(2) * m
    mine = pl.ds(first, m)

    @pl.when(pl.program_id(1) == 0)
    def _():
        state_ref[mine] = s0_ref[0, mine]

    @pl.when(group == 0)
    def _():
        for ref, scratch in ((q_ref, qs), (k_ref, ks), (v_ref, vs), (g_ref, gs)):
            _unpack(ref, scratch, interpret)

    take = functools.partial(_mine, first=first, count=m, chunk=chunk)
    qk = [take(x, groups=heads // x.shape[0]) for x in (qs, ks)]
    beta_col[...] = _column(beta_ref[0])  # [m, 1, BLOCK_T] -> [m, BLOCK_T, 1]
    beta = beta_col[...].reshape(-1, chunk, 1)
    intra = chunk_intra(*qk, take(vs), take(gs), beta, scale=scale, low=low)
    intra = [x.reshape(m, per_block, *x.shape[1:]) for x in intra]
    state = state_ref[mine]
    for c in range(per_block):
        if save:
            states_ref[0, :, c * key_dim : (c + 1) * key_dim, :] = state
        o, state = state_forward(tuple(x[:, c] for x in intra), state, low)
        outs[mine, c * chunk : (c + 1) * chunk, :] = o
    state_ref[mine] = state

    @pl.when(group == pl.num_programs(2) - 1)
    def _():
        _pack(outs, o_ref, interpret)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        final_ref[0, mine] = state


def _backward_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, states_ref, do_ref, d_final_ref,
                     dq_ref, dk_ref, dv_ref, dg_ref, d_beta_ref, d_s0_ref, d_state_ref, beta_col,
                     qs, ks, vs, gs, d_os, dqs, dks, dvs, dgs, *, chunk: int, scale: float,
                     low: bool, m: int, interpret: bool):  # fmt: skip
    """One (row, block in reverse, m heads): the intra parts recomputed with their pullback, the
    states' cotangents chunk by chunk from the last, then every chunk's pullback at once (rows
    unpacked and packed as in :func:`_forward_kernel`)."""
    heads, key_dim, value_dim = d_state_ref.shape
    per_block = BLOCK_T // chunk
    group, first = pl.program_id(2), pl.program_id(2) * m
    mine = pl.ds(first, m)
    f32 = jnp.float32

    @pl.when(pl.program_id(1) == 0)
    def _():
        d_state_ref[mine] = d_final_ref[0, mine]

    @pl.when(group == 0)
    def _():
        for ref, scratch in ((q_ref, qs), (k_ref, ks), (v_ref, vs), (g_ref, gs), (do_ref, d_os)):
            _unpack(ref, scratch, interpret)

    step = functools.partial(chunk_intra, scale=scale, low=low)
    take = functools.partial(_mine, first=first, count=m, chunk=chunk, dtype=f32)
    qk = [take(x, groups=heads // x.shape[0]) for x in (qs, ks)]
    beta_col[...] = _column(beta_ref[0])
    beta = beta_col[...].reshape(-1, chunk, 1)
    intra, pullback = jax.vjp(step, *qk, take(vs), take(gs), beta)
    intra = [x.reshape(m, per_block, *x.shape[1:]) for x in intra]
    d_o = take(d_os).reshape(m, per_block, chunk, -1)
    d_state = d_state_ref[mine]
    d_intra = [None] * per_block
    for c in reversed(range(per_block)):
        state = states_ref[0, :, c * key_dim : (c + 1) * key_dim, :]
        d_intra[c], d_state = state_backward(tuple(x[:, c] for x in intra), state, d_o[:, c],
                                             d_state, low)  # fmt: skip
    d_state_ref[mine] = d_state
    d_intra = [jnp.stack(x, 1).reshape(-1, *x[0].shape[1:]) for x in zip(*d_intra, strict=True)]
    dq, dk, dv, dg, d_beta = pullback(tuple(d_intra))
    for scratch, x in ((dqs, dq), (dks, dk), (dvs, dv), (dgs, dg)):
        scratch[mine] = x.reshape(m, BLOCK_T, x.shape[-1])
    # beta's cotangent back to its row layout: a masked sum over rows
    d_beta = d_beta.reshape(m, -1, 1)
    d_beta_ref[0] = jnp.sum(jnp.where(_eye(BLOCK_T), d_beta, _ZERO), axis=1, keepdims=True)

    @pl.when(group == pl.num_programs(2) - 1)
    def _():
        for scratch, ref in ((dqs, dq_ref), (dks, dk_ref), (dvs, dv_ref), (dgs, dg_ref)):
            _pack(scratch, ref, interpret)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        d_s0_ref[0, mine] = d_state


# ------------------------------------------------------------------ the calls
def _interpret(interpret):
    """``pallas_call``'s ``interpret`` (None: the HLO interpreter off a TPU), and whether the
    kernels take rows by reshapes (the HLO interpreter has no strided slices; Pallas's TPU
    interpreter, a ``pltpu.InterpretParams``, runs the compiled branches)."""
    mode = jax.default_backend() != "tpu" if interpret is None else interpret
    return mode, mode is True


def _specs(v, most: int, reverse: bool):
    """``(heads per program m, grid, rows(count, width), whole heads spec, beta spec)`` for the
    grid (batch, blocks, value heads / m): a block of every head (``rows``: a ``[B, T * count *
    width / 128, 128]`` array's block of ``BLOCK_T`` tokens, the same across a block's programs,
    so read once), a program's m heads taken from scratch its block's first program unpacked;
    state specs hold every head. The head axis must stay "arbitrary" (one core walks it: only
    group 0 unpacks), so a megacore chip splits only the batch axis (at B = 1, one core)."""
    batch, seq_len, heads, value_dim = v.shape
    m = _heads_per_program(heads, most)
    n_blocks = seq_len // BLOCK_T
    at = (lambda n: n_blocks - 1 - n) if reverse else (lambda n: n)

    def rows(count, width):
        size = BLOCK_T * count * (width // LANES)
        return pl.BlockSpec((1, size, LANES), lambda b, n, h: (b, at(n), _I0))

    def whole(key_dim):
        return pl.BlockSpec((1, heads, key_dim, value_dim), lambda b, n, h: (b, _I0, _I0, _I0))

    beta = pl.BlockSpec((1, m, 1, BLOCK_T), lambda b, n, h: (b, h, _I0, at(n)))
    return m, (batch, n_blocks, heads // m), rows, whole, beta


def _flat(x):
    """``[B, T, H, D]`` -> ``[B, T * H * D / 128, 128]`` (the same bytes where D = 128 and H fills
    whole tiles; an XLA copy otherwise)."""
    return x.reshape(x.shape[0], -1, LANES)


def _out_dtype(dtype, rows: int):
    """The kernel's dtype for an output of ``dtype`` with ``rows`` 128-lane rows a token: 16-bit
    rows go two to a word, so an odd count writes float32 (cast by the caller)."""
    return dtype if jnp.dtype(dtype).itemsize == 4 or rows % 2 == 0 else jnp.float32


def _scratch(shape, *dtypes):
    return [pltpu.VMEM(shape, d) for d in dtypes]


def _forward(q, k, v, g, beta_rows, s0, *, scale, chunk, low, save, interpret=None):
    """The forward kernel on padded inputs: ``(o, final_state, entering states or None)``."""
    batch, seq_len, heads, value_dim = v.shape
    key_dim, q_heads = q.shape[-1], q.shape[2]
    per_block = BLOCK_T // chunk
    m, grid, rows, whole, beta_spec = _specs(v, HEADS[0], False)
    in_specs = [rows(q_heads, key_dim), rows(q_heads, key_dim), rows(heads, value_dim),
                rows(heads, key_dim), beta_spec, whole(key_dim)]  # fmt: skip
    out_specs = [rows(heads, value_dim), whole(key_dim)]
    out_shape = [jax.ShapeDtypeStruct((batch, seq_len * heads * value_dim // LANES, LANES),
                                      _out_dtype(q.dtype, heads * value_dim // LANES)),
                 jax.ShapeDtypeStruct((batch, heads, key_dim, value_dim), jnp.float32)]
    if save:
        out_specs.append(pl.BlockSpec((1, m, per_block * key_dim, value_dim),
                                      lambda b, n, h: (b, h, n, _I0)))  # fmt: skip
        out_shape.append(jax.ShapeDtypeStruct(
            (batch, heads, seq_len // chunk * key_dim, value_dim), jnp.float32))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0, grid=grid, in_specs=in_specs, out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((heads, key_dim, value_dim), jnp.float32),
                        pltpu.VMEM((m, BLOCK_T, 1), jnp.float32),
                        *_scratch((q_heads, BLOCK_T, key_dim), q.dtype, k.dtype),
                        *_scratch((heads, BLOCK_T, value_dim), v.dtype),
                        *_scratch((heads, BLOCK_T, key_dim), jnp.float32),
                        *_scratch((heads, BLOCK_T, value_dim), jnp.float32)])  # fmt: skip
    interpret, reshaped = _interpret(interpret)
    kernel = functools.partial(_forward_kernel, chunk=chunk, scale=scale, low=low, save=save,
                               m=m, interpret=reshaped)  # fmt: skip
    out = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape, interpret=interpret,
        compiler_params=_compiler_params(("parallel", "arbitrary", "arbitrary")),
    )(_flat(q), _flat(k), _flat(v), _flat(g), beta_rows, s0)
    o = out[0].reshape(batch, seq_len, heads, value_dim).astype(q.dtype)
    return o, out[1], (out[2] if save else None)


def _backward(q, k, v, g, beta_rows, states, d_o, d_final, *, scale, chunk, groups, low,
              interpret=None):  # fmt: skip
    """The backward kernel: ``(dq, dk, dv, dg, d_beta_rows, d_s0)``, dq and dk per value head."""
    batch, seq_len, heads, value_dim = v.shape
    key_dim, q_heads = q.shape[-1], q.shape[2]
    per_block = BLOCK_T // chunk
    m, grid, rows, whole, beta_spec = _specs(v, HEADS[1], True)
    n_blocks = grid[1]
    in_specs = [rows(q_heads, key_dim), rows(q_heads, key_dim), rows(heads, value_dim),
                rows(heads, key_dim), beta_spec,
                pl.BlockSpec((1, m, per_block * key_dim, value_dim),
                             lambda b, n, h: (b, h, n_blocks - 1 - n, _I0)),
                rows(heads, value_dim), whole(key_dim)]  # fmt: skip
    grad_dtype = q.dtype if groups == 1 else jnp.float32
    wide = lambda width, dtype: jax.ShapeDtypeStruct(  # noqa: E731
        (batch, seq_len * heads * width // LANES, LANES), _out_dtype(dtype, heads * width // LANES))
    out_shape = [wide(key_dim, grad_dtype), wide(key_dim, grad_dtype), wide(value_dim, v.dtype),
                 wide(key_dim, jnp.float32), jax.ShapeDtypeStruct(beta_rows.shape, jnp.float32),
                 jax.ShapeDtypeStruct((batch, heads, key_dim, value_dim), jnp.float32)]
    out_specs = [rows(heads, key_dim), rows(heads, key_dim), rows(heads, value_dim),
                 rows(heads, key_dim), beta_spec, whole(key_dim)]  # fmt: skip
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0, grid=grid, in_specs=in_specs, out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((heads, key_dim, value_dim), jnp.float32),
                        pltpu.VMEM((m, BLOCK_T, 1), jnp.float32),
                        *_scratch((q_heads, BLOCK_T, key_dim), q.dtype, k.dtype),
                        *_scratch((heads, BLOCK_T, value_dim), v.dtype),
                        *_scratch((heads, BLOCK_T, key_dim), jnp.float32),
                        *_scratch((heads, BLOCK_T, value_dim), d_o.dtype),
                        *_scratch((heads, BLOCK_T, key_dim), jnp.float32, jnp.float32),
                        *_scratch((heads, BLOCK_T, value_dim), jnp.float32),
                        *_scratch((heads, BLOCK_T, key_dim), jnp.float32)])  # fmt: skip
    interpret, reshaped = _interpret(interpret)
    kernel = functools.partial(_backward_kernel, chunk=chunk, scale=scale, low=low, m=m,
                               interpret=reshaped)  # fmt: skip
    dq, dk, dv, dg, d_beta, d_s0 = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape, interpret=interpret,
        compiler_params=_compiler_params(("parallel", "arbitrary", "arbitrary")),
    )(_flat(q), _flat(k), _flat(v), _flat(g), beta_rows, states, _flat(d_o), d_final)
    per_value_head = lambda x: x.reshape(batch, seq_len, heads, -1)  # noqa: E731
    return (*map(per_value_head, (dq, dk, dv, dg)), d_beta, d_s0)


def _exact_where_not_finite(o, final, q, k, v, g, beta_rows, s0, scale):
    """``(o, final)``, or where either is not finite the recurrence's (:func:`recurrent_core`,
    which keeps non-finite inputs to where the recurrence has them; a chunk would spread
    them). Inside the custom VJP's forward: never differentiated (no residuals)."""

    def exact(_):
        batch, seq_len, heads, value_dim = v.shape
        dims = Dims(batch, seq_len, heads, q.shape[-1], value_dim, q.shape[2])
        beta = jnp.moveaxis(beta_rows[:, :, 0], 1, 2)
        out, state, *_ = recurrent_core(q, k, v, g, beta, dims=dims, scale=scale,
                                        initial_state=s0, segment_ids=None,
                                        output_final_state=True)  # fmt: skip
        return out.astype(o.dtype), state.astype(final.dtype)

    # one flag for the whole call (under jax.vmap the cond becomes a select: the recurrence
    # then runs on every call, which kda_context_parallel on one device pays)
    finite = jnp.isfinite(o).all() & jnp.isfinite(final).all()
    return jax.lax.cond(finite, lambda _: (o, final), exact, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10, 11))
def _kda(q, k, v, g, beta_rows, s0, scale, chunk, groups, low, interpret, fallback):
    return _kda_fwd(q, k, v, g, beta_rows, s0, scale, chunk, groups, low, interpret, fallback,
                    save=False)[0]  # fmt: skip


def _kda_fwd(q, k, v, g, beta_rows, s0, scale, chunk, groups, low, interpret, fallback,
             save=True):  # fmt: skip
    forward = functools.partial(_forward, scale=scale, chunk=chunk, low=low, save=save,
                                interpret=interpret)  # fmt: skip
    o, final, states = not_differentiated(forward, KERNELS)(q, k, v, g, beta_rows, s0)
    if fallback:
        o, final = _exact_where_not_finite(o, final, q, k, v, g, beta_rows, s0, scale)
    return (o, final), (q, k, v, g, beta_rows, states)


def _kda_bwd(scale, chunk, groups, low, interpret, fallback, residuals, cotangents):
    q, k, v, g, beta_rows, states = residuals
    d_o, d_final = cotangents
    backward = functools.partial(_backward, scale=scale, chunk=chunk, groups=groups, low=low,
                                 interpret=interpret)  # fmt: skip
    dq, dk, dv, dg, d_beta, d_s0 = not_differentiated(backward, KERNELS)(
        q, k, v, g, beta_rows, states, d_o.astype(q.dtype), d_final.astype(jnp.float32))
    if groups > 1:  # a q/k head's gradient: the sum over the value heads that read it
        b, t, hv, kd = dq.shape
        dq, dk = (x.reshape(b, t, hv // groups, groups, kd).sum(3) for x in (dq, dk))
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg.astype(g.dtype),
            d_beta.astype(beta_rows.dtype), d_s0)  # fmt: skip


_kda.defvjp(_kda_fwd, _kda_bwd)


def kda_pallas(q, k, v, g, beta, *, scale: float, initial_state=None, chunk_size: int = 64,
               low: bool | None = None, interpret: bool | pltpu.InterpretParams | None = None,
               non_finite_fallback: bool = True):  # fmt: skip
    """KDA by the Pallas kernels on checked inputs: ``(o [B, T, HV, V] in q's dtype,
    final_state [B, HV, K, V] float32)``. q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, g ``[B, T,
    HV, K]`` (log-space, ``<= 0``), beta ``[B, T, HV]``; K, V padded to multiples of 128 (HBM
    copies: fastest at multiples), ``chunk_size`` a power of two from 16 to ``BLOCK_T``.
    ``low``: fewer matmul passes (:data:`LOW_PASSES`; default: q in bfloat16). ``interpret``:
    Pallas's interpreter (default: off a TPU); a ``pltpu.InterpretParams`` runs the branches
    compiled on a TPU (strided loads) under Pallas's TPU interpreter.
    ``non_finite_fallback``: where the result is not finite, the recurrence's outputs
    (:func:`_exact_where_not_finite`); False: the kernels' own. Differentiable (reverse mode)
    in every array."""
    batch, seq_len, heads, value_dim = v.shape
    key_dim, groups = q.shape[-1], heads // q.shape[2]
    pad = -seq_len % BLOCK_T  # padding tokens: no decay (g = 0), no write (beta = 0)
    # K and V to lane multiples: zero keys, queries and values, no decay (g = 0), zero state
    widen = lambda x, *last: jnp.pad(x, [(0, 0), (0, pad), *last]) if pad or any(last[-1]) else x
    q, k, g = (widen(x, (0, 0), (0, -key_dim % LANES)) for x in (q, k, g))
    v, beta = widen(v, (0, 0), (0, -value_dim % LANES)), widen(beta, (0, 0))
    s0 = (jnp.zeros((batch, heads, key_dim, value_dim), jnp.float32) if initial_state is None
          else initial_state.astype(jnp.float32))  # fmt: skip
    s0 = jnp.pad(s0, [(0, 0), (0, 0), (0, -key_dim % LANES), (0, -value_dim % LANES)])
    beta_rows = jnp.moveaxis(beta.astype(jnp.float32), 1, 2)[:, :, None, :]  # [B, HV, 1, T]
    dtype = q.dtype
    low = dtype == jnp.bfloat16 if low is None else low
    # at most ROW_BYTES a token a call: n calls of `size` value heads, as a batch axis (one XLA
    # copy of each array where n > 1); a call's value heads read whole q/k heads, or one repeated
    parts = v.shape[-1] // LANES
    size = _call_heads(heads, groups, parts, max(x.dtype.itemsize for x in (q, k, v)))
    if max(1, size // groups) % 2 or size * parts % 2:  # odd 16-bit rows: read in float32 below
        size = _call_heads(heads, groups, parts, 4)
    n = heads // size
    if size < groups:
        q, k = (jnp.repeat(x, groups // size, axis=2) for x in (q, k))
    q, k, v, g = (_split(x, n) for x in (q, k, v, g))
    s0, beta_rows = (x.reshape(batch * n, size, *x.shape[2:]) for x in (s0, beta_rows))
    # 16-bit rows are read two to a 32-bit word (_rows_of): an odd row count in float32 (the
    # kernels compute in float32 from the inputs' values: the same numerics)
    q, k, v = (x.astype(jnp.float32) if x.dtype.itemsize == 2 and x.shape[2] * x.shape[3] //
               LANES % 2 else x for x in (q, k, v))  # fmt: skip
    o, final = _kda(q, k, v, g.astype(jnp.float32), beta_rows, s0, float(scale), chunk_size,
                    size // q.shape[2], low, interpret, non_finite_fallback)  # fmt: skip
    o, final = _merge(o, n), final.reshape(batch, heads, *final.shape[2:])
    return o[:, :seq_len, :, :value_dim].astype(dtype), final[:, :, :key_dim, :value_dim]


def _call_heads(heads: int, groups: int, parts: int, itemsize: int) -> int:
    """Value heads per kernel call: all where their rows of ``parts`` a token, ``itemsize`` bytes
    each, take at most :data:`ROW_BYTES`, else the largest power of two dividing ``heads`` within
    it whose q/k heads are whole (a multiple of ``groups``) or one (dividing it)."""
    rows = max(1, ROW_BYTES // itemsize)
    if heads * parts <= rows:
        return heads
    size = max(1, rows // parts)
    while heads % size or (size % groups and groups % size):
        size //= 2
    return size


def _split(x, n: int):
    """``[B, T, n * h, D]`` -> ``[B * n, T, h, D]`` (no copy at n = 1)."""
    b, t, heads, d = x.shape
    return jnp.moveaxis(x.reshape(b, t, n, heads // n, d), 2, 1).reshape(b * n, t, heads // n, d)


def _merge(x, n: int):
    """:func:`_split`'s inverse."""
    bn, t, heads, d = x.shape
    return jnp.moveaxis(x.reshape(bn // n, n, t, heads, d), 1, 2).reshape(bn // n, t, n * heads, d)


def pallas_core(q, k, v, g, beta, *, dims, scale: float, initial_state, segment_ids,
                output_final_state: bool, chunk_size: int, dtype, precision=None):  # fmt: skip
    """:func:`kda_lib.kda` by the kernels on checked inputs (no segment ids): ``(o,
    final_state or None, None)``. ``dtype``: the caller's (bfloat16: :data:`LOW_PASSES`, q and
    k back in bfloat16 after an L2 norm in float32); ``precision="highest"``: float32's passes.
    Where the result is not finite, the recurrence's outputs (:func:`_exact_where_not_finite`);
    the gradients are the kernels' (non-finite values may spread over a chunk there)."""
    del dims, segment_ids  # segment ids: refused by :func:`problems`
    low = jnp.dtype(dtype) == jnp.bfloat16 and precision != "highest"
    if low:
        q, k = q.astype(dtype), k.astype(dtype)
    o, final = kda_pallas(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          chunk_size=chunk_size, low=low)  # fmt: skip
    return o, (final if output_final_state else None), None


def problems(options, here: bool = True) -> list[str]:
    """Why the kernels cannot serve the checked call ``options`` (:class:`KDAOptions`); ``here``: on
    this machine too (compiled on a TPU, Pallas's interpreter on a CPU, neither elsewhere)."""
    name = "implementation='pallas_tpu'"
    backend = jax.default_backend() if here else "tpu"
    key_dim, value_dim = options.dims.key_dim, options.dims.value_dim
    found = [problem for bad, problem in [
        (backend not in ("tpu", "cpu"),
         f"{name} runs on a TPU (and interpreted on a CPU), not on {backend}; use 'chunked'"),
        (not MIN_CHUNK <= options.chunk_size <= BLOCK_T,
         f"{name} needs {MIN_CHUNK} <= chunk_size <= {BLOCK_T}, got {options.chunk_size}"),
        (jnp.dtype(options.dtype) not in (jnp.float32, jnp.bfloat16),
         f"{name} takes float32 or bfloat16 inputs, got {jnp.dtype(options.dtype).name}; use "
         "'chunked' or 'recurrent'"),
        (options.has_segments, f"{name} does not take segment_ids; use 'chunked'"),
        (key_dim > LANES or value_dim > 2 * LANES,
         f"{name} was compiled on a TPU for key_dim <= {LANES} and value_dim <= {2 * LANES} "
         f"(each padded to {LANES}-lane multiples), got {key_dim} and {value_dim}; use 'chunked'"),
        *[(getattr(options, flag), f"{name} returns no interior states ({flag}); use 'chunked' or "
           "'recurrent'") for flag in ("output_chunk_states", "output_token_states")],
    ] if bad]  # fmt: skip
    return found
