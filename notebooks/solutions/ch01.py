"""Worked solutions of notebook 01's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import numpy as np


def write_map(beta, alpha):
    """1: the state stays a multiple of ``k v^T``; let ``f`` be the recalled fraction, ``S^T k
    = f v``. Decay multiplies it by ``alpha``; section 2's write then turns the error
    ``(alpha f - 1) v`` into ``(1 - beta)`` times itself: ``f -> r f + beta``, ``r = alpha
    (1 - beta)``. Its fixed point ``f_inf = beta / (1 - r)`` (written ``1 - alpha + alpha
    beta`` below, which keeps its digits when beta is tiny) and ``f_inf - f`` shrinks by ``r``
    per write: from ``f_0 = 0``, ``f_n = f_inf (1 - r^n)``. With ``alpha < 1``, ``f_inf < 1``
    unless ``beta = 1``: a decayed memory never holds all of ``v``."""
    return alpha * (1 - beta), beta / (1 - alpha + alpha * beta)


def write_map_by_limit(beta, alpha):
    """1, written differently: float64 NumPy, ``f_inf`` as the fraction one more write leaves
    unchanged, ``f = r f + beta``, so ``f = beta / (1 - r)``, with ``1 - r = (1 - alpha) + alpha
    beta`` divided through by beta. Not ``beta / (1 - r)`` from a computed ``r``: at beta = 1e-14,
    alpha = 1, ``r`` is 1 to 14 digits and ``1 - r`` keeps about 2 of them."""
    r = np.float64(alpha) * (1 - np.float64(beta))
    return r, 1 / ((1 - np.float64(alpha)) / beta + alpha)


def sweep_error(mu, v1, v2, n):
    """2: ``err_j = S^T k_j - v_j``. Section 3's disturbance formula: a beta = 1 write of pair
    ``t`` sets ``err_t = 0`` and adds ``mu`` times its correction ``-err_t`` (before the write)
    to the other pair's error. Sweep 1: writing ``k_1`` into ``S = 0`` gives ``err_1 = 0``,
    ``err_2 = mu v_1 - v_2``; writing ``k_2`` corrects by ``v_2 - mu v_1`` and moves ``err_1 =
    mu (v_2 - mu v_1)``. Every later sweep: writing ``k_1`` moves ``err_2 = -mu err_1``, writing
    ``k_2`` moves ``err_1`` to ``mu^2 err_1``: the factor per sweep is ``mu^2``. So after ``n >=
    1`` sweeps ``err_1 = mu^(2n - 1) (v_2 - mu v_1)``, and after none ``-v_1`` (the formula at
    n = 0 would divide by mu): slow when the keys nearly coincide, not at all when ``|mu| =
    1``."""
    v1, v2 = np.asarray(v1, np.float64), np.asarray(v2, np.float64)
    return -v1 if n == 0 else mu ** (2 * n - 1) * (v2 - mu * v1)


def sweep_error_loop(mu, v1, v2, n):
    """2, written differently: float32 jnp, the two errors carried through ``n`` sweeps by the
    disturbance formula (no state: a simulated ``S^T k - v`` rounds to about 1e-16 of ``v``)."""
    import jax.numpy as jnp

    mu, e1, e2 = jnp.float32(mu), -jnp.asarray(v1, jnp.float32), -jnp.asarray(v2, jnp.float32)
    for _ in range(n):
        e2 = e2 - mu * e1  # pair 1's write: err_1 -> 0, its correction -err_1 reaches err_2
        e1, e2 = -mu * e2, 0 * e2  # pair 2's write: err_2 -> 0, -mu err_2 reaches err_1
    return e1


def cases():
    def no_decay(beta, alpha):  # the decay ignored: r = 1 - beta
        return 1 - beta, 1.0

    def one_sweep_factor_mu(mu, v1, v2, n):  # a factor of mu per sweep: only one write followed
        return mu**n * (np.asarray(v2) - mu * np.asarray(v1))

    return [
        ("01.1", write_map, {}, no_decay),
        ("01.1", write_map_by_limit, {}, no_decay),
        ("01.2", sweep_error, {}, one_sweep_factor_mu),
        ("01.2", sweep_error_loop, {}, one_sweep_factor_mu),
    ]
