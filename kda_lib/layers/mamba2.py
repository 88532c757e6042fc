"""Two token mixers on the KDA layer's scaffolding: Mamba2-style (scalar decay, no delta rule)
and :class:`ConvMixer` (KDA's short-conv path alone).

``y = o_proj(gated_rmsnorm(o, o_norm, g_proj(x)))`` with ``o`` per head from
:func:`kda_lib.ops.scalar_decay.scalar_decay_chunked`; per head, with the step size
``dt_t = softplus(f_t + dt_bias)`` and ``A = -exp(A_log)`` (:func:`discretize`)::

    S <- exp(dt_t A) S + w_t k_t v_t^T,   o_t = scale q_t^T S

``w_t = dt_t`` with ``scale_writes=True`` (the ``"mamba2_dt"`` mixer): Mamba2's
discretisation, ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t`` with ``k`` as B, ``v`` as x and
``q`` as C; ``w_t = 1`` with ``scale_writes=False`` (the ``"mamba2"`` mixer, the default): a
stand-in whose step size sets the decay alone, so a small step keeps the state and still
writes in full. ``q, k, v``: projections of ``x`` through KDA's short causal convs (+ SiLU),
q and k L2-normalised (Mamba2 normalises neither and adds a skip ``D x``: neither mixer has
that); ``f_t = f_proj(x_t)`` one number per head; the KDA layer's parameter names.
"""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.checks import check_int
from kda_lib.layers.attention import Widths, check_call, check_fields, mix_convs
from kda_lib.layers.conv import ShortConvolution
from kda_lib.layers.kda_layer import WIDTH_FIELDS, KDACache, KDAConfig, KimiDeltaAttention
from kda_lib.layers.params import NO_DECAY, check_parameters_fit, no_decay_param
from kda_lib.ops.gating import init_a_log, init_dt_bias
from kda_lib.ops.norms import gated_rms_norm, l2_normalize
from kda_lib.ops.scalar_decay import scalar_decay_chunked, scalar_decay_recurrent
from kda_lib.ops.segments import segment_starts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mamba2Config(Widths):
    """Sizes of :class:`Mamba2Mixer`, named as in :class:`kda_lib.KDAConfig`: ``hidden_size``;
    ``num_heads`` H of ``head_dim`` K and ``value_head_dim`` V (None = K); ``conv_size`` W (4;
    0: SiLU only); ``norm_eps`` (1e-5); ``chunk_size`` of the kernel (64); ``scale_writes``
    (False): each write scaled by the step size ``dt_t``, Mamba2's discretisation (module
    docstring; False: the stand-in whose writes are not scaled)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    value_head_dim: int | None = None
    conv_size: int = 4
    norm_eps: float = 1e-5
    chunk_size: int = 64
    scale_writes: bool = False

    def __post_init__(self):
        check_fields(self, int="hidden_size num_heads head_dim chunk_size", width="value_head_dim",
                     int0="conv_size", eps="norm_eps", bool="scale_writes")  # fmt: skip


# decode state with KDACache's fields (its own type: a KDA layer refuses it)
Mamba2Cache = namedtuple("Mamba2Cache", KDACache._fields)


class Mamba2Mixer(nnx.Module):
    """``layer(x [B, T, hidden]) -> [B, T, hidden]``; ``layer(x, cache=c) -> (y, new_cache)``."""

    cache_type, cache_kind = Mamba2Cache, "a Mamba2Cache"

    def __init__(self, config: Mamba2Config, *, rngs: nnx.Rngs):
        check_parameters_fit(Mamba2Mixer, config)
        cfg = self.config = config
        h, kd, vd, hidden = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.hidden_size
        linear = dict(use_bias=False, rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj = (nnx.Linear(hidden, h * d, **linear)
                                                 for d in (kd, kd, vd))  # fmt: skip
        convs = cfg.conv_size and [
            ShortConvolution(c, cfg.conv_size, rngs=rngs) for c in (h * kd, h * kd, h * vd)
        ]
        self.q_conv1d, self.k_conv1d, self.v_conv1d = convs or (None,) * 3
        self.f_proj = nnx.Linear(hidden, h, **linear)
        self.A_log = no_decay_param(init_a_log(rngs.params(), h))
        self.dt_bias = no_decay_param(init_dt_bias(rngs.params(), h, 1))
        self.g_proj = nnx.Linear(hidden, h * vd, bias_metadata=NO_DECAY, rngs=rngs)
        self.o_norm = no_decay_param(jnp.ones((vd,), jnp.float32))
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    def __call__(self, x: jax.Array, *, segment_ids=None, cache: Mamba2Cache | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` with a cache. ``segment_ids
        [B, T]`` (int, 0 = padding, not with a cache; runs the recurrent form): the state
        restarts at every segment start, the convs stay inside it, padding outputs 0."""
        cfg = self.config
        segment_ids, _ = check_call(self, x, segment_ids, cache)
        batch, seq_len, _ = x.shape
        x = x.astype(jnp.float32)
        streams = [proj(x) for proj in (self.q_proj, self.k_proj, self.v_proj)]
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        states = None if cache is None else cache[1:]
        streams, conv_states = mix_convs(convs, streams, states, segment_ids)
        q, k, v = (z.reshape(batch, seq_len, cfg.num_heads, -1) for z in streams)
        q, k = l2_normalize(q, keep_float32=True), l2_normalize(k, keep_float32=True)
        g, k = discretize(self.f_proj(x), self.A_log[...], self.dt_bias[...], k,
                          scale_writes=cfg.scale_writes)  # fmt: skip
        if segment_ids is None:
            initial = None if cache is None else cache.state
            o, final = scalar_decay_chunked(q, k, v, g, initial_state=initial,
                                            chunk_size=cfg.chunk_size)  # fmt: skip
        else:  # padding neither decays nor writes; a segment start drops the carried state
            real = segment_ids != 0
            k = jnp.where(real[..., None, None], k, 0.0)
            g = jnp.where(real[..., None], g, 0.0)
            o, final = scalar_decay_recurrent(q, k, v, g, resets=segment_starts(segment_ids))
        y = gated_output(self, o, x, segment_ids)
        return y if cache is None else (y, Mamba2Cache(final, *conv_states))

    # zero state and conv history, as the KDA layer's (Mamba2Cache has KDACache's fields)
    init_cache, _cache_shapes = KimiDeltaAttention.init_cache, KimiDeltaAttention._cache_shapes


def discretize(f, a_log, dt_bias, k, *, scale_writes: bool):
    """``(g, k_written)``: the log decay ``g = dt A`` ``[B, T, H]`` and the write's key, ``dt k``
    with ``scale_writes`` (Mamba2's discretisation), else ``k`` (the stand-in), from the gate
    input ``f [B, T, H]``, ``a_log``, ``dt_bias [H]`` and ``k [B, T, H, K]``; the step size is
    ``dt = softplus(f + dt_bias)`` and ``A = -exp(a_log)``."""
    dt = jax.nn.softplus(f + dt_bias)
    g = -jnp.exp(a_log) * dt
    return g, (dt[..., None] * k if scale_writes else k)


class ConvMixer(nnx.Module):
    """KDA's short-conv path alone: ``y = o_proj(gated_rmsnorm(silu(conv(v_proj(x))), o_norm,
    g_proj(x)))`` per value head, from a :class:`kda_lib.KDAConfig` (value heads, ``conv_size``
    W >= 1, ``norm_eps``, dtypes), with the KDA layer's parameter names."""

    def __init__(self, config: KDAConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, KDAConfig):
            raise ValueError(f"ConvMixer config must be a KDAConfig, got {config!r}")
        check_parameters_fit(ConvMixer, config, fields=WIDTH_FIELDS)
        self.config = config
        hidden, channels = config.hidden_size, config.value_heads * config.value_dim
        dtypes = dict(dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
        self.v_proj = nnx.Linear(hidden, channels, use_bias=False, **dtypes)
        self.v_conv1d = ShortConvolution(channels, conv_size=config.conv_size, **dtypes)
        self.g_proj = nnx.Linear(hidden, channels, bias_metadata=NO_DECAY, **dtypes)
        self.o_norm = no_decay_param(jnp.ones((config.value_dim,), config.param_dtype))
        self.o_proj = nnx.Linear(channels, hidden, use_bias=False, **dtypes)

    def __call__(self, x: jax.Array, *, segment_ids=None, cache: jax.Array | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given.
        ``segment_ids [B, T]`` (not with a cache): the taps stay inside a segment."""
        cfg = self.config
        segment_ids, _ = check_call(self, x, segment_ids, cache)
        batch, seq_len, _ = x.shape
        got, want = getattr(cache, "shape", type(cache).__name__), self._cache_shape(batch)
        if cache is not None and got != want:
            raise ValueError(f"cache for a conv layer must be an array of shape [B, W-1, H*V] = "
                             f"{want}, got {got}; build it with init_cache({batch})")  # fmt: skip
        x = x.astype(cfg.dtype)
        states = None if cache is None else (cache,)
        (o,), (new_cache,) = mix_convs((self.v_conv1d,), (self.v_proj(x),), states, segment_ids)
        y = gated_output(self, o.reshape(batch, seq_len, cfg.value_heads, -1), x, segment_ids)
        return y if cache is None else (y, new_cache)

    def init_cache(self, batch_size: int) -> jax.Array:
        """Decode state: the last ``W - 1`` value-stream inputs ``[B, W-1, H*V]``."""
        batch_size = check_int("init_cache: batch_size", batch_size)
        return jnp.zeros(self._cache_shape(batch_size), self.config.dtype)

    def _cache_shape(self, batch: int) -> tuple:
        return (batch, self.config.conv_size - 1, self.config.value_heads * self.config.value_dim)


def gated_output(layer, o, x, segment_ids) -> jax.Array:
    """``o_proj(gated_rmsnorm(o [B, T, H, V], o_norm, g_proj(x)))``, 0 at padding (id 0)."""
    gate = layer.g_proj(x).reshape(o.shape)
    normed = gated_rms_norm(o, layer.o_norm[...], gate, eps=layer.config.norm_eps)
    y = layer.o_proj(normed.astype(x.dtype).reshape(*x.shape[:2], -1))
    return y if segment_ids is None else jnp.where((segment_ids != 0)[..., None], y, 0.0)
