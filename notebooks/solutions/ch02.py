"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import math

import numpy as np


def spread_below(n, ratio, width):
    """1: in log units the time steps are uniform: ``u_i = ln(tau_i / tau_min) / ln(width)``,
    and the half-lives span less than ``ratio`` when the ``u`` span less than ``rho =
    ln(ratio) / ln(width)``. Let draw ``i`` be the lowest, at ``m``, and the other ``n - 1``
    fall in ``[m, m + rho]``: chance ``rho^(n - 1)`` while that window lies inside [0, 1]
    (``m <= 1 - rho``), ``(1 - m)^(n - 1)`` above, where it is cut at 1. Over the ``n`` choices
    of ``i``: ``P = n [(1 - rho) rho^(n - 1) + rho^n / n] = n rho^(n - 1) - (n - 1) rho^n``,
    1 for ``rho >= 1`` or ``n = 1``. The page's case, 32 channels under a decade of two (rho =
    1/2): ``33 / 2^32 = 7.7e-9``."""
    rho = min(math.log(ratio) / math.log(width), 1.0)
    return n * rho ** (n - 1) - (n - 1) * rho**n


def spread_below_by_integral(n, ratio, width):
    """1, written differently: the span ``s`` of ``n`` uniform draws has density ``n (n - 1)
    s^(n - 2) (1 - s)``; integrate it from 0 to ``rho`` term by term."""
    rho = min(np.log(ratio) / np.log(width), 1.0)
    if n == 1:
        return 1.0
    return n * (n - 1) * (rho ** (n - 1) / (n - 1) - rho**n / n)


def older_weight(beta):
    """2: Omega_ts = beta k^T M_t D_(t-1)...D_(s'+1) M_s' D_(s'-1)...D_(s+1) k with
    M = (I - beta k k^T) D at s' and t. Write A = D_t...D_(s'+1), B = D_s'...D_(s+1) (diagonal,
    so AB = D_t...D_(s+1)) and use k^T (I - beta k k^T) = (1 - beta) k^T (k unit):
    Omega_ts = beta (1 - beta) k^T A (I - beta k k^T) B k
             = beta (1 - beta) [k^T A B k - beta (k^T A k)(k^T B k)],
    so c1 = beta (1 - beta), c2 = -beta^2 (1 - beta). With one decay for all channels (A = a I,
    B = b I) it is beta (1 - beta)^2 a b: each later write of k keeps 1 - beta of what is there;
    per channel, the middle write removes beta (k^T B k) k, the decayed memory's projection on
    k, not beta times all of it."""
    return beta * (1 - beta), -(beta**2) * (1 - beta)


def older_weight_float32(beta):
    """2, written differently: expanded, in float32 jnp."""
    import jax.numpy as jnp

    beta = jnp.float32(beta)
    return beta - beta**2, beta**3 - beta**2


def cases():
    def one_window(n, ratio, width):  # all n in one fixed window: rho^n
        return (math.log(ratio) / math.log(width)) ** n

    def page_formula(beta):  # the statement's latest-occurrence weight, no second term
        return beta * (1 - beta), 0.0

    return [
        ("02.1", spread_below, {}, one_window),
        ("02.1", spread_below_by_integral, {}, one_window),
        ("02.2", older_weight, {}, page_formula),
        ("02.2", older_weight_float32, {}, page_formula),
    ]
