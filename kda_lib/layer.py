"""KimiDeltaAttention: the KDA token mixer as a Flax NNX module, with a decode cache.

Dataflow for ``x [B, T, hidden]`` (parameter names follow fla's ``fla/layers/kda.py``)::

    q, k = silu(conv(q_proj(x))), silu(conv(k_proj(x)))   [B, T, H, K], L2-normalised in kda()
    v    = silu(conv(v_proj(x)))                          [B, T, H, V]
    f    = f_proj(x)                                      [B, T, H, K] raw forget gate
    beta = sigmoid(b_proj(x))   (x2 with allow_neg_eigval) [B, T, H]
    o    = kda(q, k, v, f, beta, a_log=A_log, dt_bias=dt_bias, lower_bound=...)
    y    = o_proj(rmsnorm(o) * o_norm.weight * sigmoid(g_proj(x)))

``f_proj``/``g_proj`` are single full-rank matmuls (MaxText) or fla's two-matmul low-rank form
(``gate_low_rank=r``; fla uses r = V). ``A_log``/``dt_bias`` stay float32.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.conv import ShortConvolution, kernel_from_torch
from kda_lib.gating import check_lower_bound, init_a_log, init_dt_bias
from kda_lib.kernel import IMPLEMENTATIONS, kda


@dataclasses.dataclass(frozen=True)
class KDAConfig:
    """Hyper-parameters of :class:`KimiDeltaAttention`.

    Attributes:
      hidden_size: model width.
      num_heads: H.
      head_dim: K (query/key size per head).
      value_head_dim: V per head (default K).
      conv_size: short-conv width W (default 4); 0 disables the convolutions.
      lower_bound: None = softplus gate; a float in [-5, 0) = safe (lower-bound sigmoid) gate.
      gate_low_rank: None = full-rank forget/output gates; int r = fla's low-rank gates.
      allow_neg_eigval: beta = 2 * sigmoid(.) in [0, 2).
      per_head_decay: one forget-gate value per head, shared by its K channels (Gated
        DeltaNet) instead of KDA's per-channel gate; f_proj then has H outputs, dt_bias [H].
      norm_eps: output RMSNorm epsilon (1e-5).
      dtype: compute dtype (float32); param_dtype: parameter dtype (float32).
      implementation: kernel implementation for :func:`kda_lib.kda` ("auto").
      chunk_size: chunk length of the chunked kernel (64).
      max_num_segments: static bound on the segments in one row of ``segment_ids`` (one rank's
        slice under context parallelism), for tokamax backends, which keep one state slot per
        segment. None (default): counted from the ids when they are concrete; under ``jit``
        (traced ids) a tokamax backend then raises, asking for this bound.
    """

    hidden_size: int
    num_heads: int
    head_dim: int
    value_head_dim: int | None = None
    conv_size: int = 4
    lower_bound: float | None = None
    gate_low_rank: int | None = None
    allow_neg_eigval: bool = False
    per_head_decay: bool = False
    norm_eps: float = 1e-5
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    implementation: str = "auto"
    chunk_size: int = 64
    max_num_segments: int | None = None

    def __post_init__(self):
        if self.max_num_segments is not None and (
            isinstance(self.max_num_segments, bool)
            or not isinstance(self.max_num_segments, int)
            or self.max_num_segments < 1
        ):
            raise ValueError(
                f"KDAConfig.max_num_segments must be None or a positive int, "
                f"got {self.max_num_segments!r}"
            )
        for name in ("hidden_size", "num_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KDAConfig.{name} must be a positive int, got {value!r}")
        if self.value_head_dim is not None and (
            not isinstance(self.value_head_dim, int) or self.value_head_dim < 1
        ):
            raise ValueError(
                f"KDAConfig.value_head_dim must be a positive int or None, "
                f"got {self.value_head_dim!r}"
            )
        if not isinstance(self.conv_size, int) or self.conv_size < 0:
            raise ValueError(
                f"KDAConfig.conv_size must be an int >= 0 (0 disables the conv), "
                f"got {self.conv_size!r}"
            )
        check_lower_bound(self.lower_bound)
        if self.gate_low_rank is not None and (
            not isinstance(self.gate_low_rank, int) or self.gate_low_rank < 1
        ):
            raise ValueError(
                f"KDAConfig.gate_low_rank must be a positive int or None, "
                f"got {self.gate_low_rank!r}"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"KDAConfig.norm_eps must be > 0, got {self.norm_eps!r}")
        if self.implementation != "auto" and self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"KDAConfig.implementation must be 'auto' or one of "
                f"{IMPLEMENTATIONS}, got {self.implementation!r}"
            )
        if self.implementation == "tokamax_xla_chunked" and self.lower_bound is None:
            raise ValueError(
                "KDAConfig: implementation='tokamax_xla_chunked' needs the safe "
                "gate; set lower_bound (e.g. -5.0)"
            )

    @property
    def key_dim(self) -> int:
        return self.head_dim

    @property
    def value_dim(self) -> int:
        return self.value_head_dim or self.head_dim


class KDACache(NamedTuple):
    """Decode state of one layer: recurrent state and the last W-1 conv inputs per stream."""

    state: jax.Array  # [B, H, K, V] float32
    q_conv: jax.Array | None  # [B, W-1, H*K]
    k_conv: jax.Array | None  # [B, W-1, H*K]
    v_conv: jax.Array | None  # [B, W-1, H*V]


def _gate_projection(hidden, out, rank, *, use_bias, cfg, rngs):
    linear = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    if rank is None:
        return nnx.Linear(hidden, out, use_bias=use_bias, **linear)
    return nnx.Sequential(
        nnx.Linear(hidden, rank, use_bias=False, **linear),
        nnx.Linear(rank, out, use_bias=use_bias, **linear),
    )


class KimiDeltaAttention(nnx.Module):
    """KDA token mixer. ``layer(x)`` maps ``[B, T, hidden]`` to ``[B, T, hidden]``.

    Args:
      config: :class:`KDAConfig`.
      rngs: ``nnx.Rngs`` for parameter init.
      mesh, context_axis: run the conv halo exchange and the recurrence context-parallel over
        ``mesh``'s ``context_axis`` (see kda_lib.context_parallel); None = one device.
    """

    def __init__(
        self, config: KDAConfig, *, rngs: nnx.Rngs, mesh=None, context_axis: str = "context"
    ):
        cfg = config
        self.config = cfg
        self.mesh = mesh
        self.context_axis = context_axis
        if mesh is not None and context_axis not in mesh.axis_names:
            raise ValueError(
                f"mesh has axes {mesh.axis_names}; context_axis={context_axis!r} is not one of them"
            )
        h, kd, vd, hidden = cfg.num_heads, cfg.key_dim, cfg.value_dim, cfg.hidden_size
        linear = dict(use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(hidden, h * kd, **linear)
        self.k_proj = nnx.Linear(hidden, h * kd, **linear)
        self.v_proj = nnx.Linear(hidden, h * vd, **linear)
        if cfg.conv_size:
            conv = dict(
                conv_size=cfg.conv_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs
            )
            self.q_conv1d = ShortConvolution(h * kd, **conv)
            self.k_conv1d = ShortConvolution(h * kd, **conv)
            self.v_conv1d = ShortConvolution(h * vd, **conv)
        else:
            self.q_conv1d = self.k_conv1d = self.v_conv1d = None
        gate_channels = 1 if cfg.per_head_decay else kd
        self.f_proj = _gate_projection(
            hidden, h * gate_channels, cfg.gate_low_rank, use_bias=False, cfg=cfg, rngs=rngs
        )
        self.b_proj = nnx.Linear(hidden, h, **linear)
        self.g_proj = _gate_projection(
            hidden, h * vd, cfg.gate_low_rank, use_bias=True, cfg=cfg, rngs=rngs
        )
        self.A_log = nnx.Param(init_a_log(rngs.params(), h, safe_gate=cfg.lower_bound is not None))
        self.dt_bias = nnx.Param(init_dt_bias(rngs.params(), h, gate_channels))
        self.o_norm = nnx.Param(jnp.ones((vd,), cfg.param_dtype))  # fla: o_norm.weight
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    # ----------------------------------------------------------------- decoding
    def init_cache(self, batch_size: int) -> KDACache:
        """An empty cache for ``batch_size`` rows: zero state, zero conv history."""
        cfg = self.config
        h, kd, vd = cfg.num_heads, cfg.key_dim, cfg.value_dim
        state = jnp.zeros((batch_size, h, kd, vd), jnp.float32)
        if not cfg.conv_size:
            return KDACache(state, None, None, None)
        width = cfg.conv_size - 1
        return KDACache(
            state,
            jnp.zeros((batch_size, width, h * kd), cfg.dtype),
            jnp.zeros((batch_size, width, h * kd), cfg.dtype),
            jnp.zeros((batch_size, width, h * vd), cfg.dtype),
        )

    def _check_cache(self, cache: KDACache, batch: int):
        expected = self.init_cache(batch)
        for name, got, want in zip(KDACache._fields, cache, expected, strict=True):
            if (got is None) != (want is None) or (got is not None and got.shape != want.shape):
                raise ValueError(
                    f"cache.{name} has shape {None if got is None else got.shape}, expected "
                    f"{None if want is None else want.shape} for batch size {batch}; build it "
                    f"with layer.init_cache({batch})"
                )

    # ----------------------------------------------------------------- forward
    def __call__(
        self, x: jax.Array, *, segment_ids: jax.Array | None = None, cache: KDACache | None = None
    ):
        """``x [B, T, hidden]`` -> ``y [B, T, hidden]``, or ``(y, new_cache)`` with a cache.

        Args:
          x: ``[B, T, hidden]``.
          segment_ids: ``[B, T]`` int, 1-based, 0 = padding: packed documents never see each
            other (neither through the conv nor through the state); padding outputs 0.
          cache: from :meth:`init_cache` (or a previous call); continues decoding from it.
        """
        cfg = self.config
        if x.ndim != 3 or x.shape[-1] != cfg.hidden_size:
            raise ValueError(
                f"x must have shape [B, T, hidden_size={cfg.hidden_size}], got {x.shape}"
            )
        batch, seq_len, _ = x.shape
        if segment_ids is not None:
            if segment_ids.shape != (batch, seq_len):
                raise ValueError(
                    f"segment_ids must have shape [B, T]={(batch, seq_len)}, "
                    f"got {segment_ids.shape}"
                )
            if cache is not None:
                raise ValueError(
                    "segment_ids cannot be combined with a cache: decode one document per row"
                )
        if cache is not None:
            self._check_cache(cache, batch)
        if self.mesh is not None:
            if cache is not None:
                raise ValueError(
                    "a layer built with a mesh (context parallel) does not decode; "
                    "build one without a mesh for decoding"
                )
            from kda_lib.context_parallel import layer_forward_context_parallel

            return layer_forward_context_parallel(self, x, segment_ids=segment_ids)
        y, new_cache = self.forward(x, segment_ids=segment_ids, cache=cache)
        return y if cache is None else (y, new_cache)

    def project(self, x, *, segment_ids=None, cache=None, halo=None, history_segment_ids=None):
        """Everything before the kernel: ``(q, k, v, f, beta, new_conv_states)``.

        ``halo``: a function mapping each conv input ``[B, T, C]`` to the ``[B, W-1, C]`` inputs
        before it (context parallelism); otherwise the cache's conv states (or zeros) are used.
        """
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, kd, vd = cfg.num_heads, cfg.key_dim, cfg.value_dim
        x = x.astype(cfg.dtype)
        streams = []
        conv_states = []
        for i, (proj, conv) in enumerate(
            (
                (self.q_proj, self.q_conv1d),
                (self.k_proj, self.k_conv1d),
                (self.v_proj, self.v_conv1d),
            )
        ):
            z = proj(x)
            if conv is None:
                streams.append(jax.nn.silu(z))
                conv_states.append(None)
                continue
            history = halo(z) if halo is not None else None if cache is None else cache[1 + i]
            z, state = conv(
                z,
                segment_ids=segment_ids,
                conv_state=history,
                history_segment_ids=history_segment_ids,
            )
            streams.append(z)
            conv_states.append(state)
        q = streams[0].reshape(batch, seq_len, h, kd)
        k = streams[1].reshape(batch, seq_len, h, kd)
        v = streams[2].reshape(batch, seq_len, h, vd)
        f = self.f_proj(x).reshape(batch, seq_len, h, -1)
        if cfg.per_head_decay:  # Gated DeltaNet: every channel of a head decays alike
            f = jnp.broadcast_to(f, (batch, seq_len, h, kd))
        beta = jax.nn.sigmoid(self.b_proj(x).astype(jnp.float32))
        if cfg.allow_neg_eigval:
            beta = 2.0 * beta
        return q, k, v, f, beta, conv_states

    def kernel_kwargs(self):
        cfg = self.config
        dt_bias = self.dt_bias[...]
        if cfg.per_head_decay:
            dt_bias = jnp.repeat(dt_bias, cfg.key_dim)
        return dict(
            a_log=self.A_log[...],
            dt_bias=dt_bias,
            lower_bound=cfg.lower_bound,
            use_qk_l2norm=True,
            allow_neg_eigval=cfg.allow_neg_eigval,
        )

    def finish(self, x, o):
        """Everything after the kernel: gated RMSNorm and the output projection."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, vd = cfg.num_heads, cfg.value_dim
        gate = self.g_proj(x.astype(cfg.dtype)).reshape(batch, seq_len, h, vd)
        of = o.astype(jnp.float32)
        normed = of * jax.lax.rsqrt(jnp.mean(of * of, axis=-1, keepdims=True) + cfg.norm_eps)
        normed = (
            normed * self.o_norm[...].astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))
        )
        return self.o_proj(normed.astype(cfg.dtype).reshape(batch, seq_len, h * vd))

    def forward(self, x, *, segment_ids=None, cache=None):
        """Single-device forward: ``(y, new_cache | None)``."""
        cfg = self.config
        q, k, v, f, beta, conv_states = self.project(x, segment_ids=segment_ids, cache=cache)
        o, state = kda(
            q,
            k,
            v,
            f,
            beta,
            **self.kernel_kwargs(),
            initial_state=None if cache is None else cache.state,
            output_final_state=cache is not None,
            segment_ids=segment_ids,
            max_num_segments=max_segments_bound(segment_ids, cfg),
            chunk_size=cfg.chunk_size,
            implementation=cfg.implementation,
        )
        y = self.finish(x, o)
        if cache is None:
            return y, None
        return y, KDACache(state, *conv_states)

    # ----------------------------------------------------------------- fla checkpoints
    @classmethod
    def from_fla_state_dict(cls, state_dict, config: KDAConfig, *, rngs: nnx.Rngs, **kwargs):
        """Build a layer holding the weights of an fla ``KimiDeltaAttention.state_dict()``.

        ``state_dict`` maps fla names (``q_proj.weight``, ``q_conv1d.weight``,
        ``f_proj.0.weight``, ``o_norm.weight``, ...) to arrays (numpy or torch tensors converted
        with ``.numpy()``). Linear weights ``[out, in]`` are transposed; conv weights
        ``[C, 1, W]`` become ``[W, C]`` (same tap order, see kda_lib.conv).
        """
        layer = cls(config, rngs=rngs, **kwargs)
        load_fla_state_dict(layer, state_dict)
        return layer


def max_segments_bound(segment_ids, config: KDAConfig, ranks: int = 1) -> int | None:
    """The static bound on segments per row (per rank's slice when ``ranks > 1``) that
    tokamax backends need; None for kda_lib's kernels or without ``segment_ids``.

    ``config.max_num_segments`` when set; otherwise counted from concrete ids: runs of one id,
    padding runs included, so it may exceed the true count by the padding runs. Traced ids
    without the config bound raise: the count is unknowable at trace time, and the only safe
    bound, T, would give tokamax T state slots.
    """
    if segment_ids is None or not config.implementation.startswith("tokamax"):
        return None
    if config.max_num_segments is not None:
        return config.max_num_segments
    if isinstance(segment_ids, jax.core.Tracer):
        raise ValueError(
            f"implementation={config.implementation!r} with segment_ids under jit needs "
            f"KDAConfig.max_num_segments, a static bound on the segments in one row"
            f"{' (per rank)' if ranks > 1 else ''}; tokamax keeps one state slot per segment"
        )
    # runs of one id, padding runs included (tokamax's CP gives padding the id before it, so
    # counting them keeps the bound safe)
    slices = np.asarray(segment_ids).reshape(segment_ids.shape[0] * ranks, -1)
    starts = np.concatenate(
        [np.ones((slices.shape[0], 1), bool), slices[:, 1:] != slices[:, :-1]], axis=1
    )
    return int(starts.sum(axis=1).max())


def _fla_names(layer: KimiDeltaAttention) -> dict:
    """fla state_dict name -> (our Variable, converter from the fla array)."""
    linear = lambda w: np.asarray(w).T  # noqa: E731  torch [out, in] -> [in, out]
    same = np.asarray
    names = {}
    for proj in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj"):
        names[f"{proj}.weight"] = (getattr(layer, proj).kernel, linear)
    for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):
        module = getattr(layer, conv)
        if module is not None:
            names[f"{conv}.weight"] = (module.kernel, kernel_from_torch)
    for gate, has_bias in (("f_proj", False), ("g_proj", True)):
        module = getattr(layer, gate)
        if isinstance(module, nnx.Sequential):
            for i, sub in enumerate(module.layers):
                names[f"{gate}.{i}.weight"] = (sub.kernel, linear)
            last, prefix = module.layers[-1], f"{gate}.{len(module.layers) - 1}"
        else:
            names[f"{gate}.weight"] = (module.kernel, linear)
            last, prefix = module, gate
        if has_bias:
            names[f"{prefix}.bias"] = (last.bias, same)
    names["A_log"] = (layer.A_log, same)
    names["dt_bias"] = (layer.dt_bias, same)
    names["o_norm.weight"] = (layer.o_norm, same)
    return names


def load_fla_state_dict(layer: KimiDeltaAttention, state_dict) -> None:
    """Copy an fla state_dict into ``layer`` in place (see from_fla_state_dict)."""
    names = _fla_names(layer)
    given = {
        k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
        for k, v in state_dict.items()
    }
    missing = sorted(set(names) - set(given))
    unexpected = sorted(set(given) - set(names))
    if missing or unexpected:
        raise ValueError(
            "fla state_dict does not match this KDAConfig: "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {unexpected}" if unexpected else "")
            + " (check gate_low_rank, conv_size, value_head_dim; conv biases are not supported)"
        )
    for name, (variable, convert) in names.items():
        value = convert(given[name])
        if value.shape != variable[...].shape:
            raise ValueError(
                f"fla {name}: shape {given[name].shape} converts to {value.shape}, "
                f"but the layer expects {variable[...].shape}"
            )
        variable.set_value(jnp.asarray(value, variable[...].dtype))


def weight_decay_mask(layer: KimiDeltaAttention):
    """Pytree of bools over ``nnx.state(layer, nnx.Param)``: False for A_log, dt_bias, the
    norm weight and biases (no weight decay), True for matmul and conv kernels."""
    params = nnx.state(layer, nnx.Param)
    no_decay = {"A_log", "dt_bias", "o_norm", "bias"}

    def decide(path, _):
        return not any(str(getattr(p, "key", p)) in no_decay for p in path)

    return jax.tree_util.tree_map_with_path(decide, params)
