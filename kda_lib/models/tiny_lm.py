"""Tiny language models: ``embed -> N x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head``.

Residual connections go around the mixer and the MLP. The token mixer is chosen by name from
:data:`MIXERS`:

* ``"kda"``: :class:`kda_lib.KimiDeltaAttention` (short convs + the delta-rule recurrence);
* ``"gdn"``: Gated DeltaNet, the same layer with one decay per head instead of per channel
  (``KDAConfig(per_head_decay=True)``);
* ``"attention"``: :class:`kda_lib.layers.attention.CausalSelfAttention`, causal softmax attention,
  with RoPE or, with ``ModelConfig(rope=False)``, without positional encoding (NoPE, as Kimi
  Linear's attention layers);
* ``"attention_conv"``: the same attention with KDA's short causal convolutions on q, k and v
  (the ablation that shows what the convolution gives the recurrent mixers);
* ``"mamba2"``: :class:`kda_lib.layers.mamba2.Mamba2Mixer`, a Mamba2-style mixer: one decay
  per head and no delta rule (``S <- a_t S + k_t v_t^T``), on the same projections, short
  convs and gated output norm (the paper's third baseline beside GDN);
* ``"conv"``: :class:`ConvMixer`, the same layer's short-conv value path and output gate with
  the recurrence removed, so a token sees at most ``conv_size - 1`` tokens back per layer;
* ``"mla"``: :class:`kda_lib.layers.mla.MultiHeadLatentAttention`, multi-head latent attention
without
  positional encoding (Kimi Linear's global layers): its decode cache holds one latent of
  ``kv_lora_rank`` numbers per token instead of per-head keys and values.

Layers may mix kinds: ``ModelConfig(layers=("kda", "kda", "kda", "attention"), num_layers=4)``
is Kimi Linear's 3:1 hybrid (the pattern is tiled over ``num_layers``). Decoding keeps one cache
per layer, each of its own kind (:meth:`TinyLM.init_cache`).

More mixers plug in with :func:`register_mixer`; a mixer maps ``[B, T, hidden]`` to
``[B, T, hidden]`` and, for decoding, offers ``init_cache(batch)`` and
``mixer(x, cache=cache) -> (y, new_cache)``. Training lives in :mod:`kda_lib.lab.train`,
generation and decode measurements in :mod:`kda_lib.lab.generate`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from types import MappingProxyType

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.checks import check_int, check_positive_int, check_token_ids, shared_fields
from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
from kda_lib.layers.conv import ShortConvolution
from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.layers.mamba2 import Mamba2Config, Mamba2Mixer
from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention
from kda_lib.layers.params import (
    NO_DECAY,
    check_parameters_fit,
    no_decay_param,
    parameter_count,
    weight_decay_mask,
)
from kda_lib.ops.norms import gated_rms_norm

# The token mixer's config when none is given: H = 2 heads of K = V = 32 on a width of 64
MIXER_DEFAULTS = MappingProxyType(dict(hidden_size=64, num_heads=2, head_dim=32))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Hyper-parameters of :class:`TinyLM` (keyword-only).

    The token mixer's widths and options are one :class:`kda_lib.KDAConfig`, ``mixer_config``,
    declared nowhere else: the KDA and GDN layers are built from it whole, and the other
    mixers' configs (attention, MLA, Mamba2, the conv mixer) take the widths they share with it
    by name (:func:`kda_lib.checks.shared_fields`). The model's width and norm epsilon are its
    ``hidden_size`` and ``norm_eps``. :meth:`from_flat` builds a config from one flat set of
    names (command lines, recorded ``model`` dicts), :meth:`record` writes it so.

    Attributes:
      vocab_size: tokens in and out.
      num_layers: N blocks (default 2).
      mixer: a name in :data:`MIXERS` ("kda", "conv", ...): the mixer of every layer, unless
        ``layers`` is given.
      layers: per-layer mixer pattern, e.g. ``("kda", "kda", "kda", "attention")``, tiled over
        the ``num_layers`` blocks (``num_layers`` must be a multiple of its length); empty (the
        default): ``mixer`` in every layer. A list is stored as a tuple.
      mixer_config: the :class:`kda_lib.KDAConfig` of every mixer layer (default:
        :data:`MIXER_DEFAULTS`, H = 2 heads of K = V = 32 on a width of 64).
      rope: rotary position embedding in the attention layers (default True); False is NoPE,
        as in Kimi Linear, where the KDA layers carry position.
      kv_lora_rank: the ``"mla"`` mixer's latent width r (default None:
        ``mixer_config.head_dim``).
      mlp_ratio: MLP width as a multiple of hidden_size (default 2).
      mlp_width: the MLP width itself, overriding ``mlp_ratio`` (used to give models of
        different mixers the same parameter count, see :func:`match_parameter_count`).
    """

    vocab_size: int
    num_layers: int = 2
    mixer: str = "kda"
    layers: tuple[str, ...] = ()
    mixer_config: KDAConfig = KDAConfig(**MIXER_DEFAULTS)
    rope: bool = True
    kv_lora_rank: int | None = None
    mlp_ratio: int = 2
    mlp_width: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "mlp_ratio"):
            check_positive_int(f"ModelConfig.{name}", getattr(self, name))
        if not isinstance(self.mixer_config, KDAConfig):
            raise ValueError(
                f"ModelConfig.mixer_config must be a KDAConfig (the mixer's widths and "
                f"options), got {self.mixer_config!r}"
            )
        if not isinstance(self.mixer, str) or self.mixer not in MIXERS:
            raise ValueError(
                f"ModelConfig.mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}"
            )
        self._check_layers()
        if not isinstance(self.rope, bool):
            raise ValueError(f"ModelConfig.rope must be True or False, got {self.rope!r}")
        for name in ("mlp_width", "kv_lora_rank"):
            check_int(f"ModelConfig.{name}", getattr(self, name), optional=True)

    @classmethod
    def from_flat(cls, **fields) -> ModelConfig:
        """A config from one flat set of names: ModelConfig's own fields, and
        :class:`kda_lib.KDAConfig`'s, which make ``mixer_config`` (those not given:
        :data:`MIXER_DEFAULTS`, then KDAConfig's defaults). Reads a command line's options and
        every recorded ``model`` dict (:meth:`record`'s, and those recorded before
        ``mixer_config`` existed, which had the same flat names).

        Raises:
          ValueError: naming the fields neither config has.
        """
        own = {field.name for field in dataclasses.fields(cls)} - {"mixer_config"}
        mixer = {field.name for field in dataclasses.fields(KDAConfig)}
        unknown = sorted(set(fields) - own - mixer)
        if unknown:
            raise ValueError(
                f"ModelConfig.from_flat got fields {unknown} that neither ModelConfig "
                f"({sorted(own)}) nor KDAConfig ({sorted(mixer)}) has"
            )
        mixer_fields = {name: value for name, value in fields.items() if name in mixer}
        for name in ("dtype", "param_dtype"):  # recorded by name: "float32" is jnp.float32
            if isinstance(mixer_fields.get(name), str):
                mixer_fields[name] = getattr(jnp, jnp.dtype(mixer_fields[name]).name)
        own_fields = {name: value for name, value in fields.items() if name in own}
        return cls(**own_fields, mixer_config=KDAConfig(**{**MIXER_DEFAULTS, **mixer_fields}))

    def record(self) -> dict:
        """This config as one flat JSON-ready dict (what experiment records store as
        ``model``): ModelConfig's own fields, then ``mixer_config``'s (its dtypes by name, its
        gate form as a string). :meth:`from_flat` reads it back."""
        own = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "mixer_config"
        }
        mixer = dataclasses.asdict(self.mixer_config)
        mixer["gate_form"] = str(mixer["gate_form"])
        for name in ("dtype", "param_dtype"):
            mixer[name] = jnp.dtype(mixer[name]).name
        return {**own, "layers": list(self.layers), **mixer}

    @property
    def hidden_size(self) -> int:
        """The model width: ``mixer_config.hidden_size``."""
        return self.mixer_config.hidden_size

    @property
    def norm_eps(self) -> float:
        """Every RMSNorm's epsilon: ``mixer_config.norm_eps``."""
        return self.mixer_config.norm_eps

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
        if len(set(self.layer_mixers)) == 1:
            return self.layer_mixers[0]
        runs = [(name, len(list(run))) for name, run in itertools.groupby(self.layers)]
        return "-".join(name + (str(count) if count > 1 else "") for name, count in runs)

    @property
    def mlp_hidden(self) -> int:
        """The MLP's inner width: ``mlp_width``, else ``mlp_ratio * hidden_size``."""
        return self.mlp_width or self.mlp_ratio * self.hidden_size

    def attention_config(self, *, short_conv: bool = False) -> AttentionConfig:
        """The :class:`kda_lib.layers.attention.AttentionConfig` of an attention layer: the
        widths it shares with ``mixer_config`` (H, K, V, W, dtypes), ``rope`` from this config
        and, with ``short_conv``, KDA's short convolutions on q, k and v."""
        shared = shared_fields(self.mixer_config, AttentionConfig)
        return AttentionConfig(**shared, rope=self.rope, short_conv=short_conv)

    @property
    def conv_reach(self) -> int:
        """How many tokens back the convolutions alone can see through all layers:
        ``num_layers * (conv_size - 1)``. A conv-only model is blind beyond it."""
        return self.num_layers * max(self.mixer_config.conv_size - 1, 0)

    def for_layer(self, index: int) -> ModelConfig:
        """This config with ``mixer`` set to layer ``index``'s mixer (what its factory reads)."""
        return dataclasses.replace(self, mixer=self.layer_mixers[index], layers=())


MixerFactory = Callable[[ModelConfig, nnx.Rngs], nnx.Module]


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
        """The widths of the KDA layer ``config`` describes: ``hidden_size`` in and out, its
        value heads (HV) of ``value_dim`` (V) channels, the conv width ``conv_size`` (W >= 1),
        the output norm's ``norm_eps`` and the dtypes (its gate and kernel fields are unused:
        this mixer has neither)."""
        if not isinstance(config, KDAConfig):
            raise ValueError(f"ConvMixer config must be a KDAConfig, got {config!r}")
        if config.conv_size < 1:
            raise ValueError("ConvMixer needs conv_size >= 1 (it has no other way to mix tokens)")
        hidden_size, num_heads, value_dim = config.hidden_size, config.value_heads, config.value_dim
        dtype, param_dtype, conv_size = config.dtype, config.param_dtype, config.conv_size
        self.hidden_size, self.num_heads, self.value_dim = hidden_size, num_heads, value_dim
        self.conv_size, self.norm_eps, self.dtype = conv_size, config.norm_eps, dtype
        h, vd, hidden = num_heads, value_dim, hidden_size
        linear = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.v_proj = nnx.Linear(hidden, h * vd, use_bias=False, **linear)
        self.v_conv1d = ShortConvolution(
            h * vd, conv_size=conv_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.g_proj = nnx.Linear(hidden, h * vd, bias_metadata=NO_DECAY, **linear)
        self.o_norm = no_decay_param(jnp.ones((vd,), param_dtype))
        self.o_proj = nnx.Linear(h * vd, hidden, use_bias=False, **linear)

    def init_cache(self, batch_size: int) -> jax.Array:
        """Decode state: the last ``conv_size - 1`` value-stream inputs ``[B, W-1, H*V]``."""
        channels = self.num_heads * self.value_dim
        return jnp.zeros((batch_size, self.conv_size - 1, channels), self.dtype)

    def __call__(
        self, x: jax.Array, *, segment_ids: jax.Array | None = None, cache: jax.Array | None = None
    ):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given.
        ``segment_ids [B, T]`` (optional, not with a cache): the conv's taps stay inside a
        segment (the rule of :mod:`kda_lib.ops.segments`)."""
        batch, seq_len, _ = x.shape
        if segment_ids is not None and cache is not None:
            raise ValueError(
                "segment_ids cannot be combined with a cache: decode one document per row"
            )
        h, vd = self.num_heads, self.value_dim
        if cache is not None:
            want = (batch, self.conv_size - 1, h * vd)
            if not hasattr(cache, "shape") or tuple(cache.shape) != want:
                got = tuple(cache.shape) if hasattr(cache, "shape") else type(cache).__name__
                raise ValueError(
                    f"cache for a conv layer must be an array of shape [B, W-1, H*V] = {want}, "
                    f"got {got}; build it with model.init_cache({batch})"
                )
        x = x.astype(self.dtype)
        o, new_cache = self.v_conv1d(self.v_proj(x), conv_state=cache, segment_ids=segment_ids)
        gate = self.g_proj(x).reshape(batch, seq_len, h, vd)
        normed = gated_rms_norm(
            o.reshape(batch, seq_len, h, vd), self.o_norm[...], gate, eps=self.norm_eps
        )
        y = self.o_proj(normed.astype(self.dtype).reshape(batch, seq_len, h * vd))
        if segment_ids is not None:  # padding outputs 0, as in every mixer (host ids compared
            # on the host: no conversion can wrap an int64 id to 0)
            y = jnp.where(jnp.asarray(segment_ids != 0)[..., None], y, 0)
        return y if cache is None else (y, new_cache)


def _mla_mixer(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    rank = config.kv_lora_rank or config.mixer_config.head_dim  # the latent's default width
    mla = MLAConfig(**shared_fields(config.mixer_config, MLAConfig), kv_lora_rank=rank)
    return MultiHeadLatentAttention(mla, rngs=rngs)


# name -> factory(config, rngs) of a layer's token mixer (the module docstring says each)
MIXERS: dict[str, MixerFactory] = {
    "kda": lambda c, rngs: KimiDeltaAttention(c.mixer_config, rngs=rngs),
    "gdn": lambda c, rngs: KimiDeltaAttention(
        dataclasses.replace(c.mixer_config, per_head_decay=True), rngs=rngs
    ),
    "mamba2": lambda c, rngs: Mamba2Mixer(
        Mamba2Config(**shared_fields(c.mixer_config, Mamba2Config)), rngs=rngs
    ),
    "attention": lambda c, rngs: CausalSelfAttention(c.attention_config(), rngs=rngs),
    "attention_conv": lambda c, rngs: CausalSelfAttention(
        c.attention_config(short_conv=True), rngs=rngs
    ),
    "conv": lambda c, rngs: ConvMixer(c.mixer_config, rngs=rngs),
    "mla": _mla_mixer,
}


def register_mixer(name: str):
    """Decorator: ``@register_mixer("name")`` on a ``factory(config, rngs) -> nnx.Module``."""

    def register(factory: MixerFactory) -> MixerFactory:
        MIXERS[name] = factory
        return factory

    return register


class MLP(nnx.Module):
    """``down(gelu(up(x)))``."""

    def __init__(self, hidden: int, width: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(hidden, width, bias_metadata=NO_DECAY, rngs=rngs)
        self.down = nnx.Linear(width, hidden, bias_metadata=NO_DECAY, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    """Pre-norm residual block: ``x + mixer(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        """``config.mixer`` names this block's mixer (see :meth:`ModelConfig.for_layer`)."""
        hidden = config.hidden_size
        norm = dict(epsilon=config.norm_eps, scale_metadata=NO_DECAY, rngs=rngs)
        self.mixer_norm = nnx.RMSNorm(hidden, **norm)
        self.mixer = make_mixer(config, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(hidden, **norm)
        self.mlp = MLP(hidden, config.mlp_hidden, rngs=rngs)

    def __call__(self, x, *, cache=None):
        mixed = self.mixer(self.mixer_norm(x), cache=cache)
        if cache is not None:
            mixed, cache = mixed
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return x if cache is None else (x, cache)


def _vocabulary_ends(config: ModelConfig, *, rngs: nnx.Rngs) -> nnx.List:
    """The embedding and the head alone (their shapes, for :func:`check_parameters_fit`)."""
    v, d = config.vocab_size, config.hidden_size
    return nnx.List([nnx.Embed(v, d, rngs=rngs), nnx.Linear(d, v, use_bias=False, rngs=rngs)])


class TinyLM(nnx.Module):
    """``embed -> N x Block -> RMSNorm -> head``: tokens ``[B, T]`` -> logits ``[B, T, vocab]``.

    Block ``i`` uses the mixer ``config.layer_mixers[i]`` (one mixer everywhere, or a pattern
    such as Kimi Linear's 3:1 KDA/attention hybrid). ``model(tokens,
    cache=model.init_cache(B))`` also returns the per-layer caches after the tokens, one per
    block and each of its own kind (a :class:`kda_lib.layers.kda_layer.KDACache` with a fixed
    ``[B, H, K, V]`` state for KDA and GDN layers, a
    :class:`kda_lib.layers.attention.AttentionCache` that grows with the context for attention
    layers), so decoding can continue from them.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        # the vocabulary's parameters (embedding and head) fit, or vocab_size is refused; the
        # mixers check their own
        check_parameters_fit(_vocabulary_ends, config, "TinyLM's embedding and head")
        self.embed = nnx.Embed(
            config.vocab_size, config.hidden_size, embedding_metadata=NO_DECAY, rngs=rngs
        )
        self.blocks = nnx.List(
            [Block(config.for_layer(i), rngs=rngs) for i in range(config.num_layers)]
        )
        self.final_norm = nnx.RMSNorm(
            config.hidden_size, epsilon=config.norm_eps, scale_metadata=NO_DECAY, rngs=rngs
        )
        self.head = nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False, rngs=rngs)

    def init_cache(self, batch_size: int, *, max_len: int | None = None) -> tuple:
        """One empty cache per block (see the mixers' ``init_cache``). ``max_len``: room for
        that many tokens in every attention and MLA cache (fixed shapes, one compiled decode
        step); None: those caches grow by concatenation. Other mixers' caches do not depend
        on it."""
        check_int("batch_size", batch_size)
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


def config_param_count(config: ModelConfig) -> int:
    """:func:`kda_lib.layers.params.parameter_count` of ``TinyLM(config)``, from shapes only
    (nothing is initialised)."""
    return parameter_count(nnx.eval_shape(lambda: TinyLM(config, rngs=nnx.Rngs(0))))


def match_parameter_count(config: ModelConfig, target: int) -> ModelConfig:
    """``config`` with the ``mlp_width`` whose parameter count is nearest ``target``.

    The MLPs are the one part every mixer shares, and their size is linear in the width
    (``(2 hidden + 1)`` scalars per unit and layer), so models with different mixers can be
    brought to (almost) the same size by their MLP alone, as in equal-size comparisons.

    Raises:
      ValueError: ``target`` is smaller than the model without its MLP units allows.
    """
    check_int("target", target)
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
    mark each parameter was created with (:func:`kda_lib.layers.params.weight_decay_mask`: no decay
    for ``A_log``, ``dt_bias``, norm weights, biases and embeddings; matmul and conv kernels
    decay)."""
    return {
        parameter_path_names(path): bool(decay)
        for path, decay in jax.tree_util.tree_leaves_with_path(weight_decay_mask(model))
    }
