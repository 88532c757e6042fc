"""Worked solutions of notebook 07's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

import kda_lib


def state_only_cache(config: kda_lib.KDAConfig, batch: int) -> int:
    """1: with conv_size=0 the cache holds the float32 states alone, B H K V numbers."""
    plain = kda_lib.KimiDeltaAttention(dataclasses.replace(config, conv_size=0), rngs=nnx.Rngs(0))
    return sum(a.nbytes for a in jax.tree.leaves(plain.init_cache(batch)))


def two_piece_prefill(layer, x_prompt):
    """2: the second call starts from the cache the first returned."""
    half = x_prompt.shape[1] // 2
    y_a, cache = layer(x_prompt[:, :half], cache=layer.init_cache(x_prompt.shape[0]))
    y_b, _ = layer(x_prompt[:, half:], cache=cache)
    return jnp.concatenate([y_a, y_b], axis=1)


def t_star(heads, key_dim, value_dim, kv_numbers, state_bytes, cache_bytes) -> int:
    """3: a KDA step reads and writes H K V state numbers, 2 H K V b_S bytes; an attention step
    over T tokens reads T n b_KV bytes. The first whole T with T n b_KV >= 2 H K V b_S."""
    return math.ceil(2 * heads * key_dim * value_dim * state_bytes / (kv_numbers * cache_bytes))


def cases():
    config = kda_lib.KDAConfig(
        hidden_size=16, num_heads=2, head_dim=8, conv_size=4, implementation="recurrent"
    )
    layer = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (1, 12, 16))
    full = layer(x)
    cache_context = dict(batch=1, num_heads=2, key_dim=8, value_dim=8)
    return [
        (
            "07.1",
            state_only_cache(config, 1),
            cache_context,
            sum(a.nbytes for a in jax.tree.leaves(layer.init_cache(1))),
        ),
        ("07.2", two_piece_prefill(layer, x), dict(full=full, prompt=x), layer(x[:, 6:])),
        ("07.3", t_star, {}, lambda h, k, v, n, bs, bc: h * k * v * bs / (n * bc)),
    ]
