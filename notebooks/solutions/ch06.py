"""Worked solutions of notebook 06's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import jax.numpy as jnp


def chance_level(vocab_size: int) -> float:
    """1: -sum_v (1/|V|) log2(1/|V|) = log2 |V| bits (= ``chance_loss`` / ln 2)."""
    uniform = jnp.full((vocab_size,), 1 / vocab_size)
    return float(-jnp.sum(uniform * jnp.log2(uniform)))


def seen_positions(last: int, conv_sizes: list[int]) -> list[int]:
    """2: a causal conv of width w mixes a position with the w - 1 before it; stacked, the
    reaches add: sum(w - 1) tokens back (``conv_reach`` = N (w - 1) for N equal layers), the
    last position included, and nothing before position 0. In the notebook,
    ``np.flatnonzero(reach["conv only"])`` gives the same list for its stack."""
    return list(range(max(0, last - sum(w - 1 for w in conv_sizes)), last + 1))


def late_clearing(p: int, seq_len: int, delay: int, conv_size: int) -> list[int]:
    """3: the token of position t sits at s = t - delay. With the states and the upper layers'
    conv histories cleared, only layer 0's history (the embeddings of the last w - 1 tokens)
    survives, so the token has no path when s < p - (w - 1). In the notebook,
    ``accuracy_after(p_late, True, True)`` then shows these at chance and the others copied."""
    return [t for t in range(p, seq_len) if t - delay < p - (conv_size - 1)]


def cases():
    def no_clipping(last, conv_sizes):  # forgets that the sequence starts at 0
        return list(range(last - sum(w - 1 for w in conv_sizes), last + 1))

    import math

    late = dict(p=24, seq_len=32, delay=8, conv_size=4)  # lost: 24..28; kept: 29..31
    return [
        ("06.1", chance_level, {}, math.log),
        ("06.2", seen_positions, {}, no_clipping),
        ("06.3", late_clearing(**late), late, list(range(24, 32))),
    ]
