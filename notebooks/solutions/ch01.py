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


def exercise_2(mu, v1, v2, sweeps):
    """Two pairs, Kaczmarz sweeps. Write ``err_j = S^T k_j - v_j`` (pair j's recall error) and
    ``mu = k_1^T k_2``. Section 3's disturbance formula: a beta = 1 write of pair ``t`` sets
    ``err_t = 0`` and adds ``mu`` times its correction ``-err_t`` (before the write) to the
    other pair's error.

    Sweep 1: writing ``k_1`` into ``S = 0`` gives ``err_1 = 0`` and ``S^T k_2 = mu v_1``, so
    ``err_2 = mu v_1 - v_2``; writing ``k_2`` corrects by ``v_2 - mu v_1`` and moves
    ``err_1 = mu (v_2 - mu v_1)``. Every later sweep: writing ``k_1`` moves
    ``err_2 = -mu err_1``, writing ``k_2`` moves ``err_1 = mu^2 err_1``. After ``m`` sweeps
    ``err_1 = mu^(2m - 1) (v_2 - mu v_1)`` (and ``err_2 = 0``): the error shrinks by ``mu^2``
    per sweep, slowly when the keys nearly coincide, not at all when ``|mu| = 1``."""
    return mu ** (2 * sweeps - 1) * (np.asarray(v2) - mu * np.asarray(v1))


def exercise_2_exp_log(mu, v1, v2, sweeps):
    """2, written differently: ``|mu|^(2m - 1)`` through ``exp`` and ``log`` (the sign of
    ``mu`` kept apart), for ``mu != 0``; ``mu = 0`` leaves ``err_1 = 0`` after sweep 1."""
    if mu == 0:
        return np.zeros(np.shape(v1))
    size = np.exp((2.0 * sweeps - 1) * np.log(abs(mu)))
    return np.sign(mu) * size * (np.asarray(v2, np.float64) - mu * np.asarray(v1, np.float64))


def exercise_2_squared(mu, v1, v2, sweeps):
    """Refused: right, but ``mu^(2m - 1)`` by repeated squaring (the bits of ``sweeps``)."""
    power, base, n = 1.0, mu, 2 * sweeps - 1
    while n:
        power, base, n = power * base if n & 1 else power, base * base, n >> 1
    return power * (np.asarray(v2) - mu * np.asarray(v1))


def exercise_1_matrix_power(beta, alpha, writes):
    """Refused: right and fast, but ``f_n`` read off the ``n``-th power of the affine map
    ``f -> alpha (1 - beta) f + beta`` as a 2 x 2 matrix: repeated squaring, not the closed
    form (the exercise's rule: the same work at every count)."""
    step = np.array([[alpha * (1 - beta), beta], [0.0, 1.0]])
    return np.linalg.matrix_power(step, writes)[0, 1]


def exercise_2_simulated(mu, v1, v2, sweeps):
    """Refused: two unit keys with overlap ``mu`` in the plane, swept with section 3's
    ``sweep``, right but a simulation; at 10^9 sweeps it does not finish."""
    k = np.array([[1.0, 0.0], [mu, np.sqrt(1 - mu * mu)]])
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
        ("01.2", exercise_2, {}, lambda mu, v1, v2, m: mu ** (2 * m) * (v2 - mu * v1)),
        ("01.2", exercise_2_exp_log, {}, exercise_2_squared),
        ("01.1", exercise_1, {}, exercise_1_matrix_power),
    ]
