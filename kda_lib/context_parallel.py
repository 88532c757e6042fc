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

Everything runs inside ``jax.shard_map``; gradients flow through ppermute and all_gather.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kda_lib.kernel import RECURRENT_MAX_AUTO_T, kda


def _axis_size(axis_name) -> int:
    return jax.lax.axis_size(axis_name)


def halo_exchange(x: jax.Array, *, axis_name: str, halo_size: int, seq_axis: int = 1):
    """The ``halo_size`` entries before this rank's slice along ``seq_axis`` (zeros before rank 0).

    Inside ``jax.shard_map``. Open chain: nothing wraps from the last rank to the first. When
    ``halo_size`` exceeds the local length, the halo is assembled from as many previous ranks as
    needed. Returns ``concat([halo, x], seq_axis)``; works for any array, e.g. segment ids.
    """
    if halo_size < 0:
        raise ValueError(f"halo_size must be >= 0, got {halo_size}")
    seq_axis = seq_axis % x.ndim
    if halo_size == 0:
        return x
    ranks = _axis_size(axis_name)
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


def _segment_links(segment_ids, axis_name):
    """Per rank: does its first segment continue the last segment of the ranks before it?

    Returns ``[B]`` bool for this rank. Needs each rank's first and last non-padding id, a
    ``[ranks, B, 2]`` all-gather.
    """
    valid = segment_ids != 0
    positions = jnp.arange(segment_ids.shape[1])
    first = jnp.take_along_axis(segment_ids, jnp.argmax(valid, 1)[:, None], 1)[:, 0]
    last_pos = jnp.max(jnp.where(valid, positions, -1), axis=1)
    last = jnp.take_along_axis(segment_ids, jnp.maximum(last_pos, 0)[:, None], 1)[:, 0]
    has_valid = valid.any(axis=1)
    ends = jnp.stack([jnp.where(has_valid, first, 0), jnp.where(has_valid, last, 0)], -1)
    all_ends = jax.lax.all_gather(ends, axis_name)  # [R, B, 2]
    rank = jax.lax.axis_index(axis_name)
    ranks = all_ends.shape[0]
    # id of the last valid token on ranks < r (0 if none): scan over ranks in order
    upstream = jnp.zeros_like(first)
    before = []
    for j in range(ranks):
        before.append(upstream)
        upstream = jnp.where(all_ends[j, :, 1] != 0, all_ends[j, :, 1], upstream)
    before = jnp.stack(before)  # [R, B]
    return before, all_ends, rank


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
    **kernel_kwargs,
) -> jax.Array:
    """KDA over a sequence sharded along ``axis_name``; call inside ``jax.shard_map``.

    Args:
      q, k: local ``[B, T_local, H, K]``; v: ``[B, T_local, H, V]``; g: ``[B, T_local, H, K]``
        (log-space, or raw with ``a_log`` in kernel_kwargs); beta: ``[B, T_local, H]``.
      axis_name: the mesh axis the sequence is split over (default "context").
      scale, segment_ids (local ``[B, T_local]``), implementation: as in :func:`kda_lib.kda`.
      kernel_kwargs: passed to :func:`kda_lib.kda` (``a_log``, ``dt_bias``, ``lower_bound``,
        ``use_qk_l2norm``, ``allow_neg_eigval``, ``chunk_size``).

    Returns:
      The local outputs ``[B, T_local, H, V]``, equal to the matching slice of a one-device run.
    """
    if implementation.startswith("tokamax"):
        # tokamax's XLA kernels build loop carries that do not vary over the mesh axis, which
        # shard_map rejects; its Mosaic kernel has its own CP path (ContextParallelMetadata)
        raise ValueError(
            f"kda_context_parallel runs kda_lib's kernels ('chunked' or 'recurrent'); "
            f"{implementation!r} cannot run inside shard_map here"
        )
    if implementation == "auto":
        implementation = "recurrent" if q.shape[1] <= RECURRENT_MAX_AUTO_T else "chunked"
    batch, _, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    kw = dict(scale=scale, segment_ids=segment_ids, implementation=implementation, **kernel_kwargs)

    # 1. this rank's affine summary: augmented values [0 | v], initial state [I | 0]
    eye = jnp.broadcast_to(jnp.eye(key_dim, dtype=jnp.float32), (batch, heads, key_dim, key_dim))
    init_aug = jnp.concatenate([eye, jnp.zeros((batch, heads, key_dim, value_dim))], -1)
    v_aug = jnp.concatenate([jnp.zeros(v.shape[:-1] + (key_dim,), v.dtype), v], -1)
    _, summary = kda(q, k, v_aug, g, beta, initial_state=init_aug, output_final_state=True, **kw)
    transition, state_ext = summary[..., :key_dim], summary[..., key_dim:]

    # 2. all-gather the summaries (size independent of T) and fold the upstream ones
    all_m = jax.lax.all_gather(transition, axis_name)  # [R, B, H, K, K]
    all_e = jax.lax.all_gather(state_ext, axis_name)  # [R, B, H, K, V]
    ranks = all_m.shape[0]
    if segment_ids is None:
        keeps = jnp.ones((ranks, batch), bool)
        rank = jax.lax.axis_index(axis_name)
    else:
        before, all_ends, rank = _segment_links(segment_ids, axis_name)
        # a rank keeps the incoming state iff its first segment is the upstream's last one;
        # an all-padding rank passes the state through (its M is the identity)
        keeps = (all_ends[:, :, 0] == before) | (all_ends[:, :, 0] == 0)
    state = jnp.zeros((batch, heads, key_dim, value_dim), jnp.float32)
    entering = []
    for j in range(ranks):
        state = jnp.where(keeps[j][:, None, None, None], state, 0.0)
        entering.append(state)
        state = (
            jnp.einsum("bhij,bhjv->bhiv", all_m[j], state, precision=jax.lax.Precision.HIGHEST)
            + all_e[j]
        )
    initial = jnp.take(jnp.stack(entering), rank, axis=0)

    # 3. this rank's outputs from its true initial state
    out, _ = kda(q, k, v, g, beta, initial_state=initial, **kw)
    return out


def layer_forward_context_parallel(layer, x, *, segment_ids=None):
    """``layer(x)`` with the sequence split over ``layer.mesh``'s ``layer.context_axis``.

    x ``[B, T, hidden]`` (replicated or sharded along T). T that does not divide by the number of
    ranks is padded at the end (trailing tokens cannot change earlier outputs) and cut back.
    """
    from flax import nnx

    axis = layer.context_axis
    # an Auto-typed view of the user's mesh: outputs then carry ordinary shardings, so code
    # outside needs no mesh context, whichever axis types the user's mesh has
    mesh = jax.sharding.Mesh(
        layer.mesh.devices,
        layer.mesh.axis_names,
        axis_types=(jax.sharding.AxisType.Auto,) * len(layer.mesh.axis_names),
    )
    ranks = mesh.shape[axis]
    batch, seq_len, hidden = x.shape
    pad = (-seq_len) % ranks
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad), (0, 0)])
        if segment_ids is not None:
            segment_ids = jnp.pad(segment_ids, [(0, 0), (0, pad)])
    graphdef, state = nnx.split(layer)
    width = max(layer.config.conv_size - 1, 0)
    cfg = layer.config

    def local(state, x, segment_ids):
        module = nnx.merge(graphdef, state)
        halo = (
            (lambda z: halo_exchange(z, axis_name=axis, halo_size=width)[:, :width])
            if width
            else None
        )
        history_ids = None if segment_ids is None or not width else halo(segment_ids)
        q, k, v, f, beta, _ = module.project(
            x, segment_ids=segment_ids, halo=halo, history_segment_ids=history_ids
        )
        o = kda_context_parallel(
            q,
            k,
            v,
            f,
            beta,
            axis_name=axis,
            segment_ids=segment_ids,
            implementation=cfg.implementation,
            chunk_size=cfg.chunk_size,
            **module.kernel_kwargs(),
        )
        return module.finish(x, o)

    seq = P(None, axis)
    specs = (P(), P(None, axis, None), None if segment_ids is None else seq)
    fn = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(None, axis, None))

    def run(state, x, segment_ids):
        # put the inputs in the layout shard_map expects, whatever they arrive in
        state = jax.tree.map(lambda a: place(a, mesh, P()), state)
        x = place(x, mesh, specs[1])
        segment_ids = None if segment_ids is None else place(segment_ids, mesh, seq)
        return fn(state, x, segment_ids)

    y = jax.jit(run)(state, x, segment_ids)
    return y[:, :seq_len]


def place(array, mesh, spec):
    """``array`` laid out as ``spec`` on ``mesh`` inside jit (reshard on Explicit meshes,
    a sharding constraint on Auto ones), so shard_map accepts it whatever it arrived as."""
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
    if explicit:
        return jax.sharding.reshard(array, jax.sharding.NamedSharding(mesh, spec))
    return jax.lax.with_sharding_constraint(array, jax.sharding.NamedSharding(mesh, spec))


_COLLECTIVE = re.compile(
    r"=\s*(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\][^=]*?\s"
    r"(?P<op>all-gather|collective-permute|all-reduce|reduce-scatter|all-to-all)(?:-start)?\("
)
_BYTES = {
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "pred": 1,
    "s8": 1,
    "u8": 1,
}


def hlo_collectives(hlo_text: str, num_ranks: int) -> list[dict]:
    """Collectives in compiled HLO text, with the bytes each rank sends (ring algorithms).

    Returns dicts with ``op``, ``dtype``, ``shape`` (the result shape), ``elements`` and
    ``sent_bytes``: all-gather ``(R-1)/R`` of its result, all-reduce ``2 (R-1)/R``,
    reduce-scatter and all-to-all ``(R-1)/R`` of their operand, collective-permute all of it.
    """
    found = []
    for match in _COLLECTIVE.finditer(hlo_text):
        dims = [int(d) for d in match["dims"].split(",") if d]
        elements = math.prod(dims)
        size = elements * _BYTES.get(match["dtype"], 4)
        op = match["op"]
        share = (num_ranks - 1) / num_ranks
        sent = {
            "all-gather": share * size,
            "all-reduce": 2 * share * size,
            "reduce-scatter": share * size * num_ranks,
            "all-to-all": share * size,
            "collective-permute": size,
        }[op]
        found.append(
            dict(
                op=op,
                dtype=match["dtype"],
                shape=tuple(dims),
                elements=elements,
                sent_bytes=int(sent),
            )
        )
    return found
