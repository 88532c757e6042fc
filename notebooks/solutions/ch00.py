"""Worked solutions of notebook 00's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import jax.numpy as jnp


def step_write_first(state, q, k, v, g, beta):
    """1: ``S_t = D [(I - beta k k^T) S + beta k v^T]``, ``D = diag(e^g)``. Expand the write as
    in section 1's step, but on the undecayed state: ``(I - beta k k^T) S + beta k v^T
    = S + beta k (v - S^T k)^T`` (the recall ``S^T k`` reads the old state), then scale row
    ``i`` (key channel ``i``) by ``e^{g_i}``. The read-out uses the decayed result:
    ``o = S_t^T q / sqrt(K)``. Equivalently ``S_t = D S + beta (D k)(v - S^T k)^T``: the write
    goes along the decayed key ``D k``, not along ``k``."""
    recalled = jnp.einsum("bhk,bhkv->bhv", k, state)  # S^T k, from the undecayed state
    written = state + beta[..., None, None] * k[..., :, None] * (v - recalled)[..., None, :]
    new_state = jnp.exp(g)[..., None] * written  # D (...): row i times e^{g_i}
    o = jnp.einsum("bhk,bhkv->bhv", q, new_state) * q.shape[-1] ** -0.5
    return new_state, o


def step_write_first_numpy(state, q, k, v, g, beta):
    """1, written differently: float64 NumPy, the matrices ``D`` and ``I - beta k k^T`` formed
    per batch row and head (slower, but the equation as written)."""
    import numpy as np

    state, q, k, v, g, beta = (np.asarray(a, np.float64) for a in (state, q, k, v, g, beta))
    new, out = np.empty_like(state), np.empty(v.shape)
    for b in range(state.shape[0]):
        for h in range(state.shape[1]):
            kk, erase = k[b, h], np.eye(k.shape[-1]) - beta[b, h] * np.outer(k[b, h], k[b, h])
            new[b, h] = np.diag(np.exp(g[b, h])) @ (erase @ state[b, h]
                                                     + beta[b, h] * np.outer(kk, v[b, h]))
            out[b, h] = new[b, h].T @ q[b, h] / np.sqrt(len(kk))
    return new, out


def step_value_decay(state, q, k, v, g, beta):
    """2: ``S_t = (I - beta k k^T) S D_v + beta k v^T`` with ``D_v = diag(e^g)``, ``g [B, H, V]``.
    ``S D_v`` scales *column* ``e`` (value channel ``e``) by ``e^{g_e}``: the last axis. The
    write is section 1's, on that decayed state ``S' = S D_v``: ``(I - beta k k^T) S' + beta k
    v^T = S' + beta k (v - S'^T k)^T``, whose recall ``S'^T k = D_v S^T k`` is the old recall
    with each value channel decayed. The read-out is unchanged: ``o = S_t^T q / sqrt(K)``."""
    decayed = state * jnp.exp(g)[..., None, :]  # S D_v: column e times e^{g_e}
    recalled = jnp.einsum("bhk,bhkv->bhv", k, decayed)
    new = decayed + beta[..., None, None] * k[..., :, None] * (v - recalled)[..., None, :]
    return new, jnp.einsum("bhkv,bhk->bhv", new, q) / jnp.sqrt(q.shape[-1])


def step_value_decay_loop(state, q, k, v, g, beta):
    """2, written differently: float64 NumPy, a loop over batch and heads, the matrices
    formed."""
    import numpy as np

    s = np.asarray(state, np.float64)
    new, out = np.empty_like(s), np.empty(np.shape(v))
    for b in range(s.shape[0]):
        for h in range(s.shape[1]):
            kk = np.asarray(k, np.float64)[b, h]
            erase = np.eye(len(kk)) - float(beta[b, h]) * np.outer(kk, kk)
            decay = np.diag(np.exp(np.asarray(g, np.float64)[b, h]))
            write = float(beta[b, h]) * np.outer(kk, np.asarray(v, np.float64)[b, h])
            new[b, h] = erase @ s[b, h] @ decay + write
            out[b, h] = new[b, h].T @ np.asarray(q, np.float64)[b, h] / np.sqrt(len(kk))
    return new, out


def cases():
    def page_step(state, q, k, v, g, beta):  # section 1's order: decay, then write
        decayed = jnp.exp(g)[..., None] * state
        recalled = jnp.einsum("bhk,bhkv->bhv", k, decayed)
        new = decayed + beta[..., None, None] * k[..., :, None] * (v - recalled)[..., None, :]
        return new, jnp.einsum("bhk,bhkv->bhv", q, new) / jnp.sqrt(q.shape[-1])

    def key_axis_decay(state, q, k, v, g, beta):  # decays rows, as if g were per key channel
        return page_step(state, q, k, v, g[..., : state.shape[-2]], beta)

    def read_before_decay(state, q, k, v, g, beta):  # 1 with o read from the undecayed write
        new, _ = step_write_first(state, q, k, v, g, beta)
        written, _ = step_write_first(state, q, k, v, jnp.zeros_like(g), beta)
        return new, jnp.einsum("bhk,bhkv->bhv", q, written) / jnp.sqrt(q.shape[-1])

    return [
        ("00.1", step_write_first, {}, page_step),
        ("00.1", step_write_first_numpy, {}, read_before_decay),
        ("00.2", step_value_decay, {}, key_axis_decay),
        ("00.2", step_value_decay_loop, {}, page_step),
    ]
