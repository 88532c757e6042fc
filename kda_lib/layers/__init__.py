"""Flax NNX modules, each with a frozen config; parameter names follow fla."""

from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
from kda_lib.layers.conv import ShortConvolution
from kda_lib.layers.kda_layer import KDACache, KDAConfig, KimiDeltaAttention, cache_at
from kda_lib.layers.mla import MLAConfig, MultiHeadLatentAttention

__all__ = [
    "AttentionConfig",
    "CausalSelfAttention",
    "KDACache",
    "KDAConfig",
    "KimiDeltaAttention",
    "MLAConfig",
    "MultiHeadLatentAttention",
    "ShortConvolution",
    "cache_at",
]
