"""Multi-head latent attention (MLA, DeepSeek-V2) without positional encoding: Kimi Linear's
global mixer. For ``x [B, T, hidden]``, H heads, key width D, value width Dv, latent width r::

    q        = q_proj(x)  (or q_b_proj(rmsnorm(q_a_proj(x))))      [B, T, H, D + Ds]
    c, s     = split(kv_a_proj_with_mqa(x), [r, Ds]);  c = rmsnorm(c)
    k_h, v_h = split(c @ kv_b_proj, per head)                     [B, T, H, D], [B, T, H, Dv]
    o_h      = causal softmax(q_h concat(k_h, s)^T / sqrt(D + Ds)) v_h
    y        = o_proj(concat_h o_h)

``s`` (``shared_key_dim`` Ds, DeepSeek's rotary slot, unrotated; 0 = none) is shared by all
heads. Decoding caches only ``c`` and ``s`` and attends in latent space (DESIGN section 4).
Parameter names follow the Hugging Face Kimi Linear / DeepSeek-V2 checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.layers.attention import (
    AttentionCache,
    CausalSelfAttention,
    Widths,
    attend,
    attention_mask,
    check_call,
    check_fields,
    write_rows,
)
from kda_lib.layers.params import NO_DECAY, check_parameters_fit


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLAConfig(Widths):
    """Hyper-parameters of :class:`MultiHeadLatentAttention` (keyword-only): ``hidden_size``;
    ``num_heads`` H; ``head_dim`` D (DeepSeek's ``qk_nope_head_dim``); ``value_head_dim`` Dv
    (None = D; ``v_head_dim``); ``kv_lora_rank`` r, the cached latent's width; ``q_lora_rank``
    (None: one full-rank ``q_proj``, Kimi Linear; an int: DeepSeek's low-rank query);
    ``shared_key_dim`` Ds (0; ``qk_rope_head_dim``); ``norm_eps`` of the latent RMSNorms
    (1e-5); ``dtype``, ``param_dtype`` (float32)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    value_head_dim: int | None = None
    kv_lora_rank: int
    q_lora_rank: int | None = None
    shared_key_dim: int = 0
    norm_eps: float = 1e-5
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def __post_init__(self):
        check_fields(self, int="hidden_size num_heads head_dim kv_lora_rank",
                     width="value_head_dim q_lora_rank", int0="shared_key_dim", eps="norm_eps",
                     dtype="dtype param_dtype")  # fmt: skip

    score_dim = property(lambda self: self.head_dim + self.shared_key_dim)  # q.k width: D + Ds


class MLACache(NamedTuple):
    """Decode state of :class:`MultiHeadLatentAttention`: ``latents [B, C, r]`` (normalised),
    ``shared_keys [B, C, Ds]`` (None when Ds = 0), ``length`` as in ``AttentionCache``."""

    latents: jax.Array
    shared_keys: jax.Array | None = None
    length: jax.Array | None = None
    seen = AttentionCache.seen


class MultiHeadLatentAttention(nnx.Module):
    """Causal MLA without positional encoding ``[B, T, hidden] -> [B, T, hidden]``, with a cache."""

    cache_type, cache_kind = MLACache, "an MLACache"

    def __init__(self, config: MLAConfig, *, rngs: nnx.Rngs):
        check_parameters_fit(MultiHeadLatentAttention, config)
        cfg = self.config = config
        h, hidden, r = cfg.num_heads, cfg.hidden_size, cfg.kv_lora_rank
        linear = dict(use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        norm = dict(epsilon=cfg.norm_eps, dtype=jnp.float32, param_dtype=cfg.param_dtype,
                    scale_metadata=NO_DECAY, rngs=rngs)  # fmt: skip
        if cfg.q_lora_rank is None:
            self.q_proj = nnx.Linear(hidden, h * cfg.score_dim, **linear)
        else:
            self.q_a_proj = nnx.Linear(hidden, cfg.q_lora_rank, **linear)
            self.q_a_layernorm = nnx.RMSNorm(cfg.q_lora_rank, **norm)
            self.q_b_proj = nnx.Linear(cfg.q_lora_rank, h * cfg.score_dim, **linear)
        self.kv_a_proj_with_mqa = nnx.Linear(hidden, r + cfg.shared_key_dim, **linear)
        self.kv_a_layernorm = nnx.RMSNorm(r, **norm)
        self.kv_b_proj = nnx.Linear(r, h * (cfg.head_dim + cfg.value_dim), **linear)
        self.o_proj = nnx.Linear(h * cfg.value_dim, hidden, **linear)

    def __call__(self, x: jax.Array, *, segment_ids=None, cache: MLACache | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given.
        ``segment_ids [B, T]`` (int, 0 = padding, not with a cache): a token attends only to
        earlier tokens of its own segment; padding outputs 0."""
        cfg = self.config
        segment_ids, _ = check_call(self, x, segment_ids, cache)
        batch, seq_len, _ = x.shape
        d, r, h = cfg.head_dim, cfg.kv_lora_rank, cfg.num_heads
        x = x.astype(cfg.dtype)
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            low = self.q_a_layernorm(self.q_a_proj(x).astype(jnp.float32))
            q = self.q_b_proj(low.astype(cfg.dtype))
        q = q.reshape(batch, seq_len, h, cfg.score_dim)
        ckv = self.kv_a_proj_with_mqa(x)  # the latent c [B, T, r] and the shared key s [B, T, Ds]
        c = self.kv_a_layernorm(ckv[..., :r].astype(jnp.float32)).astype(cfg.dtype)
        s = ckv[..., r:] if cfg.shared_key_dim else None
        if cache is None:  # training / prefill: per-head keys and values formed from the latents
            k, v = jnp.split(self.kv_b_proj(c).reshape(batch, seq_len, h, -1), [d], -1)
            if s is not None:  # the shared key part, the same for every head
                shared = jnp.broadcast_to(s[:, :, None], (*k.shape[:3], s.shape[-1]))
                k = jnp.concatenate([k, shared], -1)
            mask = attention_mask(jnp.arange(seq_len), seq_len, segment_ids)
            o = attend(q, k, v, mask, cfg.score_dim**-0.5)
            return self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, -1))
        # decoding: attention against the cached latents only (absorbed form)
        (c, s), length, overflow = write_rows(
            "MLA", (cache.latents, cache.shared_keys), (c, s), cache.length
        )
        w = self.kv_b_proj.kernel[...].astype(jnp.float32).reshape(r, h, -1)
        w_uk, w_uv = w[..., :d], w[..., d:]  # [r, H, D], [r, H, Dv]
        q = q.astype(jnp.float32)
        # the query moved into latent space: one key/value "head", the latent, for all heads
        query, key = jnp.einsum("bthd,rhd->bthr", q[..., :d], w_uk), c[:, :, None]
        if s is not None:
            query = jnp.concatenate([query, q[..., d:]], -1)
            key = jnp.concatenate([key, s[:, :, None]], -1)
        mask = attention_mask(cache.seen + jnp.arange(seq_len), c.shape[1])
        weighted = attend(query, key, c[:, :, None], mask, cfg.score_dim**-0.5)
        o = jnp.where(overflow, jnp.nan, jnp.einsum("bthr,rhv->bthv", weighted, w_uv))
        y = self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, -1))
        return y, MLACache(c, s, length)

    init_cache = CausalSelfAttention.init_cache  # growing, or room for max_len tokens

    def _cache_shapes(self, batch: int, rows: int) -> dict:
        ds = self.config.shared_key_dim
        return dict(latents=(batch, rows, self.config.kv_lora_rank),
                    shared_keys=(batch, rows, ds) if ds else None)  # fmt: skip
