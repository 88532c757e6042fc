"""Worked solutions of notebook 00's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import numpy as np


def output_after_one(read, q, k, v, g, beta):
    """1: section 1's step is ``S_t = (I - beta k k^T) D S + beta k v^T``, ``D = diag(e^g)``.
    Transpose it and apply it to ``q``: ``S_t^T q = S^T D (I - beta k k^T) q + beta v (k^T q)``
    (``D`` and ``I - beta k k^T`` are symmetric; transposing reverses their order, so ``q`` is
    erased along ``k`` first, then decayed). The old state enters through one vector,
    ``vec = D (q - beta (k . q) k)``: one read, ``S^T vec``. The token's own write adds ``beta
    (k . q) v``, with no read at all."""
    overlap = float(np.dot(k, q))
    vec = np.exp(g) * (q - beta * overlap * k)
    return (read(vec) + beta * overlap * np.asarray(v)) / np.sqrt(len(q))


def output_after(read, q, k, v, g, beta):
    """2: ``S_T^T q = S_(T-1)^T M_T^T q + beta_T v_T (k_T . q)`` with ``M_T^T = D_T (I -
    beta_T k_T k_T^T)``: peel the newest token off, carry ``vec = M_T^T q`` back, and repeat
    down to token 1; what is left is ``S_0^T vec``, one read. Each token adds its value times
    ``beta_t (k_t . vec)`` for the ``vec`` that reached it (the query pushed back through the
    tokens after it): the chunkwise form of notebook 03 does this for all queries at once."""
    vec, out = np.asarray(q, np.float64), np.zeros(np.shape(v)[1])
    for t in reversed(range(len(beta))):
        overlap = float(k[t] @ vec)
        out += beta[t] * overlap * v[t]
        vec = np.exp(g[t]) * (vec - beta[t] * overlap * k[t])
    return (read(vec) + out) / np.sqrt(len(q))


def output_after_jnp(read, q, k, v, g, beta):
    """2, written differently: float32 jnp, the transitions pushed onto q as matrices
    ``M_t^T = D_t - beta_t (D_t k_t) k_t^T`` and the writes collected as ``beta (V^T w)``."""
    import jax.numpy as jnp

    vec, weights = jnp.asarray(q, jnp.float32), []
    for t in range(len(beta) - 1, -1, -1):
        decay = jnp.exp(jnp.asarray(g[t], jnp.float32))
        weights.insert(0, beta[t] * jnp.dot(k[t], vec))
        vec = (jnp.diag(decay) - beta[t] * jnp.outer(decay * k[t], k[t])) @ vec
    out = jnp.asarray(read(np.asarray(vec))) + jnp.asarray(v, jnp.float32).T @ jnp.stack(weights)
    return out / jnp.sqrt(len(q))


def cases():
    def page_read(read, q, k, v, g, beta):  # the old memory's read: the token ignored
        return read(q) / np.sqrt(len(q))

    def reads_per_token(read, q, k, v, g, beta):  # one read per token: more than one read
        return sum(read(np.asarray(q)) for _ in beta) / np.sqrt(len(q))

    def decay_first(read, q, k, v, g, beta):  # D applied to q before the erase
        vec = np.exp(g) * q
        return (read(vec - beta * (k @ vec) * k) + beta * (k @ q) * v) / np.sqrt(len(q))

    return [
        ("00.1", output_after_one, {}, page_read),
        ("00.1", lambda read, q, k, v, g, b: output_after(read, q, k[None], v[None], g[None],
                                                          np.array([b])), {}, decay_first),
        ("00.2", output_after, {}, reads_per_token),
        ("00.2", output_after_jnp, {}, page_read),
    ]
