"""Segment ids and the one segment rule (DESIGN section 3); non-finite inputs' isolation.

``segment_ids [B, T]`` are ints, 0 = padding. A segment starts wherever a real token's id
differs from the previous real token's; padding belongs to no segment (output 0, state left
alone); the initial state belongs to a row's first segment."""

from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np

# a raw gate input this negative activates to g = 0 in both gates, with zero gradients
NEUTRAL_RAW_GATE = -1e30


def first_segment_id(segment_ids: jax.Array) -> jax.Array:
    """``[B]``: each row's first non-zero id (0 for an all-padding row)."""
    valid = segment_ids != 0
    first = jnp.take_along_axis(segment_ids, jnp.argmax(valid, axis=1)[:, None], 1)[:, 0]
    return jnp.where(valid.any(axis=1), first, 0)


def fill_padding_ids(segment_ids: jax.Array, fallback: jax.Array) -> jax.Array:
    """``segment_ids [B, T]``, padding given the last real id before it (none: ``fallback [B]``)."""
    positions = jnp.where(segment_ids != 0, jnp.arange(segment_ids.shape[1]), -1)
    last_valid = jax.lax.cummax(positions, axis=1)
    filled = jnp.take_along_axis(segment_ids, jnp.maximum(last_valid, 0), 1)
    return jnp.where(last_valid >= 0, filled, fallback[:, None])


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """``[B, T]`` bool: the real tokens that start a segment after the row's first one."""
    filled = fill_padding_ids(segment_ids, first_segment_id(segment_ids))
    return filled != jnp.concatenate([filled[:, :1], filled[:, :-1]], axis=1)


def segment_ordinals(segment_ids: jax.Array) -> jax.Array:
    """``[B, T]`` int32: a token's segment's ordinal in its row (padding: the one before, or 1)."""
    return (1 + jnp.cumsum(segment_starts(segment_ids), axis=1)).astype(jnp.int32)


def segment_masks(segment_ids: jax.Array, chunk_size: int):
    """The chunked form's masks (``T % chunk_size == 0``): ``same [B,1,N,C,C]`` (tokens i, j
    real, one segment), ``sees_in``, ``in_last [B,1,N,C]`` (a real token of the segment
    entering, leaving the chunk), ``keeps_in [B,1,N]`` (the incoming state survives it)."""
    shape = (segment_ids.shape[0], -1, chunk_size)  # [B, N, C]
    ordinals = segment_ordinals(segment_ids)
    leaving = ordinals[:, chunk_size - 1 :: chunk_size]  # [B, N]
    entering = jnp.concatenate([jnp.ones_like(leaving[:, :1]), leaving[:, :-1]], axis=1)
    ord_c, valid_c = ordinals.reshape(shape), (segment_ids != 0).reshape(shape)
    both = valid_c[..., :, None] & valid_c[..., None, :]
    same = (ord_c[..., :, None] == ord_c[..., None, :]) & both
    sees_in = valid_c & (ord_c == entering[..., None])
    in_last = valid_c & (ord_c == leaving[..., None])
    keeps_in = leaving == entering
    return tuple(x[:, None] for x in (same, sees_in, in_last, keeps_in))  # head axis


# ------------------------------------------------------------------- across ranks (shard_map)
def varying_like(x: jax.Array, ref: jax.Array) -> jax.Array:
    """``x + zeros_like(ref)``: inside ``shard_map`` varying over ``ref``'s mesh axes, as a scan's
    carry must vary like its inputs (a parameter's gradient then sums over ranks); a broadcast."""
    return x + jnp.zeros_like(ref)


def rank_segment_links(segment_ids: jax.Array, axis_name: str):
    """Inside ``shard_map`` over ``axis_name`` (this rank's ids ``[B, T_local]``): ``(before
    [R, B], ends [R, B, 2], rank)``, the last real id on ranks ``< r`` (0: none), each rank's
    first and last real ids, this rank's index."""
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


def canonical_segment_ids(segment_ids) -> jax.Array:
    """``[B, T]`` int32: each segment's ordinal, padding 0 (host ids renumbered on the host)."""
    if not isinstance(segment_ids, jax.Array):
        ids = np.asarray(segment_ids)
        if not ids.size:
            return jnp.zeros(ids.shape, jnp.int32)
        dense = np.unique(ids, return_inverse=True)[1].reshape(ids.shape) + (ids != 0).all()
        segment_ids = jnp.asarray(dense, jnp.int32)  # 0 stays 0, equal ids stay equal
    return jnp.where(segment_ids != 0, segment_ordinals(segment_ids), 0).astype(jnp.int32)


def zero_padding(segment_ids, q, k, v, g, beta, *, neutral_gate: float = 0.0):
    """q, k, v, beta 0 and g ``neutral_gate`` at padding, by selection (no NaN leaks)."""
    if segment_ids is None:
        return q, k, v, g, beta
    tokens = (segment_ids != 0)[..., None, None]
    q, k, v = (jnp.where(tokens, x, 0) for x in (q, k, v))
    return q, k, v, jnp.where(tokens, g, neutral_gate), jnp.where(tokens[..., 0], beta, 0)


# where the recurrence is non-finite: outputs [B, T, H, V], final_state [B, H, V], states
NonFinite = namedtuple("NonFinite", "outputs final_state states")  # [B, T, H, V]


def overflowing_keys_as_nan(k):
    """``k [B, T, H, K]`` with NaN for every key whose squared norm overflows float32."""
    norms = jnp.sum(jnp.square(k.astype(jnp.float32)), axis=-1, keepdims=True)
    return jnp.where(norms < jnp.inf, k, jnp.nan)  # NaN stays NaN


def isolate_non_finite(q, k, v, g, beta, initial_state, segment_ids, *, raw_gate: bool = False):
    """``(q, k, v, g, beta, initial_state, where)``: finite stand-ins and :class:`NonFinite`,
    where the recurrence is non-finite: a bad query, output t; a bad key, beta or gate (NaN,
    +inf log-space), t's segment from t on; a bad value or initial-state column, that column."""
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
    ones = jnp.ones((batch, seq_len), jnp.int32)
    ordinals = ones if segment_ids is None else segment_ordinals(segment_ids)
    valid = ones > 0 if segment_ids is None else segment_ids != 0
    if initial_state is None:
        bad_init = jnp.zeros((batch, heads, value_dim), bool)
    else:
        bad_init = ~jnp.isfinite(initial_state).all(-2)  # [B, H, V]
        initial_state = jnp.where(jnp.isfinite(initial_state), initial_state, 0)
    state_flags = (bad_token[..., None] | bad_v) & valid[..., None, None]
    ords = ordinals[:, :, None, None]  # bad from a flagged token on, in its segment
    bad_state = jax.lax.cummax(jnp.where(state_flags, ords, 0), axis=1) == ords
    bad_state |= bad_init[:, None] & (ords == 1)
    outputs = (bad_state | bad_q[..., None]) & valid[..., None, None]
    # the state after each token: after the last real token so far (else the initial state)
    last = jax.lax.cummax(jnp.where(valid, jnp.arange(seq_len), -1), axis=1)  # [B, T]
    at_last = jnp.take_along_axis(bad_state, jnp.maximum(last, 0)[:, :, None, None], 1)
    states = jnp.where((last >= 0)[:, :, None, None], at_last, bad_init[:, None])
    return q, k, v, g, beta, initial_state, NonFinite(outputs, states[:, -1], states)


def restore_non_finite(out, final_state, where: NonFinite):
    """NaN where ``where`` flags outputs ``[B, T, H, V]`` and final-state columns."""
    out = jnp.where(where.outputs, jnp.nan, out)
    if final_state is not None:
        final_state = jnp.where(where.final_state[:, :, None, :], jnp.nan, final_state)
    return out, final_state


def pad_time(multiple: int, *arrays, segment_ids=None):
    """``(arrays, segment_ids, pad)``, ``[B, T, ...]`` zero-padded along T to ``multiple``."""
    pad = (-arrays[0].shape[1]) % multiple
    if not pad:
        return arrays, segment_ids, 0
    widths = lambda x: [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)  # noqa: E731
    arrays = tuple(jnp.pad(x, widths(x)) for x in arrays)
    if segment_ids is not None:
        segment_ids = jnp.pad(segment_ids, widths(segment_ids))
    return arrays, segment_ids, pad
