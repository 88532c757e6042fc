"""A Mamba2-style token mixer on the KDA layer's scaffolding: scalar decay, no delta rule.

``y = o_proj(gated_rmsnorm(o, o_norm, g_proj(x)))`` with ``o`` from
:func:`kda_lib.ops.scalar_decay.scalar_decay_chunked` per head::

    S <- a_t S + k_t v_t^T,   o_t = scale q_t^T S,   a_t = exp(-exp(A_log) softplus(f_t + dt_bias))

where ``q, k, v`` are projections of ``x`` through KDA's short causal convolutions (+ SiLU),
``q`` and ``k`` L2-normalised (as in the KDA and Gated DeltaNet layers, so the three
recurrent mixers differ only in their state update), ``f_t = f_proj(x_t)`` one number per head
and ``A_log``, ``dt_bias`` per head (Mamba2's ``-A dt`` decay, KDA's initialisation). Against
Gated DeltaNet (``"gdn"``) it lacks the delta rule (and its ``beta``); against KDA also the
per-channel decay. Parameter names follow the KDA layer's where the part is the same.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.checks import check_int, check_number, check_positive_int
from kda_lib.layers.attention import check_hidden, checked_segments
from kda_lib.layers.conv import qkv_convolutions
from kda_lib.layers.params import NO_DECAY, check_parameters_fit, no_decay_param
from kda_lib.ops.gating import init_a_log, init_dt_bias
from kda_lib.ops.norms import gated_rms_norm, l2_normalize
from kda_lib.ops.scalar_decay import scalar_decay_chunked, scalar_decay_recurrent
from kda_lib.ops.segments import segment_starts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mamba2Config:
    """Sizes of :class:`Mamba2Mixer`, named as :class:`kda_lib.KDAConfig` names them:
    ``hidden_size`` in and out, ``num_heads`` heads of ``head_dim`` (K, q and k) and
    ``value_head_dim`` (V, None = K) channels, conv width ``conv_size`` (0: no conv, SiLU
    only), the output norm's ``norm_eps`` and the chunk length of the kernel."""

    hidden_size: int
    num_heads: int
    head_dim: int
    value_head_dim: int | None = None
    conv_size: int = 4
    norm_eps: float = 1e-5
    chunk_size: int = 64

    def __post_init__(self):
        for name in ("hidden_size", "num_heads", "head_dim", "chunk_size"):
            check_positive_int(f"Mamba2Config.{name}", getattr(self, name))
        if self.value_head_dim is not None:
            check_positive_int("Mamba2Config.value_head_dim", self.value_head_dim)
        check_positive_int("Mamba2Config.conv_size", self.conv_size, minimum=0)
        check_number("Mamba2Config.norm_eps", self.norm_eps, positive=True)

    @property
    def value_dim(self) -> int:
        """V: ``value_head_dim``, else ``head_dim``."""
        return self.value_head_dim or self.head_dim


class Mamba2Cache(NamedTuple):
    """Decode state: the recurrent state and the last ``W - 1`` conv inputs per stream."""

    state: jax.Array  # [B, H, K, V] float32
    q_conv: jax.Array | None  # [B, W-1, H*K]
    k_conv: jax.Array | None  # [B, W-1, H*K]
    v_conv: jax.Array | None  # [B, W-1, H*V]


class Mamba2Mixer(nnx.Module):
    """``layer(x [B, T, hidden]) -> [B, T, hidden]``; ``layer(x, cache=c) -> (y, new_cache)``."""

    def __init__(self, config: Mamba2Config, *, rngs: nnx.Rngs):
        check_parameters_fit(Mamba2Mixer, config)
        cfg = self.config = config
        h, kd, vd, hidden = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.hidden_size
        linear = dict(use_bias=False, rngs=rngs)
        self.q_proj = nnx.Linear(hidden, h * kd, **linear)
        self.k_proj = nnx.Linear(hidden, h * kd, **linear)
        self.v_proj = nnx.Linear(hidden, h * vd, **linear)
        if cfg.conv_size:
            self.q_conv1d, self.k_conv1d, self.v_conv1d = qkv_convolutions(
                h * kd, h * vd, cfg.conv_size, rngs=rngs
            )
        else:
            self.q_conv1d = self.k_conv1d = self.v_conv1d = None
        self.f_proj = nnx.Linear(hidden, h, **linear)
        self.A_log = no_decay_param(init_a_log(rngs.params(), h))
        self.dt_bias = no_decay_param(init_dt_bias(rngs.params(), h, 1))
        self.g_proj = nnx.Linear(hidden, h * vd, bias_metadata=NO_DECAY, rngs=rngs)
        self.o_norm = no_decay_param(jnp.ones((vd,), jnp.float32))
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    def _cache_shapes(self, batch_size: int) -> Mamba2Cache:
        cfg = self.config
        h, kd, vd, width = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.conv_size - 1
        state = (batch_size, h, kd, vd)
        if not cfg.conv_size:
            return Mamba2Cache(state, None, None, None)
        return Mamba2Cache(
            state,
            (batch_size, width, h * kd),
            (batch_size, width, h * kd),
            (batch_size, width, h * vd),
        )

    def init_cache(self, batch_size: int) -> Mamba2Cache:
        """Zero state and zero conv history for ``batch_size`` rows."""
        shapes = self._cache_shapes(check_int("init_cache: batch_size", batch_size))
        return Mamba2Cache(*(None if s is None else jnp.zeros(s, jnp.float32) for s in shapes))

    def _check(self, x, cache) -> None:
        check_hidden(x, self.config.hidden_size)
        if cache is None:
            return
        want = self._cache_shapes(x.shape[0])
        got = [None if c is None else getattr(c, "shape", c) for c in cache]
        if not isinstance(cache, Mamba2Cache) or [tuple(g or ()) for g in got] != [
            tuple(w or ()) for w in want
        ]:
            raise ValueError(
                f"cache must be a Mamba2Cache of shapes {tuple(want)}, got {got}; build it with "
                f"layer.init_cache({x.shape[0]})"
            )

    def __call__(
        self,
        x: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        cache: Mamba2Cache | None = None,
    ):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` with a cache. ``segment_ids
        [B, T]`` (int, 0 = padding, not with a cache): the state restarts at every segment
        start, the convs stay inside their segment, padding outputs 0 (the one segment rule);
        this runs the token-by-token recurrence (the chunked form has no segment masks)."""
        self._check(x, cache)
        segment_ids = checked_segments(segment_ids, cache, *x.shape[:2])
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, kd, vd = cfg.num_heads, cfg.head_dim, cfg.value_dim
        x = x.astype(jnp.float32)
        streams, conv_states = [], []
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        projs = (self.q_proj, self.k_proj, self.v_proj)
        for i, (proj, conv) in enumerate(zip(projs, convs, strict=True)):
            state = None if cache is None else cache[1 + i]
            z, state = (
                (jax.nn.silu(proj(x)), None)
                if conv is None
                else conv(proj(x), conv_state=state, segment_ids=segment_ids)
            )
            streams.append(z)
            conv_states.append(state)
        q = l2_normalize(streams[0].reshape(batch, seq_len, h, kd), keep_float32=True)
        k = l2_normalize(streams[1].reshape(batch, seq_len, h, kd), keep_float32=True)
        v = streams[2].reshape(batch, seq_len, h, vd)
        rate = jnp.exp(self.A_log[...])
        g = -rate * jax.nn.softplus(self.f_proj(x).astype(jnp.float32) + self.dt_bias[...])
        if segment_ids is None:
            o, final = scalar_decay_chunked(
                q,
                k,
                v,
                g,
                initial_state=None if cache is None else cache.state,
                chunk_size=cfg.chunk_size,
            )
        else:  # padding neither decays nor writes; a segment start drops the carried state
            real = segment_ids != 0
            k = jnp.where(real[..., None, None], k, 0.0)
            g = jnp.where(real[..., None], g, 0.0)
            o, final = scalar_decay_recurrent(q, k, v, g, resets=segment_starts(segment_ids))
        gate = self.g_proj(x).reshape(batch, seq_len, h, vd)
        normed = gated_rms_norm(o, self.o_norm[...], gate, eps=cfg.norm_eps)
        y = self.o_proj(normed.reshape(batch, seq_len, h * vd))
        if segment_ids is not None:
            y = jnp.where((segment_ids != 0)[..., None], y, 0.0)
        return y if cache is None else (y, Mamba2Cache(final, *conv_states))
