"""Context parallelism: the sequence split over a mesh axis, equal to one device.

Two things cross device boundaries, inside ``jax.shard_map`` (gradients flow through both):

* the short convolution needs the ``conv_size - 1`` inputs before a rank's slice:
  :func:`halo_exchange` sends them down an open chain with ``ppermute`` (rank 0 gets zeros);
* the recurrence needs the state leaving all earlier slices. Each rank summarises its slice as
  the affine map ``S_out = M S_in + S_ext`` (``M [B, HV, K, K]``, ``S_ext [B, HV, K, V]``): one
  local run with values ``[0 | v]`` from the state ``[I | 0]`` ends in exactly ``[M | S_ext]``.
  The summaries are all-gathered (size independent of T), every rank folds all of them in
  order and keeps the state entering its slice, and a second local run from it gives its
  outputs (and, with ``output_chunk_states``, the global states at its chunk boundaries).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kda_lib.checks import check_int
from kda_lib.ops.api import STATE_PASSING, check_call, context_parallel_route, kda
from kda_lib.ops.contract import KDAResult, check_chunk_size, check_flag, check_shapes
from kda_lib.ops.segments import rank_segment_links, segment_ordinals


def halo_exchange(x: jax.Array, *, axis_name: str, halo_size: int):
    """Inside ``jax.shard_map``: ``concat([halo, x], 1)``, the halo the ``halo_size`` entries
    (axis 1) before this rank's slice, from as many ranks back as needed (zeros before rank 0)."""
    halo_size = check_int("halo_size", halo_size, minimum=0)
    ranks, local = jax.lax.axis_size(axis_name), x.shape[1]
    hops = range(min(math.ceil(halo_size / local), ranks - 1) if halo_size else 0, 0, -1)
    needs = [min(local, halo_size - (hop - 1) * local) for hop in hops]  # farthest rank first
    pieces = [
        jax.lax.ppermute(x[:, local - need :], axis_name,
                         perm=[(i, i + hop) for i in range(ranks - hop)])
        for hop, need in zip(hops, needs, strict=True)
    ]  # fmt: skip
    if missing := halo_size - sum(needs):  # beyond the first rank: zeros
        pieces.insert(0, jnp.zeros((x.shape[0], missing, *x.shape[2:]), x.dtype))
    return jnp.concatenate([*pieces, x], axis=1)


def kda_context_parallel(q, k, v, g, beta, *, axis_name: str = "context", scale=None,
                         segment_ids=None, implementation: str = "auto", mesh=None,
                         **kernel_kwargs):  # fmt: skip
    """KDA over a sequence sharded along ``axis_name`` ("context"), inside ``jax.shard_map``:
    q, k, v, g, beta, ``segment_ids`` are this rank's slices (``T_local`` tokens), the rest as
    in :func:`kda_lib.kda` but ``output_token_states`` (``initial_state`` the same on every
    rank); ``"tokamax_mosaic"`` runs tokamax's own CP on ``mesh`` (default the abstract mesh),
    without states. Returns this slice of a one-device run's outputs ``[B, T_local, HV, V]``,
    the final state ``[B, HV, K, V]`` float32 (equal on every rank) or None, and with
    ``output_chunk_states`` this slice's ``chunk_states [B, T_local // chunk_size, HV, K, V]``."""
    return _context_parallel(q, k, v, g, beta, axis_name=axis_name, scale=scale,
                             segment_ids=segment_ids, implementation=implementation, mesh=mesh,
                             prechecked=False, **kernel_kwargs)  # fmt: skip


def kda_context_parallel_prechecked(q, k, v, g, beta, **kwargs):
    """:func:`kda_context_parallel` for the KDA layer, which checked its inputs at its entry
    (tokamax's per-segment states among them, named as the layer sets them:
    ``KDALayer._check_inputs``)."""
    return _context_parallel(q, k, v, g, beta, prechecked=True, **kwargs)


def _context_parallel(q, k, v, g, beta, *, axis_name, scale, segment_ids, implementation, mesh,
                      prechecked: bool, **kernel_kwargs):  # fmt: skip
    implementation, route = context_parallel_route(implementation, q.shape[1])
    kw = dict(scale=scale, segment_ids=segment_ids, **kernel_kwargs)
    output_chunk_states = check_flag("output_chunk_states", kw.pop("output_chunk_states", False))
    if route != STATE_PASSING:  # its own CP (tokamax Mosaic)
        if output_chunk_states:
            raise ValueError(f"output_chunk_states is served by kda_lib's context parallelism "
                             f"('chunked' or 'recurrent'), not by {implementation!r}'s "
                             "own")  # fmt: skip
        return _own_route(route, implementation, (q, k, v, g, beta), kw, prechecked,
                          axis_name=axis_name, mesh=mesh), None  # fmt: skip
    initial_state = kw.pop("initial_state", None)
    output_final_state = check_flag("output_final_state", kw.pop("output_final_state", False))
    if check_flag("output_token_states", kw.pop("output_token_states", False)):
        raise ValueError("output_token_states is not served under context parallelism")
    sizes = dict(B=q.shape[0], HV=v.shape[2], K=q.shape[-1], V=v.shape[-1])
    state_shape = tuple(check_shapes(sizes, initial_state=initial_state).values())  # [B, HV, K, V]
    chunk_size = check_chunk_size(kw.get("chunk_size", kda.__kwdefaults__["chunk_size"]))
    if output_chunk_states and q.shape[1] % chunk_size:
        raise ValueError(f"output_chunk_states under context parallelism needs each rank's "
                         f"slice to be a multiple of chunk_size={chunk_size}, got "
                         f"T_local={q.shape[1]}")  # fmt: skip
    kw["implementation"] = implementation
    # this rank's summary (module docstring): values [0 | v] from the state [I | 0]
    batch, heads, key_dim, _ = state_shape
    eye = jnp.broadcast_to(jnp.eye(key_dim, dtype=jnp.float32), (batch, heads, key_dim, key_dim))
    v_aug = jnp.concatenate([jnp.zeros((*v.shape[:-1], key_dim), v.dtype), v], -1)
    init_aug = jnp.concatenate([eye, jnp.zeros(state_shape)], -1)
    _, summary = kda(q, k, v_aug, g, beta, initial_state=init_aug, output_final_state=True, **kw)
    initial, arriving, final = _fold_summaries(summary[..., :key_dim], summary[..., key_dim:],
                                               initial_state, segment_ids, axis_name,
                                               state_shape)  # fmt: skip
    result = kda(q, k, v, g, beta, initial_state=initial, output_chunk_states=output_chunk_states,
                 **kw)  # fmt: skip
    # the final state is equal on every rank, which shard_map cannot know: the last rank's copy
    last = jax.lax.axis_index(axis_name) == jax.lax.axis_size(axis_name) - 1
    final = jax.lax.psum(jnp.where(last, final, 0.0), axis_name) if output_final_state else None
    if not output_chunk_states:
        return result[0], final
    states = result.chunk_states
    if segment_ids is not None:  # before this slice's first real token: upstream's state
        seen = jnp.cumsum(segment_ids != 0, axis=1)[:, chunk_size - 1 :: chunk_size]
        before_any = (seen[:, : states.shape[1]] == 0)[:, :, None, None, None]
        states = jnp.where(before_any, arriving[:, None], states)
    return KDAResult(result[0], final, states, None)


def _own_route(route, implementation: str, arrays, kw: dict, prechecked: bool, **where):
    """A kernel's own context parallelism (tokamax Mosaic's ``route``) on this rank's
    ``arrays``, the call checked as :func:`kda_lib.kda`'s (``prechecked``: by the layer)."""
    if unknown := sorted(set(kw) - set(kda.__kwdefaults__)):
        raise TypeError(f"kda_context_parallel got unexpected keyword arguments {unknown}")
    refused, seq_len = f"{implementation!r} cannot run inside shard_map here: ", arrays[0].shape[1]
    if kw.get("segment_ids") is not None and kw.get("max_num_segments") is None:
        kw["max_num_segments"] = seq_len  # at most a segment slot per token of this slice
        refused += (f"max_num_segments not given, so a state slot per token of this slice "
                    f"(T_local={seq_len}); ")  # fmt: skip
    _, _, options = check_call(
        *arrays, **{**kda.__kwdefaults__, **kw, "implementation": implementation},
        prechecked=prechecked, refused=refused)  # fmt: skip
    return route(*arrays, options, **where, **kw)


def _fold_summaries(transition, state_ext, initial_state, segment_ids, axis_name, state_shape):
    """The rank summaries gathered and folded in order: float32 ``(state entering this rank,
    state after the last real token upstream (or the initial state), final state)``."""
    all_m = jax.lax.all_gather(transition, axis_name)  # [R, B, HV, K, K]
    all_e = jax.lax.all_gather(state_ext, axis_name)  # [R, B, HV, K, V]
    ranks, batch = all_m.shape[:2]
    if segment_ids is None:
        keeps = passes = jnp.ones((ranks, batch), bool)
        rank = jax.lax.axis_index(axis_name)
    else:
        # the entering state reaches a rank's end only if no segment starts in it (selected:
        # a non-finite upstream state cannot leak through 0 * NaN)
        passes = jax.lax.all_gather(segment_ordinals(segment_ids)[:, -1] == 1, axis_name)
        before, all_ends, rank = rank_segment_links(segment_ids, axis_name)
        # kept iff the rank's first segment is upstream's last, the rank is all padding, or
        # upstream has no real token (the initial state is the row's first segment's)
        first = all_ends[:, :, 0]
        keeps = (first == before) | (first == 0) | (before == 0)
    state = jnp.zeros(state_shape, jnp.float32)
    if initial_state is not None:
        state = initial_state.astype(jnp.float32)
    entering, arriving = [], []
    for j in range(ranks):
        arriving.append(state)
        state = jnp.where(keeps[j][:, None, None, None], state, 0.0)
        entering.append(state)
        carried = jnp.einsum("bhij,bhjv->bhiv", all_m[j], state,
                             precision=jax.lax.Precision.HIGHEST)  # fmt: skip
        state = jnp.where(passes[j][:, None, None, None], carried, 0.0) + all_e[j]
    entering, arriving = (jnp.take(jnp.stack(x), rank, axis=0) for x in (entering, arriving))
    return entering, arriving, state


def shard_as(array, mesh, spec):
    """``array`` sharded as ``spec`` on ``mesh`` inside jit (Explicit or Auto mesh)."""
    sharding = jax.sharding.NamedSharding(mesh, spec)
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard(array, sharding)
    return jax.lax.with_sharding_constraint(array, sharding)
