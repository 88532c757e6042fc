"""Worked solutions of notebook 07's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math


def layer_cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size,
                      conv_bytes) -> int:
    """1: with grouped value heads the state is one K x V matrix per *value* head: B HV K V
    float32 numbers (4 bytes). The conv histories keep the last conv_size - 1 rows of the conv
    inputs, which are q and k (H K channels each) and v (HV V channels): B (w - 1) (2 H K +
    HV V) numbers of ``conv_bytes`` bytes. With conv_size = 0 there is no conv, so no history
    (not -1 rows). Section 3's formula is the case HV = H, conv_bytes = 4."""
    conv = batch * max(conv_size - 1, 0) * (2 * num_heads * key_dim + num_v_heads * value_dim)
    return 4 * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


def second_piece(layer, x_prompt, split):
    """2: the first call returns the cache; the second call starts from it."""
    _, cache = layer(x_prompt[:, :split], cache=layer.init_cache(x_prompt.shape[0]))
    y_b, _ = layer(x_prompt[:, split:], cache=cache)
    return y_b


def t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes) -> int:
    """3: a KDA step reads and writes its whole cache: the state, H K V numbers, and the conv
    histories, (w - 1) H (2 K + V) numbers, all of b_S bytes: 2 b_S H (K V + (w - 1)(2 K + V)).
    An attention step over T cached tokens writes the new token's entry and reads all T + 1:
    (T + 2) n b_KV bytes. The first whole T (at least 1) with (T + 2) n b_KV >= the KDA bytes
    is ceil(KDA / (n b_KV)) - 2. Section 5's T*_step drops the conv and the + 2; at Kimi
    Linear's shape the conv adds (w - 1)(2 K + V) / (K V) = 7 % to the KDA side."""
    kda = 2 * state_bytes * heads * (key_dim * value_dim
                                     + max(conv_size - 1, 0) * (2 * key_dim + value_dim))
    return max(1, math.ceil(kda / (kv_numbers * cache_bytes)) - 2)


def cases():
    def section_3(b, h, hv, k, v, w, cb):  # the page's layout: HV = H, all float32
        return 4 * (b * h * k * v + b * max(w - 1, 0) * h * (2 * k + v))


    def whole_prompt_sliced(layer, x_prompt, split):
        return layer(x_prompt)[:, split:]

    return [
        ("07.1", layer_cache_bytes, {}, section_3),
        ("07.2", second_piece, {}, whole_prompt_sliced),
        ("07.3", t_star, {},
         lambda h, k, v, w, n, bs, bc: math.ceil(2 * h * k * v * bs / (n * bc))),
    ]
