"""Worked solutions of notebook 01's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import numpy as np


def exercise_1(beta, writes):
    """Partial writes. Section 2: one write turns the error ``S^T k - v`` into ``(1 - beta)``
    times itself. An empty memory starts at error ``-v``; after ``writes`` writes the error is
    ``-(1 - beta)^writes v``, so the memory returns ``(1 - (1 - beta)^writes) v``."""
    return 1 - (1 - beta) ** writes


def exercise_2(keys, values):
    """One pass of beta = 1 writes, in order; returns the memory ``[K, V]``. With orthonormal
    keys a later write changes nothing along an earlier key (``k_i^T k_j = 0``), so every pair
    comes back exactly; with generic keys the later writes disturb the earlier pairs, and the
    memory is not the solution of ``keys @ S = values``."""
    S = np.zeros((keys.shape[1], values.shape[1]))
    for k, v in zip(keys, values, strict=True):
        S = S + np.outer(k, v - k @ S)
    return S


def exercise_3(beta, k):
    """``I - beta k k^T`` maps ``k`` to ``(1 - beta) k`` and every vector orthogonal to ``k`` to
    itself: eigenvalues ``1 - beta`` (once) and 1 (``K - 1`` times). For beta in [0, 2],
    ``1 - beta`` is in [-1, 1], so the spectral norm (the largest ``|eigenvalue|`` of this
    symmetric matrix) stays at most 1."""
    return np.linalg.eigvalsh(np.eye(len(k)) - beta * np.outer(k, k))


def exercise_4(S, k, v, alpha, beta):
    """The gated delta rule: KDA with ``D_t = alpha I``. Decay first, then the delta write on the
    decayed state: ``S' = alpha S + beta k (v - (alpha S)^T k)^T
    = alpha (I - beta k k^T) S + beta k v^T``."""
    decayed = alpha * S
    return decayed + beta * np.outer(k, v - k @ decayed)


def cases():
    def solve(keys, values):  # the shortcut: exact recall by a linear solve, not one pass
        return np.linalg.lstsq(keys, values, rcond=None)[0]

    undecayed_read = lambda S, k, v, a, b: a * S + b * np.outer(k, v - k @ S)  # noqa: E731
    return [
        ("01.1", exercise_1, {}, lambda beta, writes: (1 - beta) ** writes),
        ("01.2", exercise_2, {}, solve),
        ("01.3", exercise_3, {"key_dim": 16}, lambda beta, k: np.ones(len(k))),
        ("01.4", exercise_4, {"key_dim": 16, "value_dim": 8}, undecayed_read),
    ]
