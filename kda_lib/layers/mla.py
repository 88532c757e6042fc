"""Multi-head latent attention (MLA) without positional encoding: Kimi Linear's global mixer.

DeepSeek-V2 introduced MLA; Kimi Linear's global layers use it without rotary embedding
(``mla_use_nope`` in its published config). For ``x [B, T, hidden]``, with H heads, key width
``D = head_dim``, value width ``Dv = value_dim`` and latent width ``r = kv_lora_rank``::

    q        = q_proj(x)                                   [B, T, H, D + Ds]
               (or q_b_proj(rmsnorm(q_a_proj(x))) with q_lora_rank)
    c, s     = split(kv_a_proj_with_mqa(x), [r, Ds])       c [B, T, r], s [B, T, Ds]
    c        = rmsnorm(c) * kv_a_layernorm                 the compressed latent
    k_h, v_h = split(c @ kv_b_proj, per head)              [B, T, H, D], [B, T, H, Dv]
    key_h    = concat(k_h, s)                              s shared by every head
    o_h      = causal softmax(q_h key_h^T / sqrt(D + Ds)) v_h
    y        = o_proj(concat_h o_h)

``Ds = shared_key_dim`` is the slot DeepSeek's MLA gives its rotary key; in the NoPE form it
is a plain key part shared by all heads (no rotation), as in Kimi Linear, whose published
config keeps it (``qk_rope_head_dim``). Set it to 0 to drop it.

Decoding keeps only what every head is computed from: the latent ``c`` (and ``s``), i.e.
``r + Ds`` numbers per token instead of ``H (D + Dv)`` for multi-head attention. The cached
path never forms per-head keys or values: since ``kv_b_proj`` has no bias,
``q_h . k_h = (q_h W_uk,h^T) . c`` and ``sum_s p_s v_h,s = (sum_s p_s c_s) W_uv,h``, so the
query is moved into latent space ("absorbed") and the weighted latent is projected out
afterwards. The uncached path forms the per-head keys and values; the tests check the two
agree.

Parameter names follow the Hugging Face Kimi Linear / DeepSeek-V2 checkpoints
(``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.checks import check_int
from kda_lib.layers.attention import (
    attend,
    attention_mask,
    check_hidden,
    checked_segments,
    write_rows,
)
from kda_lib.layers.params import NO_DECAY, check_parameters_fit


def _positive_int(name: str, value, *, minimum: int = 1) -> int:
    return check_int(f"MLAConfig.{name}", value, minimum)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLAConfig:
    """Hyper-parameters of :class:`MultiHeadLatentAttention` (keyword-only; the widths carry
    :class:`kda_lib.KDAConfig`'s names).

    Attributes:
      hidden_size: model width.
      num_heads: H.
      head_dim: D, the per-head query/key width formed from the latent (DeepSeek's
        ``qk_nope_head_dim``).
      value_head_dim: Dv, the per-head value width (None = D; DeepSeek's ``v_head_dim``).
      kv_lora_rank: r, the width of the cached latent.
      q_lora_rank: None = one full-rank query projection (Kimi Linear); an int = DeepSeek's
        low-rank query ``q_b_proj(rmsnorm(q_a_proj(x)))``.
      shared_key_dim: Ds, a key part shared by all heads and cached beside the latent
        (DeepSeek's rotary slot ``qk_rope_head_dim``, used without rotation here); 0 = none.
      norm_eps: epsilon of the latent RMSNorms (1e-5).
      dtype, param_dtype: compute and parameter dtypes (float32).
    """

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
        for name in ("hidden_size", "num_heads", "head_dim", "kv_lora_rank"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        for name in ("value_head_dim", "q_lora_rank"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        object.__setattr__(
            self, "shared_key_dim", _positive_int("shared_key_dim", self.shared_key_dim, minimum=0)
        )
        eps = self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"MLAConfig.norm_eps must be a float > 0, got {eps!r}")

    @property
    def value_dim(self) -> int:
        """Dv: ``value_head_dim``, else ``head_dim``."""
        return self.value_head_dim or self.head_dim

    @property
    def score_dim(self) -> int:
        """Width of a query/key dot product: ``head_dim + shared_key_dim``."""
        return self.head_dim + self.shared_key_dim

    @property
    def cache_width(self) -> int:
        """Numbers cached per token: ``kv_lora_rank + shared_key_dim``."""
        return self.kv_lora_rank + self.shared_key_dim


class MLACache(NamedTuple):
    """Decode state of :class:`MultiHeadLatentAttention`: the compressed latents seen so far.

    ``latents [B, C, r]`` (after the latent RMSNorm) and ``shared_keys [B, C, Ds]`` (None when
    ``shared_key_dim`` is 0). As :class:`kda_lib.layers.attention.AttentionCache`: growing
    (``length``
    None, C = tokens seen, a new shape per step) or fixed capacity (``length`` an int32
    scalar, the first ``length`` of C rows filled; writing past C gives NaN outputs, and
    raises outside jit).
    """

    latents: jax.Array
    shared_keys: jax.Array | None = None
    length: jax.Array | None = None

    @property
    def seen(self):
        return self.latents.shape[1] if self.length is None else self.length


class MultiHeadLatentAttention(nnx.Module):
    """Causal MLA without positional encoding; ``mla(x)`` maps ``[B, T, hidden]`` to itself.

    ``mla(x, cache=cache)`` returns ``(y, new_cache)`` and continues from the cached latents
    (see the module docstring for the absorbed form the cached path uses).
    """

    def __init__(self, config: MLAConfig, *, rngs: nnx.Rngs):
        check_parameters_fit(MultiHeadLatentAttention, config)
        cfg = config
        self.config = cfg
        h, hidden = cfg.num_heads, cfg.hidden_size
        linear = dict(use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        if cfg.q_lora_rank is None:
            self.q_proj = nnx.Linear(hidden, h * cfg.score_dim, **linear)
        else:
            self.q_a_proj = nnx.Linear(hidden, cfg.q_lora_rank, **linear)
            self.q_a_layernorm = self._norm(cfg.q_lora_rank, rngs)
            self.q_b_proj = nnx.Linear(cfg.q_lora_rank, h * cfg.score_dim, **linear)
        self.kv_a_proj_with_mqa = nnx.Linear(hidden, cfg.cache_width, **linear)
        self.kv_a_layernorm = self._norm(cfg.kv_lora_rank, rngs)
        self.kv_b_proj = nnx.Linear(cfg.kv_lora_rank, h * (cfg.head_dim + cfg.value_dim), **linear)
        self.o_proj = nnx.Linear(h * cfg.value_dim, hidden, **linear)

    def _norm(self, width: int, rngs: nnx.Rngs) -> nnx.RMSNorm:
        """A latent RMSNorm, computed in float32; its weight ``scale`` is not decayed (as every
        norm weight, :mod:`kda_lib.layers.params`)."""
        cfg = self.config
        return nnx.RMSNorm(
            width,
            epsilon=cfg.norm_eps,
            dtype=jnp.float32,
            param_dtype=cfg.param_dtype,
            scale_metadata=NO_DECAY,
            rngs=rngs,
        )

    # ----------------------------------------------------------------- pieces
    def _queries(self, x) -> jax.Array:
        cfg = self.config
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            low = self.q_a_layernorm(self.q_a_proj(x).astype(jnp.float32))
            q = self.q_b_proj(low.astype(cfg.dtype))
        return q.reshape(*x.shape[:2], cfg.num_heads, cfg.score_dim)

    def _latents(self, x):
        """The normalised latent ``c [B, T, r]`` and the shared key ``s [B, T, Ds]`` (or None)."""
        cfg = self.config
        ckv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(ckv[..., : cfg.kv_lora_rank].astype(jnp.float32))
        s = ckv[..., cfg.kv_lora_rank :] if cfg.shared_key_dim else None
        return c.astype(cfg.dtype), s

    def _up_weights(self):
        """``kv_b_proj``'s kernel as ``W_uk [r, H, D]`` and ``W_uv [r, H, Dv]``."""
        cfg = self.config
        w = self.kv_b_proj.kernel[...].reshape(
            cfg.kv_lora_rank, cfg.num_heads, cfg.head_dim + cfg.value_dim
        )
        return w[..., : cfg.head_dim], w[..., cfg.head_dim :]

    # ----------------------------------------------------------------- decoding
    def init_cache(self, batch_size: int, max_len: int | None = None) -> MLACache:
        """An empty cache: growing (``max_len`` None) or with room for ``max_len`` tokens."""
        for name, value, optional in (
            ("batch_size", batch_size, False),
            ("max_len", max_len, True),
        ):
            check_int(name, value, optional=optional)
        cfg = self.config
        capacity = 0 if max_len is None else max_len
        shared = (
            jnp.zeros((batch_size, capacity, cfg.shared_key_dim), cfg.dtype)
            if cfg.shared_key_dim
            else None
        )
        return MLACache(
            jnp.zeros((batch_size, capacity, cfg.kv_lora_rank), cfg.dtype),
            shared,
            None if max_len is None else jnp.zeros((), jnp.int32),
        )

    # ----------------------------------------------------------------- forward
    def __call__(
        self,
        x: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        cache: MLACache | None = None,
    ):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given.

        ``segment_ids [B, T]`` (int, 0 = padding, optional, not with a cache): a token attends
        only to earlier tokens of its own segment; padding outputs 0.
        """
        cfg = self.config
        check_hidden(x, cfg.hidden_size)
        segment_ids = checked_segments(segment_ids, cache, *x.shape[:2])
        x = x.astype(cfg.dtype)
        if cache is None:
            return self._forward_expanded(x, segment_ids)
        return self._forward_cached(x, cache)

    def _forward_expanded(self, x, segment_ids):
        """Per-head keys and values formed from the latents (training / prefill form)."""
        cfg = self.config
        batch, seq_len, _ = x.shape
        h, d = cfg.num_heads, cfg.head_dim
        q = self._queries(x)
        c, s = self._latents(x)
        kv = self.kv_b_proj(c).reshape(batch, seq_len, h, d + cfg.value_dim)
        k, v = kv[..., :d], kv[..., d:]
        if s is not None:  # the shared key part, the same for every head
            k = jnp.concatenate(
                [k, jnp.broadcast_to(s[:, :, None], (*k.shape[:3], s.shape[-1]))], -1
            )
        mask = attention_mask(jnp.arange(seq_len), seq_len, segment_ids)
        o = attend(q, k, v, mask, cfg.score_dim**-0.5)
        return self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, h * cfg.value_dim))

    def _check_cache(self, x, cache) -> None:
        """``cache`` must be this layer's :class:`MLACache` for ``x``'s batch, before any work."""
        cfg = self.config
        if not isinstance(cache, MLACache):
            raise ValueError(
                f"cache must be an MLACache, got {type(cache).__name__}; build it with "
                f"mixer.init_cache(batch_size)"
            )
        batch = x.shape[0]
        latents = getattr(cache.latents, "shape", None)
        if latents is None or len(latents) != 3 or latents[::2] != (batch, cfg.kv_lora_rank):
            raise ValueError(
                f"cache.latents must have shape [B={batch}, C, kv_lora_rank={cfg.kv_lora_rank}] "
                f"(a cache of this layer for x's batch), got {latents}"
            )
        want = (batch, latents[1], cfg.shared_key_dim) if cfg.shared_key_dim else None
        got = None if cache.shared_keys is None else getattr(cache.shared_keys, "shape", "?")
        if (want is None) != (got is None) or (want is not None and tuple(got) != want):
            raise ValueError(
                f"cache.shared_keys must be {'None' if want is None else f'of shape {want}'} "
                f"(shared_key_dim={cfg.shared_key_dim}), got {got}"
            )

    def _forward_cached(self, x, cache: MLACache):
        """Attention against the cached latents only (absorbed form), then the new cache."""
        cfg = self.config
        self._check_cache(x, cache)
        batch, seq_len, _ = x.shape
        d = cfg.head_dim
        c_new, s_new = self._latents(x)
        (latents, shared), overflow = write_rows(
            "MLA", (cache.latents, cache.shared_keys), (c_new, s_new), cache.length
        )
        w_uk, w_uv = (w.astype(jnp.float32) for w in self._up_weights())
        q = self._queries(x).astype(jnp.float32)
        # the query moved into latent space: one key/value "head", the latent, for all heads
        query = jnp.einsum("bthd,rhd->bthr", q[..., :d], w_uk)
        key = latents[:, :, None]
        if shared is not None:
            query = jnp.concatenate([query, q[..., d:]], -1)
            key = jnp.concatenate([key, shared[:, :, None]], -1)
        mask = attention_mask(cache.seen + jnp.arange(seq_len), latents.shape[1])
        weighted = attend(query, key, latents[:, :, None], mask, cfg.score_dim**-0.5)
        o = jnp.einsum("bthr,rhv->bthv", weighted, w_uv)
        o = jnp.where(overflow, jnp.nan, o)
        y = self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, -1))
        length = None if cache.length is None else cache.length + seq_len
        return y, MLACache(latents, shared, length)
