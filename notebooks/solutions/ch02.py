"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np


def erased_at_most(lower_bound):
    """1: the safe gate keeps ``g >= lower_bound``, so a token keeps at least
    ``exp(lower_bound)`` of a channel and erases at most ``1 - exp(lower_bound)`` (0.632 at -1)."""
    return 1 - np.exp(lower_bound)


def full_overwrite(q, k, g):
    """2: with beta = 1 and ``q_t = k_t`` (unit), ``S_t^T k_t = (1 - beta) (D_t S_{t-1})^T k_t +
    beta v_t (k_t^T k_t) = v_t``: ``o_t = v_t`` whatever came before, so row t of the mixing
    matrix is one-hot at t, and Omega is the identity (the decays ``g`` play no part)."""
    return np.eye(len(q))


def full_overwrite_by_probes(q, k, g):
    """2, written differently: run the recurrence (float64, beta = 1, scale 1) with the one-hot
    value ``e_s`` at token ``s`` and zeros elsewhere; ``o_t`` is then column ``s`` of Omega."""
    T, K = np.shape(k)
    omega = np.zeros((T, T))
    for s in range(T):
        S = np.zeros((K, T))
        for t in range(T):
            S = np.exp(g[t])[:, None] * S
            v = np.eye(T)[s] if t == s else np.zeros(T)
            S = S + np.outer(k[t], v - k[t] @ S)
            omega[t, s] = (q[t] @ S)[s]
    return omega


def cases():
    def half_kept(q, k, g):  # the beta = 1/2 answer: half of each write stays
        return 0.5 * np.eye(len(q))

    return [
        ("02.1", erased_at_most, {}, np.exp),
        ("02.1", lambda lower_bound: -np.expm1(np.float32(lower_bound)), {}, np.exp),
        ("02.2", full_overwrite, {}, half_kept),
        ("02.2", full_overwrite_by_probes, {}, half_kept),
    ]
