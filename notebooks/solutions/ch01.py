"""Worked solutions of notebook 01's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import numpy as np


def write_map(beta, alpha):
    """1: the state stays a multiple of ``k v^T``; let ``zeta`` be the recalled fraction, ``S^T
    k = zeta v``. Decay multiplies it by ``alpha``; section 2's write then turns the error
    ``(alpha zeta - 1) v`` into ``(1 - beta)`` times itself: ``zeta -> lam zeta + beta``, ``lam
    = alpha (1 - beta)``. Its fixed point ``zeta_inf = beta / (1 - lam)`` (written ``1 - alpha +
    alpha beta`` below, which subtracts no nearly equal numbers) and ``zeta_inf - zeta`` shrinks
    by ``lam`` per write, from ``zeta_inf`` in the empty memory. With ``alpha < 1``, ``zeta_inf <
    1`` unless ``beta = 1``: a decayed memory never holds all of ``v``."""
    return alpha * (1 - beta), beta / (1 - alpha + alpha * beta)


def write_map_natural(beta, alpha):
    """1, written as derived: ``zeta_inf = beta / (1 - lam)`` in float64. At the checker's beta
    near 1e-9 ``1 - lam`` keeps about 7 digits of a float64 ``lam`` (the checker asks 6);
    in float32 it keeps none there, so a float32 answer simplifies ``1 - lam`` by hand."""
    lam = np.asarray(alpha, np.float64) * (1 - np.asarray(beta, np.float64))
    return lam, beta / (1 - lam)


def write_map_loop(beta, alpha):
    """1, written differently: one point at a time in Python floats, ``np.vectorize`` over the
    arrays, ``zeta_inf`` as the fraction one more write leaves unchanged, ``zeta = lam zeta +
    beta``, with ``1 - lam`` simplified by hand. The function called per point does arithmetic
    only: the checker watches every Python call, so a NumPy function called per point (an
    ``np.ndim`` test, say) costs more than the arithmetic. Measured at the checker's million
    points with its watch on (CPU time, a shared 2-core EPYC): this form 1.1 s; the same with
    two ``np.ndim`` calls per point 6.6 to 11.5 s; the checker's limit is 20 s
    (docs/NOTEBOOK_NOTES.md, notebook 01, exercise 1's checker)."""
    def point(b, a):
        return a * (1 - b), b / ((1 - a) + a * b)

    return np.vectorize(point, otypes=[float, float])(beta, alpha)


def write_map_float32(beta, alpha):
    """1, written differently: float32 ``jnp``, ``1 - lam`` simplified by hand to ``1 - alpha +
    alpha beta`` (where beta is near 1e-9, float32's ``lam`` rounds to 1 or within 6e-8 of it, so
    ``1 - lam`` formed from it would keep no digits)."""
    import jax.numpy as jnp

    beta, alpha = jnp.float32(beta), jnp.float32(alpha)
    return alpha * (1 - beta), beta / (1 - alpha + alpha * beta)


def sweep_error(mu, v1, v2, m):
    """2: ``err_j = S^T k_j - v_j``. Section 3's disturbance formula: a beta = 1 write of pair
    ``t`` sets ``err_t = 0`` and adds ``mu`` times its correction ``-err_t`` (before the write)
    to the other pair's error. Sweep 1: writing ``k_1`` into ``S = 0`` gives ``err_1 = 0``,
    ``err_2 = mu v_1 - v_2``; writing ``k_2`` corrects by ``v_2 - mu v_1`` and moves ``err_1 =
    mu (v_2 - mu v_1)``. Every later sweep: writing ``k_1`` moves ``err_2 = -mu err_1``, writing
    ``k_2`` moves ``err_1`` to ``mu^2 err_1``: the factor per sweep is ``mu^2``. So after ``m >=
    1`` sweeps ``err_1 = mu^(2m - 1) (v_2 - mu v_1)``, and after none ``-v_1`` (the formula at
    m = 0 would divide by mu): slow when the keys nearly coincide, not at all when ``|mu| =
    1``."""
    v1, v2 = np.asarray(v1, np.float64), np.asarray(v2, np.float64)
    return -v1 if m == 0 else mu ** (2 * m - 1) * (v2 - mu * v1)


def sweep_error_loop(mu, v1, v2, m):
    """2, written differently: float32 jnp, the two errors carried through ``m`` sweeps by the
    disturbance formula. This simulates the two recall errors, not the memory: no state, so none
    of the rounding of a float64 ``S^T k - v`` (about 1e-16 of ``v``) that the checker's smallest
    ``mu`` leaves a simulated memory; the checker accepts it (docs/NOTEBOOK_NOTES.md)."""
    import jax.numpy as jnp

    mu, e1, e2 = jnp.float32(mu), -jnp.asarray(v1, jnp.float32), -jnp.asarray(v2, jnp.float32)
    for _ in range(m):
        e2 = e2 - mu * e1  # pair 1's write: err_1 -> 0, its correction -err_1 reaches err_2
        e1, e2 = -mu * e2, 0 * e2  # pair 2's write: err_2 -> 0, -mu err_2 reaches err_1
    return e1


def cases():
    def no_decay(beta, alpha):  # the decay ignored: lam = 1 - beta
        return 1 - beta, 1.0

    def one_sweep_factor_mu(mu, v1, v2, m):  # a factor of mu per sweep: only one write followed
        return mu**m * (np.asarray(v2) - mu * np.asarray(v1))

    return [
        ("01.1", write_map, {}, no_decay),
        ("01.1", write_map_natural, {}, no_decay),
        ("01.1", write_map_loop, {}, no_decay),
        ("01.1", write_map_float32, {}, no_decay),
        ("01.2", sweep_error, {}, one_sweep_factor_mu),
        ("01.2", sweep_error_loop, {}, one_sweep_factor_mu),
    ]
