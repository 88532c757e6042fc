"""Causal softmax attention, the quadratic baseline mixer, with RoPE and a decode cache.

``y = o_proj(softmax(mask(q k^T / sqrt(K))) v)`` per head, scores and softmax in float32.
Queries and keys are rotated by their positions (:func:`rotary_embedding`, RoPE) or used as
they are (NoPE, as Kimi Linear's attention layers, ``AttentionConfig(rope=False)``). With
``short_conv`` the q, k and v projections first go through KDA's short causal convolutions
(:func:`kda_lib.layers.conv.qkv_convolutions`). Decoding keeps every key and value seen
(:class:`AttentionCache`): memory linear in the context, the contrast with KDA's fixed state.
:mod:`kda_lib.models.tiny_lm` registers it as the ``"attention"`` and ``"attention_conv"`` mixers.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib.checks import check_array, check_int, check_positive_int
from kda_lib.layers.conv import qkv_convolutions
from kda_lib.layers.params import check_parameters_fit
from kda_lib.ops.contract import check_segment_ids
from kda_lib.ops.segments import canonical_segment_ids


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Hyper-parameters of :class:`CausalSelfAttention`.

    Attributes:
      hidden_size: model width.
      num_heads, head_dim, value_head_dim: H, K and V (V defaults to K).
      rope: rotate q and k by their positions (default True); False is NoPE. Needs an even K.
      short_conv: KDA's short causal convolutions (+ SiLU) on q, k and v (default False).
      conv_size: their width W (default 4; used only with ``short_conv``).
      dtype, param_dtype: compute and parameter dtypes (float32).
    """

    hidden_size: int
    num_heads: int
    head_dim: int
    value_head_dim: int | None = None
    rope: bool = True
    short_conv: bool = False
    conv_size: int = 4
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def __post_init__(self):
        for name in ("hidden_size", "num_heads", "head_dim"):
            check_positive_int(f"AttentionConfig.{name}", getattr(self, name))
        if self.value_head_dim is not None:
            check_positive_int("AttentionConfig.value_head_dim", self.value_head_dim)
        check_positive_int("AttentionConfig.conv_size", self.conv_size, minimum=0)
        for name in ("rope", "short_conv"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"AttentionConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.rope and self.head_dim % 2:
            raise ValueError(f"attention needs an even head_dim for RoPE, got {self.head_dim}")
        if self.short_conv and self.conv_size < 1:
            raise ValueError(f"short_conv needs conv_size >= 1, got {self.conv_size}")

    @property
    def value_dim(self) -> int:
        return self.value_head_dim or self.head_dim


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
    same depthwise causal convolution + SiLU as in the KDA layer (width ``conv_size``). H, K
    and V come from its :class:`AttentionConfig`; it has no gate or decay.
    """

    def __init__(self, config: AttentionConfig, *, rngs: nnx.Rngs):
        check_parameters_fit(CausalSelfAttention, config)
        self.config = config
        self.rope = config.rope
        self.short_conv = config.short_conv
        h, kd, vd, hidden = config.num_heads, config.head_dim, config.value_dim, config.hidden_size
        linear = dict(use_bias=False, dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(hidden, h * kd, **linear)
        self.k_proj = nnx.Linear(hidden, h * kd, **linear)
        self.v_proj = nnx.Linear(hidden, h * vd, **linear)
        if config.short_conv:
            self.q_conv1d, self.k_conv1d, self.v_conv1d = qkv_convolutions(
                h * kd,
                h * vd,
                config.conv_size,
                dtype=config.dtype,
                param_dtype=config.param_dtype,
                rngs=rngs,
            )
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> AttentionCache:
        """An empty cache: growing (``max_len`` None) or with room for ``max_len`` tokens."""
        cfg = self.config
        check_int("batch_size", batch_size)
        check_int("max_len", max_len, optional=True)
        capacity = 0 if max_len is None else max_len
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

    def _project(self, x, cache, segment_ids=None):
        """q, k, v ``[B, T, H*D]`` and the new conv states (None without short_conv)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if not self.short_conv:
            return (q, k, v), (None, None, None)
        states = (None, None, None) if cache is None else (cache.q_conv, cache.k_conv, cache.v_conv)
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        pairs = [
            conv(a, conv_state=state, segment_ids=segment_ids)
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
        h, kd, vd, width = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.conv_size - 1
        keys = getattr(cache.keys, "shape", ())
        seen = keys[1] if len(keys) == 4 else None
        want = {"keys": (batch, seen, h, kd), "values": (batch, seen, h, vd)}
        for name, channels in zip(
            ("q_conv", "k_conv", "v_conv"), (h * kd, h * kd, h * vd), strict=True
        ):
            want[name] = (batch, width, channels) if self.short_conv else None
        for name, shape in want.items():
            got = getattr(cache, name)
            got = None if got is None else tuple(getattr(got, "shape", (type(got).__name__,)))
            if got != shape:
                raise ValueError(f"cache.{name} has shape {got}, expected {shape}; {build}")

    def __call__(
        self,
        x: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        cache: AttentionCache | None = None,
    ):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given.

        ``segment_ids [B, T]`` (int, 0 = padding, optional, not with a cache): a token attends
        only to earlier real tokens of its own segment (the rule of :mod:`kda_lib.ops.segments`);
        padding outputs 0."""
        cfg = self.config
        check_hidden(x, cfg.hidden_size)
        batch, seq_len, _ = x.shape
        h, kd, vd = cfg.num_heads, cfg.head_dim, cfg.value_dim
        if cache is not None:
            self._check_cache(cache, batch)
        segment_ids = checked_segments(segment_ids, cache, batch, seq_len)
        x = x.astype(cfg.dtype)
        seen = 0 if cache is None else cache.seen
        positions = seen + jnp.arange(seq_len)
        (q, k, v), conv_states = self._project(x, cache, segment_ids)
        q, k = q.reshape(batch, seq_len, h, kd), k.reshape(batch, seq_len, h, kd)
        v = v.reshape(batch, seq_len, h, vd)
        if self.rope:
            q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)
        keys, values, overflow = k, v, False
        if cache is not None:
            (keys, values), overflow = write_rows(
                "attention", (cache.keys, cache.values), (k, v), cache.length
            )
        mask = attention_mask(positions, keys.shape[1], segment_ids)
        o = attend(q, keys, values, mask, kd**-0.5)
        o = jnp.where(overflow, jnp.nan, o)
        y = self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, h * vd))
        if cache is None:
            return y
        length = None if cache.length is None else cache.length + seq_len
        return y, AttentionCache(keys, values, length, *conv_states)


def check_hidden(x, hidden_size: int) -> None:
    """``x`` must be ``[B, T, hidden_size]``."""
    if getattr(x, "ndim", None) != 3 or x.shape[-1] != hidden_size:
        raise ValueError(
            f"x must have shape [B, T, hidden_size={hidden_size}], "
            f"got {getattr(x, 'shape', type(x).__name__)}"
        )


def checked_segments(segment_ids, cache, batch: int, seq_len: int):
    """Canonical ``segment_ids [B, T]`` (or None), checked before any work; refused with a
    cache (decode one document per row)."""
    if segment_ids is None:
        return None
    if cache is not None:
        raise ValueError("segment_ids cannot be combined with a cache: decode one document per row")
    check_array("segment_ids", segment_ids)
    check_segment_ids(segment_ids, batch, seq_len)
    return canonical_segment_ids(segment_ids)  # host ids numbered before any conversion


def attention_mask(positions, num_keys: int, segment_ids=None) -> jax.Array:
    """Boolean ``[B|1, 1, T, S]``: query at ``positions [T]`` sees keys ``0..position``; with
    canonical ``segment_ids [B, T]`` (S = T) only real keys of its own segment."""
    allowed = (positions[:, None] >= jnp.arange(num_keys)[None, :])[None, None]
    if segment_ids is None:
        return allowed
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] != 0)
    return allowed & same[:, None]


def attend(q, k, v, mask, scale: float) -> jax.Array:
    """Softmax attention in float32: ``q [B, T, H, D]`` over ``k [B, S, G, D]``, ``v [B, S, G,
    V]`` (G divides H), boolean ``mask [B|1, 1, T, S]``. ``jax.nn.dot_product_attention`` where
    D = V; where they differ (MLA: D = d_qk + d_R) the same product written out, since the
    library needs equal widths and zero-padding would multiply zeros. Rows with no allowed key
    output 0. Returns ``[B, T, H, V]`` float32."""
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    seen = jnp.moveaxis(mask.any(-1), 1, 2)[..., None]  # [B|1, T, 1, 1]
    if q.shape[-1] == v.shape[-1]:
        o = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    else:  # query heads in G groups of R, each group reading its key/value head
        b, t, h, _ = q.shape
        g = k.shape[2]
        grouped = q.reshape(b, t, g, h // g, q.shape[-1])
        scores = jnp.einsum("btgrd,bsgd->bgrts", grouped, k) * scale
        masked = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(masked, axis=-1)
        o = jnp.einsum("bgrts,bsgv->btgrv", weights, v).reshape(b, t, h, v.shape[-1])
    return jnp.where(seen, o, 0.0)


def write_rows(what: str, buffers, new, length):
    """The cache ``buffers [B, C, ...]`` (None entries stay None) with the ``new [B, T, ...]``
    rows appended (``length`` None) or written at ``length`` (fixed capacity), and whether they
    overflow its capacity C (a traced flag under jit; outside jit an overflow raises)."""
    seq_len = new[0].shape[1]
    if length is None:
        rows = [
            None if b is None else jnp.concatenate([b, n.astype(b.dtype)], 1)
            for b, n in zip(buffers, new, strict=True)
        ]
        return tuple(rows), False
    capacity = buffers[0].shape[1]
    overflow = length + seq_len > capacity
    if seq_len > capacity or (not isinstance(overflow, jax.core.Tracer) and bool(overflow)):
        filled = "?" if isinstance(overflow, jax.core.Tracer) else int(length)
        raise ValueError(
            f"the {what} cache holds {capacity} tokens; {filled} are filled, {seq_len} "
            f"more do not fit (init_cache(..., max_len=...))"
        )
    rows = [
        None
        if b is None
        else jax.lax.dynamic_update_slice(b, n.astype(b.dtype), (0, length) + (0,) * (b.ndim - 2))
        for b, n in zip(buffers, new, strict=True)
    ]
    return tuple(rows), overflow
