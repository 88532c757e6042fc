"""KimiDeltaAttention: the KDA token mixer as a Flax NNX module, with a decode cache.

For ``x [B, T, hidden]`` (parameter names as in fla's ``fla/layers/kda.py``)::

    q, k = silu(conv(q_proj(x))), silu(conv(k_proj(x)))   [B, T, H, K], L2-normalised in kda()
    v    = silu(conv(v_proj(x)))                          [B, T, HV, V]
    f    = f_proj(x)                                      [B, T, HV, K] raw forget gate
    beta = sigmoid(b_proj(x))   (x2 with allow_neg_eigval) [B, T, HV]
    o    = kda(q, k, v, f, beta, a_log=A_log, dt_bias=dt_bias, lower_bound=...,
              use_gate_in_kernel=True)                    [B, T, HV, V]
    y    = o_proj(rmsnorm(o) * o_norm.weight * sigmoid(g_proj(x)))

HV = ``num_v_heads`` (default H): value head ``j`` reads q/k head ``j // (HV // H)``.
Options: docs/DESIGN.md section 2; context parallelism: section 5.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import namedtuple
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from kda_lib import checks
from kda_lib.checks import check_activation, is_concrete, is_int
from kda_lib.layers.attention import (
    Widths,
    check_cache,
    check_cache_and_ids,
    check_fields,
    empty_cache,
    mix_convs,
)
from kda_lib.layers.checkpoints import load_state_dict
from kda_lib.layers.conv import ShortConvolution
from kda_lib.layers.params import NO_DECAY, check_parameters_fit, no_decay_param
from kda_lib.ops.api import implementation_row, kda_prechecked, refusals, register_compiled_cache
from kda_lib.ops.contract import Dims, check_chunk_size
from kda_lib.ops.gating import (
    GateForm,
    check_gate_form,
    check_lower_bound,
    init_a_log,
    init_dt_bias,
    kda_gate,
)
from kda_lib.ops.norms import gated_rms_norm
from kda_lib.ops.tokamax.adapter import segment_slots_problem
from kda_lib.parallel.context_parallel import (
    halo_exchange,
    kda_context_parallel_prechecked,
    shard_as,
)

MAX_CONV_SIZE = 64  # a *short* conv (4 in fla and Kimi Linear); why the bound: DESIGN section 2
# the fields the parameters grow with: a layer too large for this machine names the largest
WIDTH_FIELDS = ("hidden_size num_heads num_v_heads head_dim value_head_dim conv_size "
                "forget_gate_rank output_gate_rank").split()  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class KDAConfig(Widths):
    """Hyper-parameters of :class:`KimiDeltaAttention` (keyword-only; a bad field raises
    ValueError naming ``KDAConfig.<field>``): ``hidden_size`` d, ``num_heads`` H,
    ``num_v_heads`` HV (None = H; a multiple of H), ``head_dim`` K, ``value_head_dim`` V (None =
    K), ``conv_size`` W (0: no conv; <= 64), ``fused_qkv_conv``: one conv over concat(q, k, v).
    Forget gate (:mod:`kda_lib.ops.gating`): ``gate_form`` a :class:`GateForm` or its value
    (None: softplus without ``lower_bound``, else safe_sigmoid), ``lower_bound`` None or in
    [-5, 0), ``use_a_log`` a learned rate per value head (False: A = 1), ``per_head_decay`` one
    gate per head, ``forget_gate_rank`` None or a low-rank pair's r (``output_gate_rank``
    likewise). ``allow_neg_eigval``: beta = 2 sigmoid. ``max_num_segments``: tokamax's static
    segment bound under ``jit`` (None: counted from concrete ids)."""

    hidden_size: int
    num_heads: int
    num_v_heads: int | None = None
    head_dim: int
    value_head_dim: int | None = None
    conv_size: int = 4
    fused_qkv_conv: bool = False
    gate_form: GateForm | None = None
    lower_bound: float | None = None
    use_a_log: bool = True
    per_head_decay: bool = False
    forget_gate_rank: int | None = None
    allow_neg_eigval: bool = False
    output_gate_rank: int | None = None
    output_gate_bias: bool = True
    norm_eps: float = 1e-5
    implementation: str = "auto"
    chunk_size: int = 64
    max_num_segments: int | None = None
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def __post_init__(self):
        check_fields(self, int="hidden_size num_heads head_dim", int0="conv_size",
                     width="num_v_heads value_head_dim forget_gate_rank output_gate_rank "
                           "max_num_segments",
                     bool="fused_qkv_conv use_a_log per_head_decay allow_neg_eigval "
                          "output_gate_bias",
                     eps="norm_eps", dtype="dtype param_dtype")  # fmt: skip
        set_field = functools.partial(object.__setattr__, self)  # frozen: normalise here only
        try:  # checks whose messages start with the bare field name
            check_lower_bound(self.lower_bound)
            set_field("chunk_size", check_chunk_size(self.chunk_size))
        except ValueError as error:
            raise ValueError(f"KDAConfig.{error}") from None
        set_field("lower_bound", None if self.lower_bound is None else float(self.lower_bound))
        implementation_row(self.implementation, "KDAConfig.implementation")
        set_field("gate_form", check_gate_form(self.gate_form, self.lower_bound,
                                               where="KDAConfig.gate_form"))  # fmt: skip
        # fields valid alone that cannot go together
        if self.conv_size > MAX_CONV_SIZE:
            raise ValueError(f"KDAConfig.conv_size must be <= {MAX_CONV_SIZE} (a short conv), "
                             f"got {self.conv_size}")  # fmt: skip
        if self.num_v_heads is not None and self.num_v_heads % self.num_heads:
            raise ValueError(f"KDAConfig.num_v_heads must be a multiple of num_heads="
                             f"{self.num_heads} (each q/k head serves num_v_heads // num_heads "
                             f"value heads), got {self.num_v_heads}")  # fmt: skip
        fused = self.gate_form is not GateForm.CLAMPED_SOFTPLUS
        hint = (" (set lower_bound, e.g. -5.0)" if fused else "; with gate_form="
                "'clamped_softplus' the layer activates the gate itself, so the kernel gets a "
                "log-space gate")  # fmt: skip
        for problem in refusals(self.implementation, here=False, fused_gate=fused,
                                lower_bound=self.lower_bound,
                                allow_neg_eigval=self.allow_neg_eigval):  # fmt: skip
            raise ValueError(f"KDAConfig: {problem}{hint if 'gate' in problem else ''}")
        if not self.use_a_log and self.lower_bound is None:
            raise ValueError("KDAConfig.use_a_log=False is the safe gate without A_log (fla's "
                             "A_log=None): set lower_bound (e.g. -5.0); the softplus gate has no "
                             "rate-free form")  # fmt: skip
        if self.fused_qkv_conv and not self.conv_size:
            raise ValueError("KDAConfig.fused_qkv_conv needs a conv: conv_size must be > 0")


# what KimiDeltaAttention.project hands the kernel: q, k [B, T, H, K] after conv + SiLU, v [B, T,
# HV, V], f [B, T, HV, K] the raw gate input (clamped softplus: the log-space gate), beta [B, T,
# HV] float32, conv_states per stream q, k, v [B, W-1, C] after x (or None)
Projected = namedtuple("Projected", "q k v f beta conv_states")


class KDACache(NamedTuple):
    """Decode state of one layer: recurrent state and the last W-1 conv inputs per stream."""

    state: jax.Array  # [B, HV, K, V] float32
    q_conv: jax.Array | None  # [B, W-1, H*K]
    k_conv: jax.Array | None  # [B, W-1, H*K]
    v_conv: jax.Array | None  # [B, W-1, HV*V] (fused_qkv_conv: the same channels, split)


class KimiDeltaAttention(nnx.Module):
    """KDA token mixer ``[B, T, hidden] -> [B, T, hidden]`` of a :class:`KDAConfig`, initialised
    from ``rngs``; with a ``mesh``, context-parallel over its ``context_axis`` ("context").
    Parameters past this machine's memory are refused, naming the largest width field."""

    cache_type, cache_kind = KDACache, "a KDACache"

    def __init__(
        self, config: KDAConfig, *, rngs: nnx.Rngs, mesh=None, context_axis: str = "context"
    ):
        if not isinstance(config, KDAConfig):
            raise TypeError(f"config must be a KDAConfig, got {type(config).__name__}")
        check_parameters_fit(KimiDeltaAttention, config, fields=WIDTH_FIELDS)
        if mesh is not None and context_axis not in mesh.axis_names:
            raise ValueError(f"mesh has axes {mesh.axis_names}; context_axis={context_axis!r} "
                             "is not one of them")  # fmt: skip
        cfg = self.config = config
        self.mesh, self.context_axis = mesh, context_axis
        # tokamax's row: its per-segment states are checked at each call's entry
        self._tokamax = implementation_row(cfg.implementation).variant is not None
        kd, vd, hv = cfg.head_dim, cfg.value_dim, cfg.value_heads
        d, qk, vc = cfg.hidden_size, cfg.num_heads * kd, hv * vd
        linear = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj = (
            nnx.Linear(d, c, use_bias=False, **linear) for c in (qk, qk, vc)
        )
        conv = dict(conv_size=cfg.conv_size, **linear)
        fused = cfg.fused_qkv_conv  # (the config refuses it without a conv)
        self.qkv_conv1d = ShortConvolution(2 * qk + vc, **conv) if fused else None
        separate = cfg.conv_size and not fused
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (
            [ShortConvolution(c, **conv) for c in (qk, qk, vc)] if separate else (None,) * 3
        )

        def gate_projection(out, rank, use_bias):  # nnx.Linear, or a low-rank pair through rank
            last = dict(use_bias=use_bias, bias_metadata=NO_DECAY, **linear)
            if rank is None:
                return nnx.Linear(d, out, **last)
            return nnx.Sequential(nnx.Linear(d, rank, use_bias=False, **linear),
                                  nnx.Linear(rank, out, **last))  # fmt: skip

        gate_channels = 1 if cfg.per_head_decay else kd
        self.f_proj = gate_projection(hv * gate_channels, cfg.forget_gate_rank, False)
        self.b_proj = nnx.Linear(d, hv, use_bias=False, **linear)
        self.g_proj = gate_projection(vc, cfg.output_gate_rank, cfg.output_gate_bias)
        # gate parameters and the norm weight are not decayed (fla marks A_log and dt_bias)
        safe_gate = cfg.gate_form is GateForm.SAFE_SIGMOID  # A_log None: A = 1, no learned rate
        self.A_log = no_decay_param(init_a_log(rngs.params(), hv, safe_gate=safe_gate)) if (
            cfg.use_a_log) else None  # fmt: skip
        self.dt_bias = no_decay_param(init_dt_bias(rngs.params(), hv, gate_channels))
        self.o_norm = no_decay_param(jnp.ones((vd,), cfg.param_dtype))  # fla: o_norm.weight
        self.o_proj = nnx.Linear(vc, d, use_bias=False, **linear)

    # ----------------------------------------------------------------- forward
    def __call__(
        self, x: jax.Array, *, segment_ids: jax.Array | None = None, cache: KDACache | None = None
    ):
        """``x [B, T, hidden]`` (its values are not read: a NaN or inf gives NaN outputs) -> ``y
        [B, T, hidden]``; with a ``cache`` (:meth:`init_cache`'s or a previous call's; one
        device, no ids) ``(y, new_cache)``. ``segment_ids [B, T]`` int, 0 = padding: packed
        documents never see each other (through the conv or the state); padding outputs 0."""
        segment_ids = self._check_inputs(x, segment_ids, cache)
        if self.mesh is not None:
            return self._forward_context_parallel(x, segment_ids)
        y, new_cache, _ = self._forward(x, segment_ids=segment_ids, cache=cache)
        return y if cache is None else (y, new_cache)

    def _forward(self, x, *, segment_ids=None, cache=None, **states):
        """One-device forward of checked inputs: ``(y, new_cache or None, kda's result)``."""
        cfg = self.config
        ids, count = segment_ids or (None, None)
        q, k, v, f, beta, conv_states = self.project(x, segment_ids=ids, cache=cache)
        final = cache is not None or bool(states)
        result = kda_prechecked(
            q, k, v, f, beta, **self.kernel_kwargs(), output_final_state=final,
            initial_state=None if cache is None else cache.state, **states, segment_ids=ids,
            segments_per_row=count, max_num_segments=max_segments_bound(segment_ids, cfg),
            chunk_size=cfg.chunk_size, implementation=cfg.implementation)  # fmt: skip
        new_cache = KDACache(result[1], *conv_states) if final else None
        return self.project_output(x, result[0]), new_cache, result

    # ``__call__`` is project -> kda(**kernel_kwargs()) -> project_output, each callable alone
    def project(
        self, x, *, segment_ids=None, cache=None, halo=None, history_segment_ids=None
    ) -> Projected:
        """Everything before the kernel, for ``x [B, T, hidden]``: a :class:`Projected`. Not
        checked: ``segment_ids [B, T]``; ``cache`` whose conv states precede x; ``halo`` maps
        each conv input ``[B, T, C]`` to the ``[B, W-1, C]`` before it (CP; default the cache's
        or zeros); ``history_segment_ids [B, W-1]`` the halo tokens' ids."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        x = x.astype(cfg.dtype)
        raw = [proj(x) for proj in (self.q_proj, self.k_proj, self.v_proj)]
        h, kd, vd, hv = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.value_heads
        states = None if cache is None else cache[1:]  # the W-1 inputs before x (else zeros)
        ids = (segment_ids, history_segment_ids)
        if cfg.fused_qkv_conv:  # one depthwise conv over the concatenation, split after it
            z = jnp.concatenate(raw, axis=-1)
            history = halo(z) if halo else states and jnp.concatenate(states, axis=-1)
            (z,), (state,) = mix_convs((self.qkv_conv1d,), [z], [history], *ids)
            cuts = (h * kd, 2 * h * kd)
            streams, conv_states = jnp.split(z, cuts, axis=-1), jnp.split(state, cuts, axis=-1)
        else:
            states = [halo(z) for z in raw] if halo else states  # CP: the ranks before
            convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
            streams, conv_states = mix_convs(convs, raw, states, *ids)
        q, k = (s.reshape(batch, seq_len, h, kd) for s in streams[:2])
        v = streams[2].reshape(batch, seq_len, hv, vd)
        f = self.f_proj(x).reshape(batch, seq_len, hv, -1)
        if cfg.per_head_decay:  # Gated DeltaNet: every channel of a head decays alike
            f = jnp.broadcast_to(f, (batch, seq_len, hv, kd))
        if cfg.gate_form is GateForm.CLAMPED_SOFTPLUS:  # the kernels fuse only the other forms
            a_log = jnp.zeros((hv,), jnp.float32) if self.A_log is None else self.A_log[...]
            f = jnp.maximum(kda_gate(f, a_log, self._dt_bias()), cfg.lower_bound)
        beta = jax.nn.sigmoid(self.b_proj(x).astype(jnp.float32))
        beta = 2.0 * beta if cfg.allow_neg_eigval else beta
        return Projected(q, k, v, f, beta, tuple(conv_states))

    def kernel_kwargs(self) -> dict:
        """The layer's keyword arguments to :func:`kda_lib.kda` (no gate ones when clamped)."""
        cfg = self.config
        options = dict(use_qk_l2norm=True, allow_neg_eigval=cfg.allow_neg_eigval)
        if cfg.gate_form is GateForm.CLAMPED_SOFTPLUS:
            return options
        a_log = None if self.A_log is None else self.A_log[...]
        return dict(a_log=a_log, dt_bias=self._dt_bias(), lower_bound=cfg.lower_bound,
                    use_gate_in_kernel=True, **options)  # fmt: skip

    def project_output(self, x, o) -> jax.Array:
        """Gated RMSNorm and output projection of ``o [B, T, HV, V]``, gated by ``x``."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        hv, vd = cfg.value_heads, cfg.value_dim
        gate = self.g_proj(x.astype(cfg.dtype)).reshape(batch, seq_len, hv, vd)
        normed = gated_rms_norm(o, self.o_norm[...], gate, eps=cfg.norm_eps)
        return self.o_proj(normed.astype(cfg.dtype).reshape(batch, seq_len, hv * vd))

    def _dt_bias(self) -> jax.Array:
        """``dt_bias [HV * K]`` (a per-head one repeated over K with per_head_decay)."""
        dt_bias = self.dt_bias[...]
        return jnp.repeat(dt_bias, self.config.head_dim) if self.config.per_head_decay else dt_bias

    def _forward_context_parallel(self, x, segment_ids):
        """``layer(x)`` with T split over the mesh's context axis (padded at the end to divide)."""
        axis, cfg, names = self.context_axis, self.config, self.mesh.axis_names
        # an Auto-typed view of the user's mesh; arrays on it are relabelled, no data moves
        mesh = jax.sharding.Mesh(self.mesh.devices, names,
                                 axis_types=(jax.sharding.AxisType.Auto,) * len(names))  # fmt: skip
        home = getattr(getattr(x, "sharding", None), "mesh", None)  # to return y there too
        ids = None if segment_ids is None else segment_ids[0]
        x, ids = (_onto_mesh(a, mesh) for a in (x, ids))
        seq_len, ranks = x.shape[1], mesh.shape[axis]
        pad = (-seq_len) % ranks
        if pad:
            x = jnp.pad(x, [(0, 0), (0, pad), (0, 0)])
            if ids is not None:  # numpy ids stay on the host
                ids = (np if isinstance(ids, np.ndarray) else jnp).pad(ids, [(0, 0), (0, pad)])
        graphdef, state = nnx.split(self)
        key = (graphdef, axis, cfg, mesh, ids is not None)
        if callable(implementation_row(cfg.implementation).context_parallel):
            # tokamax's CP: its trace depends on the emulated chip, built for each call
            bound = max_segments_bound(segment_ids, cfg, ranks)
            program = _context_parallel_program(*key, own_cp=True, bound=bound)
        else:
            program = _cached_context_parallel_program(*key)
        y = program(state, x, ids)[:, :seq_len]
        return _onto_mesh(y, home) if isinstance(home, jax.sharding.Mesh) else y

    # ----------------------------------------------------------------- decoding
    def _cache_shapes(self, batch_size: int, rows: int = 0) -> dict:
        cfg = self.config
        qk, vc = cfg.num_heads * cfg.head_dim, cfg.value_heads * cfg.value_dim
        state = (batch_size, cfg.value_heads, cfg.head_dim, cfg.value_dim)
        conv = [(batch_size, cfg.conv_size - 1, c) if cfg.conv_size else None for c in (qk, qk, vc)]
        return dict(zip(KDACache._fields, (state, *conv), strict=True))

    def init_cache(self, batch_size: int) -> KDACache:
        """Zero state and conv history for ``batch_size`` rows (refused past memory)."""
        return empty_cache(self, batch_size)

    def prefill(self, x: jax.Array, *, cache: KDACache | None = None):
        """Run a prompt ``x [B, T, hidden]`` (one document per row) from ``cache`` (default
        empty): ``(y, cache after x, boundaries)``, the caches after every chunk with an axis
        ``N = T // chunk_size`` after B (:func:`cache_at`; prefix caching)."""
        return self._with_states(x, cache, self.config.chunk_size, "chunk_states")

    def draft(self, x: jax.Array, *, cache: KDACache):
        """Run a draft ``x [B, T, hidden]`` from ``cache``: ``(y, cache, each token's caches)``."""
        if cache is None:
            raise ValueError("draft continues a cache: pass cache=layer.init_cache(B) or one "
                             "a previous call returned")  # fmt: skip
        return self._with_states(x, cache, 1, "token_states")

    def accept_draft(self, cache: KDACache, token_caches: KDACache, num_accepted_tokens):
        """The cache after each row's accepted prefix of a :meth:`draft` from ``cache``:
        ``num_accepted_tokens`` an int or ``[B]`` ints in ``[0, T]``, as in :func:`cache_at`."""
        if not isinstance(token_caches, KDACache) or getattr(token_caches.state, "ndim", 0) != 5:
            raise ValueError("token_caches must be the KDACache layer.draft returned, got "
                             f"{type(token_caches).__name__}")  # fmt: skip
        check_cache(cache, self, token_caches.state.shape[0])
        for name, c, t in zip(KDACache._fields, cache, token_caches, strict=True):
            if (c is None) != (t is None) or (c is not None and t.shape[2:] != c.shape[1:]):
                want = None if c is None else f"[B, T, {', '.join(map(str, c.shape[1:]))}]"
                raise ValueError(f"token_caches.{name} must be {want} (as layer.draft returns), "
                                 f"got {getattr(t, 'shape', None)}")  # fmt: skip
        stacked = (None if c is None else jnp.concatenate([c[:, None].astype(t.dtype), t], 1)
                   for c, t in zip(cache, token_caches, strict=True))  # fmt: skip
        return _pick(KDACache(*stacked), num_accepted_tokens, "num_accepted_tokens")

    def _with_states(self, x, cache, every: int, states: str):
        """The forward, and the caches every ``every`` tokens stacked in one :class:`KDACache`."""
        self._check_inputs(x, None, cache, serving=True)
        y, new_cache, result = self._forward(x, cache=cache, **{f"output_{states}": True})
        cfg, convs = self.config, [None] * 3
        if cfg.conv_size:
            width, seq_len = cfg.conv_size - 1, x.shape[1]
            ends = jnp.arange(1, seq_len // every + 1) * every  # tokens before each boundary
            pos = ends[:, None] - width + jnp.arange(width)[None]  # [N, W-1], < 0: the history
            picked = x[:, jnp.clip(pos, 0, seq_len - 1)].astype(cfg.dtype)  # [B, N, W-1, hidden]
            projs = (self.q_proj, self.k_proj, self.v_proj)
            before = jnp.clip(width + pos, 0, width - 1)  # the history's rows
            histories = [None] * 3 if cache is None else cache[1:]  # no cache: zeros before x
            convs = [jnp.where((pos < 0)[None, :, :, None],
                               0.0 if history is None else history[:, before], proj(picked))
                     for proj, history in zip(projs, histories, strict=True)]  # fmt: skip
        return y, new_cache, KDACache(getattr(result, states), *convs)

    @classmethod
    def from_fla_state_dict(cls, state_dict, config: KDAConfig, *, rngs: nnx.Rngs, **kwargs):
        """A layer of an fla ``KimiDeltaAttention.state_dict()`` (``kwargs``: the constructor's)."""
        layer = cls(config, rngs=rngs, **kwargs)
        load_state_dict(layer, state_dict, "fla")
        return layer

    # ----------------------------------------------------------------- checks
    def _check_inputs(self, x, segment_ids, cache, serving=False):
        """A mixer's entry checks (``check_call``'s: ``x`` by :func:`check_activation`, then the
        cache and ids where given) and the layer's own, on shapes, dtypes and the ids only (x's
        values are never read here): ``(ids, segments per row)`` or None."""
        if self.mesh is not None and (cache is not None or serving):
            raise ValueError("a layer built with a mesh (context parallel) does not decode, "
                             "prefill or draft; build one without a mesh for these")  # fmt: skip
        check_activation("x", x, self.config.hidden_size)
        ids, count = (None, None) if cache is None and segment_ids is None else (
            check_cache_and_ids(self, x.shape[0], x.shape[1], segment_ids, cache))  # fmt: skip
        cfg = self.config
        # tokamax: its per-segment states (a rank's under context parallelism) fit, checked
        # here, naming what set the bound (kda_prechecked's kernel row skips this check)
        if ids is not None and self._tokamax:
            ranks = 1 if self.mesh is None else self.mesh.shape[self.context_axis]
            bound = max_segments_bound((ids, count), cfg, ranks)
            dims = Dims(x.shape[0], -(-x.shape[1] // ranks), cfg.value_heads, cfg.head_dim,
                        cfg.value_dim, cfg.num_heads)  # fmt: skip
            name = ("KDAConfig.max_num_segments" if cfg.max_num_segments else
                    "the segment count of segment_ids" + (" + 1 (a rank's slice can hold the "
                    "end of one more)" if ranks > 1 else ""))  # fmt: skip
            if problem := segment_slots_problem(cfg.implementation, dims, bound, name=name,
                                                segments_per_row=count):  # fmt: skip
                raise ValueError(problem)
        return None if ids is None else (ids, count)


def cache_at(caches: KDACache, index) -> KDACache:
    """One :class:`KDACache` out of stacked ones (``prefill``'s, ``draft``'s: an axis N after
    B). ``index``: an int or ``[B]`` ints in ``[0, N)``, checked when concrete; under ``jit`` a
    row outside gets NaN in every field. Resume with ``layer(x, cache=cache_at(caches, i))``."""
    if not isinstance(caches, KDACache) or getattr(caches.state, "ndim", None) != 5:
        raise ValueError("caches must be a KDACache of stacked states [B, N, HV, K, V] (from "
                         f"layer.prefill or layer.draft), got {type(caches).__name__}")  # fmt: skip
    return _pick(caches, index, "index")


def _pick(caches: KDACache, index, name: str) -> KDACache:
    """Entry ``index`` of every stacked field (see :func:`cache_at`)."""
    batch, count = caches.state.shape[:2]
    if is_int(index, minimum=None) or getattr(index, "shape", None) == ():
        index = jnp.broadcast_to(index, (batch,))  # an int or a 0-d array, traced under jit too
    shape = getattr(index, "shape", None)
    if shape != (batch,) or not jnp.issubdtype(index.dtype, jnp.integer):
        got = f"shape {shape} {index.dtype}" if shape is not None else repr(index)
        raise ValueError(f"{name} must be an int or [B]={batch} ints, got {got}")
    if is_concrete(index) and not (((got := checks.host_values(index)) >= 0) & (got < count)).all():
        raise ValueError(f"{name} must be in [0, {count - 1}], got {got}")
    inside, at = (index >= 0) & (index < count), jnp.clip(index, 0, count - 1)

    def pick(c):
        return jnp.where(inside.reshape(-1, *[1] * (c.ndim - 2)), c[jnp.arange(batch), at], jnp.nan)

    return KDACache(*(None if c is None else pick(c) for c in caches))


def max_segments_bound(segments, config: KDAConfig, ranks: int = 1) -> int | None:
    """Tokamax's static bound on segments per row (per rank) for the checked ``segments = (ids,
    count or None)``: ``max_num_segments``, else the count (+1 over ranks); None for kda_lib's
    kernels or without ids; refused for traced ids without the config bound."""
    if segments is None or implementation_row(config.implementation).variant is None:
        return None
    if config.max_num_segments is not None:
        return config.max_num_segments
    if segments[1] is None:
        raise ValueError(
            f"implementation={config.implementation!r} with segment_ids under jit needs "
            f"KDAConfig.max_num_segments, a static bound on the segments in one row"
            f"{' (per rank)' if ranks > 1 else ''}; tokamax keeps one state slot per segment"
        )
    return max(segments[1], 1) + (ranks > 1)


# ------------------------------------------------------------------ the context-parallel program
def _context_parallel_program(graphdef, axis, cfg, mesh, has_segments, own_cp=False, bound=None):
    """The jitted CP forward ``(state, x, segment_ids) -> y`` over ``mesh``'s ``axis`` (each rank:
    project with the halo, :func:`kda_context_parallel`); ``own_cp``: tokamax's, with ``bound``."""
    mosaic = dict(mesh=mesh, max_num_segments=bound) if own_cp else {}
    width = max(cfg.conv_size - 1, 0)

    def halo(z):  # the W-1 inputs before this rank's slice, from the ranks before it
        return halo_exchange(z, axis_name=axis, halo_size=width)[:, :width]

    def local(state, x, segment_ids):
        module = nnx.merge(graphdef, state)
        history_ids = None if segment_ids is None or not width else halo(segment_ids)
        q, k, v, f, beta, _ = module.project(x, segment_ids=segment_ids,
                                             halo=halo if width else None,
                                             history_segment_ids=history_ids)  # fmt: skip
        o = kda_context_parallel_prechecked(
            q, k, v, f, beta, axis_name=axis, scale=None, segment_ids=segment_ids,
            implementation=cfg.implementation, chunk_size=cfg.chunk_size,
            **{"mesh": None, **mosaic}, **module.kernel_kwargs())[0]  # fmt: skip
        return module.project_output(x, o)

    seq, tokens = P(None, axis), P(None, axis, None)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), tokens, seq if has_segments else None),
                       out_specs=tokens, check_vma=not own_cp)  # fmt: skip

    def run(state, x, segment_ids):  # the inputs in the layout shard_map expects
        state = jax.tree.map(lambda a: shard_as(a, mesh, P()), state)
        ids = None if segment_ids is None else shard_as(segment_ids, mesh, seq)
        return fn(state, shard_as(x, mesh, tokens), ids)

    return jax.jit(run)


# kda_lib's own CP route: one program per (structure, axis, config, mesh, segments)
_cached_context_parallel_program = register_compiled_cache(
    functools.lru_cache(maxsize=32)(_context_parallel_program)
)


def _onto_mesh(array, mesh):
    """``array`` on ``mesh`` if it is laid out on another mesh of the same devices."""
    sharding = getattr(array, "sharding", None) if not isinstance(array, jax.core.Tracer) else None
    if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh != mesh:
        return jax.device_put(array, jax.sharding.NamedSharding(mesh, sharding.spec))
    return array
