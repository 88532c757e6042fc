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

from kda_lib._checks import check_kda_inputs
from kda_lib.kernel import (
    RECURRENT_MAX_AUTO_T,
    TOKAMAX_CHUNK,
    _check_fused,
    call_tokamax_batch_first,
    fill_padding_ids,
    kda,
    mosaic_problems,
    tokamax_kda_api,
)


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
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    **kernel_kwargs,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """KDA over a sequence sharded along ``axis_name``; call inside ``jax.shard_map``.

    Args:
      q, k: local ``[B, T_local, H, K]``; v: ``[B, T_local, H, V]``; g: ``[B, T_local, H, K]``
        (log-space, or raw with ``a_log`` in kernel_kwargs); beta: ``[B, T_local, H]``.
      axis_name: the mesh axis the sequence is split over (default "context").
      scale, segment_ids (local ``[B, T_local]``), implementation: as in :func:`kda_lib.kda`.
        ``"tokamax_mosaic"`` runs tokamax's own CP (see :func:`_tokamax_mosaic_cp`).
      mesh: the mesh of the enclosing ``shard_map`` (only ``"tokamax_mosaic"`` uses it, for
        ``ContextParallelMetadata``); default: the current abstract mesh.
      kernel_kwargs: passed to :func:`kda_lib.kda` (``a_log``, ``dt_bias``, ``lower_bound``,
        ``use_qk_l2norm``, ``allow_neg_eigval``, ``chunk_size``; ``"tokamax_mosaic"`` also
        takes ``max_num_segments``, a static bound on the segments of one rank's slice).
        kda_lib's kernels also take ``initial_state`` ``[B, H, K, V]`` (the state before the
        whole sequence, the same array on every rank; it belongs to each row's first segment)
        and ``output_final_state`` (default False); tokamax's Mosaic CP takes neither.

    Returns:
      The local outputs ``[B, T_local, H, V]``, equal to the matching slice of a one-device run;
      with ``output_final_state=True`` also the state after the last token of the whole
      sequence, ``[B, H, K, V]`` float32, the same on every rank (``out_specs`` ``P()``).
    """
    if implementation == "tokamax_mosaic":
        return _tokamax_mosaic_cp(
            q,
            k,
            v,
            g,
            beta,
            axis_name=axis_name,
            mesh=mesh,
            scale=scale,
            segment_ids=segment_ids,
            **kernel_kwargs,
        )
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
    initial_state = kernel_kwargs.pop("initial_state", None)
    output_final_state = kernel_kwargs.pop("output_final_state", False)
    state_shape = (batch, heads, key_dim, value_dim)
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(
            f"initial_state must have shape [B, H, K, V]={state_shape} (the same on every "
            f"rank), got {tuple(initial_state.shape)}"
        )
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state must be a bool, got {output_final_state!r}")
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
        # an all-padding rank passes the state through (its M is the identity), and with no
        # real token upstream the state is the initial state, which belongs to the row's first
        # segment
        first = all_ends[:, :, 0]
        keeps = (first == before) | (first == 0) | (before == 0)
    if initial_state is None:
        state = jnp.zeros(state_shape, jnp.float32)
    else:
        state = initial_state.astype(jnp.float32)
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
    if not output_final_state:
        return out
    # after the fold, `state` is the state after the last token of the whole sequence, equal
    # on every rank; shard_map cannot know that, so take the last rank's copy through a psum
    # (B H K V floats, independent of T) to return it replicated (out_specs P())
    last = jax.lax.axis_index(axis_name) == ranks - 1
    return out, jax.lax.psum(jnp.where(last, state, 0.0), axis_name)


def _tokamax_mosaic_cp(
    q,
    k,
    v,
    g,
    beta,
    *,
    axis_name,
    mesh,
    scale=None,
    segment_ids=None,
    a_log=None,
    dt_bias=None,
    lower_bound=None,
    use_qk_l2norm=False,
    allow_neg_eigval=False,
    chunk_size=TOKAMAX_CHUNK,
    max_num_segments=None,
    **unsupported,
):
    """tokamax's own CP for its Mosaic kernel: ``ContextParallelMetadata(mesh, axis_name)``.

    tokamax all-gathers per-rank ``(S_ext, M)`` summaries like kda_lib's path, but derives the
    chain from rank-local segment ids: padding (id 0) is filled with the id of the segment it
    follows (so the chain sees through it) and made neutral (no decay, no write, zero output);
    without ids every token gets id 1 and ``max_num_segments=1``. Its constraints: a TPU v6+
    (or :func:`kda_lib.emulate_tpu`), K and V multiples of 128 (and K <= 256), float32/bfloat16,
    the fused gate with ``lower_bound``, no initial/final state, beta in [0, 1], chunk_size 64,
    and a ``shard_map`` with ``check_vma=False`` (tokamax's CP loops carry values that do not
    vary over the mesh axis).
    """
    fused_gate = a_log is not None
    name = "'tokamax_mosaic'"
    problems = mosaic_problems(
        key_dim=q.shape[-1], dtype=q.dtype, lower_bound=lower_bound, fused_gate=fused_gate
    )
    key_dim, value_dim = q.shape[-1], v.shape[-1]
    if key_dim % 128 or value_dim % 128:
        problems.append(
            f"tokamax_mosaic context parallelism needs K and V multiples of 128, "
            f"got K={key_dim}, V={value_dim}"
        )
    for arg in ("initial_state", "output_final_state"):
        value = unsupported.pop(arg, None)
        if value is not None and value is not False:
            problems.append(f"tokamax_mosaic context parallelism does not support {arg}")
    if unsupported:
        raise TypeError(f"kda_context_parallel got unexpected arguments {sorted(unsupported)}")
    if allow_neg_eigval:
        problems.append("tokamax_mosaic requires beta in [0, 1]; allow_neg_eigval is not supported")
    if chunk_size != TOKAMAX_CHUNK:
        problems.append(
            f"tokamax_mosaic supports chunk_size={TOKAMAX_CHUNK} only, got {chunk_size}"
        )
    if max_num_segments is not None and (
        isinstance(max_num_segments, bool)
        or not isinstance(max_num_segments, int)
        or max_num_segments < 1
    ):
        problems.append(f"max_num_segments must be a positive int, got {max_num_segments!r}")
    if problems:
        raise ValueError(f"{name} cannot run inside shard_map here: " + "; ".join(problems))
    if axis_name in _varying_axes(q):
        raise ValueError(
            f"{name} context parallelism needs jax.shard_map(..., check_vma=False): tokamax's CP "
            "kernels build loop carries that do not vary over the mesh axis, which the vma "
            "check rejects"
        )
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if axis_name not in mesh.axis_names:
        raise ValueError(
            f"{name} context parallelism needs the shard_map's mesh (mesh=...); "
            f"{axis_name!r} is not one of its axes {mesh.axis_names}"
        )
    if fused_gate:
        dims = _check_fused(q, k, v, g, beta, None, segment_ids, False, a_log, dt_bias)
    else:
        dims = check_kda_inputs(q, k, v, g, beta, segment_ids=segment_ids)
    batch, seq_len = dims.batch, dims.seq_len
    if segment_ids is None:
        ids = jnp.ones((batch, seq_len), jnp.int32)
        max_num_segments = 1
    else:
        ids = _fill_padding_ids_across_ranks(segment_ids.astype(jnp.int32), axis_name)
        valid = (segment_ids != 0)[..., None, None]
        neutral_gate = -1e30 if fused_gate else 0.0  # activates to exactly g = 0
        g = jnp.where(valid, g, neutral_gate)
        beta = jnp.where(valid[..., 0], beta, 0.0)
        q = jnp.where(valid, q, 0.0)
        # a bound on the segments of one slice; Mosaic pads every slot to a 64-token chunk
        max_num_segments = min(max_num_segments or seq_len, seq_len)

    metadata = tokamax_kda_api().ContextParallelMetadata(mesh, axis_name)
    out, _ = call_tokamax_batch_first(
        "tokamax_mosaic",
        q,
        k,
        v,
        g,
        beta,
        a_log=a_log,
        dt_bias=dt_bias,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
        segment_ids=ids,
        lower_bound=lower_bound,
        max_num_segments=max_num_segments,
        context_parallel_metadata=metadata,
    )
    return out.astype(q.dtype)


def _varying_axes(x) -> frozenset:
    """Mesh axes ``x`` varies over (empty unless shard_map checks vma): ``typeof(x).mat.varying``
    in jax 0.12, ``typeof(x).vma`` before."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def _fill_padding_ids_across_ranks(segment_ids, axis_name):
    """Rank-local ids with padding (0) replaced by the id of the last valid token before it,
    looking across ranks (an all-padding row gets 1), so tokamax's chain detection, which
    compares neighbouring ranks' first and last ids, links a segment across padding and across
    all-padding ranks exactly as kda_lib's segments do."""
    before, _, rank = _segment_links(segment_ids, axis_name)
    upstream = jnp.take(before, rank, axis=0)  # [B]: last valid id on earlier ranks (0: none)
    filled = fill_padding_ids(segment_ids, upstream)
    # leading padding of a row that has no valid token before it: join the first segment
    first = jnp.take_along_axis(segment_ids, jnp.argmax(segment_ids != 0, 1)[:, None], 1)
    filled = jnp.where(filled == 0, first, filled)
    return jnp.where(filled == 0, 1, filled).astype(jnp.int32)


def layer_forward_context_parallel(layer, x, *, segment_ids=None):
    """``layer(x)`` with the sequence split over ``layer.mesh``'s ``layer.context_axis``.

    x ``[B, T, hidden]`` (replicated or sharded along T). T that does not divide by the number of
    ranks is padded at the end (trailing tokens cannot change earlier outputs) and cut back.
    """
    from flax import nnx

    from kda_lib.layer import max_segments_bound

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
            **mosaic,
            **module.kernel_kwargs(),
        )
        return module.finish(x, o)

    # tokamax's CP needs the mesh and a shard_map without the vma check (see _tokamax_mosaic_cp)
    tokamax_cp = cfg.implementation == "tokamax_mosaic"
    mosaic = dict(mesh=mesh, max_num_segments=max_segments_bound(segment_ids, cfg, ranks))
    mosaic = mosaic if tokamax_cp else {}
    seq = P(None, axis)
    specs = (P(), P(None, axis, None), None if segment_ids is None else seq)
    fn = jax.shard_map(
        local, mesh=mesh, in_specs=specs, out_specs=P(None, axis, None), check_vma=not tokamax_cp
    )

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
