"""Checkers of notebook 04's exercises (the KDA layer); hints never contain the answer."""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.layers.params import parameter_count
from kda_lib.teaching.exercises import checker


@checker("04.1")
def full_rank_gates(answer, *, config: KDAConfig):
    """``answer``: the number of parameters of ``config``'s layer with ``gate_low_rank=None``."""
    full = dataclasses.replace(config, gate_low_rank=None)
    expected = parameter_count(nnx.eval_shape(lambda: KimiDeltaAttention(full, rngs=nnx.Rngs(0))))
    if np.ndim(answer) != 0 or int(answer) != answer:
        return "the answer is one whole number of parameters"
    if int(answer) != expected:
        return "not the full-rank count: f_proj and g_proj become single d x (H * K) matrices"
    return None


@checker("04.2")
def one_decay_per_head(answer, *, batch, seq_len, num_heads, key_dim):
    """``answer``: the log decays ``g [B, T, H, K]`` of a ``per_head_decay=True`` layer."""
    g = np.asarray(answer, np.float64)
    if g.shape != (batch, seq_len, num_heads, key_dim):
        return f"g should have shape {(batch, seq_len, num_heads, key_dim)}, got {g.shape}"
    if not np.all(g <= 0):
        return "a log decay is <= 0: is this the activated gate (kda_gate), not its input?"
    if np.abs(g - g[..., :1]).max() > 1e-6:
        return "the channels of a head do not share one decay: was per_head_decay=True set?"
    if np.ptp(g, axis=1).max() == 0:
        return "g does not depend on the token: is it the gate of the layer's input x?"
    return None


@checker("04.3")
def safe_gate_fixture(answer, *, fla_y):
    """``answer``: the layer's output on the safe-gate fixture's ``x``; ``fla_y``: fla's."""
    y, expected = np.asarray(answer, np.float64), np.asarray(fla_y, np.float64)
    if y.shape != expected.shape:
        return f"y should have shape {expected.shape}, got {y.shape}"
    if np.abs(y - expected).max() > 5e-6 + 1e-5 * np.abs(expected).max():
        return "y differs from fla's: the fixture was made with the safe gate (lower_bound=-5)"
    return None
