"""Worked solutions of notebook 10's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math

from kda_lib.lab import at_scale
from kda_lib.models import presets


def kda_layer_bytes(heads, head_dim, conv_size) -> int:
    """One sequence's KDA cache: a float32 state of H d_k d_v numbers (d_v = d_k) and the last
    w - 1 inputs of its 2 H d_k + H d_v conv channels in bf16."""
    return 4 * heads * head_dim * head_dim + 2 * max(conv_size - 1, 0) * 3 * heads * head_dim


def cache_reduction(context, kda_layers, global_layers, heads, head_dim, conv_size, latent):
    """1: hybrid = kda_layers S + global_layers T (2 latent) bytes, all-global = (kda_layers +
    global_layers) T (2 latent), so the reduction is kda_layers / L (1 - S / (2 T latent)), L
    the depth: it tends to kda_layers / L (7 of 27 global layers: 74.1%) and is negative for
    T < S / (2 latent), where one KDA state outweighs one global layer's latents.

    Explain why (model answer): Kimi K3 at 4,096 tokens gives -0.282: its KDA state, 6.2 MiB
    per layer, is more than one MLA layer's 4.5 MiB of latents at 4K, so the hybrid needs 28%
    more memory than all-MLA; it saves memory only beyond S / (2 latent) tokens. Kimi Linear's
    hybrid likewise needs more below 1,885 tokens (section 4)."""
    per_token = 2 * latent
    hybrid = kda_layers * kda_layer_bytes(heads, head_dim, conv_size) + (
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


def decode_crossover(batch, heads, head_dim, conv_size, latent, kda_params, mla_params) -> int:
    """3: per step, KDA moves 2 kda_params (bf16 weights, once) + batch 2 S (its state read and
    written), MLA 2 mla_params + batch T 2 latent (latents read); equal at
    T = (2 (kda_params - mla_params) + 2 batch S) / (2 batch latent), rounded up, at least 1.
    At batch 1 the weights' difference dominates (Kimi Linear: 21,824 tokens, against 3,769 for
    the state alone); as the batch grows it fades and T tends to 2 S / (2 latent)."""
    kda = 2 * kda_params + batch * 2 * kda_layer_bytes(heads, head_dim, conv_size)
    return max(1, math.ceil((kda - 2 * mla_params) / (batch * 2 * latent)))


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
        ("10.2", ring_crossover, dict(preset=name, ranks=8),
         lambda r, *a: ring_crossover(r, *a) - 1),
        ("10.2", ring_crossover, dict(preset=k3, ranks=64), lambda r, *a: ring_crossover(8, *a)),
        ("10.3", decode_crossover, dict(preset=name),
         lambda b, h, d, w, latent, *a: math.ceil(2 * kda_layer_bytes(h, d, w) / (2 * latent))),
    ]
