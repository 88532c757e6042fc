"""Worked solutions of notebook 04's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np


def conv_step(ring, start, xi_t, kernel):
    """1: section 1's tap formula at the newest token ``t`` needs ``xi_{t-w+1} .. xi_t``: the
    ``w - 1`` inputs before ``t`` and ``xi_t``. In the ring they sit oldest first from slot
    ``start`` on, so the window is the ring rolled left by ``start`` (``np.roll(ring, -start,
    1)``), then ``xi_t``; ``conv_t = sum_j kappa_j window_j``. The next step no longer needs the
    oldest input: ``xi_t`` takes its slot and the oldest is now the one after it, ``start + 1``
    (mod ``w - 1``). No row moves: one slot written per step, ``channels`` numbers, where
    shifting the cache moves all ``(w - 1) channels``."""
    ring = np.array(ring)
    window = np.concatenate([np.roll(ring, -start, axis=1), np.asarray(xi_t)[:, None]], axis=1)
    conv_t = np.einsum("bwc,wc->bc", window, np.asarray(kernel))
    ring[:, start] = xi_t
    return ring, (start + 1) % ring.shape[1], conv_t


def conv_step_taps(ring, start, xi_t, kernel):
    """1, written differently: jnp, the taps one by one (``kernel[w - 1]`` on ``xi_t``, then
    ``kernel[w - 1 - back]`` on the input ``back`` tokens before it, the slot ``(start - back)
    % (w - 1)``)."""
    import jax.numpy as jnp

    width = kernel.shape[0]
    conv_t = kernel[width - 1] * xi_t
    for back in range(1, width):
        conv_t = conv_t + kernel[width - 1 - back] * ring[:, (start - back) % (width - 1)]
    return jnp.asarray(ring).at[:, start].set(xi_t), (start + 1) % (width - 1), conv_t


def rmsnorm_backward(o, eta, dn, eps):
    """2: with ``r = sqrt(mean(o^2) + eps)`` (per row) and ``n_e = eta_e o_e / r``:
    ``∂r/∂o_i = o_i / (V r)``, so ``∂n_e/∂o_i = eta_e delta_ei / r - eta_e o_e o_i / (V r^3)``
    and, with ``dn`` the given cotangent, ``do_i = sum_e dn_e ∂n_e/∂o_i = eta_i dn_i / r - o_i
    sum_e(eta_e dn_e o_e) / (V r^3)``. The first term treats ``r`` as a constant; the second
    removes the part of ``eta * dn`` along ``o`` that only rescales the row (at ``eps = 0``
    scaling ``o`` leaves ``n`` as is: ``do . o = 0``)."""
    o, eta, dn = (np.asarray(a, np.float64) for a in (o, eta, dn))
    r = np.sqrt(np.mean(o**2, axis=-1, keepdims=True) + eps)
    along = np.sum(eta * dn * o, axis=-1, keepdims=True)
    return eta * dn / r - o * along / (o.shape[-1] * r**3)


def rmsnorm_backward_jnp(o, eta, dn, eps):
    """2, written differently: float32 jnp, through the normalised output ``n_hat = o / r``:
    ``do = (eta dn - n_hat mean(eta dn n_hat)) / r``."""
    import jax.numpy as jnp

    r = jnp.sqrt(jnp.mean(o**2, axis=-1, keepdims=True) + eps)
    n_hat, g = o / r, eta * dn
    return (g - n_hat * jnp.mean(g * n_hat, axis=-1, keepdims=True)) / r


def cases():
    def conv_shifted(ring, start, xi_t, kernel):  # conv_t right, the ring shifted like a cache
        window = np.concatenate([np.roll(ring, -start, 1), np.asarray(xi_t)[:, None]], axis=1)
        return window[:, 1:], 0, np.einsum("bwc,wc->bc", window, np.asarray(kernel))

    def rms_constant(o, eta, dn, eps):  # r treated as a constant
        return np.asarray(eta) * dn / np.sqrt(np.mean(np.square(o), -1, keepdims=True) + eps)

    def ring_as_oldest_first(ring, start, xi_t, kernel):  # slot 0 read as the oldest
        return conv_step(ring, 0, xi_t, kernel)[0], (start + 1) % ring.shape[1], conv_step(
            ring, 0, xi_t, kernel)[2]

    def eps_outside(o, eta, dn, eps):  # r = sqrt(mean(o^2)) + eps
        return rmsnorm_backward(o, eta, dn, 0.0)

    return [
        ("04.1", conv_step, {}, conv_shifted),
        ("04.1", conv_step_taps, {}, ring_as_oldest_first),
        ("04.2", rmsnorm_backward, {}, rms_constant),
        ("04.2", rmsnorm_backward_jnp, {}, eps_outside),
    ]
