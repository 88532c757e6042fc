"""Causal softmax attention, the quadratic baseline mixer, and what all mixers share (config,
input and cache checks, caches). ``y = o_proj(softmax(mask(q k^T / sqrt(K))) v)`` per head
(float32 scores); q, k rotated by position (RoPE) unless ``rope=False``; ``short_conv``: q, k, v
first through KDA's short convs. The cache keeps every key and value."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from kda_lib import checks
from kda_lib.checks import (
    allocation_problem,
    check_activation,
    check_allocation,
    check_array,
    check_int,
    dominant_size,
)
from kda_lib.layers.conv import ShortConvolution, window_segment_ids
from kda_lib.layers.params import check_parameters_fit
from kda_lib.ops.contract import check_segment_ids
from kda_lib.ops.segments import canonical_segment_ids

_FIELD_CHECKS = {  # kind -> check(name, value), returning the value stored
    "int": lambda name, value: checks.check_positive_int(name, value, 1),
    "int0": lambda name, value: checks.check_positive_int(name, value, 0),
    "width": lambda name, value: check_int(name, value, optional=True),  # None or >= 1
    "eps": lambda name, value: checks.check_number(name, value, positive=True),
    "bool": checks.check_flag,
    "dtype": lambda name, value: (checks.check_float_dtype(name, value), value)[1],  # as given
}


def check_fields(config, **kinds: str) -> None:
    """Check and store ``config``'s fields listed under each :data:`_FIELD_CHECKS` kind."""
    for kind, fields in kinds.items():
        for field in fields.split():
            name = f"{type(config).__name__}.{field}"
            object.__setattr__(config, field, _FIELD_CHECKS[kind](name, getattr(config, field)))


class Widths:
    """What every mixer config with ``head_dim`` and ``value_head_dim`` derives."""

    value_dim = property(lambda self: self.value_head_dim or self.head_dim)  # V (None: K)
    value_heads = property(lambda self: getattr(self, "num_v_heads", None) or self.num_heads)  # HV


@dataclasses.dataclass(frozen=True)
class AttentionConfig(Widths):
    """Hyper-parameters of :class:`CausalSelfAttention`: ``hidden_size``; ``num_heads`` H of
    ``head_dim`` K and ``value_head_dim`` V (None = K); ``rope`` (True; needs an even K);
    ``short_conv`` (False) of width ``conv_size`` (4); ``dtype``, ``param_dtype`` (float32)."""

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
        check_fields(self, int="hidden_size num_heads head_dim", width="value_head_dim",
                     bool="rope short_conv", int0="conv_size",
                     dtype="dtype param_dtype")  # fmt: skip
        if self.rope and self.head_dim % 2:
            raise ValueError(f"attention needs an even head_dim for RoPE, got {self.head_dim}")


class AttentionCache(NamedTuple):
    """Decode state of :class:`CausalSelfAttention`: ``keys [B, C, H, K]``, ``values [B, C, H,
    V]``, growing (``length`` None) or fixed capacity (``length`` int32, rows filled; past C:
    NaN, or raises outside jit); ``q_conv, k_conv, v_conv [B, W-1, channels]`` or None."""

    keys: jax.Array
    values: jax.Array
    length: jax.Array | None = None
    q_conv: jax.Array | None = None
    k_conv: jax.Array | None = None
    v_conv: jax.Array | None = None

    @property
    def seen(self):
        """Tokens seen so far (an int for a growing cache, an int32 array for a fixed one)."""
        return self[0].shape[1] if self.length is None else self.length


class CausalSelfAttention(nnx.Module):
    """Multi-head causal softmax attention ``[B, T, hidden] -> [B, T, hidden]``, with a cache."""

    cache_type, cache_kind = AttentionCache, "an AttentionCache"

    def __init__(self, config: AttentionConfig, *, rngs: nnx.Rngs):
        check_parameters_fit(CausalSelfAttention, config)
        self.config = cfg = config
        h, kd, vd, hidden = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.hidden_size
        linear = dict(use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.q_proj, self.k_proj, self.v_proj = (nnx.Linear(hidden, h * d, **linear)
                                                 for d in (kd, kd, vd))  # fmt: skip
        if cfg.short_conv:
            conv = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
            self.q_conv1d, self.k_conv1d, self.v_conv1d = (
                ShortConvolution(c, cfg.conv_size, **conv) for c in (h * kd, h * kd, h * vd)
            )
        self.o_proj = nnx.Linear(h * vd, hidden, **linear)

    def __call__(self, x: jax.Array, *, segment_ids=None, cache: AttentionCache | None = None):
        """``x [B, T, hidden]`` -> ``y``, or ``(y, new_cache)`` when a cache is given.
        ``segment_ids [B, T]`` (int, 0 = padding, not with a cache): a token attends only to
        earlier real tokens of its own segment; padding outputs 0."""
        cfg = self.config
        segment_ids, _ = check_call(self, x, segment_ids, cache)
        batch, seq_len, _ = x.shape
        x = x.astype(cfg.dtype)
        positions = (0 if cache is None else cache.seen) + jnp.arange(seq_len)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_states = (None, None, None)
        if cfg.short_conv:
            convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
            states = None if cache is None else cache[3:]
            (q, k, v), conv_states = mix_convs(convs, (q, k, v), states, segment_ids)
        q, k, v = (z.reshape(batch, seq_len, cfg.num_heads, -1) for z in (q, k, v))
        if cfg.rope:
            q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)
        keys, values, length, overflow = k, v, None, False
        if cache is not None:
            (keys, values), length, overflow = write_rows(
                "attention", (cache.keys, cache.values), (k, v), cache.length
            )
        mask = attention_mask(positions, keys.shape[1], segment_ids)
        o = jnp.where(overflow, jnp.nan, attend(q, keys, values, mask, cfg.head_dim**-0.5))
        y = self.o_proj(o.astype(cfg.dtype).reshape(batch, seq_len, -1))
        return y if cache is None else (y, AttentionCache(keys, values, length, *conv_states))

    def init_cache(self, batch_size: int, max_len: int | None = None) -> AttentionCache:
        """An empty cache: growing (``max_len`` None) or with room for ``max_len`` tokens."""
        length = None if max_len is None else jnp.zeros((), jnp.int32)
        return empty_cache(self, batch_size, max_len, length=length)

    def _cache_shapes(self, batch: int, rows: int) -> dict:
        cfg = self.config
        h, kd, vd, width = cfg.num_heads, cfg.head_dim, cfg.value_dim, cfg.conv_size - 1
        conv = lambda c: (batch, width, c) if cfg.short_conv else None
        return dict(keys=(batch, rows, h, kd), values=(batch, rows, h, vd),
                    q_conv=conv(h * kd), k_conv=conv(h * kd), v_conv=conv(h * vd))  # fmt: skip


# ------------------------------------------------------------------ shared by the mixers
def check_call(layer, x, segment_ids, cache):
    """A mixer's entry checks: ``x`` (:func:`kda_lib.checks.check_activation`), then
    :func:`check_cache_and_ids`. Returns ``(canonical ids, the most segments in one row)`` or
    ``(None, None)``."""
    check_activation("x", x, layer.config.hidden_size)
    return check_cache_and_ids(layer, x.shape[0], x.shape[1], segment_ids, cache)


def check_cache_and_ids(layer, batch: int, seq_len: int, segment_ids, cache):
    """``cache`` (:func:`check_cache`), ``segment_ids [B, T]`` ints (0 = padding), not with a
    cache: :func:`check_call`'s return."""
    if cache is not None and hasattr(layer, "cache_type"):
        check_cache(cache, layer, batch)
    if segment_ids is None:
        return None, None
    if cache is not None:
        raise ValueError("segment_ids cannot be combined with a cache: decode one document per row")
    count = check_segment_ids(segment_ids, batch, seq_len)  # the call's one host read
    return canonical_segment_ids(segment_ids), count


def check_cache(cache, layer, batch: int) -> None:
    """``cache`` a ``layer.cache_type`` of floating arrays shaped ``layer._cache_shapes``."""
    kind, cls = layer.cache_kind, layer.cache_type
    build = f"build it with init_cache({batch}) (or pass on the cache a call returned)"
    if not isinstance(cache, cls):
        raise ValueError(f"cache must be {kind}, got {type(cache).__name__}; {build}")
    first = tuple(getattr(cache[0], "shape", ()))
    for name, shape in layer._cache_shapes(batch, first[1] if len(first) > 1 else 0).items():
        got = getattr(cache, name)
        if got is not None:
            check_array(f"cache.{name}", got, floating=True)
            got = tuple(got.shape)
        if got != shape:
            raise ValueError(f"cache.{name} has shape {got}, expected {shape} for batch size "
                             f"{batch}; {build}")  # fmt: skip


def empty_cache(layer, batch_size, max_len: int | None = None, **fields):
    """A ``layer.cache_type`` of zeros for ``batch_size`` rows, ``max_len`` tokens (past memory:
    refused); ``state`` float32, else the layer's dtype."""
    batch_size = check_int("init_cache: batch_size", batch_size)
    check_int("max_len", max_len, optional=True)
    dtype = getattr(layer.config, "dtype", jnp.float32)
    shapes = layer._cache_shapes(batch_size, max_len or 0)
    dtypes = {n: jnp.float32 if n == "state" else dtype for n in shapes}

    def nbytes(sizes):
        shapes = layer._cache_shapes(sizes["batch_size"], sizes["max_len"])
        return sum(math.prod(s) * jnp.dtype(dtypes[n]).itemsize for n, s in shapes.items() if s)

    sizes = {"batch_size": batch_size, "max_len": max_len or 0}
    if allocation_problem("the cache", total := nbytes(sizes)):
        name = dominant_size(sizes, nbytes)
        check_allocation(name, sizes[name], "the cache", total)
    zeros = {n: s and jnp.zeros(s, dtypes[n]) for n, s in shapes.items()}
    return layer.cache_type(**zeros, **fields)


def mix_convs(convs, streams, states, segment_ids, history_segment_ids=None):
    """Each stream ``[B, T, C]`` through its conv (None: SiLU) from ``states``: ``(out, new)``."""
    if convs[0] is None:
        return tuple(jax.nn.silu(z) for z in streams), (None,) * len(streams)
    width = convs[0].conv_size
    window = None
    if segment_ids is not None and width > 1:
        window = window_segment_ids(segment_ids, history_segment_ids, width)
    states = states or (None,) * len(convs)
    mixed = [conv.mix(z, s, window) for conv, z, s in zip(convs, streams, states, strict=True)]
    return tuple(m[0] for m in mixed), tuple(m[1] for m in mixed)


def rotary_embedding(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """RoPE: channel pairs ``(i, i + D/2)`` of ``x [B, T, H, D]`` rotated by ``t base^(-2i/D)``."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs  # [T, D/2]
    cos, sin = jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]  # [T, 1, D/2]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


def attention_mask(positions, num_keys: int, segment_ids=None) -> jax.Array:
    """Boolean ``[B|1, 1, T, S]``: causal by ``positions [T]``, within ``segment_ids [B, T]``."""
    allowed = (positions[:, None] >= jnp.arange(num_keys)[None, :])[None, None]
    if segment_ids is None:
        return allowed
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] != 0)
    return allowed & same[:, None]


def attend(q, k, v, mask, scale: float) -> jax.Array:
    """Softmax attention in float32: ``q [B, T, H, D]`` over ``k [B, S, G, D]``, ``v [B, S, G,
    V]`` (G divides H), ``mask [B|1, 1, T, S]`` -> ``[B, T, H, V]``, 0 where no key is allowed."""
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    seen = jnp.moveaxis(mask.any(-1), 1, 2)[..., None]  # [B|1, T, 1, 1]
    if q.shape[-1] == v.shape[-1]:
        o = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    else:  # query heads in G groups of R, each group reading its key/value head
        b, t, h, d = q.shape
        g = k.shape[2]
        scores = jnp.einsum("btgrd,bsgd->bgrts", q.reshape(b, t, g, h // g, d), k) * scale
        masked = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(masked, axis=-1)
        o = jnp.einsum("bgrts,bsgv->btgrv", weights, v).reshape(b, t, h, v.shape[-1])
    return jnp.where(seen, o, 0.0)


def write_rows(what: str, buffers, new, length):
    """``(buffers [B, C, ...] with new [B, T, ...] appended (length None) or written at length,
    the new length, whether they overflow C)``; outside jit an overflow raises."""
    seq_len = new[0].shape[1]
    if length is None:
        return tuple(None if b is None else jnp.concatenate([b, n.astype(b.dtype)], 1)
                     for b, n in zip(buffers, new, strict=True)), None, False  # fmt: skip
    capacity = buffers[0].shape[1]
    overflow = length + seq_len > capacity
    traced = isinstance(overflow, jax.core.Tracer)
    if seq_len > capacity or (not traced and bool(overflow)):
        raise ValueError(
            f"the {what} cache holds {capacity} tokens; {'?' if traced else int(length)} are "
            f"filled, {seq_len} more do not fit (init_cache(..., max_len=...))"
        )
    start = lambda b: (0, length) + (0,) * (b.ndim - 2)
    written = tuple(None if b is None else jax.lax.dynamic_update_slice(b, n.astype(b.dtype),
                    start(b)) for b, n in zip(buffers, new, strict=True))  # fmt: skip
    return written, length + seq_len, overflow
