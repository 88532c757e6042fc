"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np


def keeping_input(zeta, m, a, lower_bound):
    """1: with a constant input every token has the same ``g = lower_bound * sigmoid(a f)``, and
    the channel keeps ``exp(g_1 + ... + g_m) = exp(m g)`` (section 3). Keeping ``zeta`` needs
    ``g = ln(zeta) / m``, i.e. ``sigmoid(a f) = ln(zeta) / (m lower_bound)`` (=: s, in (0, 1):
    such an f exists exactly for ``exp(m lower_bound) < zeta < 1``, the most m tokens can
    erase), and ``f = logit(s) / a``. At zeta = 1/2, m = 1 it is the input at which one token
    erases half a channel; at a = 1, lower_bound = -5, m = 10, zeta = 1/2: s = 0.0139,
    f = -4.26."""
    s = np.log(zeta) / (m * lower_bound)
    return np.log(s / (1 - s)) / a


def keeping_input_by_bisection(zeta, m, a, lower_bound):
    """1, written differently: bisect ``m lower_bound sigmoid(a f) - ln p`` (the log of the
    kept fraction falls as f grows)."""
    lo, hi = -40.0 / a, 40.0 / a
    for _ in range(100):
        mid = (lo + hi) / 2
        log_kept = m * lower_bound / (1 + np.exp(-a * mid))
        lo, hi = (mid, hi) if log_kept > np.log(zeta) else (lo, mid)
    return (lo + hi) / 2


def older_weight(kk_ts, kk_tsp, kk_sps, beta):
    """2: Omega_ts = beta k^T M_t D_(t-1)...D_(s'+1) M_s' D_(s'-1)...D_(s+1) k with
    M = (I - beta k k^T) D at s' and t. Write A = D_t...D_(s'+1), B = D_s'...D_(s+1) (diagonal,
    so AB = D_t...D_(s+1)) and use k^T (I - beta k k^T) = (1 - beta) k^T (k unit):
    Omega_ts = beta (1 - beta) k^T A (I - beta k k^T) B k
             = beta (1 - beta) [k^T A B k - beta (k^T A k)(k^T B k)],
    symmetric in A and B. With one decay for all channels (A = a I, B = b I) it is
    beta (1 - beta)^2 a b: each later write of k keeps 1 - beta of what is there; per channel,
    the middle write removes beta (k^T B k) k, the decayed memory's projection on k, not beta
    times all of it."""
    return beta * (1 - beta) * (kk_ts - beta * kk_tsp * kk_sps)


def older_weight_float32(kk_ts, kk_tsp, kk_sps, beta):
    """2, written differently: expanded, in float32 jnp."""
    import jax.numpy as jnp

    x, a, b, beta = (jnp.float32(z) for z in (kk_ts, kk_tsp, kk_sps, beta))
    return beta * x - beta**2 * x - beta**2 * a * b + beta**3 * a * b


def cases():
    def page_formula(kk_ts, kk_tsp, kk_sps, beta):  # section 4's latest-occurrence weight, echoed
        return beta * (1 - beta) * kk_ts

    def one_token(p, m, a, lower_bound):  # 1: the one-token answer (m ignored)
        s = np.log(p) / lower_bound
        return np.log(s / (1 - s)) / a

    return [
        ("02.1", keeping_input, {}, one_token),
        ("02.1", keeping_input_by_bisection, {}, one_token),
        ("02.2", older_weight, {}, page_formula),
        ("02.2", older_weight_float32, {}, page_formula),
    ]
