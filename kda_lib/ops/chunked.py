"""Chunkwise KDA: the same recurrence, computed a chunk of C tokens at a time with matmuls.

Within a chunk every step ``S_t = (I - beta_t k_t k_t^T) diag(exp g_t) S_{t-1} + beta_t k_t v_t^T``
is linear in the state entering the chunk, so the whole chunk is an affine map

    S_out = M @ S_in + S_ext          M [K, K], S_ext [K, V]

and its outputs are ``O = Q_eff @ S_in + O_intra``. Everything inside a chunk comes from one
unit-lower-triangular solve per chunk (the WY/UT form), computed for every chunk in parallel
(:class:`IntraChunk`). Across chunks the state is carried in one of three ways (``scan=``):
``"streaming"`` (the CPU default), one ``lax.scan`` step per chunk that builds that chunk's
WY/UT form and updates the state, so a step's working set is one chunk; ``"sequential"``, every
chunk's form built at once, then a scan that corrects each chunk's values with the entering
state (two matmuls per step, no K x K maps); or ``"associative"`` (the accelerator default),
``lax.associative_scan`` over the affine maps (log depth, more flops). Context parallelism
(kda_lib.parallel.context_parallel) chains the same maps across devices.

Numerical safety: decay ratios ``exp(G_i - G_j)`` (G = in-chunk cumulative log decay) are never
formed as ``exp(G_i) * exp(-G_j)``, which overflows for strong gates, nor from differences of
long prefix sums. The chunk's score matrices are built by merging neighbouring segments
(1 + 1 tokens, 2 + 2, ...); each merge's cross term factors through the log decay at the
boundary into two factors <= 1, each a product of ``exp(g_m)`` over exactly its own range
(:func:`_segment_decays`). Any ``g <= 0`` is safe, the unbounded softplus gate included, and
float32 results stay as close to the float64 oracle as the float32 recurrence is.

Speed (CPU, XLA): the score matrices and the triangular inverse have hand-written gradients
(:func:`_decayed_scores_bwd`, ``unit_lower_inverse``): a few batched matmuls per level instead
of differentiating every slice, product and concatenation. ``kda-bench`` measures.

Precision policy (``precision=``, :func:`_matmul` is the one place matmuls happen). ``"highest"``:
inputs of any dtype are cast to float32 (float64 stays float64) and every matmul runs at
``Precision.HIGHEST``. ``"input"`` (the default, None): for bfloat16/float16 inputs the matmul
groups in ``LOW_PRECISION_MATMULS`` take operands rounded to that dtype, with float32
accumulation (``preferred_element_type``, precision DEFAULT: tensor cores on GPU); their
gradients follow the same policy. For float32/float64 inputs ``"input"`` is ``"highest"``.

The rule: an operand may be rounded to the input dtype only if it is an input times decay
factors <= 1, never a computed quantity. That leaves one group, the decayed scores' cross
blocks ``"scores"`` (rows ``x * decay``, keys ``k * decay``): their rounding is the rounding
of the inputs themselves, and it cannot overflow float16 (``|x * decay| <= |x|``). Float32
throughout: the gates and every decay factor, the triangular inverse (:func:`unit_lower_inverse`)
and ``W``/``U`` from it (``"wu"``), the chunk maps (``"maps"``), the state carry (``"state"``),
the outputs (``"outputs"``), the associative scan's compositions (``"compose"``), the scores'
gradient matmuls (``"scores_bwd"``) and the triangular sums of the gate gradient.

Why this policy, measured on fla's badly conditioned context-parallel inputs (the table of
errors per group, and the speed on CPU): ``docs/DESIGN.md``, section 4 (precision);
``tests/contracts/test_precision.py`` holds the bounds.
"""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from kda_lib.ops.contract import (
    Dims,
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


class ChunkMaps(NamedTuple):
    """Per-chunk affine summaries, each with leading dims ``[B, H, N]`` (N = number of chunks).

    ``S_out = transition @ S_in + state_ext`` and ``O = q_eff @ S_in + o_intra``.
    """

    transition: jax.Array  # [B, H, N, K, K]
    state_ext: jax.Array  # [B, H, N, K, V]
    q_eff: jax.Array  # [B, H, N, C, K]
    o_intra: jax.Array  # [B, H, N, C, V]


def default_scan_mode() -> ScanMode:
    """Streaming on CPU (measured faster there, forward and backward: docs/DESIGN.md section 4);
    associative where scan steps cost kernel launches."""
    return "streaming" if jax.default_backend() == "cpu" else "associative"


# matmul groups that take low-precision operands under the "input" policy (module docstring):
# only those whose operands are inputs times decays <= 1
LOW_PRECISION_MATMULS = frozenset({"scores"})


def _policy_dtype(group: str, operand_dtype):
    """``operand_dtype`` for a matmul of ``group`` if the group goes low-precision, else None."""
    return operand_dtype if group in LOW_PRECISION_MATMULS else None


def _matmul(subscripts: str, *operands, operand_dtype=None):
    """The one place the chunked form multiplies matrices (an einsum).

    ``operand_dtype`` None: operands as they are (float32/float64), ``Precision.HIGHEST``.
    Otherwise (bfloat16/float16, the ``"input"`` policy): operands cast to ``operand_dtype``,
    products accumulated in the dtype they were passed in, float32 (``preferred_element_type``),
    precision DEFAULT (tensor cores on GPU); the gradient has the same policy (:func:`_low_mm`).
    """
    if operand_dtype is None:
        return jnp.einsum(subscripts, *operands, precision=HIGHEST)
    if len(operands) != 2:
        raise ValueError(f"a low-precision matmul takes two operands, got {len(operands)}")
    return _low_mm(subscripts, jnp.dtype(operand_dtype), *operands)


def _low_einsum(subscripts, operand_dtype, a, b, out_dtype):
    return jnp.einsum(
        subscripts,
        a.astype(operand_dtype),
        b.astype(operand_dtype),
        preferred_element_type=out_dtype,
        precision=jax.lax.Precision.DEFAULT,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _low_mm(subscripts, operand_dtype, a, b):
    """``einsum(a, b)`` with ``operand_dtype`` operands, accumulated in a's and b's dtype.

    Its gradient takes the cotangent as a low-precision operand too (two matmuls of the same
    kind, results in the operands' dtype): autodiff through ``astype`` would instead run mixed
    float32 x bfloat16 dots and round each gradient to bfloat16.
    """
    return _low_einsum(subscripts, operand_dtype, a, b, jnp.result_type(a, b))


def _low_mm_fwd(subscripts, operand_dtype, a, b):
    out = _low_mm(subscripts, operand_dtype, a, b)
    # residuals in the operand dtype: what the backward matmuls read anyway
    return out, (a.astype(operand_dtype), b.astype(operand_dtype))


def _low_mm_bwd(subscripts, operand_dtype, residuals, d_out):
    a, b = residuals
    inputs, out = subscripts.split("->")
    sub_a, sub_b = inputs.split(",")
    # both operands are in the accumulation dtype (float32), the dtype of d_out
    d_a = _low_einsum(f"{out},{sub_b}->{sub_a}", operand_dtype, d_out, b, d_out.dtype)
    d_b = _low_einsum(f"{out},{sub_a}->{sub_b}", operand_dtype, d_out, a, d_out.dtype)
    return _unbroadcast(d_a, a.shape), _unbroadcast(d_b, b.shape)


def _unbroadcast(x, shape):
    """Sum ``x`` down to ``shape`` over the dimensions an einsum's ``...`` broadcast."""
    if x.shape == tuple(shape):
        return x
    extra = x.ndim - len(shape)
    x = jnp.sum(x, axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return jnp.sum(x, axis=axes, keepdims=True)


_low_mm.defvjp(_low_mm_fwd, _low_mm_bwd)


def unit_lower_inverse(a: jax.Array, base: int = 16) -> jax.Array:
    """``(I + a)^-1`` for strictly lower-triangular ``a`` ``[..., C, C]``, with matmuls only.

    Diagonal blocks of size ``base`` are inverted by the finite Neumann product
    ``(I - X)(I + X^2)(I + X^4)...``; blocks are then merged pairwise with the exact formula
    ``[[X1, 0], [L21, X2]]^-1 = [[X1^-1, 0], [-X2^-1 L21 X1^-1, X2^-1]]``.
    The gradient is the inverse's own formula, ``da = -X^T dX X^T`` (strictly lower part), two
    matmuls instead of differentiating every step. Float32 under every precision policy
    (module docstring).
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

    def blocks(rows, cols, width, count):  # [N, count, width, width] from block offsets
        return jnp.stack(
            [a[:, r : r + width, c : c + width] for r, c in zip(rows, cols, strict=True)][:count],
            axis=1,
        )

    n = size // block
    starts = [i * block for i in range(n)]
    x = blocks(starts, starts, block, n)
    eye = jnp.eye(block, dtype=a.dtype)
    inv = eye - x
    power = x
    for _ in range(int(math.log2(block)) - 1):
        power = _matmul("...ij,...jk->...ik", power, power)
        inv = _matmul("...ij,...jk->...ik", inv, eye + power)
    m = block
    while m < size:
        pairs = size // (2 * m)
        inv = inv.reshape(-1, pairs, 2, m, m)
        x1, x2 = inv[:, :, 0], inv[:, :, 1]
        l21 = blocks(
            [(2 * p + 1) * m for p in range(pairs)], [2 * p * m for p in range(pairs)], m, pairs
        )
        lower = -_matmul("...ij,...jk,...kl->...il", x2, l21, x1)
        top = jnp.concatenate([x1, jnp.zeros_like(x1)], axis=-1)
        bottom = jnp.concatenate([lower, x2], axis=-1)
        inv = jnp.concatenate([top, bottom], axis=-2)
        m *= 2
    return inv.reshape(*lead, size, size)


def _unit_lower_inverse_fwd(a, base):
    inv = _unit_lower_inverse(a, base)
    return inv, inv


def _unit_lower_inverse_bwd(base, inv, d_inv):
    inv_t = jnp.swapaxes(inv, -1, -2)
    d_a = -_matmul("...ij,...jk->...ik", inv_t, _matmul("...ij,...jk->...ik", d_inv, inv_t))
    return (jnp.tril(d_a, -1),)


_unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def _segment_decays(g) -> list[tuple[jax.Array, jax.Array]]:
    """Decay factors of aligned segments of width 1, 2, 4, ..., C.

    g: ``[..., C, K]`` log decays ``<= 0``. Entry ``l`` (segments of width ``w = 2^l``) is
    ``(head, tail)``, both ``[..., C, K]``: for each token, ``head = prod e_m`` from the start
    of its segment through the token, and ``tail = prod e_m`` after the token through the end of
    its segment, with ``e_m = exp(g_m) <= 1``. The last entry (one segment, the chunk) is
    ``(exp(G_i), exp(G_C - G_i))``.

    Factors are products over exactly their own range (a segment of width 2w extends the
    later half's heads by the earlier half's total, and the earlier half's tails by the later
    half's total): only one ``exp`` per token and channel, nothing is a ratio or a difference
    of long prefix sums (those lose relative precision, or overflow, with strong gates), each
    factor has a relative error of a few eps and underflows only when its true value does.
    """
    size = g.shape[-2]
    head, tail = jnp.exp(g), jnp.ones_like(g)
    levels = [(head, tail)]
    width = 1
    while width < size:
        head, tail = _split_pairs(head, width), _split_pairs(tail, width)
        totals = head[..., -1:, :]  # [..., pairs, 2, 1, K]: each half's product
        ones = jnp.ones_like(totals[..., :1, :, :])
        # heads of the later half times the earlier half's total, tails of the earlier half
        # times the later half's total (one broadcast multiply each)
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _decayed_scores(xs, k, g, operand_dtype=None):
    """Decayed scores within each chunk, and the chunk's boundary decays.

    ``S_x[i, j] = sum_c x[i, c] k[j, c] exp(G_i - G_j)_c`` for j <= i (zero above), for each row
    set x in ``xs`` (e.g. ``(k, q)``), where ``G`` is the in-chunk cumulative log decay.
    xs: tuple of ``[..., C, K]``; k, g: ``[..., C, K]``.

    Returns ``(tuple of S_x [..., C, C], decay_in, decay_out)`` with ``decay_in_i = exp(G_i)``
    (chunk start through token i) and ``decay_out_j = exp(G_C - G_j)`` (after token j through
    the chunk end), both ``[..., C, K]``.

    The C x C matrix is built by merging neighbouring segments, 1 + 1 tokens, 2 + 2, ...: the
    cross term of a merge (rows in the later half, keys in the earlier one) factors through the
    log decay at the boundary a, ``exp(G_i - G_a) * exp(G_a - G_j)``: the later half's heads
    times the earlier half's tails (:func:`_segment_decays`), both <= 1, and one batched matmul
    per level. The backward pass (:func:`_decayed_scores_bwd`) walks the same levels.
    ``operand_dtype``: the matmul policy (:func:`_matmul`); the decays are float32 regardless.
    """
    levels = _segment_decays(g)
    low = _policy_dtype("scores", operand_dtype)
    size = k.shape[-2]
    crosses = [[] for _ in xs]
    width = 1
    for head, tail in levels[:-1]:
        keys = _split_pairs(k, width)[..., 0, :, :] * _split_pairs(tail, width)[..., 0, :, :]
        later_head = _split_pairs(head, width)[..., 1, :, :]
        for x, cross in zip(xs, crosses, strict=True):
            rows = _split_pairs(x, width)[..., 1, :, :] * later_head
            cross.append(_matmul("...pik,...pjk->...pij", rows, keys, operand_dtype=low))
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


def _decayed_scores_bwd(operand_dtype, residuals, cotangents):
    """Row and key gradients walk the merge levels again (two matmuls per level and row set).

    ``g`` enters the scores only through ``exp(G_i - G_j)`` (j < i), whose derivative with
    respect to ``g_m`` is itself when ``j < m <= i``. With ``P[i, j] = dS[i, j] x_i k_j
    exp(G_i - G_j)`` (per channel), ``dg_m = sum_{i >= m > j} P[i, j]``, and since the row sums
    of P are ``x * dx`` and its column sums ``k * dk`` (off the diagonal), ``dg`` is the reverse
    cumulative sum of ``sum_x x * dx - k * dk``. In float32 this is as close to the float64
    oracle as autodiff through the forward was (measured on kda_chunked's gradients).
    """
    xs, k, g = residuals
    d_scores, d_in, d_out = cotangents
    size = k.shape[-2]
    levels = _segment_decays(g)
    low = _policy_dtype("scores_bwd", operand_dtype)
    below = jnp.tril(jnp.ones((size, size), bool), -1)
    # levels: the cross blocks of each merge, split off the score cotangent from the top down
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
            d_rows = _matmul("...pij,...pjc->...pic", d_cross, keys, operand_dtype=low)
            d_keys = d_keys + _matmul("...pij,...pic->...pjc", d_cross, rows, operand_dtype=low)
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
    return _matmul("...mi,...ic->...mc", jnp.broadcast_to(mask, (*x.shape[:-2], size, size)), x)


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


class IntraChunk(NamedTuple):
    """Everything inside each chunk that does not depend on the state entering it.

    With ``S`` the state entering the chunk, the chunk's corrected values, outputs and
    leaving state are ``U = u - w @ S``, ``O = q_in @ S + attn_qk @ U`` and
    ``S_out = keep * S + k_out^T @ U``. Leading dims ``[...]`` are those of the inputs
    (``[B, H, N]`` in :func:`chunk_affine_maps`, chunk-major ``[N, B, H]`` in
    :func:`kda_chunked`).
    """

    attn_qk: jax.Array  # [..., C, C] scaled, decayed, causal q.k scores
    w: jax.Array  # [..., C, K]
    u: jax.Array  # [..., C, V]
    q_in: jax.Array  # [..., C, K] scaled queries decayed from the chunk start
    k_out: jax.Array  # [..., C, K] keys decayed to the chunk end
    keep: jax.Array  # [..., K] decay over the whole chunk


def _intra_chunk(
    q, k, v, g, beta, *, scale: float, segments=None, operand_dtype=None
) -> IntraChunk:
    """The WY/UT form of every chunk, in parallel (arguments as in :func:`chunk_affine_maps`)."""
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
    low = _policy_dtype("wu", operand_dtype)
    w = _matmul("...ij,...jk->...ik", solve, beta[..., None] * k_in, operand_dtype=low)  # [C, K]
    u = _matmul("...ij,...jv->...iv", solve, beta[..., None] * v, operand_dtype=low)  # [C, V]
    return IntraChunk(attn_qk, w, u, q_in, k_out, keep)


def chunk_affine_maps(
    q, k, v, g, beta, *, scale: float, segments=None, operand_dtype=None
) -> ChunkMaps:
    """Affine summaries of every chunk, computed in parallel.

    Args:
      q, k, g: ``[B, H, N, C, K]``; v: ``[B, H, N, C, V]``; beta: ``[B, H, N, C]`` (all in the
        accumulation dtype; padding tokens must already have g = 0 and beta = 0).
      segments: None, or ``(same [B,1,N,C,C] bool, sees_in [B,1,N,C] bool,
        in_last [B,1,N,C] bool, keeps_in [B,1,N] bool)``: which token pairs share a segment,
        which tokens continue the segment entering the chunk, which belong to the segment
        leaving it, and whether the entering segment is also the leaving one.
      operand_dtype: the matmul policy (:func:`_matmul`): None (all float32) or the low-precision
        operand dtype of the ``"input"`` policy.
    """
    intra = _intra_chunk(
        q, k, v, g, beta, scale=scale, segments=segments, operand_dtype=operand_dtype
    )
    return _affine_maps(intra, operand_dtype)


def _affine_maps(intra: IntraChunk, operand_dtype=None) -> ChunkMaps:
    attn_qk, w, u, q_in, k_out, keep = intra
    low = _policy_dtype("maps", operand_dtype)
    q_eff = q_in - _matmul("...ij,...jk->...ik", attn_qk, w, operand_dtype=low)
    o_intra = _matmul("...ij,...jv->...iv", attn_qk, u, operand_dtype=low)
    transition = keep[..., :, None] * jnp.eye(w.shape[-1], dtype=w.dtype) - _matmul(
        "...ck,...cl->...kl", k_out, w, operand_dtype=low
    )
    state_ext = _matmul("...ck,...cv->...kv", k_out, u, operand_dtype=low)
    return ChunkMaps(transition, state_ext, q_eff, o_intra)


def _pass_states(intra: IntraChunk, initial_state, operand_dtype=None):
    """Outputs ``[N, B, H, C, V]``, the final state and the states entering each chunk
    ``[N, B, H, K, V]``, carrying the state chunk by chunk.

    ``intra`` is chunk-major (leading dims ``[N, B, H]``), so the scan reads and writes its
    per-chunk slices in place. The sequential scan needs no ``K x K`` transition maps: each step
    corrects the chunk's values with the entering state and updates the state (two matmuls),
    and the outputs of all chunks are then computed together.
    """
    k_out_t = jnp.swapaxes(intra.k_out, -1, -2)  # [.., K, C]: a plain matmul inside the scan
    # inside shard_map the carry must vary over the same mesh axes as the chunks
    initial_state = initial_state + jnp.zeros_like(intra.u[0, ..., :1, :])
    low = _policy_dtype("state", operand_dtype)

    def step(state, chunk):
        new, corrected = _carry_state(state, *chunk, low)
        return new, (state, corrected)

    final, (entering, corrected) = jax.lax.scan(
        step, initial_state, (intra.w, intra.u, k_out_t, intra.keep)
    )
    return _chunk_outputs(intra, entering, corrected, operand_dtype), final, entering


def _carry_state(state, w, u, k_out_t, keep, low):
    """One chunk applied to its entering ``state [.., K, V]``: ``(the state leaving it, the
    chunk's values corrected by the entering state [.., C, V])``; ``k_out_t`` is ``[.., K, C]``
    and ``low`` the ``"state"`` group's operand dtype."""
    corrected = u - _matmul("...ck,...kv->...cv", w, state, operand_dtype=low)
    new = keep[..., None] * state + _matmul(
        "...kc,...cv->...kv", k_out_t, corrected, operand_dtype=low
    )
    return new, corrected


def _chunk_outputs(intra: IntraChunk, entering, corrected, operand_dtype=None):
    """The outputs ``[.., C, V]``: the entering state read by the decayed queries plus the
    in-chunk part of the corrected values."""
    low = _policy_dtype("outputs", operand_dtype)
    return _matmul("...ck,...kv->...cv", intra.q_in, entering, operand_dtype=low) + _matmul(
        "...ij,...jv->...iv", intra.attn_qk, corrected, operand_dtype=low
    )


# the streaming scan rematerialises its step under differentiation above this many saved bytes
REMAT_MIN_BYTES = 16 * 2**20


def stream_saved_bytes(chunks) -> int:
    """About the bytes the streaming scan's plain autodiff saves for its backward, summed over
    all N steps: ``N B H (2 C^2 + 3 C K + 2 C V)`` floats (an estimate: the measured saving is
    about twice it). ``chunks``: ``(q, k, v, ...)`` chunk-major ``[N, B, H, C, K]``."""
    n, b, h, c, k = chunks[0].shape
    v = chunks[2].shape[-1]
    return chunks[0].dtype.itemsize * n * b * h * (2 * c * c + 3 * c * k + 2 * c * v)


def _stream_chunks(chunks, segments, initial_state, scale, operand_dtype=None):
    """Outputs ``[N, B, H, C, V]``, the final state and the states entering each chunk
    ``[N, B, H, K, V]``, one chunk per scan step.

    ``chunks``: ``(q, k, v, g, beta)`` chunk-major (leading dims ``[N, B, H]``); ``segments``:
    :func:`_chunk_masks` or None. Each step builds its chunk's WY/UT form and applies it to the
    entering state, so what a step touches (a few ``[C, C]`` and ``[C, K]`` blocks per head)
    stays in cache; the other modes write every chunk's ``[C, C]`` scores to memory first and
    read them back, which is what their time goes to on a CPU. Under differentiation, where
    :func:`stream_saved_bytes` exceeds :data:`REMAT_MIN_BYTES`, only the entering states are
    kept and each step's blocks are recomputed in the backward.
    """
    # inside shard_map the carry must vary over the same mesh axes as the chunks
    initial_state = initial_state + jnp.zeros_like(chunks[2][0, ..., :1, :])
    low = _policy_dtype("state", operand_dtype)

    def step(state, chunk):
        xs, masks = chunk
        intra = _intra_chunk(*xs, scale=scale, segments=masks, operand_dtype=operand_dtype)
        k_out_t = jnp.swapaxes(intra.k_out, -1, -2)
        new, corrected = _carry_state(state, intra.w, intra.u, k_out_t, intra.keep, low)
        return new, (_chunk_outputs(intra, state, corrected, operand_dtype), state)

    # where the blocks all N steps would save for the backward are large, the backward
    # recomputes each step's blocks from the carried state instead: half the memory and no
    # slower there (DESIGN section 6); small programs keep plain autodiff, which compiles faster
    if stream_saved_bytes(chunks) > REMAT_MIN_BYTES:
        step = jax.checkpoint(step, prevent_cse=False)
    final, (o, entering) = jax.lax.scan(step, initial_state, (chunks, segments))
    return o, final, entering


def compose_affine(first, second, operand_dtype=None):
    """Apply ``first`` then ``second``: ``(M2 M1, M2 E1 + E2)``. Works on stacked maps."""
    m1, e1 = first
    m2, e2 = second
    low = _policy_dtype("compose", operand_dtype)
    return (
        _matmul("...ij,...jk->...ik", m2, m1, operand_dtype=low),
        _matmul("...ij,...jv->...iv", m2, e1, operand_dtype=low) + e2,
    )


def chain_states(transition, state_ext, initial_state, mode: ScanMode, operand_dtype=None):
    """States entering each chunk and the final state.

    transition ``[B, H, N, K, K]``, state_ext ``[B, H, N, K, V]``, initial_state ``[B, H, K, V]``.
    Returns ``(entering [B, H, N, K, V], final [B, H, K, V])``. ``operand_dtype``: the
    matmul policy (:func:`_matmul`).
    """
    low = _policy_dtype("state", operand_dtype)
    # inside shard_map the carry must vary over the same mesh axes as the maps
    initial_state = initial_state + jnp.zeros_like(state_ext[:, :, 0])
    if mode == "sequential":

        def step(state, maps):
            m, e = maps
            return _matmul("bhij,bhjv->bhiv", m, state, operand_dtype=low) + e, state

        final, entering = jax.lax.scan(
            step, initial_state, (jnp.moveaxis(transition, 2, 0), jnp.moveaxis(state_ext, 2, 0))
        )
        return jnp.moveaxis(entering, 0, 2), final
    if mode == "associative":
        compose = functools.partial(compose_affine, operand_dtype=operand_dtype)
        m_cum, e_cum = jax.lax.associative_scan(compose, (transition, state_ext), axis=2)
        # the state after each chunk
        after = _matmul("bhnij,bhjv->bhniv", m_cum, initial_state, operand_dtype=low) + e_cum
        entering = jnp.concatenate([initial_state[:, :, None], after[:, :, :-1]], axis=2)
        return entering, after[:, :, -1]
    raise ValueError(f"scan must be 'sequential', 'associative' or None, got {mode!r}")


def _operand_dtype(precision: Precision | None, q, k, v):
    """The matmul policy as :func:`_matmul`'s ``operand_dtype``: None (all float32/float64) for
    ``"highest"``; for ``"input"``/None the low-precision dtype of the matmul inputs q, k, v
    (bfloat16 or float16; float32 q/k with bfloat16 v, as ``kda(use_qk_l2norm=True)`` passes
    them, count as bfloat16), or None when there is none (or both kinds are mixed)."""
    if precision == "highest":
        return None
    low = {jnp.dtype(x.dtype) for x in (q, k, v)} & set(LOW_PRECISION_DTYPES)
    return low.pop() if len(low) == 1 else None


def isolate_non_finite_if_any(q, k, v, g, beta, initial_state, segment_ids):
    """:func:`kda_lib.ops.segments.isolate_non_finite`, skipped when every input is finite.

    Public on purpose: the chunked form's shortcut, which ``tests/ops/test_chunked.py`` holds equal
    to ``isolate_non_finite`` (values, flags and gradients) on finite and non-finite inputs.

    With finite inputs (and no ``+inf``/NaN gate) it changes nothing and flags nothing, so a
    ``lax.cond`` on one max-reduction per input saves its segment-wise running maximum over
    ``[B, T, H, V]`` (measured: a large part of the forward on CPU). The cond only yields
    booleans (where an input is replaced, and the NonFinite flags); the replacements are
    selections outside it, so differentiating never goes through the cond.
    """
    operands = (q, k, v, g, beta, initial_state)

    def finite(x):
        return jnp.max(jnp.abs(x)) < jnp.inf  # False for inf or NaN: max propagates NaN

    clean = finite(q) & finite(k) & finite(v) & finite(beta) & (jnp.max(g) < jnp.inf)
    if initial_state is not None:
        clean = clean & finite(initial_state)

    def unchanged(xs):
        # zeros_like: inside shard_map the flags vary over the same mesh axes as v
        flags = NonFinite(
            jnp.zeros_like(v, bool), jnp.zeros_like(v[:, 0], bool), jnp.zeros_like(v, bool)
        )
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
    """KDA in chunkwise (WY/UT) form; same results as :func:`kda_lib.kda_recurrent`.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV, K]`` log decay ``<= 0``;
        beta: ``[B, T, HV]``, HV a positive multiple of H (grouped value heads: value head j
        reads q/k head ``j // (HV // H)``; served by repeating the q/k heads, since every
        chunk matrix depends on the value head's own gate). Any float dtype; all arithmetic
        is float32 (float64 for float64 inputs), outputs are cast back to q's dtype.
      scale, initial_state, output_final_state, segment_ids, allow_neg_eigval: as in
        :func:`kda_lib.kda_recurrent`.
      chunk_size: tokens per chunk, a power of two (default 64). Any T works (padded inside).
      scan: how the state is carried across chunks: ``"streaming"``, ``"sequential"``,
        ``"associative"`` (see the module docstring; the same values up to rounding), or None
        for the platform default (:func:`default_scan_mode`).
      precision: the matmul policy (module docstring). ``"highest"``: every matmul in float32
        (float64) at ``Precision.HIGHEST``. ``"input"``: for bfloat16/float16 inputs the large
        matmuls take operands in that dtype with float32 accumulation (tensor cores on GPU);
        for float32/float64 inputs it is ``"highest"``. None (default): ``"input"``, i.e.
        ``"input"`` for bfloat16/float16 inputs and ``"highest"`` for float32/float64.
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``, the
        state after every full chunk (prefix caching), taken from the states the chunk scan
        carries anyway (no second pass); default False. See
        :class:`kda_lib.ops.contract.KDAResult` for what a boundary state is with
        ``initial_state`` and ``segment_ids``.

    Returns:
      ``(o [B, T, HV, V], final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` a :class:`kda_lib.ops.contract.KDAResult` ``(output,
      final_state, chunk_states, None)``.

    Differentiable in reverse mode (``jax.grad``/``jax.vjp``; parts of it have hand-written
    gradients); forward mode (``jax.jvp``, ``jacfwd``) needs :func:`kda_lib.kda_recurrent`.
    """
    dims, chunk_size, mode = _check_arguments(
        (q, k, v, g, beta), initial_state, segment_ids, allow_neg_eigval, chunk_size, scan
    )
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


def _check_arguments(
    arrays, initial_state, segment_ids, allow_neg_eigval, chunk_size, scan
) -> tuple[Dims, int, ScanMode]:
    """:func:`kda_chunked`'s inputs, chunk size and scan mode checked before any work:
    ``(dims, chunk_size, scan mode)`` (scan None: the platform's mode)."""
    dims = check_kda_inputs(
        *arrays,
        initial_state=initial_state,
        segment_ids=segment_ids,
        allow_neg_eigval=allow_neg_eigval,
    )
    chunk_size = check_chunk_size(chunk_size)
    mode = scan or default_scan_mode()
    if mode not in SCAN_MODES:
        raise ValueError(f"scan must be one of {SCAN_MODES} or None, got {scan!r}")
    return dims, chunk_size, mode


# traced once per static options and shapes (eager calls compile one program; see
# kda_lib.ops.registry.run)
@functools.partial(
    jax.jit,
    static_argnames=(
        "dims",
        "scale",
        "output_final_state",
        "chunk_size",
        "scan",
        "precision",
        "output_chunk_states",
    ),
)
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
    """:func:`kda_chunked` on checked inputs (padding already zeroed, ``dims`` from the
    check): nothing is checked or zeroed again. ``scan`` None: :func:`default_scan_mode`.
    Returns ``(o, final_state | None, chunk_states [B, T // C, HV, K, V] | None)``."""
    operand_dtype = _operand_dtype(precision, q, k, v)
    acc = accumulation_dtype(q.dtype)
    batch, seq_len, heads, key_dim, value_dim, _ = dims
    out_dtype = q.dtype
    q, k, v, g, beta = (x.astype(acc) for x in (q, k, v, g, beta))
    q, k = repeat_qk_heads(q, k, dims.groups)
    # non-finite real tokens: computed as zeros and restored as NaN exactly where the
    # recurrence has them (matmuls would spread them)
    k = overflowing_keys_as_nan(k)  # an overflowing key stays in its segment, from it on
    q, k, v, g, beta, initial_state, non_finite = isolate_non_finite_if_any(
        q, k, v, g, beta, initial_state, segment_ids
    )
    # padding tokens: no decay, no write, outputs dropped
    (q, k, v, g, beta), segment_ids, pad = pad_time(
        chunk_size, q, k, v, g, beta, segment_ids=segment_ids
    )
    chunks = tuple(_to_chunks(x, chunk_size) for x in (q, k, v, g, beta))
    segments = None if segment_ids is None else _chunk_masks(segment_ids, chunk_size)
    state0 = (
        jnp.zeros((batch, heads, key_dim, value_dim), acc)
        if initial_state is None
        else initial_state.astype(acc)
    )
    mode = scan or default_scan_mode()
    if mode == "streaming":
        o, final_state, entering = _stream_chunks(chunks, segments, state0, scale, operand_dtype)
    else:
        intra = _intra_chunk(*chunks, scale=scale, segments=segments, operand_dtype=operand_dtype)
        o, final_state, entering = _chain(intra, state0, mode, operand_dtype)
    o = jnp.moveaxis(o, (0, 2), (1, 3)).reshape(batch, seq_len + pad, heads, value_dim)
    chunk_states = None
    if output_chunk_states:  # the state leaving chunk i enters chunk i + 1; the last: final
        after = jnp.concatenate([entering[1:], final_state[None]], axis=0)[: seq_len // chunk_size]
        chunk_states = restore_non_finite_chunk_states(
            jnp.moveaxis(after, 0, 1), non_finite, chunk_size
        )
    o, final_state = restore_non_finite(o[:, :seq_len], final_state, non_finite)
    return o.astype(out_dtype), (final_state if output_final_state else None), chunk_states


def _to_chunks(x, chunk_size):
    """``[B, T, H, ...] -> [N, B, H, C, ...]``: chunk-major, for the state scan."""
    batch, seq_len, heads = x.shape[:3]
    x = x.reshape(batch, seq_len // chunk_size, chunk_size, heads, *x.shape[3:])
    return jnp.moveaxis(x, (1, 3), (0, 2))


def _chunk_masks(segment_ids, chunk_size):
    """:func:`kda_lib.ops.segments.segment_masks`, chunk-major: ``[B, 1, N, ...] -> [N, B, 1,
    ...]``."""
    return tuple(jnp.moveaxis(x, 2, 0) for x in segment_masks(segment_ids, chunk_size))


def _chain(intra: IntraChunk, state0, mode: ScanMode, operand_dtype):
    """Outputs ``[N, B, H, C, V]``, the final state and the states entering each chunk
    ``[N, B, H, K, V]`` from the chunks' ``intra`` parts, with the sequential scan or the
    associative one over the affine maps."""
    if mode == "sequential":
        return _pass_states(intra, state0, operand_dtype)
    maps = _affine_maps(intra, operand_dtype)
    entering, final_state = chain_states(
        jnp.moveaxis(maps.transition, 0, 2),
        jnp.moveaxis(maps.state_ext, 0, 2),
        state0,
        mode,
        operand_dtype,
    )
    low = _policy_dtype("outputs", operand_dtype)
    o = _matmul("nbhck,bhnkv->nbhcv", maps.q_eff, entering, operand_dtype=low) + maps.o_intra
    return o, final_state, jnp.moveaxis(entering, 2, 0)
