"""The plain KDA recurrence, one token at a time: the oracle every other form is checked against,
and the decoding steps (one token, a state pool, a draft over a state pool).

Per head, with state ``S [K, V]``::

    S = S * exp(g_t)[:, None]                     # per-channel forget gate
    S = S + beta_t * outer(k_t, v_t - k_t @ S)    # delta rule (read after the decay)
    o_t = (scale * q_t) @ S                       # read after write

Grouped value heads (fla's ``num_v_heads``): q, k have H heads and v, g, beta, the state HV,
a multiple of H; value head j reads q/k head ``j // (HV // H)``. Run it under
``jax_enable_x64`` with float64 inputs for a float64 oracle.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib import checks
from kda_lib.checks import check_array, is_concrete
from kda_lib.ops import contract
from kda_lib.ops.segments import first_segment_id, varying_like


def _step(state, q_t, k_t, v_t, g_t, beta_t, *, scale: float):
    """The one core: a token's decay, delta-rule write and read. state ``[B, HV, K, V]``;
    q_t, k_t ``[B, H, K]``; v_t ``[B, HV, V]``; g_t ``[B, HV, K]``; beta_t ``[B, HV]``, all in
    the state's dtype. Returns ``(state after the token, o_t [B, HV, V])``."""
    groups = state.shape[1] // q_t.shape[1]
    q_t, k_t = jnp.repeat(q_t, groups, axis=1), jnp.repeat(k_t, groups, axis=1)
    state = state * jnp.exp(g_t)[..., None]
    prediction = jnp.einsum("bhk,bhkv->bhv", k_t, state)
    state = state + (beta_t[..., None] * k_t)[..., None] * (v_t - prediction)[..., None, :]
    return state, jnp.einsum("bhk,bhkv->bhv", q_t * scale, state)


_STATIC = ("dims", "scale", "output_final_state", "chunk_states_every", "output_token_states")


@functools.partial(jax.jit, static_argnames=_STATIC)
def recurrent_core(q, k, v, g, beta, *, dims: contract.Dims, scale: float, initial_state,
                   output_final_state, segment_ids, chunk_states_every: int | None = None,
                   output_token_states: bool = False):  # fmt: skip
    """:func:`kda_lib.kda_recurrent` on checked inputs: ``(o, final_state, chunk_states [B, T //
    c, HV, K, V] after every c = chunk_states_every tokens, token_states)`` (None if not asked)."""
    acc = contract.accumulation_dtype(q.dtype)
    shape = (dims.batch, dims.num_heads, dims.key_dim, dims.value_dim)
    state0 = jnp.zeros(shape, acc) if initial_state is None else initial_state.astype(acc)
    xs = [jnp.moveaxis(x.astype(acc), 1, 0) for x in (q, k, v, g, beta)]  # time-major
    ids = jnp.ones((dims.batch, dims.seq_len), jnp.int32) if segment_ids is None else segment_ids
    prev0, ids = first_segment_id(ids), jnp.moveaxis(ids, 1, 0)

    def step(carry, x):  # one token with the segment rules: (o_t, state after t if kept)
        state, prev_id = carry
        *token, id_t = x
        valid = id_t != 0  # [B]
        fresh = valid & (id_t != prev_id)
        new_state, o_t = _step(jnp.where(fresh[:, None, None, None], 0.0, state), *token,
                               scale=scale)  # fmt: skip
        state = jnp.where(valid[:, None, None, None], new_state, state)
        o_t = jnp.where(valid[:, None, None], o_t, 0.0)
        kept = state if output_token_states else None
        return (state, jnp.where(valid, id_t, prev_id)), (o_t, kept)

    # chunks of chunk_states_every tokens (default T; padded with id 0), each one's last state
    every = chunk_states_every or dims.seq_len
    pad = -dims.seq_len % every
    seq = tuple(jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in (*xs, ids))

    def chunk(carry, tokens):
        carry, (o, kept) = jax.lax.scan(step, carry, tokens)
        return carry, (o, kept, carry[0])

    state0 = varying_like(state0, xs[2][0][:, :, None, :])
    (final_state, _), (o, token_states, chunk_states) = jax.lax.scan(
        chunk, (state0, varying_like(prev0, ids[0])),
        tuple(x.reshape(-1, every, *x.shape[1:]) for x in seq),
    )  # fmt: skip
    o, token_states = (None if x is None else jnp.moveaxis(x.reshape(-1, *x.shape[2:]), 0, 1)
                       [:, : dims.seq_len] for x in (o, token_states))  # fmt: skip
    chunk_states = jnp.moveaxis(chunk_states[: dims.seq_len // every], 0, 1)
    return (o.astype(q.dtype), final_state if output_final_state else None,
            chunk_states if chunk_states_every else None, token_states)  # fmt: skip


def kda_step(state, q_t, k_t, v_t, g_t, beta_t, *, scale=None):
    """One decoding step: state ``[B, HV, K, V]``; q_t, k_t ``[B, H, K]``; v_t ``[B, HV, V]``;
    g_t ``[B, HV, K]``; beta_t ``[B, HV]``; scale default ``K ** -0.5``. Returns ``(new_state,
    o_t [B, HV, V])``: the state in float32 (float64 when q_t or the state is), o_t as q_t."""
    dims = _check_token(q_t, k_t, v_t, g_t, beta_t)
    contract.check_shape("state", state, dims)
    acc = jnp.promote_types(contract.accumulation_dtype(q_t.dtype), state.dtype)
    new_state, o_t = _step(*(x.astype(acc) for x in (state, q_t, k_t, v_t, g_t, beta_t)),
                           scale=contract.resolve_scale(scale, dims.key_dim))  # fmt: skip
    return new_state, o_t.astype(q_t.dtype)


def kda_pool_step(pool, state_indices, q_t, k_t, v_t, g_t, beta_t, *, scale=None):
    """One decoding step of B rows whose states are slots of a pool (continuous batching):
    :func:`kda_pool_verify` of one token, accepted. ``pool [N, HV, K, V]`` floating, kept in its
    dtype, **donated** (use the returned pool). ``state_indices [B]``: distinct slots in ``[0,
    N)`` (checked when concrete; under ``jit`` a bad row writes nothing and outputs NaN), other
    slots stay bit for bit. Tokens, ``scale`` as in :func:`kda_step`: ``(new_pool, o_t)``."""
    dims = _check_token(q_t, k_t, v_t, g_t, beta_t)  # refusals name q_t .. beta_t
    _check_pool(pool, state_indices, dims)
    tokens = (x[:, None] for x in (q_t, k_t, v_t, g_t, beta_t))
    new_pool, o = _pool_run(pool, state_indices, *tokens, np.ones(dims.batch, np.int32),
                            scale=contract.resolve_scale(scale, dims.key_dim))  # fmt: skip
    return new_pool, o[:, 0]


def kda_pool_verify(pool, state_indices, q, k, v, g, beta, num_accepted_tokens, *, scale=None):
    """A draft of T tokens per row over pool slots (speculative decoding): row b runs from
    ``pool[state_indices[b]]`` and writes back the state after its first
    ``num_accepted_tokens[b]`` (``[B]`` ints in ``[0, T]``, 0: unchanged; else refused, NaN
    under ``jit``). ``pool``, ``state_indices`` as in :func:`kda_pool_step`; tokens, ``scale``
    as in :func:`kda_lib.kda_recurrent`. Returns ``(new_pool, o [B, T, HV, V] in q's dtype)``."""
    dims = _check_token(q, k, v, g, beta, token=False)
    _check_pool(pool, state_indices, dims)
    counts = _batch_ints("num_accepted_tokens", num_accepted_tokens, dims.batch)
    if counts is not None and (counts.min() < 0 or counts.max() > dims.seq_len):
        raise ValueError(f"num_accepted_tokens must be in [0, T={dims.seq_len}], got {counts}")
    return _pool_run(pool, state_indices, q, k, v, g, beta, num_accepted_tokens,
                     scale=contract.resolve_scale(scale, dims.key_dim))  # fmt: skip


def _check_token(q, k, v, g, beta, *, token: bool = True) -> contract.Dims:
    """A step's (``token``: q_t .. beta_t) or a draft's inputs, values as in :func:`kda_lib.kda`."""
    dims = contract.checked_dims(q, k, v, g, beta, token=token)
    contract.check_values(beta, g, allow_neg_eigval=None, raw_gate=False, token=token)
    return dims


def _check_pool(pool, state_indices, dims: contract.Dims) -> None:
    """``pool [N, HV, K, V]`` floating; ``state_indices [B]`` distinct slots in ``[0, N)``."""
    contract.check_shape("pool", pool, dims)
    idx = _batch_ints("state_indices", state_indices, dims.batch)
    if idx is not None and (idx.min() < 0 or idx.max() >= len(pool) or len(set(idx)) < idx.size):
        raise ValueError(f"state_indices must be distinct slots in [0, {len(pool)}), got {idx}")


def _batch_ints(name: str, x, batch: int) -> np.ndarray | None:
    """``x`` must be ``[B]`` ints; returns its values when concrete (else None, under jit)."""
    check_array(name, x)
    if x.shape != (batch,) or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be [B]={batch} ints, got {x.shape} {x.dtype}")
    return checks.host_values(x) if is_concrete(x) else None


@functools.partial(jax.jit, static_argnames="scale", donate_argnums=0)
def _pool_run(pool, slots, q, k, v, g, beta, accepted, *, scale: float):
    """The pool steps on checked inputs: gather slots, run, scatter accepted states back."""
    n, seq_len = pool.shape[0], q.shape[1]
    in_range = (slots >= 0) & (slots < n)
    safe = jnp.where(in_range, slots, n)
    ok = in_range & (jnp.zeros(n + 1, jnp.int32).at[safe].add(1)[safe] == 1)  # not shared
    acc = jnp.promote_types(contract.accumulation_dtype(q.dtype), pool.dtype)
    initial = pool[jnp.where(ok, slots, 0)].astype(acc)

    def step(carry, x):
        state, kept = carry
        t, *token = x
        state, o_t = _step(state, *(y.astype(acc) for y in token), scale=scale)
        return (state, jnp.where((t < accepted)[:, None, None, None], state, kept)), o_t

    xs = (jnp.arange(seq_len), *(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta)))
    (_, kept), o = jax.lax.scan(step, (initial, initial), xs)
    counted = (accepted >= 0) & (accepted <= seq_len)
    kept = jnp.where(counted[:, None, None, None], kept, jnp.nan).astype(pool.dtype)
    o = jnp.where(ok[:, None, None, None], jnp.moveaxis(o, 0, 1), jnp.nan).astype(q.dtype)
    return pool.at[jnp.where(ok, slots, n)].set(kept, mode="drop"), o
