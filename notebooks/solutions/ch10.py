"""Worked solutions of notebook 10's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math

from kda_lib.lab import at_scale
from kda_lib.models import presets


def cache_reduction(preset: str, context: int) -> float:
    """1: all mixer layers, one sequence: MLA latents in the global layers, the KDA layers'
    float32 state and bf16 conv history in the others."""
    p = presets.PRESETS[preset]
    hybrid = len(p.global_layers) * context * at_scale.mla_cache_numbers(p) * 2 + len(
        p.kda_layers
    ) * at_scale.kda_state_bytes(p)
    return 1 - hybrid / (p.num_layers * context * at_scale.mla_cache_numbers(p) * 2)


def ring_crossover(preset: str, ranks: int) -> int:
    """2: (R - 1)/R T n b_KV > summaries + halo: the first whole T past the equality."""
    p = presets.PRESETS[preset]
    flat = at_scale.cp_summary_bytes(p, ranks) + at_scale.cp_halo_bytes(p)
    per_token = (ranks - 1) / ranks * at_scale.mla_cache_numbers(p) * 2
    return math.floor(flat / per_token) + 1


def decode_crossover(preset: str) -> int:
    """3: T (d_c + d_R) 2 bytes >= 2 x the KDA cache bytes."""
    p = presets.PRESETS[preset]
    return math.ceil(2 * at_scale.kda_state_bytes(p) / (at_scale.mla_cache_numbers(p) * 2))


def cases():
    name = presets.KIMI_LINEAR_48B.name
    k3 = presets.KIMI_K3.name
    return [
        ("10.1", cache_reduction(name, 2**20), dict(preset=name, context=2**20), 1 - 7 / 27),
        ("10.1", cache_reduction(k3, 4096), dict(preset=k3, context=4096), 0.75),
        ("10.2", ring_crossover(name, 8), dict(preset=name, ranks=8), ring_crossover(name, 8) - 1),
        ("10.2", ring_crossover(k3, 64), dict(preset=k3, ranks=64), ring_crossover(k3, 8)),
        ("10.3", decode_crossover(name), dict(preset=name), decode_crossover(name) // 2),
    ]
