"""Tiny language models: ``embed -> N x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head``,
residual around the mixer and the MLP; each layer's token mixer is a name in :data:`MIXERS`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from types import MappingProxyType

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.checks import (
    MAX_LAYERS,
    check_array,
    check_float_dtype,
    check_int,
    check_token_ids,
    shared_fields,
)
from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention, check_fields
from kda_lib.layers.kda_layer import WIDTH_FIELDS, KDAConfig, KimiDeltaAttention
from kda_lib.layers.mamba2 import ConvMixer, Mamba2Config, Mamba2Mixer
from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention
from kda_lib.layers.params import NO_DECAY, check_parameters_fit, config_bytes, parameter_count

# The token mixer's config when none is given: H = 2 heads of K = V = 32 on a width of 64
MIXER_DEFAULTS = MappingProxyType(dict(hidden_size=64, num_heads=2, head_dim=32))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Hyper-parameters of :class:`TinyLM` (keyword-only): ``vocab_size``; ``num_layers`` N
    (2; at most :data:`~kda_lib.checks.MAX_LAYERS`); ``mixer``, the :data:`MIXERS` name of
    every layer ("kda"), unless ``layers``, a pattern such as ``("kda", "kda", "kda",
    "attention")`` tiled over the N blocks; ``mixer_config``, the
    mixers' :class:`kda_lib.KDAConfig` (:data:`MIXER_DEFAULTS`; its ``hidden_size`` and
    ``norm_eps`` are the model's, DESIGN section 3); ``rope`` in attention layers (True; False:
    NoPE); ``kv_lora_rank`` of ``"mla"`` (None: ``head_dim``); the MLP width ``mlp_ratio *
    hidden_size`` (2) or ``mlp_width`` (:func:`match_parameter_count`)."""

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
        check_fields(self, int="vocab_size num_layers mlp_ratio", bool="rope",
                     width="mlp_width kv_lora_rank")  # fmt: skip
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"ModelConfig.num_layers must be <= {MAX_LAYERS:,} (more layers than "
                             f"any model), got {self.num_layers}")  # fmt: skip
        layers, known = self.layers, sorted(MIXERS)
        if not isinstance(self.mixer_config, KDAConfig):
            raise ValueError(f"ModelConfig.mixer_config must be a KDAConfig (the mixer's widths "
                             f"and options), got {self.mixer_config!r}")  # fmt: skip
        if not isinstance(self.mixer, str) or self.mixer not in known:
            raise ValueError(f"ModelConfig.mixer must be one of {known}, got {self.mixer!r}")
        if isinstance(layers, str) or not isinstance(layers, Sequence):
            raise ValueError(f"ModelConfig.layers must be a tuple of mixer names such as "
                             f"('kda', 'kda', 'kda', 'attention'), got {layers!r}")  # fmt: skip
        if unknown := [name for name in layers if not isinstance(name, str) or name not in known]:
            raise ValueError(f"ModelConfig.layers names unknown mixers {unknown}; known: {known}")
        if layers and self.num_layers % len(layers):
            raise ValueError(f"ModelConfig.num_layers={self.num_layers} is not a multiple of the "
                             f"{len(layers)} entries of ModelConfig.layers={tuple(layers)} (tiled "
                             f"over the layers; num_layers={len(layers)} is one copy)")  # fmt: skip
        object.__setattr__(self, "layers", tuple(layers))  # a list becomes a hashable tuple

    @classmethod
    def from_flat(cls, **fields) -> ModelConfig:
        """A config from flat ModelConfig and :class:`kda_lib.KDAConfig` fields (defaults:
        :data:`MIXER_DEFAULTS`, then KDAConfig's), as :meth:`record` writes them."""
        own = {field.name for field in dataclasses.fields(cls)} - {"mixer_config"}
        mixer = {field.name for field in dataclasses.fields(KDAConfig)}
        if unknown := sorted(set(fields) - own - mixer):
            raise ValueError(f"ModelConfig.from_flat got fields {unknown} that neither ModelConfig "
                             f"({sorted(own)}) nor KDAConfig ({sorted(mixer)}) has")  # fmt: skip
        mixer_fields = {name: value for name, value in fields.items() if name in mixer}
        for name in ("dtype", "param_dtype"):  # recorded by name: "float32" is jnp.float32
            if isinstance(mixer_fields.get(name), str):
                dtype = check_float_dtype(f"KDAConfig.{name}", mixer_fields[name])
                mixer_fields[name] = getattr(jnp, dtype.name)
        own_fields = {name: value for name, value in fields.items() if name in own}
        return cls(**own_fields, mixer_config=KDAConfig(**{**MIXER_DEFAULTS, **mixer_fields}))

    def record(self) -> dict:
        """This config as one flat JSON-ready dict (dtypes, gate form as strings)."""
        own = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        mixer = dataclasses.asdict(own.pop("mixer_config"))
        mixer["gate_form"] = str(mixer["gate_form"])
        for name in ("dtype", "param_dtype"):
            mixer[name] = jnp.dtype(mixer[name]).name
        return {**own, "layers": list(self.layers), **mixer}

    hidden_size = property(lambda self: self.mixer_config.hidden_size)
    norm_eps = property(lambda self: self.mixer_config.norm_eps)

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        """The mixer name of each of the ``num_layers`` blocks, in order."""
        pattern = self.layers or (self.mixer,)
        return pattern * (self.num_layers // len(pattern))

    @property
    def label(self) -> str:
        """The mixer of a uniform model, else the pattern run-length encoded: "kda3-attention"."""
        if len(set(self.layer_mixers)) == 1:
            return self.layer_mixers[0]
        runs = [(name, len(list(run))) for name, run in itertools.groupby(self.layers)]
        return "-".join(name + (str(count) if count > 1 else "") for name, count in runs)

    @property
    def mlp_hidden(self) -> int:
        """The MLP's inner width: ``mlp_width``, else ``mlp_ratio * hidden_size``."""
        return self.mlp_width or self.mlp_ratio * self.hidden_size

    @property
    def conv_reach(self) -> int:
        """Tokens back the convolutions alone see through all layers: N (W - 1)."""
        return self.num_layers * max(self.mixer_config.conv_size - 1, 0)


def _layer(make, kind, c: ModelConfig, rngs: nnx.Rngs, **fields) -> nnx.Module:
    """``make(kind(fields shared with c.mixer_config and c, **fields))``."""
    shared = {**shared_fields(c.mixer_config, kind), **shared_fields(c, kind), **fields}
    return make(kind(**shared), rngs=rngs)


# name -> factory(config, rngs) of a token mixer [B, T, hidden] -> [B, T, hidden] with init_cache;
# "gdn": KDA with one decay per head; "attention_conv": attention with KDA's short convs;
# "mamba2": the Mamba2-style stand-in (writes not scaled by the step size), "mamba2_dt": with
# Mamba2's discretisation (writes scaled by it; kda_lib.layers.mamba2)
MIXERS = {
    "kda": lambda c, r: KimiDeltaAttention(c.mixer_config, rngs=r),
    "gdn": lambda c, r: _layer(KimiDeltaAttention, KDAConfig, c, r, per_head_decay=True),
    "mamba2": lambda c, r: _layer(Mamba2Mixer, Mamba2Config, c, r),
    "mamba2_dt": lambda c, r: _layer(Mamba2Mixer, Mamba2Config, c, r, scale_writes=True),
    "attention": lambda c, r: _layer(CausalSelfAttention, AttentionConfig, c, r),
    "attention_conv": lambda c, r: _layer(CausalSelfAttention, AttentionConfig, c, r,
                                          short_conv=True),
    "conv": lambda c, r: ConvMixer(c.mixer_config, rngs=r),
    "mla": lambda c, r: _layer(MultiHeadLatentAttention, MLAConfig, c, r,
                               kv_lora_rank=c.kv_lora_rank or c.mixer_config.head_dim),
}  # fmt: skip


class MLP(nnx.Module):
    """``down(gelu(up(x)))``."""

    def __init__(self, hidden: int, width: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(hidden, width, bias_metadata=NO_DECAY, rngs=rngs)
        self.down = nnx.Linear(width, hidden, bias_metadata=NO_DECAY, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    """Pre-norm block: ``x + mixer(norm(x))``, then ``x + mlp(norm(x))`` (``MIXERS[mixer]``)."""

    def __init__(self, config: ModelConfig, mixer: str, *, rngs: nnx.Rngs):
        norm = dict(epsilon=config.norm_eps, scale_metadata=NO_DECAY, rngs=rngs)
        self.mixer_norm = nnx.RMSNorm(config.hidden_size, **norm)
        self.mixer = MIXERS[mixer](config, rngs)
        self.mlp_norm = nnx.RMSNorm(config.hidden_size, **norm)
        self.mlp = MLP(config.hidden_size, config.mlp_hidden, rngs=rngs)

    def __call__(self, x, *, cache=None):
        mixed = self.mixer(self.mixer_norm(x), cache=cache)
        if cache is not None:
            mixed, cache = mixed
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return x if cache is None else (x, cache)


class TinyLM(nnx.Module):
    """``embed -> N x Block -> RMSNorm -> head``: tokens ``[B, T]`` -> logits (with a cache too)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        _check_config(config)
        own = "vocab_size num_layers mlp_ratio mlp_width kv_lora_rank".split()
        sizes = {f"KDAConfig.{name}": getattr(config.mixer_config, name) for name in WIDTH_FIELDS}
        sizes |= {f"ModelConfig.{name}": getattr(config, name) for name in own}
        check_parameters_fit(TinyLM, config, fields=sizes, nbytes=_parameter_bytes)
        self.config = config
        hidden, vocab = config.hidden_size, config.vocab_size
        self.embed = nnx.Embed(vocab, hidden, embedding_metadata=NO_DECAY, rngs=rngs)
        self.blocks = nnx.List([Block(config, name, rngs=rngs) for name in config.layer_mixers])
        self.final_norm = nnx.RMSNorm(hidden, epsilon=config.norm_eps, scale_metadata=NO_DECAY,
                                      rngs=rngs)  # fmt: skip
        self.head = nnx.Linear(hidden, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array, *, cache: tuple | None = None):
        check_array("tokens", tokens)
        if tokens.ndim != 2 or 0 in tokens.shape:
            raise ValueError(f"tokens must have shape [B, T] with B, T >= 1, got {tokens.shape}")
        blocks = len(self.blocks)
        if cache is not None and (not isinstance(cache, (tuple, list)) or len(cache) != blocks
                                  or any(entry is None for entry in cache)):  # fmt: skip
            raise ValueError(f"cache must hold one entry per block ({blocks}), as init_cache "
                             f"returns, got {cache!r:.200}")  # fmt: skip
        check_token_ids("tokens", tokens, self.config.vocab_size)
        x, new_cache = self.embed(tokens), []
        for block, layer_cache in zip(self.blocks, cache or [None] * len(self.blocks), strict=True):
            x = block(x, cache=layer_cache)
            if layer_cache is not None:
                x, layer_cache = x
                new_cache.append(layer_cache)
        logits = self.head(self.final_norm(x))
        return logits if cache is None else (logits, tuple(new_cache))

    def init_cache(self, batch_size: int, *, max_len: int | None = None) -> tuple:
        """One empty cache per block; attention/MLA ones hold ``max_len`` tokens (None: grow)."""
        check_int("max_len", max_len, optional=True)
        sized = (CausalSelfAttention, MultiHeadLatentAttention)
        room = lambda mixer: dict(max_len=max_len) if isinstance(mixer, sized) else {}
        return tuple(b.mixer.init_cache(batch_size, **room(b.mixer)) for b in self.blocks)


def _check_config(config) -> None:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")


def _parameter_bytes(config: ModelConfig) -> int:
    """Bytes of ``TinyLM(config)``'s parameters from one and two copies of its layer pattern
    (built as shapes) and arithmetic: checking N layers costs no more than checking two."""
    pattern = len(config.layers or (config.mixer,))
    copies = config.num_layers // pattern
    if copies <= 2:
        return config_bytes(TinyLM, config)
    one, two = (config_bytes(TinyLM, dataclasses.replace(config, num_layers=n * pattern))
                for n in (1, 2))  # fmt: skip
    return one + (copies - 1) * (two - one)


def config_param_count(config: ModelConfig) -> int:
    """Parameters of ``TinyLM(config)``, from ``nnx.eval_shape`` (nothing is initialised)."""
    _check_config(config)
    return parameter_count(nnx.eval_shape(lambda: TinyLM(config, rngs=nnx.Rngs(0))))


def match_parameter_count(config: ModelConfig, target: int) -> ModelConfig:
    """``config`` with the ``mlp_width`` whose parameter count is nearest ``target``."""
    _check_config(config)
    check_int("target", target)
    one = config_param_count(dataclasses.replace(config, mlp_width=1))
    per_unit = config.num_layers * (2 * config.hidden_size + 1)
    width = round((target - one) / per_unit) + 1
    if width < 1:
        raise ValueError(f"target={target} parameters is below what {config.label} needs with a "
                         f"1-unit MLP ({one})")  # fmt: skip
    return dataclasses.replace(config, mlp_width=width)
