"""The plain KDA recurrence, one token at a time: the oracle every other form is checked against.

Per head, with state ``S [K, V]``::

    S = S * exp(g_t)[:, None]                     # per-channel forget gate
    S = S + beta_t * outer(k_t, v_t - k_t @ S)    # delta rule (read after the decay)
    o_t = (scale * q_t) @ S                       # read after write

Grouped value heads (fla's ``num_v_heads``): q, k have H heads and v, g, beta, the state HV,
a multiple of H; value head j reads q/k head ``j // (HV // H)``, by that index mapping inside
the step (nothing is repeated).

Run it under ``jax_enable_x64`` with float64 inputs for a float64 oracle.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_array, is_concrete
from kda_lib.ops.contract import (
    Dims,
    accumulation_dtype,
    check_flag,
    check_kda_inputs,
    check_state,
    kda_result,
    resolve_scale,
)
from kda_lib.ops.segments import canonical_segment_ids, first_segment_id, zero_padding


def _delta_update(state, k_t, v_t, g_t, beta_t):
    """One decay + delta-rule write. state [..., K, V]; k_t, g_t [..., K]; v_t [..., V]."""
    state = state * jnp.exp(g_t)[..., :, None]
    prediction = jnp.einsum("...k,...kv->...v", k_t, state)
    return state + (beta_t[..., None] * k_t)[..., :, None] * (v_t - prediction)[..., None, :]


def kda_recurrent(
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
    output_token_states: bool = False,
):
    """KDA as a ``lax.scan`` over time.

    Args:
      q, k: ``[B, T, H, K]``; used as given (normalise them first if you want L2-normed keys).
      v: ``[B, T, HV, V]``, HV a positive multiple of H (HV = H: one value head per q/k head).
        Grouped value heads are served natively: value head j reads q/k head ``j // (HV // H)``.
      g: ``[B, T, HV, K]`` log-space decay, ``<= 0``.
      beta: ``[B, T, HV]`` write strength in [0, 1] ([0, 2] with ``allow_neg_eigval``).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` state before the first token (of the row's first
        segment), default zeros.
      output_final_state: also return the state after the last non-padding token.
      segment_ids: ``[B, T]`` int, 1-based, 0 = padding. The state resets to zero whenever the
        id changes; padding tokens output 0 and leave the state alone.
      allow_neg_eigval: accept beta in [0, 2].
      output_token_states: also return ``token_states [B, T, HV, K, V]``, the state after
        every token (speculative decoding: a verifier keeps the state after the accepted
        prefix, as :func:`kda_pool_verify` does over a state pool); default False. A padding
        token's entry repeats the state before it; across a segment start see
        :class:`kda_lib.ops.contract.KDAResult`.

    Returns:
      ``(o, final_state)``: o ``[B, T, HV, V]`` in q's dtype; final_state ``[B, HV, K, V]``
      float32 (float64 for float64 inputs), or None. With ``output_token_states`` a
      :class:`kda_lib.ops.contract.KDAResult` ``(output, final_state, None, token_states)``.
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
    check_flag("output_token_states", output_token_states)
    if segment_ids is not None:  # compared in their own dtype, then numbered
        segment_ids = canonical_segment_ids(segment_ids)
    # padding by selection: its values never reach an output or a gradient
    q, k, v, g, beta = zero_padding(segment_ids, q, k, v, g, beta)
    o, final, _, token_states = recurrent_core(
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
        output_token_states=output_token_states,
    )
    return kda_result(o, final, None, token_states, asked=output_token_states)


# traced once per static options and shapes (eager calls compile one program; see
# kda_lib.ops.registry.run)
@functools.partial(
    jax.jit,
    static_argnames=(
        "dims",
        "scale",
        "output_final_state",
        "chunk_states_every",
        "output_token_states",
    ),
)
def recurrent_core(
    q,
    k,
    v,
    g,
    beta,
    *,
    dims: Dims,
    scale: float,
    initial_state,
    output_final_state,
    segment_ids,
    chunk_states_every: int | None = None,
    output_token_states: bool = False,
):
    """:func:`kda_recurrent` on checked inputs: ``segment_ids`` canonical
    (:func:`kda_lib.ops.segments.canonical_segment_ids`) and padding already zeroed; nothing is
    checked, canonicalised or padded here.

    Returns ``(o, final_state | None, chunk_states | None, token_states | None)``:
    ``chunk_states [B, T // c, HV, K, V]`` after every ``c = chunk_states_every`` tokens (a
    scan over chunks of c steps that keeps the carry at each chunk's end; with
    ``output_token_states`` every c-th token state), ``token_states [B, T, HV, K, V]``."""
    acc = accumulation_dtype(q.dtype)
    state0 = _initial_state(initial_state, dims, acc)
    # time-major for the scan
    xs = [jnp.moveaxis(x.astype(acc), 1, 0) for x in (q, k, v, g, beta)]
    if segment_ids is None:
        ids = jnp.ones((dims.seq_len, dims.batch), jnp.int32)
        prev0 = jnp.ones((dims.batch,), jnp.int32)
    else:
        prev0 = first_segment_id(segment_ids)
        ids = jnp.moveaxis(segment_ids, 1, 0)
    step = _token_step(dims, scale, keep_state=output_token_states)
    # inside shard_map the carry must vary over the same mesh axes as the inputs
    state0 = state0 + jnp.zeros_like(xs[2][0])[:, :, None, :]
    prev0 = prev0 + jnp.zeros_like(ids[0])
    carry0, seq = (state0, prev0), (*xs, ids)
    chunk_states = token_states = None
    if chunk_states_every is not None and not output_token_states:
        (final_state, _), o, chunk_states = _scan_in_chunks(step, carry0, seq, chunk_states_every)
    else:
        (final_state, _), (o, token_states) = jax.lax.scan(step, carry0, seq)
        if chunk_states_every is not None:
            c = chunk_states_every
            chunk_states = token_states[c - 1 :: c][: dims.seq_len // c]
    o = jnp.moveaxis(o, 0, 1).astype(q.dtype)
    chunk_states, token_states = (
        None if x is None else jnp.moveaxis(x, 0, 1) for x in (chunk_states, token_states)
    )
    return o, (final_state if output_final_state else None), chunk_states, token_states


def _token_step(dims: Dims, scale: float, *, keep_state: bool):
    """The scan step over ``(state, previous segment id)``: one token's decay, write and
    read; it emits ``(o_t, state after t)`` (state None unless ``keep_state``)."""
    qk_head = jnp.arange(dims.num_heads) // dims.groups  # the q/k head of each value head

    def step(carry, x):
        state, prev_id = carry
        q_t, k_t, v_t, g_t, beta_t, id_t = x
        q_t, k_t = q_t[:, qk_head], k_t[:, qk_head]  # [B, HV, K]
        valid = id_t != 0  # [B]
        fresh = valid & (id_t != prev_id)
        state_in = jnp.where(fresh[:, None, None, None], 0.0, state)
        new_state = _delta_update(state_in, k_t, v_t, g_t, beta_t)
        o_t = jnp.einsum("bhk,bhkv->bhv", q_t * scale, new_state)
        o_t = jnp.where(valid[:, None, None], o_t, 0.0)
        state = jnp.where(valid[:, None, None, None], new_state, state)
        return (state, jnp.where(valid, id_t, prev_id)), (o_t, state if keep_state else None)

    return step


def _scan_in_chunks(step, carry, seq, every: int):
    """``lax.scan(step)`` over time-major ``seq``, as a scan over chunks of ``every`` tokens
    (each an inner scan) and a scan over the remaining tokens, keeping the carried state at
    each chunk's end. Returns ``(carry, o [T, ...], chunk_states [T // every, ...])``."""
    seq_len = seq[0].shape[0]
    full = seq_len // every * every

    def chunk(carry, xs):
        carry, (o, _) = jax.lax.scan(step, carry, xs)
        return carry, (o, carry[0])

    head = tuple(x[:full].reshape(full // every, every, *x.shape[1:]) for x in seq)
    carry, (o_head, states) = jax.lax.scan(chunk, carry, head)
    carry, (o_tail, _) = jax.lax.scan(step, carry, tuple(x[full:] for x in seq))
    o = jnp.concatenate([o_head.reshape(full, *o_head.shape[2:]), o_tail], axis=0)
    return carry, o, states


def kda_step(
    state: jax.Array,
    q_t: jax.Array,
    k_t: jax.Array,
    v_t: jax.Array,
    g_t: jax.Array,
    beta_t: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One decoding step.

    Args:
      state: ``[B, H, K, V]`` (kept in float32, or float64 for float64 inputs).
      q_t, k_t, g_t: ``[B, H, K]``; v_t: ``[B, H, V]``; beta_t: ``[B, H]``.
      scale: default ``K ** -0.5``.

    Returns:
      ``(new_state [B, H, K, V], o_t [B, H, V])``: the state in float32 (float64 for float64
      inputs), as :func:`kda_recurrent` keeps it; o_t in q_t's dtype. The same rules as
      :func:`kda_recurrent` apply (floating dtypes, beta in [0, 1], g <= 0).
    """
    for name, x in (("state", state), ("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        check_array(name, x)
    for name, x in (("g_t", g_t), ("beta_t", beta_t)):
        check_array(name, x)
    if q_t.ndim != 3:
        raise ValueError(f"q_t must have shape [B, H, K], got shape {q_t.shape}")
    batch, num_heads, key_dim = q_t.shape
    if v_t.ndim != 3 or v_t.shape[:2] != (batch, num_heads):
        raise ValueError(
            f"v_t must have shape [B, H, V]=({batch}, {num_heads}, V), got {v_t.shape}"
        )
    dims = Dims(batch, 1, num_heads, key_dim, v_t.shape[2], num_heads)
    for name, x in (("k_t", k_t), ("g_t", g_t)):
        if x.shape != q_t.shape:
            raise ValueError(f"{name} must have shape [B, H, K]={q_t.shape}, got {x.shape}")
    if beta_t.shape != (batch, num_heads):
        raise ValueError(f"beta_t must have shape [B, H]={(batch, num_heads)}, got {beta_t.shape}")
    check_state(state, dims)
    # the sequence rules (dtypes, values) on the one-token sequence
    check_kda_inputs(
        q_t[:, None],
        k_t[:, None],
        v_t[:, None],
        g_t[:, None],
        beta_t[:, None],
        initial_state=state,
    )
    scale = resolve_scale(scale, key_dim)
    acc = jnp.promote_types(accumulation_dtype(q_t.dtype), accumulation_dtype(state.dtype))
    new_state = _delta_update(
        state.astype(acc), k_t.astype(acc), v_t.astype(acc), g_t.astype(acc), beta_t.astype(acc)
    )
    o_t = jnp.einsum("bhk,bhkv->bhv", q_t.astype(acc) * scale, new_state)
    return new_state, o_t.astype(q_t.dtype)


def kda_pool_step(
    pool: jax.Array,
    state_indices: jax.Array,
    q_t: jax.Array,
    k_t: jax.Array,
    v_t: jax.Array,
    g_t: jax.Array,
    beta_t: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One decoding step for B rows whose states live in slots of a state pool (continuous
    batching, as serving engines keep them).

    Args:
      pool: ``[N, HV, K, V]`` float32 states, N slots. **Donated**: the array passed in is
        consumed (its buffer becomes the result's); use the returned pool. Inside your own
        ``jit``, donate the pool there for the same in-place update.
      state_indices: ``[B]`` int, distinct slots in ``[0, N)`` (checked when concrete): row b
        reads and writes slot ``state_indices[b]``; every other slot is left as it was.
      q_t, k_t: ``[B, H, K]``; v_t: ``[B, HV, V]``; g_t: ``[B, HV, K]`` log decay ``<= 0``;
        beta_t: ``[B, HV]``, HV a multiple of H (grouped value heads as in
        :func:`kda_recurrent`).
      scale: default ``K ** -0.5``.

    Returns:
      ``(new_pool [N, HV, K, V], o_t [B, HV, V] in q_t's dtype)``.
    """
    for name, x in (("pool", pool), ("state_indices", state_indices)):
        check_array(name, x)
    dims = check_kda_inputs(q_t[:, None], k_t[:, None], v_t[:, None], g_t[:, None], beta_t[:, None])
    _check_pool(pool, state_indices, dims)
    return _pool_step(pool, state_indices, q_t, k_t, v_t, g_t, beta_t, dims=dims,
                      scale=resolve_scale(scale, dims.key_dim))  # fmt: skip


@functools.partial(jax.jit, static_argnames=("dims", "scale"), donate_argnums=0)
def _pool_step(pool, state_indices, q_t, k_t, v_t, g_t, beta_t, *, dims: Dims, scale: float):
    """:func:`kda_pool_step` on checked inputs: gather the rows' slots, one recurrence step,
    scatter them back (in place: the pool is donated)."""
    o, final, _, _ = recurrent_core(
        *(x[:, None] for x in (q_t, k_t, v_t, g_t, beta_t)),
        dims=dims,
        scale=scale,
        initial_state=pool[state_indices],
        output_final_state=True,
        segment_ids=None,
    )
    return pool.at[state_indices].set(final.astype(pool.dtype)), o[:, 0]


def _check_pool(pool, state_indices, dims: Dims) -> None:
    """``pool [N, HV, K, V]`` floating; ``state_indices [B]`` ints, distinct slots in
    ``[0, N)`` (the values checked when concrete)."""
    slot_shape = (dims.num_heads, dims.key_dim, dims.value_dim)
    if pool.ndim != 4 or tuple(pool.shape[1:]) != slot_shape:
        raise ValueError(f"pool must have shape [N, HV, K, V]=(N, {slot_shape}), got {pool.shape}")
    if not jnp.issubdtype(pool.dtype, jnp.floating):
        raise ValueError(f"pool must be a floating-point array, got dtype {pool.dtype}")
    if state_indices.shape != (dims.batch,) or not jnp.issubdtype(state_indices.dtype, jnp.integer):
        raise ValueError(
            f"state_indices must be [B]={dims.batch} ints, got {state_indices.shape} "
            f"{state_indices.dtype}"
        )
    if is_concrete(state_indices):
        idx = np.asarray(state_indices)
        if idx.min() < 0 or idx.max() >= pool.shape[0] or len(set(idx.tolist())) != idx.size:
            raise ValueError(
                f"state_indices must be distinct slots in [0, {pool.shape[0]}), got {idx}"
            )


def kda_pool_verify(
    pool: jax.Array,
    state_indices: jax.Array,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    num_accepted_tokens: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """A draft of T tokens per row over slots of a state pool, keeping the state after each
    row's accepted prefix (speculative decoding; :func:`kda_pool_step` is the T = 1 step).

    Row b runs its T tokens from ``pool[state_indices[b]]`` (the outputs of all T, the state
    after every token), then writes the state after its first ``num_accepted_tokens[b]`` tokens
    back to that slot. The count is an input: the caller knows it before the call (e.g. a
    commit after verifying). fla's ``fused_recurrent_kda(..., ssm_state_indices,
    num_accepted_tokens)`` differs: it writes every token's state to its own slot
    (``ssm_state_indices [B, T]``) and reads the count at the *next* call, to pick the slot it
    starts from.

    Args:
      pool: ``[N, HV, K, V]`` float32 states, N slots. **Donated** (as in
        :func:`kda_pool_step`): use the returned pool.
      state_indices: ``[B]`` int, distinct slots in ``[0, N)`` (checked when concrete); every
        other slot is left bit for bit as it was.
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV, K]`` log decay ``<= 0``;
        beta: ``[B, T, HV]``, HV a multiple of H (grouped value heads as in
        :func:`kda_recurrent`); T >= 1.
      num_accepted_tokens: ``[B]`` int in ``[0, T]`` (checked when concrete): the tokens of
        row b's draft to keep. 0 keeps the slot's state unchanged (nothing accepted); T keeps
        the state after the whole draft. Under ``jit`` a count outside ``[0, T]`` writes NaN
        to the row's slot (never a silently wrong state).
      scale: default ``K ** -0.5``.

    Returns:
      ``(new_pool [N, HV, K, V], o [B, T, HV, V] in q's dtype)``: the outputs of all T
      tokens, each read from the state after it (as :func:`kda_recurrent` computes them).
    """
    names = ("pool", "state_indices", "q", "k", "v", "g", "beta", "num_accepted_tokens")
    arrays = (pool, state_indices, q, k, v, g, beta, num_accepted_tokens)
    for name, x in zip(names, arrays, strict=True):
        check_array(name, x)
    dims = check_kda_inputs(q, k, v, g, beta)
    _check_pool(pool, state_indices, dims)
    accepted = num_accepted_tokens
    if accepted.shape != (dims.batch,) or not jnp.issubdtype(accepted.dtype, jnp.integer):
        raise ValueError(
            f"num_accepted_tokens must be [B]={dims.batch} ints, got {accepted.shape} "
            f"{accepted.dtype}"
        )
    if is_concrete(accepted):
        counts = np.asarray(accepted)
        if counts.min() < 0 or counts.max() > dims.seq_len:
            raise ValueError(f"num_accepted_tokens must be in [0, T={dims.seq_len}], got {counts}")
    return _pool_verify(pool, state_indices, q, k, v, g, beta, accepted, dims=dims,
                        scale=resolve_scale(scale, dims.key_dim))  # fmt: skip


@functools.partial(jax.jit, static_argnames=("dims", "scale"), donate_argnums=0)
def _pool_verify(pool, state_indices, q, k, v, g, beta, accepted, *, dims: Dims, scale: float):
    """:func:`kda_pool_verify` on checked inputs: gather, the draft with every token's state,
    pick each row's state after its accepted prefix, scatter back (the pool is donated)."""
    initial = pool[state_indices]
    o, _, _, token_states = recurrent_core(
        q, k, v, g, beta, dims=dims, scale=scale, initial_state=initial,
        output_final_state=False, segment_ids=None, output_token_states=True,
    )  # fmt: skip
    # entry a of [initial, state after token 0, ..., after token T - 1]: after a tokens
    states = jnp.concatenate([initial.astype(token_states.dtype)[:, None], token_states], 1)
    kept = jnp.take_along_axis(
        states, jnp.clip(accepted, 0, dims.seq_len)[:, None, None, None, None], axis=1
    )[:, 0]
    valid = (accepted >= 0) & (accepted <= dims.seq_len)
    kept = jnp.where(valid[:, None, None, None], kept, jnp.nan)
    return pool.at[state_indices].set(kept.astype(pool.dtype)), o


def _initial_state(initial_state, dims: Dims, acc) -> jax.Array:
    shape = (dims.batch, dims.num_heads, dims.key_dim, dims.value_dim)
    if initial_state is None:
        return jnp.zeros(shape, acc)
    return initial_state.astype(acc)
