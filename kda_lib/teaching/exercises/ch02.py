"""Checkers of notebook 02's exercises (gating and decay); hints never contain the answer."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import checker


def _number(answer) -> float | None:
    return float(answer) if np.ndim(answer) == 0 else None


@checker("02.1")
def half_life_by_hand(answer, *, g):
    """``answer``: tokens until a channel with per-token log decay ``g < 0`` keeps half."""
    if _number(answer) is None:
        return "the answer is one number of tokens"
    if abs(_number(answer) - np.log(2) / -g) > 1e-6 * np.log(2) / -g:
        return "solve exp(g t) = 1/2 for t (natural logarithm)"
    return None


@checker("02.2")
def safe_gate_floor(answer, *, lower_bound):
    """``answer``: the largest fraction of a channel one token can erase under the safe gate."""
    if _number(answer) is None:
        return "the answer is one number (a fraction in [0, 1])"
    if abs(_number(answer) - (1 - np.exp(lower_bound))) > 1e-6:
        return "the most a token can decay is exp(lower_bound); what fraction does that remove?"
    return None


@checker("02.3")
def full_overwrite(answer, *, q, k, g):
    """``answer``: the mixing matrix ``[T, T]`` of the head ``q = k`` (``[T, K]``), ``g``, at
    beta = 1 and scale 1 (the checker recomputes it from the closed form)."""
    from kda_lib.teaching.explain import mixing_matrix_by_products

    answer = np.asarray(answer, np.float64)
    expected = mixing_matrix_by_products(q, k, g, np.ones(len(q)))
    if answer.shape != expected.shape:
        return f"the mixing matrix should have shape {expected.shape}, got {answer.shape}"
    if np.abs(answer - expected).max() > 1e-4:
        return "not the mixing matrix at beta = 1 (did you pass beta = 1 for every token?)"
    return None
