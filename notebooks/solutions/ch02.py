"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import math

import numpy as np


def spread_below(d_k, ratio, width):
    """1: in log units the time steps are uniform: ``u_c = ln(tau_c / tau_min) / ln(width)``,
    and the half-lives span less than ``ratio`` when the ``u`` span less than ``chi =
    ln(ratio) / ln(width)``. Let channel ``c`` be the lowest, at ``u_min``, and the other
    ``d_k - 1`` fall in ``[u_min, u_min + chi]``: chance ``chi^(d_k - 1)`` while that window
    lies inside [0, 1] (``u_min <= 1 - chi``), ``(1 - u_min)^(d_k - 1)`` above, where it is cut
    at 1. Over the ``d_k`` choices of ``c``: ``P = d_k [(1 - chi) chi^(d_k - 1) + chi^d_k /
    d_k] = d_k chi^(d_k - 1) - (d_k - 1) chi^d_k``, 1 for ``chi >= 1`` or ``d_k = 1``. The
    page's case, 32 channels under a decade of two (chi = 1/2): ``33 / 2^32 = 7.7e-9``."""
    chi = min(math.log(ratio) / math.log(width), 1.0)
    return d_k * chi ** (d_k - 1) - (d_k - 1) * chi**d_k


def spread_below_by_integral(d_k, ratio, width):
    """1, written differently: the span ``x`` of ``d_k`` uniform draws has density ``d_k (d_k - 1)
    x^(d_k - 2) (1 - x)``; integrate it from 0 to ``chi`` term by term."""
    chi = min(np.log(ratio) / np.log(width), 1.0)
    if d_k == 1:
        return 1.0
    return d_k * (d_k - 1) * (chi ** (d_k - 1) / (d_k - 1) - chi**d_k / d_k)


def older_weight(beta):
    """2: Omega_ts = beta k^T M_t D_(t-1)...D_(s'+1) M_s' D_(s'-1)...D_(s+1) k with
    M = (I - beta k k^T) D at s' and t. Write A = D_t...D_(s'+1), B = D_s'...D_(s+1) (diagonal,
    so AB = D_t...D_(s+1)) and use k^T (I - beta k k^T) = (1 - beta) k^T (k unit):
    Omega_ts = beta (1 - beta) k^T A (I - beta k k^T) B k
             = beta (1 - beta) [k^T A B k - beta (k^T A k)(k^T B k)],
    so psi1 = beta (1 - beta), psi2 = -beta^2 (1 - beta). With one decay for all channels (A = a I,
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
    def one_window(d_k, ratio, width):  # all d_k in one fixed window: chi^d_k
        return (math.log(ratio) / math.log(width)) ** d_k

    def page_formula(beta):  # the statement's latest-occurrence weight, no second term
        return beta * (1 - beta), 0.0

    return [
        ("02.1", spread_below, {}, one_window),
        ("02.1", spread_below_by_integral, {}, one_window),
        ("02.2", older_weight, {}, page_formula),
        ("02.2", older_weight_float32, {}, page_formula),
    ]
