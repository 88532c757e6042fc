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


def exercise_1_loop(beta, writes):
    """1, written differently: follow the recalled fraction ``f`` write by write; a write moves
    it by ``beta (1 - f)``."""
    f = 0.0
    for _ in range(writes):
        f = f + beta * (1 - f)
    return f


def exercise_2(c, v1, v2, sweeps):
    """Two pairs, Kaczmarz sweeps. Write ``e_j = S^T k_j - v_j`` and ``c = k_1^T k_2``.
    Section 3's disturbance formula: a beta = 1 write of pair ``t`` sets ``e_t = 0`` and adds
    ``c`` times its correction ``-e_t`` (before the write) to the other pair's error.

    Sweep 1: writing ``k_1`` into ``S = 0`` gives ``e_1 = 0`` and ``S^T k_2 = c v_1``, so
    ``e_2 = c v_1 - v_2``; writing ``k_2`` corrects by ``v_2 - c v_1`` and moves
    ``e_1 = c (v_2 - c v_1)``. Every later sweep: writing ``k_1`` moves ``e_2 = -c e_1``,
    writing ``k_2`` moves ``e_1 = c^2 e_1``. After ``m`` sweeps
    ``e_1 = c^(2m - 1) (v_2 - c v_1)`` (and ``e_2 = 0``): the error shrinks by ``c^2`` per
    sweep, slowly when the keys nearly coincide, not at all when ``|c| = 1``."""
    return c ** (2 * sweeps - 1) * (np.asarray(v2) - c * np.asarray(v1))


def exercise_2_simulated(c, v1, v2, sweeps):
    """2, written differently: two unit keys with overlap ``c`` in the plane, swept ``sweeps``
    times with the delta rule in float64 (a check of the formula, not the derivation)."""
    k = np.array([[1.0, 0.0], [c, np.sqrt(1 - c * c)]])
    v = np.stack([np.asarray(v1, np.float64), np.asarray(v2, np.float64)])
    S = np.zeros((2, v.shape[1]))
    for _ in range(sweeps):
        for k_j, v_j in zip(k, v, strict=True):
            S = S + np.outer(k_j, v_j - k_j @ S)
    return k[0] @ S - v[0]


def cases():
    return [
        ("01.1", exercise_1, {}, lambda beta, writes: (1 - beta) ** writes),
        ("01.1", exercise_1_loop, {}, lambda beta, writes: beta * writes),
        ("01.2", exercise_2, {}, lambda c, v1, v2, m: c ** (2 * m) * (v2 - c * v1)),
        ("01.2", exercise_2_simulated, {}, lambda c, v1, v2, m: c * (v2 - c * v1)),
    ]
