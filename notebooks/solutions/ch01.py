"""Worked solutions of notebook 01's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import numpy as np


def exercise_1(beta, alpha, writes):
    """Gated partial writes. Let ``f`` be the recalled fraction, ``S^T k = f v`` (the state
    stays a multiple of ``k v^T``). Decay multiplies it by ``alpha``; section 2's write then
    turns the error ``(alpha f - 1) v`` into ``(1 - beta)`` times itself, so
    ``f_n = r f_(n-1) + beta`` with ``r = alpha (1 - beta)`` and ``f_0 = 0``: a geometric sum,
    ``f_n = beta (1 - r^n) / (1 - r)`` (``1 - (1 - beta)^n`` without decay). It tends to
    ``beta / (1 - alpha (1 - beta))``: below 1 whenever ``alpha < 1``, even after many writes,
    unless ``beta = 1``."""
    r = alpha * (1 - beta)
    return beta * (1 - r**writes) / (1 - r) if r != 1 else 0.0


def exercise_1_steady(beta, alpha, writes):
    """1, written differently: the fixed point ``f* = beta / (1 - r)`` and the distance to it,
    which shrinks by ``r`` per write from ``-f*``: ``f_n = f* (1 - r^n)``."""
    r = np.float64(alpha) * (1 - beta)
    fixed = beta / (1 - r)
    return fixed - fixed * np.power(r, writes)


def exercise_1_loop(beta, alpha, writes):
    """Refused: the recurrence followed write by write is right, but it is a simulation; at
    10^9 writes it does not finish (the exercise asks for the closed form)."""
    f = 0.0
    for _ in range(writes):
        f = alpha * (1 - beta) * f + beta
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
    """Refused: two unit keys with overlap ``c`` in the plane, swept with section 3's
    ``sweep``, right but a simulation; at 10^9 sweeps it does not finish."""
    k = np.array([[1.0, 0.0], [c, np.sqrt(1 - c * c)]])
    v = np.stack([np.asarray(v1, np.float64), np.asarray(v2, np.float64)])
    S = np.zeros((2, v.shape[1]))
    for _ in range(sweeps):
        for k_j, v_j in zip(k, v, strict=True):
            S = S + np.outer(k_j, v_j - k_j @ S)
    return k[0] @ S - v[0]


def cases():
    return [
        ("01.1", exercise_1, {}, exercise_1_loop),
        ("01.1", exercise_1_steady, {}, lambda beta, alpha, writes: 1 - (1 - beta) ** writes),
        ("01.2", exercise_2, {}, exercise_2_simulated),
        ("01.2", exercise_2, {}, lambda c, v1, v2, m: c ** (2 * m) * (v2 - c * v1)),
    ]
