"""Worked solutions of notebook 00's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import jax.numpy as jnp


def my_step(state, q, k, v, g, beta):
    """1: one token of ``S_t = (I - beta k k^T) diag(e^g) S_{t-1} + beta k v^T``,
    ``o_t = S_t^T q / sqrt(K)``, batched over ``[B, H]``. Decay first; the write then corrects
    what the decayed state recalls for ``k``: ``(I - beta k k^T) D S + beta k v^T
    = D S + beta k (v - (D S)^T k)^T``."""
    decayed = jnp.exp(g)[..., None] * state  # diag(e^g) S: row i (key channel i) times e^{g_i}
    recalled = jnp.einsum("bhk,bhkv->bhv", k, decayed)
    new_state = decayed + beta[..., None, None] * k[..., :, None] * (v - recalled)[..., None, :]
    o = jnp.einsum("bhk,bhkv->bhv", q, new_state) * q.shape[-1] ** -0.5
    return new_state, o


def my_step_numpy(state, q, k, v, g, beta):
    """1, written differently: float64 NumPy with the matrix ``(I - beta k k^T) diag(e^g)``
    formed per batch row and head (slower, but the equation as printed)."""
    import numpy as np

    state, q, k, v, g, beta = (np.asarray(a, np.float64) for a in (state, q, k, v, g, beta))
    new, out = np.empty_like(state), np.empty(v.shape)
    for b in range(state.shape[0]):
        for h in range(state.shape[1]):
            kk = k[b, h]
            m = (np.eye(len(kk)) - beta[b, h] * np.outer(kk, kk)) @ np.diag(np.exp(g[b, h]))
            new[b, h] = m @ state[b, h] + beta[b, h] * np.outer(kk, v[b, h])
            out[b, h] = new[b, h].T @ q[b, h] / np.sqrt(len(kk))
    return new, out


def step_vk(state_vk, q, k, v, g, beta):
    """2: with ``X = S^T`` (``[V, K]``) the step transposes to ``X_t = X D (I - beta k k^T)
    + beta v k^T``: the decay scales *columns* (key channels are the last axis), the recall
    is ``X D k`` and the read-out ``X_t q / sqrt(K)``. Written with the last-axis broadcast
    instead of calling ``my_step`` on a transposed copy."""
    decayed = state_vk * jnp.exp(g)[..., None, :]  # X D: column i times e^{g_i}
    recalled = jnp.einsum("bhvk,bhk->bhv", decayed, k)
    new = decayed + beta[..., None, None] * (v - recalled)[..., :, None] * k[..., None, :]
    return new, jnp.einsum("bhvk,bhk->bhv", new, q) / jnp.sqrt(q.shape[-1])


def step_vk_loop(state_vk, q, k, v, g, beta):
    """2, written differently: float64 NumPy, a loop over batch and heads, through the
    transpose of ``my_step``'s algebra."""
    import numpy as np

    x = np.asarray(state_vk, np.float64)
    new, out = np.empty_like(x), np.empty(np.shape(v))
    for b in range(x.shape[0]):
        for h in range(x.shape[1]):
            s = x[b, h].T * np.exp(np.asarray(g)[b, h])[:, None]  # D S, [K, V]
            kk = np.asarray(k)[b, h]
            s = s + float(beta[b, h]) * np.outer(kk, np.asarray(v)[b, h] - kk @ s)
            new[b, h], out[b, h] = s.T, np.asarray(q)[b, h] @ s / np.sqrt(len(kk))
    return new, out


def cases():
    def undecayed_step(state, q, k, v, g, beta):  # forgets diag(e^g)
        return my_step(state, q, k, v, jnp.zeros_like(g), beta)

    def wrong_axis(state_vk, q, k, v, g, beta):  # decays the value axis (rows) instead
        return my_step(state_vk, q, k, v, g, beta)

    return [
        ("00.1", my_step, {}, undecayed_step),
        ("00.1", my_step_numpy, {}, undecayed_step),
        ("00.2", step_vk, {}, wrong_axis),
        ("00.2", step_vk_loop, {}, wrong_axis),
    ]
