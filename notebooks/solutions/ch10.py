"""Worked solutions of notebook 10's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math

from kda_lib.lab import at_scale
from kda_lib.models import presets


def kda_layer_bytes(heads, head_dim, conv_size, state_bytes=4, cache_bytes=2) -> int:
    """One sequence's KDA cache: a state of H d_k d_v numbers (d_v = d_k), ``state_bytes`` each,
    and the last w - 1 inputs of its 2 H d_k + H d_v conv channels, ``cache_bytes`` each."""
    return (state_bytes * heads * head_dim * head_dim
            + cache_bytes * max(conv_size - 1, 0) * 3 * heads * head_dim)


def reduction_context(fraction, kda_layers, global_layers, heads, head_dim, conv_size, mla_numbers,
                      kv_heads) -> float:
    """1: with c = 2 mla_numbers the bytes of one token's MLA latents, c_G = 2 (2 kv_heads head_dim)
    those of its GQA keys and values, k = kda_layers and g = global_layers of L layers and m the
    bytes of one KDA cache (float32 state, bf16 conv history),
    1 - hybrid / all-GQA = 1 - (k m + g T c) / (L T c_G). Setting it to f:
    T (L (1 - f) c_G - g c) = k m, so T = k m / (L (1 - f) c_G - g c), positive for f below the
    limit 1 - g c / (L c_G) only (the reduction as T -> infinity); at or above it no T reaches
    f: math.inf.

    Explain why (model answer): Kimi K3 at a half against GQA with 8 key/value heads: 2,760
    tokens (limit 92.7%); against section 6's all-MLA baseline 17,337 (limit 74.2%). Two effects:
    GQA's 4,096 bytes a token against MLA's 1,152 make every GQA layer's cache 3.6x larger, so
    each KDA cache is outgrown 3.6x sooner (with the hybrid's global layers as dear as GQA's, a
    half at 4,876 tokens instead of 17,337); the global layers' latents then save
    g (c_G - c) / (L c_G) = 18.5 points of the half on top, which brings it to 2,760. With one
    key/value head (512 bytes a token, below MLA's) the limit falls to 41.9%: a half is out of
    reach (math.inf), a quarter takes 55,726 tokens."""
    kda = kda_layer_bytes(heads, head_dim, conv_size)
    gqa, mla = 2 * 2 * kv_heads * head_dim, 2 * mla_numbers
    room = (kda_layers + global_layers) * (1 - fraction) * gqa - global_layers * mla
    return kda_layers * kda / room if room > 0 else math.inf


def ring_crossover(ranks, heads, head_dim, conv_size, mla_numbers) -> int:
    """2: each rank receives (R - 1)/R T 2 mla_numbers bytes in ring attention, (R - 1) H d_k
    2 d_k 4 (the summaries: notebook 05's all-gather of the other ranks' (M, E)) + (w - 1) 3 H
    d_k 2 (the halo) otherwise; multiplied by R, ring attention moves more once
    T (R - 1) 2 mla_numbers > R (summaries + halo): the next whole T past the quotient
    (integers, so no rounding). Kimi Linear on 8 ranks: 29,201 tokens."""
    flat = (ranks - 1) * heads * head_dim * 2 * head_dim * 4 + (
        2 * max(conv_size - 1, 0) * 3 * heads * head_dim)
    return ranks * flat // ((ranks - 1) * 2 * mla_numbers) + 1


def decode_crossover(batch, heads, head_dim, conv_size, mla_numbers, kda_params, mla_params,
                     weight_bytes) -> int:
    """3: per step, KDA moves b_w kda_params (its weights, b_w = weight_bytes, once) + batch 2 m
    (m its cache's bytes, state and conv history, read and written), MLA b_w mla_params +
    batch T 2 mla_numbers (latents read); equal at
    T = (b_w (kda_params - mla_params) + 2 batch m) / (2 batch mla_numbers), rounded up, at least 1
    (where MLA's weights outweigh KDA's bytes, MLA moves more from the first token).
    b_w (kda_params - mla_params) is a multiple of 1/2 and the rest integers, so the float
    quotient is exact enough here.
    Kimi Linear at batch 1: 21,824 tokens with bf16 weights (where the whole model's
    decode step stops being slower than all-MLA's, the notes),
    12,797 with fp8, 8,283 with int4: quantising the weights shrinks the hybrid's extra weight
    bytes, the whole of its disadvantage at batch 1. At batch 256 fp8 gives 3,805, near the
    state-only 3,769: a large batch shares the weights away."""
    kda = weight_bytes * kda_params + batch * 2 * kda_layer_bytes(heads, head_dim, conv_size)
    return max(1, math.ceil((kda - weight_bytes * mla_params) / (batch * 2 * mla_numbers)))


def preset_numbers(name: str) -> tuple[dict, tuple[int, int]]:
    """A preset's numbers as the exercises take them, and its layer counts (KDA, global)."""
    p = presets.PRESETS[name]
    shape = dict(heads=p.num_heads, head_dim=p.head_dim, conv_size=p.conv_size,
                 mla_numbers=at_scale.mla_cache_numbers(p))
    return shape, (len(p.kda_layers), len(p.global_layers))


def cases():
    name = presets.KIMI_LINEAR_48B.name
    k3 = presets.KIMI_K3.name
    return [
        ("10.1", reduction_context, dict(preset=k3, fraction=0.5), lambda *a: 2_760.0),
        ("10.1", reduction_context, dict(preset=name, fraction=0.5),  # fraction ignored
         lambda f, *a: reduction_context(0.0, *a)),
        ("10.1", reduction_context, dict(preset=k3, fraction=0.5),  # section 6's all-MLA
         lambda f, k, g, h, d, w, n, kv: reduction_context(f, k, g, h, d, w, n,
                                                                n / (2 * d))),
        ("10.2", ring_crossover, dict(preset=name, ranks=8),
         lambda r, *a: ring_crossover(r, *a) - 1),
        ("10.2", ring_crossover, dict(preset=k3, ranks=64), lambda r, *a: ring_crossover(8, *a)),
        ("10.3", decode_crossover, dict(preset=name),
         lambda b, h, d, w, n, *a: math.ceil(2 * kda_layer_bytes(h, d, w) / (2 * n))),
        ("10.3", decode_crossover, dict(preset=name),  # the page's bf16 weights
         lambda *a: decode_crossover(*a[:-1], 2)),
    ]
