"""Worked solutions of notebook 07's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def layer_cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size,
                      conv_bytes) -> int:
    """1: with grouped value heads the state is one K x V matrix per *value* head: B HV K V
    float32 numbers (4 bytes). The conv histories keep the last conv_size - 1 rows of the conv
    inputs, which are q and k (H K channels each) and v (HV V channels): B (w - 1) (2 H K +
    HV V) numbers of ``conv_bytes`` bytes. With conv_size = 0 there is no conv, so no history
    (not -1 rows). Section 3's formula is the case HV = H, conv_bytes = 4."""
    conv = batch * max(conv_size - 1, 0) * (2 * num_heads * key_dim + num_v_heads * value_dim)
    return 4 * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


def roll_back(state, k, v, g, beta, rejected):
    """2: one token maps S_(t-1) to S_t = (I - b k k^T) D S_(t-1) + b k v^T (notebook 01,
    section 4). Undo it right to left: subtract the write, then invert the two factors.
    For a unit k, (I - b k k^T) k = (1 - b) k and it leaves directions orthogonal to k alone,
    so its inverse is I + b / (1 - b) k k^T (check: the product is I + (b / (1 - b) - b
    - b^2 / (1 - b)) k k^T = I). Applied to S_t - b k v^T and simplified:

        D S_(t-1) = S_t - b / (1 - b) k (v - S_t^T k)^T,

    the delta-rule write run backwards with learning rate -b / (1 - b); then divide row c by
    e^(g_c). O(K V) per token, no K x K matrix. It is exact for b in (1, 2) too (1 - b < 0:
    a negative eigenvalue along k), where the series I + b k k^T + (b k k^T)^2 + ... that an
    iteration sums diverges. It fails at b = 1 (the old value under k is
    erased: nothing to undo from) and loses precision as b -> 1 or as decays get strong (the
    division by e^g amplifies rounding): why servers keep the state after each draft token
    instead (the notebook notes)."""
    state = np.asarray(state, np.float64)
    for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
        k_t, b_t = np.asarray(k[t], np.float64), float(beta[t])
        state = state - b_t / (1 - b_t) * np.outer(k_t, np.asarray(v[t]) - k_t @ state)
        state = np.exp(-np.asarray(g[t], np.float64))[:, None] * state
    return state


def roll_back_jnp(state, k, v, g, beta, rejected):
    """2, written differently: float32 jnp, the write subtracted first and the rank-one
    inverse applied to it, keys as columns."""
    s = jnp.asarray(state, jnp.float32)
    for t in reversed(range(len(beta) - rejected, len(beta))):
        k_t = jnp.asarray(k[t], jnp.float32)[:, None]
        b = jnp.float32(beta[t])
        w = s - b * k_t @ jnp.asarray(v[t], jnp.float32)[None]  # (I - b k k^T) D S_(t-1)
        w = w + b / (1 - b) * k_t @ (k_t.T @ w)  # (I - b k k^T)^(-1) applied
        s = jnp.exp(-jnp.asarray(g[t], jnp.float32))[:, None] * w
    return s


def t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes) -> int:
    """3: a KDA step reads and writes its whole cache: the state, H K V numbers, and the conv
    histories, (w - 1) H (2 K + V) numbers, all of b_S bytes: 2 b_S H (K V + (w - 1)(2 K + V)).
    An attention step over T cached tokens writes the new token's entry and reads all T + 1:
    (T + 2) n b_KV bytes. The first whole T (at least 1) with (T + 2) n b_KV >= the KDA bytes
    is ceil(KDA / (n b_KV)) - 2. Section 5's T*_step drops the conv and the + 2; at Kimi
    Linear's shape the conv adds (w - 1)(2 K + V) / (K V) = 7 % to the KDA side."""
    kda = 2 * state_bytes * heads * (key_dim * value_dim
                                     + max(conv_size - 1, 0) * (2 * key_dim + value_dim))
    return max(1, math.ceil(kda / (kv_numbers * cache_bytes)) - 2)


def cases():
    def section_3(b, h, hv, k, v, w, cb):  # the page's layout: HV = H, all float32
        return 4 * (b * h * k * v + b * max(w - 1, 0) * h * (2 * k + v))

    def inverted_by_solve(state, k, v, g, beta, rejected):  # right, but np.linalg.solve
        for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
            m = (np.eye(len(k[t])) - beta[t] * np.outer(k[t], k[t])) * np.exp(g[t])
            state = np.linalg.solve(m, state - beta[t] * np.outer(k[t], v[t]))
        return state

    return [
        ("07.1", layer_cache_bytes, {}, section_3),
        ("07.2", roll_back, {}, inverted_by_solve),
        ("07.2", roll_back_jnp, {}, lambda s, k, v, g, beta, rejected: s),
        ("07.3", t_star, {},
         lambda h, k, v, w, n, bs, bc: math.ceil(2 * h * k * v * bs / (n * bc))),
    ]
