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


def write_map_fixed_point(beta, alpha):
    """1, written differently: float64 NumPy, ``f_inf`` as the fraction one more write leaves
    unchanged, ``f = r f + beta``, so ``f = beta / (1 - r)`` (``1 - r`` loses about 8e-8 of
    itself at beta = 1e-9 in float64: enough; in float32 it is 0)."""
    r = np.float64(alpha) * (1 - np.float64(beta))
    return r, beta / (1 - r)


def sweep_map(mu, v1, v2):
    """2: ``err_j = S^T k_j - v_j``. Section 3's disturbance formula: a beta = 1 write of pair
    ``t`` sets ``err_t = 0`` and adds ``mu`` times its correction ``-err_t`` (before the
    write) to the other pair's error. Sweep 1: writing ``k_1`` into ``S = 0`` gives ``err_1 =
    0``, ``err_2 = mu v_1 - v_2``; writing ``k_2`` corrects by ``v_2 - mu v_1`` and moves
    ``err_1 = mu (v_2 - mu v_1)``. Every later sweep: writing ``k_1`` moves ``err_2 = -mu
    err_1``, writing ``k_2`` moves ``err_1`` to ``mu^2 err_1``. So after ``n >= 1`` sweeps
    ``err_1 = mu^(2n - 1) (v_2 - mu v_1)`` (after none, ``-v_1``): slow when the keys nearly
    coincide, not at all when ``|mu| = 1``."""
    return mu * (np.asarray(v2) - mu * np.asarray(v1)), mu * mu


def sweep_map_jnp(mu, v1, v2):
    """2, written differently: float32 jnp, expanded, the factor as ``|mu|^2``."""
    import jax.numpy as jnp

    v1, v2 = jnp.asarray(v1, jnp.float32), jnp.asarray(v2, jnp.float32)
    return mu * v2 - mu**2 * v1, jnp.abs(jnp.float32(mu)) ** 2


def cases():
    def no_decay(beta, alpha):  # the decay ignored: r = 1 - beta
        return 1 - beta, 1.0

    def one_sweep_factor_mu(mu, v1, v2):  # a factor of mu per sweep: only one write followed
        return mu * (np.asarray(v2) - mu * np.asarray(v1)), mu

    return [
        ("01.1", write_map, {}, no_decay),
        ("01.1", write_map_fixed_point, {}, no_decay),
        ("01.2", sweep_map, {}, one_sweep_factor_mu),
        ("01.2", sweep_map_jnp, {}, one_sweep_factor_mu),
    ]
