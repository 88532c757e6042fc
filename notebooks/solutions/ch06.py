"""Worked solutions of notebook 06's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def chance_level(vocab_size: int) -> float:
    """1: -sum_v (1/|V|) log(1/|V|) = log |V| nats."""
    uniform = jnp.full((vocab_size,), 1 / vocab_size)
    return float(-jnp.sum(uniform * jnp.log(uniform)))


def conv_positions(reach: np.ndarray) -> list[int]:
    """2: the positions with a non-zero gradient: exactly conv_reach + 1 of them, ending at the
    last (each of the N layers' convs adds w - 1 tokens back)."""
    return np.flatnonzero(reach).tolist()


def late_clearing(p: int, seq_len: int, delay: int, conv_size: int) -> list[int]:
    """3: the token of position t sits at s = t - delay. With the states and the upper layers'
    conv histories cleared, only layer 0's history (the embeddings of the last w - 1 tokens)
    survives, so the token has no path when s < p - (w - 1). In the notebook,
    ``accuracy_after(p_late, True, True)`` then shows these at chance and the others copied."""
    return [t for t in range(p, seq_len) if t - delay < p - (conv_size - 1)]


def cases():
    reach = np.zeros(32)
    reach[25:] = 1.0  # a conv-only model of reach 6 whose last position is 31
    late = dict(p=28, seq_len=32, delay=8, conv_size=4)
    return [
        ("06.1", chance_level(16), dict(vocab_size=16), 1 / 16),
        ("06.2", conv_positions(reach), dict(last=31, conv_reach=6), list(range(26, 32))),
        ("06.3", late_clearing(**late), late, [28, 29]),
    ]
