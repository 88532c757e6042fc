"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np


def half_erasing_input(a, lower_bound):
    """1: a token keeps ``exp(g)`` of a channel, so it erases half when ``g = -ln 2``, i.e.
    ``sigmoid(a f) = ln 2 / |lower_bound|`` (=: p, below 1 since lower_bound < -ln 2), and
    ``f = logit(p) / a = ln(p / (1 - p)) / a``. At a = 1, lower_bound = -5: f = -1.83."""
    p = np.log(2.0) / -lower_bound
    return np.log(p / (1 - p)) / a


def half_erasing_input_by_bisection(a, lower_bound):
    """1, written differently: bisect ``exp(lower_bound sigmoid(a f)) - 1/2`` in float32 (the
    kept fraction falls as f grows)."""
    lo, hi = np.float32(-30.0 / a), np.float32(30.0 / a)  # exp stays finite
    for _ in range(80):
        mid = (lo + hi) / 2
        kept = np.exp(np.float32(lower_bound) / (1 + np.exp(-np.float32(a) * mid)))
        lo, hi = (mid, hi) if kept > 0.5 else (lo, mid)
    return float((lo + hi) / 2)


def older_weight(k, gamma_a, gamma_b, beta):
    """2: Omega_ts = beta k^T M_t D_(t-1)...D_(r+1) M_r D_(r-1)...D_(s+1) k with
    M = (I - beta k k^T) D at r and t. With A = diag(exp(gamma_a)), B = diag(exp(gamma_b)) and
    k^T (I - beta k k^T) = (1 - beta) k^T (k unit):
    Omega_ts = beta (1 - beta) k^T A (I - beta k k^T) B k
             = beta (1 - beta) [k^T A B k - beta (k^T A k)(k^T B k)].
    With one decay for all channels (A = a I, B = b I) it is beta (1 - beta)^2 a b: each later
    write of k keeps 1 - beta of what is there; per channel, the middle write removes
    beta (k^T B k) k, the decayed memory's projection on k, not beta times all of it."""
    k = np.asarray(k, np.float64)
    A, B = np.exp(gamma_a), np.exp(gamma_b)
    return beta * (1 - beta) * (k @ (A * B * k) - beta * (k @ (A * k)) * (k @ (B * k)))


def older_weight_by_recurrence(k, gamma_a, gamma_b, beta):
    """2, written differently: run the state in float32 jnp through the three writes, v = 1 at
    s and 0 at r and t, the decays in between lumped; the read at t is Omega_ts."""
    import jax.numpy as jnp

    k = jnp.asarray(k, jnp.float32)
    S = beta * k  # after writing (k, v = 1) into an empty state: S = beta k v^T, V = 1
    for gamma in (gamma_b, gamma_a):  # decay, then write (k, v = 0): S -= beta k (k^T S)
        S = jnp.exp(jnp.asarray(gamma, jnp.float32)) * S
        S = S - beta * k * (k @ S)
    return float(k @ S)


def cases():
    def page_formula(k, gamma_a, gamma_b, beta):  # section 4's latest-occurrence weight, echoed
        return beta * (1 - beta) * k @ (np.exp(gamma_a + gamma_b) * k)

    def page_erase_bound(a, lower_bound):  # section 1's erase bound, echoed
        return 1 - np.exp(lower_bound)

    return [
        ("02.1", half_erasing_input, {}, page_erase_bound),
        ("02.1", half_erasing_input_by_bisection, {}, page_erase_bound),
        ("02.2", older_weight, {}, page_formula),
        ("02.2", older_weight_by_recurrence, {}, page_formula),
    ]
