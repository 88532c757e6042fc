"""Segment ids: the one place that says what a segment is.

``segment_ids [B, T]`` are ints, 1-based, 0 = padding. **A segment starts wherever the id of a
real (non-padding) token differs from the id of the real token before it**; padding belongs to
no segment (it outputs 0 and leaves the state alone). The initial state belongs to a row's
first segment. Every implementation derives what it needs from the helpers here, so all agree
on every input, including ones the eager checks reject. Non-finite inputs are isolated here
too (:func:`isolate_non_finite`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_int

# a raw gate input this negative activates to exactly g = 0 in both gates (softplus and the
# safe sigmoid gate) with zero, not NaN, gradients
NEUTRAL_RAW_GATE = -1e30


def first_segment_id(segment_ids: jax.Array) -> jax.Array:
    """``[B]``: the first non-zero id of each row (0 for an all-padding row).

    The initial state belongs to this segment, also when the row starts with padding.
    """
    valid = segment_ids != 0
    first = jnp.argmax(valid, axis=1)
    return jnp.where(
        valid.any(axis=1), jnp.take_along_axis(segment_ids, first[:, None], 1)[:, 0], 0
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


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """``[B, T]`` bool: the real tokens that start a segment after the row's first one (a real
    token whose id differs from the previous real token's). The first segment's start is False:
    the initial state belongs to it, also when the row starts with padding."""
    filled = fill_padding_ids(segment_ids, first_segment_id(segment_ids))
    # (padding takes the id before it, so it never differs from its predecessor)
    return filled != jnp.concatenate([filled[:, :1], filled[:, :-1]], axis=1)


def segment_ordinals(segment_ids: jax.Array) -> jax.Array:
    """``[B, T]`` int32: 1 for every token of a row's first segment, 2 for the second, ...

    Padding takes the ordinal of the segment before it (leading padding: 1). Two ids compare
    equal as ordinals only if no other id lies between them, so a reused id (``1, 2, 1``)
    starts a new segment, exactly as the recurrence treats it.
    """
    return (1 + jnp.cumsum(segment_starts(segment_ids), axis=1)).astype(jnp.int32)


def count_segments(segment_ids, ranks: int = 1) -> int:
    """Most runs of one id (padding runs included) in a row of concrete ``segment_ids``, or in
    one rank's slice when the rows are split into ``ranks`` equal slices. An upper bound on the
    segments per row (slice) that never undercounts, whatever the padding."""
    ids = np.asarray(segment_ids)
    slices = ids.reshape(ids.shape[0] * ranks, -1)
    starts = np.concatenate(
        [np.ones((slices.shape[0], 1), bool), slices[:, 1:] != slices[:, :-1]], axis=1
    )
    return int(starts.sum(axis=1).max())


def check_max_num_segments(value, name: str = "max_num_segments", *, optional: bool = False):
    """``value`` must be a positive int (or None when ``optional``)."""
    check_int(name, value, optional=optional)


def neutral_padding(q, g, beta, valid, *, raw_gate: bool):
    """q, g, beta with every padding token (``valid [B, T]`` False) made neutral: zero query,
    no decay, no write. For kernels that cannot skip tokens (tokamax): a neutral token joins the
    segment before it without changing its state.

    ``raw_gate``: g is the raw gate input of the fused gate (neutral value
    :data:`NEUTRAL_RAW_GATE`), else the log-space decay (neutral value 0).
    """
    neutral_gate = NEUTRAL_RAW_GATE if raw_gate else 0.0
    g = jnp.where(valid[..., None, None], g, neutral_gate)
    beta = jnp.where(valid[..., None], beta, 0.0)
    q = jnp.where(valid[..., None, None], q, 0.0)
    return q, g, beta


def segment_masks(segment_ids: jax.Array, chunk_size: int):
    """Masks of the chunked form from padded ``segment_ids [B, T]`` (``T % chunk_size == 0``).

    Returns ``(same [B,1,N,C,C], sees_in [B,1,N,C], in_last [B,1,N,C], keeps_in [B,1,N])``
    (a head axis of size 1): ``same[i, j]`` tokens i and j are real and in one segment;
    ``sees_in`` a real token belongs to the segment that enters the chunk; ``in_last`` a real
    token belongs to the segment that leaves it; ``keeps_in`` the chunk's incoming state
    survives to its end (no segment starts inside it).
    """
    batch, seq_len = segment_ids.shape
    num_chunks = seq_len // chunk_size
    valid = segment_ids != 0
    ordinals = segment_ordinals(segment_ids)
    leaving = ordinals[:, chunk_size - 1 :: chunk_size]  # [B, N]
    entering = jnp.concatenate([jnp.ones_like(leaving[:, :1]), leaving[:, :-1]], axis=1)
    ord_c = ordinals.reshape(batch, num_chunks, chunk_size)
    valid_c = valid.reshape(batch, num_chunks, chunk_size)
    same = (
        (ord_c[..., :, None] == ord_c[..., None, :]) & valid_c[..., :, None] & valid_c[..., None, :]
    )
    sees_in = valid_c & (ord_c == entering[..., None])
    in_last = valid_c & (ord_c == leaving[..., None])
    keeps_in = leaving == entering
    return tuple(x[:, None] for x in (same, sees_in, in_last, keeps_in))  # head axis


# ------------------------------------------------------------------- across ranks (shard_map)
def rank_segment_links(segment_ids: jax.Array, axis_name: str):
    """How each rank's segments continue across rank boundaries; call inside ``shard_map``.

    Args:
      segment_ids: this rank's ``[B, T_local]`` ids.
      axis_name: the mesh axis the sequence is split over.

    Returns:
      ``(before [R, B], ends [R, B, 2], rank)``: ``before[r]`` is the id of the last real
      token on ranks ``< r`` (0: none); ``ends[r]`` rank r's first and last real ids (0 0 for
      an all-padding slice); ``rank`` this rank's index. One ``[R, B, 2]`` all-gather.
    """
    # the last real id: the filled id of the last token (0 for an all-padding row)
    last = fill_padding_ids(segment_ids, jnp.zeros_like(segment_ids[:, 0]))[:, -1]
    ends = jnp.stack([first_segment_id(segment_ids), last], -1)
    all_ends = jax.lax.all_gather(ends, axis_name)  # [R, B, 2]
    rank = jax.lax.axis_index(axis_name)
    upstream = jnp.zeros_like(last)
    before = []
    for j in range(all_ends.shape[0]):  # in rank order: the last real id seen so far
        before.append(upstream)
        upstream = jnp.where(all_ends[j, :, 1] != 0, all_ends[j, :, 1], upstream)
    return jnp.stack(before), all_ends, rank


def fill_padding_ids_across_ranks(segment_ids: jax.Array, axis_name: str) -> jax.Array:
    """Rank-local ids with padding (0) replaced by the id of the last real token before it,
    looking across ranks (leading padding of a row joins its first segment; an all-padding row
    gets 1). For tokamax's CP, whose chain detection compares neighbouring ranks' first and
    last ids, so that a segment links across padding and all-padding ranks as kda_lib's do."""
    before, _, rank = rank_segment_links(segment_ids, axis_name)
    upstream = jnp.take(before, rank, axis=0)  # [B]
    filled = fill_padding_ids(segment_ids, upstream)
    filled = jnp.where(filled == 0, first_segment_id(segment_ids)[:, None], filled)
    return jnp.where(filled == 0, 1, filled).astype(jnp.int32)


def canonical_segment_ids(segment_ids) -> jax.Array:
    """``[B, T]`` int32 ids in which every segment has its own number (its ordinal) and padding
    stays 0: the rule above made explicit, so code that compares ids (the short convolution,
    tokamax) and code that compares ordinals agree on any input, reused ids included.

    Ids are compared in their own dtype: host ids (numpy, any integer dtype) are numbered on the
    host before anything converts them, since with ``jax_enable_x64`` off ``jnp.asarray`` would
    wrap int64/uint64 ids to 32 bits (``2**32`` would become 0, padding). Ids that are already
    jax arrays (a dtype jax holds) or tracers are numbered by jax in their dtype."""
    if not isinstance(segment_ids, jax.Array):  # host ids: numbered before any conversion
        return jnp.asarray(host_canonical_segment_ids(np.asarray(segment_ids)))
    return jnp.where(segment_ids != 0, segment_ordinals(segment_ids), 0).astype(jnp.int32)


def host_canonical_segment_ids(ids: np.ndarray) -> np.ndarray:
    """:func:`canonical_segment_ids` in numpy, in ``ids``' own dtype (``[B, T]`` -> int32): the
    same rule as :func:`segment_ordinals` (padding filled with the id before it, leading padding
    with the row's first id; an ordinal wherever the filled id changes)."""
    if ids.ndim != 2 or not ids.size:
        return np.zeros(ids.shape, np.int32)
    valid = ids != 0
    positions = np.arange(ids.shape[1])
    last_valid = np.maximum.accumulate(np.where(valid, positions, -1), axis=1)
    first = np.take_along_axis(ids, np.argmax(valid, axis=1)[:, None], 1)  # [B, 1]
    filled = np.where(last_valid >= 0, np.take_along_axis(ids, np.maximum(last_valid, 0), 1), first)
    changes = np.concatenate([np.zeros_like(valid[:, :1]), filled[:, 1:] != filled[:, :-1]], axis=1)
    return np.where(valid, 1 + np.cumsum(changes, axis=1), 0).astype(np.int32)


def segment_cumulative_any(flags: jax.Array, ordinals: jax.Array) -> jax.Array:
    """``out[b, t, ...]``: is any ``flags[b, s, ...]`` set for some ``s <= t`` in t's segment?

    flags: ``[B, T, ...]`` bool; ordinals: ``[B, T]`` from :func:`segment_ordinals`
    (non-decreasing along T, so the running maximum of flagged ordinals equals t's own ordinal
    exactly when its segment has a flag at or before t).
    """
    extra = (1,) * (flags.ndim - 2)
    marks = jnp.where(flags, ordinals.reshape(*ordinals.shape, *extra), 0)
    return jax.lax.cummax(marks, axis=1) == ordinals.reshape(*ordinals.shape, *extra)


def zero_padding(segment_ids, q, k, v, g, beta, *, neutral_gate: float = 0.0):
    """q, k, v, beta set to 0 and g to ``neutral_gate`` at padding (id 0), by selection: whatever
    values padding holds (NaN, inf, 1e30) never reach an output or a gradient, and padding
    inputs get exactly zero gradients."""
    if segment_ids is None:
        return q, k, v, g, beta
    valid = segment_ids != 0
    tokens = valid[..., None, None]
    return (
        jnp.where(tokens, q, 0),
        jnp.where(tokens, k, 0),
        jnp.where(tokens, v, 0),
        jnp.where(tokens, g, neutral_gate),
        jnp.where(valid[..., None], beta, 0),
    )


class NonFinite(NamedTuple):
    """Where the recurrence's outputs and final state are non-finite, from where its inputs
    are (see :func:`isolate_non_finite`)."""

    outputs: jax.Array  # [B, T, H, V] bool
    final_state: jax.Array  # [B, H, V] bool: columns of the [K, V] state
    # [B, T, H, V] bool: state columns after token t as the recurrence carries it (the state
    # after the last real token at or before t; the initial state before the first)
    states: jax.Array


def overflowing_keys_as_nan(k):
    """``k`` with NaN for every key whose squared norm overflows float32 (``[B, T, H, K]``).

    The recurrence's ``beta k k^T`` is then non-finite (NaN from that token on in its segment,
    as for a NaN key); a form that mixes a chunk's tokens in matmuls would instead spread the
    overflow to every token of the chunk, earlier ones and other segments included
    (``0 * inf``). Marked as NaN, :func:`isolate_non_finite` keeps it in its segment from the
    token on. A key whose squared norm is finite but whose products inside a chunk still
    overflow would not be caught (none found up to norms of 1e19; docs/DESIGN.md).
    """
    norms = jnp.sum(jnp.square(k.astype(jnp.float32)), axis=-1, keepdims=True)
    return jnp.where(norms < jnp.inf, k, jnp.nan)  # NaN stays NaN


def isolate_non_finite(q, k, v, g, beta, initial_state, segment_ids, *, raw_gate: bool = False):
    """Finite stand-ins for non-finite inputs, and where the recurrence would be non-finite.

    Forms that mix a chunk's tokens in matmuls (the chunked form, tokamax) would otherwise
    spread one NaN to every token of the chunk (``0 * NaN = NaN``): through masked scores into
    earlier tokens and other segments. They compute on the stand-ins and then put NaN exactly
    where the token-by-token recurrence is non-finite:

    * a non-finite query ``q_t``: output t (all channels);
    * a non-finite key, ``beta``, or gate (NaN; +inf for a log-space gate) at token t: outputs of
      t's segment from t on, all channels, and the final state if that segment is the last;
    * a non-finite value channel ``v_t[j]``: channel j of those outputs (and of the state);
    * a non-finite ``initial_state[:, j]`` column: channel j of the row's first segment.

    A log-space gate of ``-inf`` (forget everything) and a raw gate of ``+-inf`` are finite
    decays and stay. Padding must already be zeroed (:func:`zero_padding`); it is never
    flagged. Huge finite values are computed as they are.

    Returns:
      ``(q, k, v, g, beta, initial_state, NonFinite)``.
    """
    bad_q = ~jnp.isfinite(q).all(-1)  # [B, T, H]
    bad_gate = jnp.isnan(g) if raw_gate else jnp.isnan(g) | (g == jnp.inf)
    bad_token = ~jnp.isfinite(k).all(-1) | ~jnp.isfinite(beta) | bad_gate.any(-1)
    bad_v = ~jnp.isfinite(v)  # [B, T, H, V]
    q = jnp.where(bad_q[..., None], 0, q)
    k = jnp.where(bad_token[..., None], 0, k)
    g = jnp.where(bad_token[..., None], 0, g)
    beta = jnp.where(bad_token, 0, beta)
    v = jnp.where(bad_v, 0, v)
    batch, seq_len, heads, value_dim = v.shape
    if segment_ids is None:
        ordinals = jnp.ones((batch, seq_len), jnp.int32)
        valid = jnp.ones((batch, seq_len), bool)
    else:
        ordinals = segment_ordinals(segment_ids)
        valid = segment_ids != 0
    if initial_state is None:
        bad_init = jnp.zeros((batch, heads, value_dim), bool)
    else:
        bad_init = ~jnp.isfinite(initial_state).all(-2)  # [B, H, V]
        initial_state = jnp.where(jnp.isfinite(initial_state), initial_state, 0)
    state_flags = (bad_token[..., None] | bad_v) & valid[..., None, None]
    bad_state = segment_cumulative_any(state_flags, ordinals) | (
        bad_init[:, None] & (ordinals == 1)[:, :, None, None]
    )
    outputs = (bad_state | bad_q[..., None]) & valid[..., None, None]
    # the state after each token: as after the last real token so far (the initial state
    # before the first); the final state is the last of them
    positions = jnp.arange(seq_len)
    last = jax.lax.cummax(jnp.where(valid, positions, -1), axis=1)  # [B, T]
    at_last = jnp.take_along_axis(bad_state, jnp.maximum(last, 0)[:, :, None, None], 1)
    states = jnp.where((last >= 0)[:, :, None, None], at_last, bad_init[:, None])
    return q, k, v, g, beta, initial_state, NonFinite(outputs, states[:, -1], states)


def restore_non_finite(out, final_state, where: NonFinite):
    """NaN at the outputs ``[B, T, H, V]`` and final-state columns ``[B, H, K, V]`` flagged by
    :func:`isolate_non_finite` (``final_state`` may be None)."""
    out = jnp.where(where.outputs, jnp.nan, out)
    if final_state is not None:
        final_state = jnp.where(where.final_state[:, :, None, :], jnp.nan, final_state)
    return out, final_state


def restore_non_finite_chunk_states(chunk_states, where: NonFinite, chunk_size: int):
    """NaN at the columns of ``chunk_states [B, N, H, K, V]`` (the states after tokens
    ``(i + 1) * chunk_size - 1``) that the recurrence has non-finite (:class:`NonFinite`)."""
    num = chunk_states.shape[1]
    bad = where.states[:, chunk_size - 1 :: chunk_size][:, :num]  # [B, N, H, V]
    return jnp.where(bad[:, :, :, None, :], jnp.nan, chunk_states)


def pad_time(multiple: int, *arrays, segment_ids=None):
    """Arrays ``[B, T, ...]`` and ``segment_ids [B, T]`` (or None) zero-padded along T to a
    multiple of ``multiple``: the one place a chunked kernel's T is padded (kda_lib's chunked
    form, tokamax's chunked kernels). Padded ids are 0 (padding). Returns
    ``(padded arrays tuple, segment_ids, pad)``."""
    pad = (-arrays[0].shape[1]) % multiple
    if not pad:
        return arrays, segment_ids, 0
    widths = lambda x: [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)  # noqa: E731
    arrays = tuple(jnp.pad(x, widths(x)) for x in arrays)
    if segment_ids is not None:
        segment_ids = jnp.pad(segment_ids, widths(segment_ids))
    return arrays, segment_ids, pad
