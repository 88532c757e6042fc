"""Context parallelism: the sequence split over a mesh axis, equal to one device.

Two things cross device boundaries:

* the short convolution needs the ``conv_size - 1`` inputs before a rank's slice:
  :func:`halo_exchange` sends them down an open chain with ``ppermute`` (rank 0 gets zeros),
  from several ranks back when the slice is shorter than the halo;
* the recurrence needs the state leaving all earlier slices. Each rank summarises its slice as
  the affine map ``S_out = M @ S_in + S_ext`` (``M [B,H,K,K]``, ``S_ext [B,H,K,V]``, float32):
  one run of the local kernel with augmented values ``[0 | v]`` and initial state ``[I | 0]``
  ends in exactly ``[M | S_ext]``. The summaries are all-gathered (size independent of T), each
  rank folds the upstream ones into its true initial state, and a second local run gives its
  outputs. Any implementation that supports initial/final states serves the local runs.

With ``output_chunk_states`` the second local run also keeps its chunk-boundary states: started
from the true incoming state, they are the global states at this rank's global boundaries.

Everything runs inside ``jax.shard_map``; gradients flow through ppermute and all_gather.
"""

from __future__ import annotations

import inspect
import math

import jax
import jax.numpy as jnp

from kda_lib.checks import check_int
from kda_lib.ops.api import STATE_PASSING, context_parallel_route, kda
from kda_lib.ops.contract import KDAResult, check_chunk_size, check_flag
from kda_lib.ops.segments import rank_segment_links, segment_ordinals


def halo_exchange(x: jax.Array, *, axis_name: str, halo_size: int, seq_axis: int = 1):
    """The ``halo_size`` entries before this rank's slice along ``seq_axis`` (zeros before rank 0).

    Inside ``jax.shard_map``. Open chain: nothing wraps from the last rank to the first. When
    ``halo_size`` exceeds the local length, the halo is assembled from as many previous ranks as
    needed. Returns ``concat([halo, x], seq_axis)``; works for any array, e.g. segment ids.
    """
    halo_size = check_int("halo_size", halo_size, minimum=0)
    seq_axis = seq_axis % x.ndim
    if halo_size == 0:
        return x
    ranks = jax.lax.axis_size(axis_name)
    local = x.shape[seq_axis]
    hops = min(math.ceil(halo_size / local), ranks - 1)
    pieces = []
    for hop in range(hops, 0, -1):  # farthest rank first, so pieces end up in sequence order
        need = min(local, halo_size - (hop - 1) * local)
        sent = jax.lax.slice_in_dim(x, local - need, local, axis=seq_axis)
        pieces.append(
            jax.lax.ppermute(sent, axis_name, perm=[(i, i + hop) for i in range(ranks - hop)])
        )
    halo = (
        jnp.concatenate(pieces, axis=seq_axis)
        if pieces
        else jax.lax.slice_in_dim(x, 0, 0, axis=seq_axis)
    )
    missing = halo_size - halo.shape[seq_axis]  # beyond the first rank: zeros
    if missing:
        shape = list(x.shape)
        shape[seq_axis] = missing
        halo = jnp.concatenate([jnp.zeros(shape, x.dtype), halo], axis=seq_axis)
    return jnp.concatenate([halo, x], axis=seq_axis)


def kda_context_parallel(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    axis_name: str = "context",
    scale: float | None = None,
    segment_ids: jax.Array | None = None,
    implementation: str = "auto",
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    **kernel_kwargs,
) -> jax.Array | tuple[jax.Array, jax.Array] | KDAResult:
    """KDA over a sequence sharded along ``axis_name``; call inside ``jax.shard_map``.

    Args:
      q, k: local ``[B, T_local, H, K]``; v: ``[B, T_local, HV, V]``; g: ``[B, T_local, HV, K]``
        (log-space, or raw with ``use_gate_in_kernel=True`` in kernel_kwargs); beta:
        ``[B, T_local, HV]``; HV a positive multiple of H (grouped value heads, served as
        :func:`kda_lib.kda` serves them: the state and the rank summaries have HV heads).
      axis_name: the mesh axis the sequence is split over (default "context").
      scale, segment_ids (local ``[B, T_local]``), implementation: as in :func:`kda_lib.kda`
        (default ``"auto"``: kda_lib's own form for T_local). The implementation names its CP route
        (:func:`kda_lib.ops.api.context_parallel_route`): kda_lib's state passing (below) or
        its own (``"tokamax_mosaic"``: tokamax's CP,
        :func:`kda_lib.ops.tokamax.adapter.tokamax_mosaic_context_parallel`).
      mesh: the mesh of the enclosing ``shard_map`` (only ``"tokamax_mosaic"`` uses it, for
        ``ContextParallelMetadata``); default: the current abstract mesh.
      kernel_kwargs: passed to :func:`kda_lib.kda` (``a_log``, ``dt_bias``, ``lower_bound``,
        ``use_gate_in_kernel``, ``use_qk_l2norm``, ``allow_neg_eigval``, ``chunk_size``;
        ``"tokamax_mosaic"`` also takes ``max_num_segments``, a static bound on the segments
        of one rank's slice).
        kda_lib's kernels also take ``initial_state`` ``[B, HV, K, V]`` (the state before the
        whole sequence, the same array on every rank; it belongs to each row's first segment)
        and ``output_final_state`` (default False), and ``output_chunk_states`` (default
        False, below); tokamax's Mosaic CP takes none of them. ``output_token_states`` is not
        served under CP.

    Returns:
      The local outputs ``[B, T_local, HV, V]``, equal to the matching slice of a one-device run;
      with ``output_final_state=True`` also the state after the last token of the whole
      sequence, ``[B, HV, K, V]`` float32, the same on every rank (``out_specs`` ``P()``).
      With ``output_chunk_states=True`` a :class:`kda_lib.ops.contract.KDAResult` ``(output,
      final_state | None, chunk_states, None)``: ``chunk_states [B, T_local // chunk_size, HV,
      K, V]`` float32, the states at this rank's boundaries (after local tokens ``(i + 1) *
      chunk_size - 1``) with the state from earlier ranks applied, i.e. the one-device
      ``kda(..., output_chunk_states=True)`` states of the global boundaries in this slice,
      sharded along the sequence like the outputs (``out_specs`` ``KDAResult(P(None, axis),
      P(), P(None, axis), None)``). ``T_local`` must be a multiple of ``chunk_size`` (so that
      every global boundary is a local one); ValueError otherwise.
    """
    implementation, route = context_parallel_route(implementation, q.shape[1])
    if kernel_kwargs.get("output_chunk_states", False) and route != STATE_PASSING:
        raise ValueError(
            f"output_chunk_states is served by kda_lib's context parallelism ('chunked' or "
            f"'recurrent'), not by {implementation!r}'s own"
        )
    if route != STATE_PASSING:  # its own CP (tokamax Mosaic)
        return route(
            q, k, v, g, beta, axis_name=axis_name, mesh=mesh, scale=scale,
            segment_ids=segment_ids, **kernel_kwargs,
        )  # fmt: skip
    kw = dict(scale=scale, segment_ids=segment_ids, implementation=implementation, **kernel_kwargs)
    return _state_passing(q, k, v, g, beta, axis_name, kw)


def _state_passing(q, k, v, g, beta, axis_name, kw):
    """kda_lib's CP route: each rank's summary, the summaries folded in rank order, then the
    local run from the folded state. ``kw``: :func:`kda_lib.kda`'s keywords, with
    ``initial_state``, ``output_final_state`` and ``output_chunk_states`` (taken out here)
    besides."""
    initial_state = kw.pop("initial_state", None)
    output_final_state = kw.pop("output_final_state", False)
    output_chunk_states = check_flag("output_chunk_states", kw.pop("output_chunk_states", False))
    if check_flag("output_token_states", kw.pop("output_token_states", False)):
        raise ValueError("output_token_states is not served under context parallelism")
    segment_ids = kw["segment_ids"]
    state_shape = (q.shape[0], v.shape[2], q.shape[-1], v.shape[-1])  # [B, HV, K, V]
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(
            f"initial_state must have shape [B, H, K, V]={state_shape} (the same on every "
            f"rank), got {tuple(initial_state.shape)}"
        )
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state must be a bool, got {output_final_state!r}")
    chunk_size = check_chunk_size(kw.get("chunk_size", _DEFAULT_CHUNK_SIZE))
    if output_chunk_states and q.shape[1] % chunk_size:
        raise ValueError(
            f"output_chunk_states under context parallelism needs each rank's slice to be a "
            f"multiple of chunk_size={chunk_size}, got T_local={q.shape[1]}"
        )
    transition, state_ext = _rank_summary(q, k, v, g, beta, kw)
    initial, arriving, final = _fold_summaries(
        transition, state_ext, initial_state, segment_ids, axis_name, state_shape
    )
    result = kda(q, k, v, g, beta, initial_state=initial, output_chunk_states=output_chunk_states,
                 **kw)  # fmt: skip
    out = result[0]
    if output_final_state:
        # the final state is equal on every rank; shard_map cannot know that, so take the last
        # rank's copy through a psum (B HV K V floats, independent of T) to return it replicated
        last = jax.lax.axis_index(axis_name) == jax.lax.axis_size(axis_name) - 1
        final = jax.lax.psum(jnp.where(last, final, 0.0), axis_name)
    if output_chunk_states:
        states = _boundaries_before_any_real_token(
            result.chunk_states, arriving, segment_ids, chunk_size
        )
        return KDAResult(out, final if output_final_state else None, states, None)
    return (out, final) if output_final_state else out


_DEFAULT_CHUNK_SIZE = inspect.signature(kda).parameters["chunk_size"].default


def _boundaries_before_any_real_token(chunk_states, arriving, segment_ids, chunk_size):
    """The local run's chunk states, except at boundaries with no real token of this slice at
    or before them (leading padding): there the global state is the one arriving from upstream
    (the running segment's), which the local run did not start from if the slice's first
    segment is a new one (it started from zeros)."""
    if segment_ids is None:
        return chunk_states
    num = chunk_states.shape[1]
    seen = jnp.cumsum(segment_ids != 0, axis=1)[:, chunk_size - 1 :: chunk_size][:, :num]
    return jnp.where((seen == 0)[:, :, None, None, None], arriving[:, None], chunk_states)


def _rank_summary(q, k, v, g, beta, kw):
    """This rank's affine map ``S_out = M S_in + S_ext`` (``M [B, HV, K, K]``,
    ``S_ext [B, HV, K, V]``): one local run with values ``[0 | v]`` and initial state
    ``[I | 0]`` ends in exactly ``[M | S_ext]``."""
    batch, key_dim = q.shape[0], q.shape[-1]
    heads, value_dim = v.shape[2:]  # the value heads HV (grouped value heads: HV > q's H)
    eye = jnp.broadcast_to(jnp.eye(key_dim, dtype=jnp.float32), (batch, heads, key_dim, key_dim))
    init_aug = jnp.concatenate([eye, jnp.zeros((batch, heads, key_dim, value_dim))], -1)
    v_aug = jnp.concatenate([jnp.zeros(v.shape[:-1] + (key_dim,), v.dtype), v], -1)
    _, summary = kda(q, k, v_aug, g, beta, initial_state=init_aug, output_final_state=True, **kw)
    return summary[..., :key_dim], summary[..., key_dim:]


def _fold_summaries(transition, state_ext, initial_state, segment_ids, axis_name, state_shape):
    """All-gather the rank summaries (size independent of T) and fold them in rank order.
    Returns ``(state entering this rank, state arriving at it, state after the whole
    sequence)``, float32: the arriving state is the one after the last real token upstream
    (the initial state if none); the entering one is zero instead where this rank's first
    segment is a new one."""
    all_m = jax.lax.all_gather(transition, axis_name)  # [R, B, HV, K, K]
    all_e = jax.lax.all_gather(state_ext, axis_name)  # [R, B, HV, K, V]
    ranks, batch = all_m.shape[:2]
    if segment_ids is None:
        keeps = passes = jnp.ones((ranks, batch), bool)
        rank = jax.lax.axis_index(axis_name)
    else:
        # does the state entering a rank reach its end? Only if no segment starts inside it
        # (then M = 0 and the leaving state is S_ext alone: selected, so that a non-finite
        # upstream state cannot leak through 0 * NaN)
        passes = jax.lax.all_gather(segment_ordinals(segment_ids)[:, -1] == 1, axis_name)
        before, all_ends, rank = rank_segment_links(segment_ids, axis_name)
        # a rank keeps the incoming state iff its first segment is the upstream's last one;
        # an all-padding rank passes the state through (its M is the identity), and with no
        # real token upstream the state is the initial state, which belongs to the row's first
        # segment
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
        carried = jnp.einsum(
            "bhij,bhjv->bhiv", all_m[j], state, precision=jax.lax.Precision.HIGHEST
        )
        state = jnp.where(passes[j][:, None, None, None], carried, 0.0) + all_e[j]
    entering, arriving = (jnp.take(jnp.stack(x), rank, axis=0) for x in (entering, arriving))
    return entering, arriving, state


def shard_as(array, mesh, spec):
    """``array`` sharded as ``spec`` on ``mesh`` inside jit (reshard on Explicit meshes,
    a sharding constraint on Auto ones), so shard_map accepts it whatever it arrived as."""
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
    if explicit:
        return jax.sharding.reshard(array, jax.sharding.NamedSharding(mesh, spec))
    return jax.lax.with_sharding_constraint(array, jax.sharding.NamedSharding(mesh, spec))
