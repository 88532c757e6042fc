"""Worked solutions of notebook 04's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np


def gate_input_for(half_life, a_log, dt_bias):
    """1: the softplus gate keeps ``e^g`` of a channel a token, ``g = -a_h softplus(f + b)``,
    ``a_h = e^A_log``. After ``t`` tokens it keeps ``e^(g t)``; half at ``t``: ``e^(g t) = 1/2``,
    ``-g = ln 2 / t`` (natural log: the decay is ``e^g``). So ``softplus(f + b) = ln 2 / (a_h t)
    =: y``, and ``softplus(x) = log(1 + e^x) = y`` gives ``x = log(e^y - 1)``: ``f = log(expm1(y))
    - b``. ``expm1``: at long half-lives ``y`` is tiny (``4e-6`` at ``t = 10^4``, ``a_h = 16``)
    and ``e^y - 1`` in float32 would keep two digits. The softplus gate reaches any ``t > 0``."""
    rate = np.exp(np.asarray(a_log, np.float64))[:, None]
    y = np.log(2.0) / (rate * np.asarray(half_life, np.float64))
    return np.log(np.expm1(y)) - np.asarray(dt_bias, np.float64)


def gate_input_for_jnp(half_life, a_log, dt_bias):
    """1, written differently: float32 jnp, ``log(e^y - 1) = y + log(1 - e^-y)``."""
    import jax.numpy as jnp

    y = jnp.log(2.0) / (jnp.exp(jnp.asarray(a_log))[:, None] * jnp.asarray(half_life))
    return y + jnp.log(-jnp.expm1(-y)) - jnp.asarray(dt_bias)


def safe_gate_input_for(half_life, lower_bound, a_log, dt_bias):
    """1b: the safe gate ``g = g_min sigma(a_h (f + b))`` keeps ``e^g`` a token; half after ``t``
    tokens where ``-g = ln 2 / t`` (as in 1), so ``sigma(a_h (f + b)) = ln 2 / (|g_min| t) =: y``
    and ``f = logit(y) / a_h - b``, ``logit(y) = log(y / (1 - y)) = log y - log1p(-y)`` (``log1p``
    keeps the digits of ``1 - y`` for ``y`` near 1). ``sigma < 1`` at every real ``f`` and ``-> 1``
    as ``f -> inf``: ``-g`` stays below ``|g_min|``, so ``t`` is reached exactly where ``y < 1``,
    ``t > ln 2 / |g_min|`` (0.14 tokens at ``g_min = -5``), with ``f -> inf`` as ``t`` nears that
    bound; below it no real ``f`` exists (``inf``). ``a_h`` and ``b`` move ``f``, not the bound:
    unlike the softplus gate of 1, the safe gate has a shortest half-life."""
    t, rate = np.asarray(half_life, np.float64), np.exp(np.asarray(a_log, np.float64))[:, None]
    y = np.log(2.0) / (abs(lower_bound) * t)
    with np.errstate(divide="ignore", invalid="ignore"):  # y >= 1: out of reach, replaced below
        f = (np.log(y) - np.log1p(-y)) / rate - np.asarray(dt_bias, np.float64)
    return np.where(y < 1, f, np.inf)


def safe_gate_input_for_jnp(half_life, lower_bound, a_log, dt_bias):
    """1b, written differently: float32 jnp, ``logit(y) = -log(1 / y - 1)``."""
    import jax.numpy as jnp

    y = jnp.log(2.0) / (-lower_bound * jnp.asarray(half_life, jnp.float32))
    f = -jnp.log(1 / y - 1) / jnp.exp(jnp.asarray(a_log))[:, None] - jnp.asarray(dt_bias)
    return jnp.where(y < 1, f, jnp.inf)


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

    def safe_gate_nan_out_of_reach(half_life, lower_bound, a_log, dt_bias):  # NaN, not inf
        y = np.log(2.0) / (-lower_bound * np.asarray(half_life))
        return (np.log(y) - np.log1p(-y)) / np.exp(a_log)[:, None] - dt_bias

    def safe_gate_as_softplus(half_life, lower_bound, a_log, dt_bias):  # 1's f, g_min unused
        return np.where(half_life > np.log(2.0) / -lower_bound, gate_input_for(
            half_life, a_log, dt_bias), np.inf)

    def conv_on_the_input(d, H, d_k, d_v, w):  # the histories of x, not of q, k, v
        return H * d_k * d_v + max(w - 1, 0) * 3 * d

    def full_windows(d, H, d_k, d_v, w):  # w inputs kept, the new token's among them
        return H * d_k * d_v + w * H * (2 * d_k + d_v)

    return [
        ("04.1", gate_input_for, {}, gate_input_exp_approximated),
        ("04.1", gate_input_for_jnp, {}, gate_input_float32_naive),
        ("04.1b", safe_gate_input_for, {}, safe_gate_nan_out_of_reach),
        ("04.1b", safe_gate_input_for_jnp, {}, safe_gate_as_softplus),
        ("04.2", rmsnorm_backward, {}, rms_constant),
        ("04.2", rmsnorm_backward_jnp, {}, eps_outside),
        ("04.3", decode_cache_numbers, {}, conv_on_the_input),
        ("04.3", decode_cache_numbers_by_parts, {}, full_windows),
    ]
