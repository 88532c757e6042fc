"""Worked solutions of notebook 07's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math


def layer_cache_bytes(batch, num_heads, key_dim, value_dim, conv_size) -> int:
    """1: the float32 states, B H K V numbers, plus (for conv_size >= 1) the q, k, v conv
    histories of the last conv_size - 1 rows: B (w - 1) H (2 K + V) numbers; 4 bytes each.
    With conv_size = 0 the layer has no conv, so no history at all (not -1 rows)."""
    conv = batch * max(conv_size - 1, 0) * num_heads * (2 * key_dim + value_dim)
    return 4 * (batch * num_heads * key_dim * value_dim + conv)


def second_piece(layer, x_prompt, split):
    """2: the first call returns the cache; the second call starts from it."""
    _, cache = layer(x_prompt[:, :split], cache=layer.init_cache(x_prompt.shape[0]))
    y_b, _ = layer(x_prompt[:, split:], cache=cache)
    return y_b


def t_star(heads, key_dim, value_dim, kv_numbers, state_bytes, cache_bytes) -> int:
    """3: a KDA step reads and writes H K V state numbers, 2 H K V b_S bytes; an attention step
    over T tokens reads T n b_KV bytes. The first whole T with T n b_KV >= 2 H K V b_S."""
    return math.ceil(2 * heads * key_dim * value_dim * state_bytes / (kv_numbers * cache_bytes))


def cases():
    def no_conv_minus_one(b, h, k, v, w):  # (w - 1) rows even when there is no conv
        return 4 * (b * h * k * v + b * (w - 1) * h * (2 * k + v))


    def whole_prompt_sliced(layer, x_prompt, split):
        return layer(x_prompt)[:, split:]

    return [
        ("07.1", layer_cache_bytes, {}, no_conv_minus_one),
        ("07.2", second_piece, {}, whole_prompt_sliced),
        ("07.3", t_star, {}, lambda h, k, v, n, bs, bc: h * k * v * bs / (n * bc)),
    ]
