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


def cache_reduction(context, kda_layers, global_layers, heads, head_dim, conv_size, latent,
                    state_bytes, cache_bytes):
    """1: hybrid = kda_layers S + global_layers T latent b_c bytes (b_c = cache_bytes), all-global
    = (kda_layers + global_layers) T latent b_c, so the reduction is kda_layers / L (1 - S /
    (T latent b_c)), L the depth: it tends to kda_layers / L (7 of 27 global layers: 74.1%) and
    is negative for T < S / (latent b_c), where one KDA cache outweighs one global layer's
    latents. Only the ratio state_bytes / cache_bytes matters (a float32 state with an fp8 cache
    is the page's float32/bf16 over again, halved; that pair is not tried).

    Explain why (model answer): Kimi K3 at 4,096 tokens: -0.282 with the page's float32 state
    and bf16 cache (its KDA cache, 6.2 MiB per layer, outweighs an MLA layer's 4.5 MiB of
    latents); +0.213 with a bf16 state (break-even 2,923 tokens instead of 5,654); -1.271 with
    an fp8 latent cache and a float32 state (break-even 11,115). Shrinking the cache helps
    all-MLA more, whose whole memory is cache; shrinking the state helps the hybrid."""
    per_token = cache_bytes * latent
    hybrid = kda_layers * kda_layer_bytes(heads, head_dim, conv_size, state_bytes, cache_bytes) + (
        global_layers * context * per_token
    )
    return 1 - hybrid / ((kda_layers + global_layers) * context * per_token)


def ring_crossover(ranks, heads, head_dim, conv_size, latent) -> int:
    """2: each rank receives (R - 1)/R T 2 latent bytes in ring attention, (R - 1) H d_k 2 d_k 4
    (the summaries) + (w - 1) 3 H d_k 2 (the halo) otherwise; multiplied by R, ring attention
    moves more once T (R - 1) 2 latent > R (summaries + halo): the next whole T past the
    quotient (integers, so no rounding). Kimi Linear on 8 ranks: 29,201 tokens."""
    flat = (ranks - 1) * heads * head_dim * 2 * head_dim * 4 + (
        2 * max(conv_size - 1, 0) * 3 * heads * head_dim)
    return ranks * flat // ((ranks - 1) * 2 * latent) + 1


def decode_crossover(batch, heads, head_dim, conv_size, latent, kda_params, mla_params,
                     weight_bytes) -> int:
    """3: per step, KDA moves b_w kda_params (its weights, b_w = weight_bytes, once) + batch 2 S
    (its state read and written), MLA b_w mla_params + batch T 2 latent (latents read); equal at
    T = (b_w (kda_params - mla_params) + 2 batch S) / (2 batch latent), rounded up, at least 1
    (where MLA's weights outweigh KDA's bytes, MLA moves more from the first token). b_w (k - m)
    is a multiple of 1/2 and the rest integers, so the float quotient is exact enough here.
    Kimi Linear at batch 1: 21,824 tokens with bf16 weights (the page's crossing, section 5),
    12,797 with fp8, 8,283 with int4: quantising the weights shrinks the hybrid's extra weight
    bytes, the whole of its disadvantage at batch 1. At batch 256 fp8 gives 3,805, near the
    state-only 3,769: a large batch shares the weights away."""
    kda = weight_bytes * kda_params + batch * 2 * kda_layer_bytes(heads, head_dim, conv_size)
    return max(1, math.ceil((kda - weight_bytes * mla_params) / (batch * 2 * latent)))


def preset_numbers(name: str) -> tuple[dict, tuple[int, int]]:
    """A preset's numbers as the exercises take them, and its layer counts (KDA, global)."""
    p = presets.PRESETS[name]
    shape = dict(heads=p.num_heads, head_dim=p.head_dim, conv_size=p.conv_size,
                 latent=at_scale.mla_cache_numbers(p))
    return shape, (len(p.kda_layers), len(p.global_layers))


def cases():
    name = presets.KIMI_LINEAR_48B.name
    k3 = presets.KIMI_K3.name
    return [
        ("10.1", cache_reduction, dict(preset=k3, context=4096), lambda *a: 0.75),
        ("10.1", cache_reduction, dict(preset=name, context=2**20),
         lambda c, kda, glob, *a: kda / (kda + glob)),
        ("10.1", cache_reduction, dict(preset=k3, context=4096),  # the page's dtypes
         lambda *a: cache_reduction(*a[:-2], 4, 2)),
        ("10.2", ring_crossover, dict(preset=name, ranks=8),
         lambda r, *a: ring_crossover(r, *a) - 1),
        ("10.2", ring_crossover, dict(preset=k3, ranks=64), lambda r, *a: ring_crossover(8, *a)),
        ("10.3", decode_crossover, dict(preset=name),
         lambda b, h, d, w, latent, *a: math.ceil(2 * kda_layer_bytes(h, d, w) / (2 * latent))),
        ("10.3", decode_crossover, dict(preset=name),  # the page's bf16 weights
         lambda *a: decode_crossover(*a[:-1], 2)),
    ]
