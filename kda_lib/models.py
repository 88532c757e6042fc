"""Tiny language models: ``embed -> N x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head``.

Residual connections go around the mixer and the MLP. The token mixer is chosen by name from
:data:`MIXERS`:

* ``"kda"``: :class:`kda_lib.KimiDeltaAttention` (short convs + the delta-rule recurrence);
* ``"gdn"``: Gated DeltaNet, the same layer with one decay per head instead of per channel
  (``KDAConfig(per_head_decay=True)``);
* ``"attention"``: :class:`CausalSelfAttention`, causal softmax attention, with RoPE or,
  with ``ModelConfig(rope=False)``, without positional encoding (NoPE, as Kimi Linear's
  attention layers);
* ``"attention_conv"``: the same attention with KDA's short causal convolutions on q, k and v
  (the ablation that shows what the convolution gives the recurrent mixers);
* ``"conv"``: :class:`ConvMixer`, the same layer's short-conv value path and output gate with
  the recurrence removed, so a token sees at most ``conv_size - 1`` tokens back per layer;
* ``"mla"``: :class:`kda_lib.mla.MultiHeadLatentAttention`, multi-head latent attention without
  positional encoding (Kimi Linear's global layers): its decode cache holds one latent of
  ``kv_lora_rank`` numbers per token instead of per-head keys and values.

Layers may mix kinds: ``ModelConfig(layers=("kda", "kda", "kda", "attention"), num_layers=4)``
is Kimi Linear's 3:1 hybrid (the pattern is tiled over ``num_layers``). Decoding keeps one cache
per layer, each of its own kind (:meth:`TinyLM.init_cache`).

More mixers plug in with :func:`register_mixer`; a mixer maps ``[B, T, hidden]`` to
``[B, T, hidden]`` and, for decoding, offers ``init_cache(batch)`` and
``mixer(x, cache=cache) -> (y, new_cache)``. Training lives in :mod:`kda_lib.train`,
generation and decode measurements in :mod:`kda_lib.generate`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib._checks import check_number, check_positive_int, check_token_ids
from kda_lib.conv import ShortConvolution
from kda_lib.layer import KDAConfig, KimiDeltaAttention, weight_decay_mask
from kda_lib.mla import MLAConfig, MultiHeadLatentAttention
from kda_lib.norms import gated_rms_norm


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of :class:`TinyLM`.

    Attributes:
      vocab_size: tokens in and out.
      hidden_size: model width (default 64).
      num_layers: N blocks (default 2).
      mixer: a name in :data:`MIXERS` ("kda", "conv", ...): the mixer of every layer, unless
        ``layers`` is given.
      layers: per-layer mixer pattern, e.g. ``("kda", "kda", "kda", "attention")``, tiled over
        the ``num_layers`` blocks (``num_layers`` must be a multiple of its length); empty (the
        default): ``mixer`` in every layer. A list is stored as a tuple.
      rope: rotary position embedding in the attention layers (default True); False is NoPE,
        as in Kimi Linear, where the KDA layers carry position.
      num_heads, head_dim, value_head_dim: the mixer's H, K, V (V defaults to K).
      conv_size: short-conv width W (default 4).
      lower_bound: None = KDA's softplus gate; a float in [-5, 0) = the safe gate.
      mlp_ratio: MLP width as a multiple of hidden_size (default 2).
      mlp_width: the MLP width itself, overriding ``mlp_ratio`` (used to give models of
        different mixers the same parameter count, see :func:`match_parameter_count`).
      norm_eps: RMSNorm epsilon.
      implementation, chunk_size: the KDA kernel's (see :func:`kda_lib.kda`).
      kv_lora_rank: the ``"mla"`` mixer's latent width r (default None: ``head_dim``); its
        heads use ``num_heads``, ``head_dim`` and ``value_head_dim``.
    """

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    mixer: str = "kda"
    layers: tuple[str, ...] = ()
    rope: bool = True
    num_heads: int = 2
    head_dim: int = 32
    value_head_dim: int | None = None
    conv_size: int = 4
    lower_bound: float | None = None
    mlp_ratio: int = 2
    mlp_width: int | None = None
    norm_eps: float = 1e-5
    implementation: str = "auto"
    chunk_size: int = 64
    kv_lora_rank: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "mlp_ratio"):
            check_positive_int(f"ModelConfig.{name}", getattr(self, name))
        check_number("ModelConfig.norm_eps", self.norm_eps, positive=True)
        if not isinstance(self.mixer, str) or self.mixer not in MIXERS:
            raise ValueError(
                f"ModelConfig.mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}"
            )
        self._check_layers()
        if not isinstance(self.rope, bool):
            raise ValueError(f"ModelConfig.rope must be True or False, got {self.rope!r}")
        if self.mlp_width is not None and (
            isinstance(self.mlp_width, bool)
            or not isinstance(self.mlp_width, int)
            or self.mlp_width < 1
        ):
            raise ValueError(
                f"ModelConfig.mlp_width must be None or a positive int, got {self.mlp_width!r}"
            )
        if self.kv_lora_rank is not None and (
            isinstance(self.kv_lora_rank, bool)
            or not isinstance(self.kv_lora_rank, int)
            or self.kv_lora_rank < 1
        ):
            raise ValueError(
                f"ModelConfig.kv_lora_rank must be None or a positive int, "
                f"got {self.kv_lora_rank!r}"
            )

    def _check_layers(self):
        layers = self.layers
        if isinstance(layers, str) or not isinstance(layers, Sequence):
            raise ValueError(
                f"ModelConfig.layers must be a tuple of mixer names such as "
                f"('kda', 'kda', 'kda', 'attention'), got {layers!r}"
            )
        layers = tuple(layers)
        unknown = [name for name in layers if not isinstance(name, str) or name not in MIXERS]
        if unknown:
            raise ValueError(
                f"ModelConfig.layers names unknown mixers {unknown}; known: {sorted(MIXERS)}"
            )
        if layers and self.num_layers % len(layers):
            raise ValueError(
                f"ModelConfig.num_layers={self.num_layers} is not a multiple of the "
                f"{len(layers)} entries of ModelConfig.layers={layers} (the pattern is tiled "
                f"over the layers; give num_layers={len(layers)} for one copy)"
            )
        object.__setattr__(self, "layers", layers)  # a list becomes a hashable tuple

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        """The mixer name of each of the ``num_layers`` blocks, in order."""
        pattern = self.layers or (self.mixer,)
        return pattern * (self.num_layers // len(pattern))

    @property
    def label(self) -> str:
        """A short name: the mixer for a uniform model, else the pattern run-length encoded,
        e.g. ``"kda3-attention"`` for ``("kda", "kda", "kda", "attention")``."""
        pattern = self.layers or (self.mixer,)
        if len(set(self.layer_mixers)) == 1:
            return self.layer_mixers[0]
        runs: list[list] = []
        for name in pattern:
            if runs and runs[-1][0] == name:
                runs[-1][1] += 1
            else:
                runs.append([name, 1])
        return "-".join(name + (str(count) if count > 1 else "") for name, count in runs)

    @property
    def mlp_hidden(self) -> int:
        """The MLP's inner width: ``mlp_width``, else ``mlp_ratio * hidden_size``."""
        return self.mlp_width or self.mlp_ratio * self.hidden_size

    def kda_config(self) -> KDAConfig:
        """The :class:`kda_lib.KDAConfig` of every mixer layer."""
        return KDAConfig(
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            value_head_dim=self.value_head_dim,
            conv_size=self.conv_size,
            lower_bound=self.lower_bound,
            implementation=self.implementation,
            chunk_size=self.chunk_size,
        )

    @property
    def conv_reach(self) -> int:
        """How many tokens back the convolutions alone can see through all layers:
        ``num_layers * (conv_size - 1)``. A conv-only model is blind beyond it."""
        return self.num_layers * max(self.conv_size - 1, 0)

    def for_layer(self, index: int) -> ModelConfig:
        """This config with ``mixer`` set to layer ``index``'s mixer (what its factory reads)."""
        return dataclasses.replace(self, mixer=self.layer_mixers[index], layers=())


MixerFactory = Callable[[ModelConfig, nnx.Rngs], nnx.Module]


MIXERS: dict[str, MixerFactory] = {}


def register_mixer(name: str):
    """Decorator: ``@register_mixer("name")`` on a ``factory(config, rngs) -> nnx.Module``."""

    def register(factory: MixerFactory) -> MixerFactory:
        MIXERS[name] = factory
        return factory

    return register


def make_mixer(config: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """The token mixer named by ``config.mixer`` (use :meth:`ModelConfig.for_layer` for the
    mixer of one layer of a pattern)."""
    try:
        factory = MIXERS[config.mixer]
    except KeyError:
        raise ValueError(f"unknown mixer {config.mixer!r}; known: {sorted(MIXERS)}") from None
    return factory(config, rngs)


class ConvMixer(nnx.Module):
    """KDA's short-conv path without the recurrence: the ablation that cannot remember.

    ``y = o_proj(rmsnorm(silu(conv(v_proj(x)))) * o_norm * sigmoid(g_proj(x)))`` per head,
    i.e. :class:`kda_lib.KimiDeltaAttention` with the kernel's output replaced by its values
    (no state). Output ``t`` depends on inputs ``t - conv_size + 1 .. t`` only. Parameter names
    match the KDA layer's (``v_proj v_conv1d g_proj o_norm o_proj``).
    """

    def __init__(self, config: KDAConfig, *, rngs: nnx.Rngs):
        if config.conv_size < 1:
            raise ValueError("ConvMixer needs conv_size >= 1 (it has no other way to mix tokens)")
        self.config = config
        h, vd, hidden = config.num_heads, config.value_dim, config.hidden_size
        linear = dict(dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
        self.v_proj = nnx.Linear(hidden, h * vd, use_bias=False, **linear)
        self.v_conv1d = ShortConvolution(
            h * vd,
            conv_size=config.conv_size,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            rngs=rngs,
        )
        self.g_proj = nnx.Linear(hidden, h * vd, use_bias=True, **linear)
        self.o_norm = nnx.Param(jnp.ones((vd,), config.param_dtype))
        self.o_proj = nnx.Linear(h * vd, hidden, use_bias=False, **linear)

    def init_cache(self, batch_size: int) -> jax.Array:
        """Decode state: the last ``conv_size - 1`` value-stream inputs ``[B, W-1, H*V]``."""
        cfg = self.config
        return jnp.zeros((batch_size, cfg.conv_size - 1, cfg.num_heads * cfg.value_dim), cfg.dtype)

    def __call__(self, x: jax.Array, *, cache: jax.Array | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, vd = cfg.num_heads, cfg.value_dim
        if cache is not None:
            want = (batch, cfg.conv_size - 1, h * vd)
            if not hasattr(cache, "shape") or tuple(cache.shape) != want:
                got = tuple(cache.shape) if hasattr(cache, "shape") else type(cache).__name__
                raise ValueError(
                    f"cache for a conv layer must be an array of shape [B, W-1, H*V] = {want}, "
                    f"got {got}; build it with model.init_cache({batch})"
                )
        x = x.astype(cfg.dtype)
        o, new_cache = self.v_conv1d(self.v_proj(x), conv_state=cache)
        gate = self.g_proj(x).reshape(batch, seq_len, h, vd)
        normed = gated_rms_norm(
            o.reshape(batch, seq_len, h, vd), self.o_norm[...], gate, eps=cfg.norm_eps
        )
        y = self.o_proj(normed.astype(cfg.dtype).reshape(batch, seq_len, h * vd))
        return y if cache is None else (y, new_cache)


def rotary_embedding(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotate channel pairs ``(i, i + D/2)`` of ``x [B, T, H, D]`` by ``positions [T] * freq_i``
    (RoPE), so a query-key dot product depends on positions only through their difference."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs  # [T, D/2]
    cos, sin = jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]  # [T, 1, D/2]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


class AttentionCache(NamedTuple):
    """Decode state of :class:`CausalSelfAttention`: the keys and values of every token seen.

    Two kinds, told apart by ``length``:

    * growing (``length`` None, from ``init_cache(B)``): ``keys [B, T_seen, H, K]`` and
      ``values [B, T_seen, H, V]`` gain a row per token (a new shape, so a new compilation,
      per decode step under jit);
    * fixed capacity (``length`` an int32 scalar, from ``init_cache(B, max_len=C)``): buffers
      ``[B, C, H, K]`` and ``[B, C, H, V]`` of which the first ``length`` rows are filled. Every
      step has the same shapes, so one compiled step serves a whole generation; writing past
      ``C`` makes the outputs NaN (and raises outside jit).

    Either way the memory is linear in the context (the contrast with KDA's fixed state).
    ``q_conv, k_conv, v_conv``: the short convolutions' last ``W - 1`` inputs for the
    ``attention_conv`` mixer, else None.
    """

    keys: jax.Array
    values: jax.Array
    length: jax.Array | None = None
    q_conv: jax.Array | None = None
    k_conv: jax.Array | None = None
    v_conv: jax.Array | None = None

    @property
    def seen(self):
        """Tokens seen so far (an int for a growing cache, an int32 array for a fixed one)."""
        return self.keys.shape[1] if self.length is None else self.length


class CausalSelfAttention(nnx.Module):
    """Multi-head causal softmax attention: the quadratic baseline.

    ``y = o_proj(softmax(mask(q k^T / sqrt(K))) v)`` per head, scores and softmax in float32,
    with ``q, k`` rotated by their positions (RoPE) when ``rope`` is True and used as they are
    (NoPE) otherwise. With ``short_conv`` the projections of q, k and v first go through the
    same depthwise causal convolution + SiLU as in the KDA layer (width ``conv_size``). Uses the
    mixer's H, K and V (``num_heads``, ``head_dim``, ``value_dim``) of the
    :class:`kda_lib.KDAConfig`; it has no gate or decay.
    """

    def __init__(
        self, config: KDAConfig, *, rngs: nnx.Rngs, rope: bool = True, short_conv: bool = False
    ):
        if rope and config.head_dim % 2:
            raise ValueError(f"attention needs an even head_dim for RoPE, got {config.head_dim}")
        if short_conv and config.conv_size < 1:
            raise ValueError(f"short_conv needs conv_size >= 1, got {config.conv_size}")
        self.config = config
        self.rope = rope
        self.short_conv = short_conv
        h, kd, vd, hidden = config.num_heads, config.head_dim, config.value_dim, config.hidden_size
        linear = dict(use_bias=False, dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(hidden, h * kd, **linear)
        self.k_proj = nnx.Linear(hidden, h * kd, **linear)
        self.v_proj = nnx.Linear(hidden, h * vd, **linear)
        if short_conv:
            conv = dict(
                conv_size=config.conv_size,
                dtype=config.dtype,
                param_dtype=config.param_dtype,
                rngs=rngs,
            )
            self.q_conv1d = ShortConvolution(h * kd, **conv)
            self.k_conv1d = ShortConvolution(h * kd, **conv)
            self.v_conv1d = ShortConvolution(h * vd, **conv)
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> AttentionCache:
        """An empty cache: growing (``max_len`` None) or with room for ``max_len`` tokens."""
        cfg = self.config
        capacity = 0 if max_len is None else max_len
        if max_len is not None and (
            isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1
        ):
            raise ValueError(f"max_len must be None or a positive int, got {max_len!r}")
        shape = (batch_size, capacity, cfg.num_heads)
        convs = (None, None, None)
        if self.short_conv:
            width = cfg.conv_size - 1
            h, kd, vd = cfg.num_heads, cfg.head_dim, cfg.value_dim
            convs = tuple(
                jnp.zeros((batch_size, width, c), cfg.dtype) for c in (h * kd, h * kd, h * vd)
            )
        return AttentionCache(
            jnp.zeros((*shape, cfg.head_dim), cfg.dtype),
            jnp.zeros((*shape, cfg.value_dim), cfg.dtype),
            None if max_len is None else jnp.zeros((), jnp.int32),
            *convs,
        )

    def _project(self, x, cache):
        """q, k, v ``[B, T, H*D]`` and the new conv states (None without short_conv)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if not self.short_conv:
            return (q, k, v), (None, None, None)
        states = (None, None, None) if cache is None else (cache.q_conv, cache.k_conv, cache.v_conv)
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        pairs = [
            conv(a, conv_state=state)
            for conv, a, state in zip(convs, (q, k, v), states, strict=True)
        ]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)

    def _check_cache(self, cache, batch: int) -> None:
        """A cache from this layer's ``init_cache(batch)`` (or a call's result), before any work:
        a cache of another mixer, batch size or head shape is a ValueError naming it."""
        cfg = self.config
        build = f"build it with model.init_cache({batch}) (or pass on the cache a call returned)"
        if not isinstance(cache, AttentionCache):
            raise ValueError(
                f"cache for an attention layer must be an AttentionCache, got "
                f"{type(cache).__name__} (a cache of a model with another layer order?); {build}"
            )
        h, kd, vd = cfg.num_heads, cfg.head_dim, cfg.value_dim
        keys, values = cache.keys, cache.values
        if not all(hasattr(a, "shape") for a in (keys, values)):
            raise ValueError(f"cache.keys and cache.values must be arrays; {build}")
        seen = keys.shape[1] if keys.ndim == 4 else None
        for name, got, want in (
            ("keys", keys, (batch, seen, h, kd)),
            ("values", values, (batch, seen, h, vd)),
        ):
            if tuple(got.shape) != want:
                raise ValueError(
                    f"cache.{name} has shape {tuple(got.shape)}, expected [B, T_seen, H, D] = "
                    f"{want} (batch size {batch}, {h} heads of {kd if name == 'keys' else vd}); "
                    f"{build}"
                )
        width = cfg.conv_size - 1
        convs = (h * kd, h * kd, h * vd) if self.short_conv else (None, None, None)
        for name, channels in zip(("q_conv", "k_conv", "v_conv"), convs, strict=True):
            got = getattr(cache, name)
            want = None if channels is None else (batch, width, channels)
            if (got is None) != (want is None) or (got is not None and tuple(got.shape) != want):
                raise ValueError(
                    f"cache.{name} has shape {None if got is None else tuple(got.shape)}, "
                    f"expected {want}; {build}"
                )

    def __call__(self, x: jax.Array, *, cache: AttentionCache | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, kd, vd = cfg.num_heads, cfg.head_dim, cfg.value_dim
        if cache is not None:
            self._check_cache(cache, batch)
        x = x.astype(cfg.dtype)
        seen = 0 if cache is None else cache.seen
        positions = seen + jnp.arange(seq_len)
        (q, k, v), conv_states = self._project(x, cache)
        q, k = q.reshape(batch, seq_len, h, kd), k.reshape(batch, seq_len, h, kd)
        v = v.reshape(batch, seq_len, h, vd)
        if self.rope:
            q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)
        overflow = False
        if cache is not None and cache.length is None:  # growing: append
            k = jnp.concatenate([cache.keys, k.astype(cache.keys.dtype)], axis=1)
            v = jnp.concatenate([cache.values, v.astype(cache.values.dtype)], axis=1)
        elif cache is not None:  # fixed capacity: write at `length`
            capacity = cache.keys.shape[1]
            overflow = cache.length + seq_len > capacity
            if seq_len > capacity or (not isinstance(overflow, jax.core.Tracer) and bool(overflow)):
                filled = "?" if isinstance(overflow, jax.core.Tracer) else int(cache.length)
                raise ValueError(
                    f"the attention cache holds {capacity} tokens; {filled} are "
                    f"filled, {seq_len} more do not fit (init_cache(..., max_len=...))"
                )
            start = (0, cache.length, 0, 0)
            k = jax.lax.dynamic_update_slice(cache.keys, k.astype(cache.keys.dtype), start)
            v = jax.lax.dynamic_update_slice(cache.values, v.astype(cache.values.dtype), start)
        scores = jnp.einsum("bthk,bshk->bhts", q.astype(jnp.float32), k.astype(jnp.float32))
        causal = positions[:, None] >= jnp.arange(k.shape[1])[None, :]  # [T, keys]
        scores = jnp.where(causal, scores * kd**-0.5, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhts,bshv->bthv", weights, v.astype(jnp.float32))
        o = jnp.where(overflow, jnp.nan, o)
        y = self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, h * vd))
        if cache is None:
            return y
        length = None if cache.length is None else cache.length + seq_len
        return y, AttentionCache(k, v, length, *conv_states)


@register_mixer("kda")
def _kda_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return KimiDeltaAttention(config.kda_config(), rngs=rngs)


@register_mixer("gdn")
def _gated_deltanet_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Gated DeltaNet: the KDA layer with one forget-gate value per head (not per channel)."""
    return KimiDeltaAttention(
        dataclasses.replace(config.kda_config(), per_head_decay=True), rngs=rngs
    )


@register_mixer("attention")
def _attention_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return CausalSelfAttention(config.kda_config(), rngs=rngs, rope=config.rope)


@register_mixer("attention_conv")
def _attention_conv_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Softmax attention with KDA's short convolutions on q, k and v."""
    return CausalSelfAttention(config.kda_config(), rngs=rngs, rope=config.rope, short_conv=True)


@register_mixer("conv")
def _conv_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return ConvMixer(config.kda_config(), rngs=rngs)


@register_mixer("mla")
def _mla_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Multi-head latent attention, NoPE (Kimi Linear's global layers)."""
    kda = config.kda_config()
    mla = MLAConfig(
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        qk_head_dim=config.head_dim,
        v_head_dim=kda.value_dim,
        kv_lora_rank=config.kv_lora_rank or config.head_dim,
        norm_eps=config.norm_eps,
    )
    return MultiHeadLatentAttention(mla, rngs=rngs)


class MLP(nnx.Module):
    """``down(gelu(up(x)))``."""

    def __init__(self, hidden: int, width: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(hidden, width, rngs=rngs)
        self.down = nnx.Linear(width, hidden, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    """Pre-norm residual block: ``x + mixer(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        """``config.mixer`` names this block's mixer (see :meth:`ModelConfig.for_layer`)."""
        hidden = config.hidden_size
        self.mixer_norm = nnx.RMSNorm(hidden, epsilon=config.norm_eps, rngs=rngs)
        self.mixer = make_mixer(config, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(hidden, epsilon=config.norm_eps, rngs=rngs)
        self.mlp = MLP(hidden, config.mlp_hidden, rngs=rngs)

    def __call__(self, x, *, cache=None):
        mixed = self.mixer(self.mixer_norm(x), cache=cache)
        if cache is not None:
            mixed, cache = mixed
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return x if cache is None else (x, cache)


class TinyLM(nnx.Module):
    """``embed -> N x Block -> RMSNorm -> head``: tokens ``[B, T]`` -> logits ``[B, T, vocab]``.

    Block ``i`` uses the mixer ``config.layer_mixers[i]`` (one mixer everywhere, or a pattern
    such as Kimi Linear's 3:1 KDA/attention hybrid). ``model(tokens,
    cache=model.init_cache(B))`` also returns the per-layer caches after the tokens, one per
    block and each of its own kind (a :class:`kda_lib.layer.KDACache` with a fixed
    ``[B, H, K, V]`` state for KDA and GDN layers, an :class:`AttentionCache` that grows with
    the context for attention layers), so decoding can continue from them.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.blocks = nnx.List(
            [Block(config.for_layer(i), rngs=rngs) for i in range(config.num_layers)]
        )
        self.final_norm = nnx.RMSNorm(config.hidden_size, epsilon=config.norm_eps, rngs=rngs)
        self.head = nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False, rngs=rngs)

    def init_cache(self, batch_size: int, *, max_len: int | None = None) -> tuple:
        """One empty cache per block (see the mixers' ``init_cache``). ``max_len``: room for
        that many tokens in every attention and MLA cache (fixed shapes, one compiled decode
        step); None: those caches grow by concatenation. Other mixers' caches do not depend
        on it."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        caches = []
        for block in self.blocks:
            if isinstance(block.mixer, (CausalSelfAttention, MultiHeadLatentAttention)):
                caches.append(block.mixer.init_cache(batch_size, max_len=max_len))
            else:
                caches.append(block.mixer.init_cache(batch_size))
        return tuple(caches)

    def __call__(self, tokens: jax.Array, *, cache: tuple | None = None):
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [B, T], got {tokens.shape}")
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(
                f"cache must hold one entry per block ({len(self.blocks)}), got {len(cache)}"
            )
        check_token_ids("tokens", tokens, self.config.vocab_size)
        x = self.embed(tokens)
        new_cache = []
        for i, block in enumerate(self.blocks):
            if cache is None:
                x = block(x)
            else:
                x, layer_cache = block(x, cache=cache[i])
                new_cache.append(layer_cache)
        logits = self.head(self.final_norm(x))
        return logits if cache is None else (logits, tuple(new_cache))


def count_params(model: nnx.Module) -> int:
    """Number of trainable scalars."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def config_param_count(config: ModelConfig) -> int:
    """:func:`count_params` of ``TinyLM(config)``, from shapes only (nothing is initialised)."""
    model = nnx.eval_shape(lambda: TinyLM(config, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def match_parameter_count(config: ModelConfig, target: int) -> ModelConfig:
    """``config`` with the ``mlp_width`` whose parameter count is nearest ``target``.

    The MLPs are the one part every mixer shares, and their size is linear in the width
    (``(2 hidden + 1)`` scalars per unit and layer), so models with different mixers can be
    brought to (almost) the same size by their MLP alone, as in equal-size comparisons.

    Raises:
      ValueError: ``target`` is smaller than the model without its MLP units allows.
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise ValueError(f"target must be a positive int, got {target!r}")
    one = config_param_count(dataclasses.replace(config, mlp_width=1))
    per_unit = config.num_layers * (2 * config.hidden_size + 1)
    width = round((target - one) / per_unit) + 1
    if width < 1:
        raise ValueError(
            f"target={target} parameters is below what {config.label} needs with a 1-unit MLP "
            f"({one})"
        )
    return dataclasses.replace(config, mlp_width=width)


def parameter_path_names(path) -> tuple[str, ...]:
    """('blocks', '0', 'mixer', 'A_log') from a pytree path over nnx.state (no '.value')."""
    names = []
    for entry in path:
        key = getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry)))
        names.append(str(key))
    return tuple(n for n in names if n != "value")


def decay_mask(model: nnx.Module) -> dict[tuple[str, ...], bool]:
    """Parameter path (``('blocks', '0', 'mixer', 'A_log')``) -> whether AdamW decays it: the
    project's one policy, :func:`kda_lib.layer.weight_decay_mask` (no decay for ``A_log``,
    ``dt_bias``, norm weights, biases and embeddings; matmul and conv kernels decay)."""
    return {
        parameter_path_names(path): bool(decay)
        for path, decay in jax.tree_util.tree_leaves_with_path(weight_decay_mask(model))
    }
