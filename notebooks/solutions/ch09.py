"""Worked solutions of notebook 09's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import numpy as np


def hybrid_cache_bytes(
    context, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size, decode_steps
) -> int:
    """1: KDA layers: a float32 state H K K plus three conv tails of (W - 1) H K numbers each
    (q, k, v with K = V; none when W <= 1); MLA layers: one latent of r = kv_lora_rank float32
    numbers per token for a capacity of context + decode_steps + 1 tokens (``decode_cost``
    leaves room for its steps and one more), plus an int32 length (4 bytes)."""
    kda_layer = 4 * (heads * key_dim * key_dim + 3 * max(conv_size - 1, 0) * heads * key_dim)
    mla_layer = (context + decode_steps + 1) * kv_lora_rank * 4 + 4
    return kda_layers * kda_layer + mla_layers * mla_layer


def attention_share(cache_bytes, *, kda_layers, heads, key_dim, value_dim, conv_size) -> float:
    """2: one minus the KDA layers' fixed share (the rest is the MLA latents)."""
    kda_layer = 4 * (
        heads * key_dim * value_dim + (conv_size - 1) * heads * (2 * key_dim + value_dim)
    )
    return 1 - kda_layers * kda_layer / cache_bytes


def largest_context_gain(bpb_by_position: dict) -> str:
    """3: the first quarter's mean minus the last quarter's, largest."""

    def gain(curve):
        y = np.asarray(curve)
        return y[: y.size // 4].mean() - y[-(y.size // 4) :].mean()

    return max(bpb_by_position, key=lambda name: gain(bpb_by_position[name]))


def cases():
    shape = dict(
        kda_layers=1, mla_layers=1, heads=2, key_dim=16, kv_lora_rank=16, conv_size=4,
        decode_steps=8,
    )
    measured = {c: hybrid_cache_bytes(c, **shape) for c in (64, 512, 2048)}  # as decode_cost
    lookup = measured.__getitem__  # a lookup of the measurements: fails at other contexts

    share = dict(
        cache_bytes=measured[2048], kda_layers=1, heads=2, key_dim=16, value_dim=16, conv_size=4
    )
    curves = {
        "kda": np.linspace(3.0, 2.0, 64).tolist(),
        "attention": np.linspace(3.0, 2.5, 64).tolist(),
    }
    return [
        (
            "09.1",
            hybrid_cache_bytes,
            dict(measured=measured, shape=shape),
            lambda c, *_: lookup(c),
        ),
        ("09.2", attention_share(**share), share, 1 - attention_share(**share)),
        ("09.3", largest_context_gain(curves), dict(bpb_by_position=curves), "attention"),
    ]
