"""Worked solutions of notebook 04's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np


def gate_input_for(half_life, a_log, dt_bias):
    """1: the softplus gate keeps ``e^g`` of a channel a token, ``g = -a_h softplus(f + b)``,
    ``a_h = e^A_log``. After ``t`` tokens it keeps ``e^(g t)``; half at ``t``: ``e^(g t) = 1/2``,
    ``-g = ln 2 / t`` (natural log: the decay is ``e^g``). So ``softplus(f + b) = ln 2 / (a_h t)
    =: y``, and ``softplus(x) = log(1 + e^x) = y`` gives ``x = log(e^y - 1)``: ``f = log(expm1(y))
    - b``. ``expm1``: at long half-lives ``y`` is tiny (``4e-6`` at ``t = 10^4``, ``a_h = 16``)
    and ``e^y - 1`` in float32 would keep two digits. The safe gate, ``g = g_min sigma(a_h (f +
    b))``, has ``-g < |g_min|``: a half-life under ``ln 2 / |g_min|`` tokens (0.14 at ``g_min =
    -5``) is out of its reach, where the softplus gate reaches any ``t > 0``."""
    rate = np.exp(np.asarray(a_log, np.float64))[:, None]
    y = np.log(2.0) / (rate * np.asarray(half_life, np.float64))
    return np.log(np.expm1(y)) - np.asarray(dt_bias, np.float64)


def gate_input_for_jnp(half_life, a_log, dt_bias):
    """1, written differently: float32 jnp, ``log(e^y - 1) = y + log(1 - e^-y)``."""
    import jax.numpy as jnp

    y = jnp.log(2.0) / (jnp.exp(jnp.asarray(a_log))[:, None] * jnp.asarray(half_life))
    return y + jnp.log(-jnp.expm1(-y)) - jnp.asarray(dt_bias)


def shortest_half_life(lower_bound, a_log, dt_bias):
    """1b: the safe gate ``g = g_min sigma(a_h (f + b))`` keeps ``e^g`` a token, so a channel
    halves after ``t = ln 2 / -g`` tokens (as in 1), and ``-g = |g_min| sigma(a_h (f + b))``.
    ``sigma < 1`` at every real ``f``, and ``sigma -> 1`` as ``f -> inf`` for any ``a_h > 0`` and
    ``b``: ``-g`` never reaches ``|g_min|`` but comes as close as one likes, so the half-lives
    reachable are all ``t > ln 2 / |g_min|`` (0.14 tokens at ``g_min = -5``), the same in every
    channel: ``a_h`` and ``b`` only move the ``f`` at which ``sigma`` nears 1. There is no root
    to find: a search over ``f`` in a finite range stops where ``sigma < 1`` (far from 1 where
    ``a_h`` is small or ``b`` far below 0)."""
    return np.full(np.shape(dt_bias), np.log(2.0) / abs(lower_bound))


def shortest_half_life_jnp(lower_bound, a_log, dt_bias):
    """1b, written differently: float32 jnp, the page's safe gate at ``f = inf`` (sigma = 1)."""
    import jax
    import jax.numpy as jnp

    f = jnp.full(jnp.shape(dt_bias), jnp.inf)
    g = lower_bound * jax.nn.sigmoid(jnp.exp(a_log)[:, None] * (f + dt_bias))
    return jnp.log(2.0) / -g


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


def decode_cache_numbers(d, H, d_k, d_v, w):
    """3: decoding brings one token, so the layer keeps what that token's output needs from the
    tokens before it. Section 1, part by part: the projections, the gates, ``beta``, the L2
    norm, SiLU, the RMSNorm and ``W_o`` see token ``t`` alone; the recurrence needs ``S_{t-1}``,
    ``d_k x d_v`` a head (``H d_k d_v``); each short convolution sums its inputs at ``t - w + 1 ..
    t``, so it needs the ``w - 1`` before ``t``: of its own input, the projected channels (``H
    d_k`` for q and for k, ``H d_v`` for v), which the layer as built caches (``d`` never
    appears; keeping ``x`` and recomputing the projections is another design, not this one's).
    ``w = 0`` (no convolution) and ``w = 1`` (the current token only) keep nothing for it."""
    return H * d_k * d_v + max(w - 1, 0) * H * (2 * d_k + d_v)


def decode_cache_numbers_by_parts(d, H, d_k, d_v, w):
    """3, written differently: a dict of the cache's arrays' shapes, summed (NumPy)."""
    history = max(w - 1, 0)
    shapes = {"state": (H, d_k, d_v), "q_conv": (history, H * d_k),
              "k_conv": (history, H * d_k), "v_conv": (history, H * d_v)}
    return int(sum(np.prod(shape) for shape in shapes.values()))


def cases():
    def gate_input_exp_approximated(half_life, a_log, dt_bias):  # softplus(x) read as e^x
        y = np.log(2.0) / (np.exp(a_log)[:, None] * half_life)
        return np.log(y) - dt_bias

    def rms_constant(o, eta, dn, eps):  # r treated as a constant
        return np.asarray(eta) * dn / np.sqrt(np.mean(np.square(o), -1, keepdims=True) + eps)

    def gate_input_float32_naive(half_life, a_log, dt_bias):  # float32 log(exp(y) - 1)
        y = np.float32(np.log(2.0)) / (np.exp(a_log)[:, None] * np.float32(half_life))
        return np.log(np.exp(y) - np.float32(1)) - dt_bias

    def eps_outside(o, eta, dn, eps):  # r = sqrt(mean(o^2)) + eps
        return rmsnorm_backward(o, eta, dn, 0.0)

    def shortest_at_f_zero(lower_bound, a_log, dt_bias):  # the half-life at f = 0, not the least
        rate = np.exp(np.asarray(a_log, np.float64))[:, None]
        return np.log(2.0) / (-lower_bound / (1 + np.exp(-rate * dt_bias)))

    def shortest_as_a_time_constant(lower_bound, a_log, dt_bias):  # 1 / |g_min|: keeps 1/e
        return np.full(np.shape(dt_bias), 1 / -lower_bound)

    def conv_on_the_input(d, H, d_k, d_v, w):  # the histories of x, not of q, k, v
        return H * d_k * d_v + max(w - 1, 0) * 3 * d

    def full_windows(d, H, d_k, d_v, w):  # w inputs kept, the new token's among them
        return H * d_k * d_v + w * H * (2 * d_k + d_v)

    return [
        ("04.1", gate_input_for, {}, gate_input_exp_approximated),
        ("04.1", gate_input_for_jnp, {}, gate_input_float32_naive),
        ("04.1b", shortest_half_life, {}, shortest_at_f_zero),
        ("04.1b", shortest_half_life_jnp, {}, shortest_as_a_time_constant),
        ("04.2", rmsnorm_backward, {}, rms_constant),
        ("04.2", rmsnorm_backward_jnp, {}, eps_outside),
        ("04.3", decode_cache_numbers, {}, conv_on_the_input),
        ("04.3", decode_cache_numbers_by_parts, {}, full_windows),
    ]
