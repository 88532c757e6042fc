"""Worked solutions of notebook 07's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def draft_cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size,
                      conv_bytes, draft) -> int:
    """1: to go back to any of the m + 1 prefixes of an m-token draft (0 to m tokens accepted)
    without recomputing, keep the state before the draft and after each token: m + 1 states of
    B HV K V float32 numbers (grouped value heads: one K x V state per *value* head). The conv
    history after a prefix of j tokens is the last w - 1 conv inputs before position j; these
    windows overlap, and together they are the w - 1 rows before the draft and the m draft rows:
    one window of w - 1 + m rows of q, k (H K channels each) and v (HV V), B (w - 1 + m)
    (2 H K + HV V) numbers of ``conv_bytes`` bytes, where m + 1 separate histories would take
    (m + 1)(w - 1) rows. A conv of width w < 2 keeps no history (w = 0: no conv; w = 1: each
    output reads its own input only), so no rows at all, draft or not."""
    rows = conv_size - 1 + draft if conv_size >= 2 else 0
    conv = batch * rows * (2 * num_heads * key_dim + num_v_heads * value_dim)
    return 4 * (draft + 1) * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


def roll_back(state, k, v, g, beta, rejected):
    """2: one token maps S_(t-1) to S_t = (I - beta k k^T) D S_(t-1) + beta k v^T (notebook 01,
    section 4). Undo it right to left: subtract the write, then invert the two factors.
    For a unit k, (I - beta k k^T) k = (1 - beta) k and it leaves directions orthogonal to k
    alone, so its inverse is I + beta / (1 - beta) k k^T (check: the product is I + (beta /
    (1 - beta) - beta - beta^2 / (1 - beta)) k k^T = I). Applied to S_t - beta k v^T and
    simplified:

        D S_(t-1) = S_t - beta / (1 - beta) k (v - S_t^T k)^T,

    the delta-rule write run backwards with learning rate -beta / (1 - beta); then divide row c
    by e^(g_c). O(K V) per token, no K x K matrix. It is exact for beta in (1, 2) too
    (1 - beta < 0: a negative eigenvalue along k), where the series I + beta k k^T + (beta k
    k^T)^2 + ... that an iteration sums diverges. It fails at beta = 1 (the old value under k is
    erased: nothing to undo from) and loses precision as beta -> 1 or as decays get strong (the
    division by e^g amplifies rounding): why servers keep the state after each draft token
    instead (the notebook notes)."""
    state = np.asarray(state, np.float64)
    for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
        k_t, beta_t = np.asarray(k[t], np.float64), float(beta[t])
        state = state - beta_t / (1 - beta_t) * np.outer(k_t, np.asarray(v[t]) - k_t @ state)
        state = np.exp(-np.asarray(g[t], np.float64))[:, None] * state
    return state


def roll_back_jnp(state, k, v, g, beta, rejected):
    """2, written differently: float32 jnp, the write subtracted first and the rank-one
    inverse applied to it, keys as columns."""
    state = jnp.asarray(state, jnp.float32)
    for t in reversed(range(len(beta) - rejected, len(beta))):
        k_t = jnp.asarray(k[t], jnp.float32)[:, None]
        beta_t = jnp.float32(beta[t])
        written = state - beta_t * k_t @ jnp.asarray(v[t], jnp.float32)[None]  # (I - beta kk^T) D S
        decayed = written + beta_t / (1 - beta_t) * k_t @ (k_t.T @ written)  # D S_(t-1)
        state = jnp.exp(-jnp.asarray(g[t], jnp.float32))[:, None] * decayed
    return state


def t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes,
           draft) -> int:
    """3: a KDA call verifying an m-token draft reads its state once and writes the state after
    each token (m states, kept to roll back, exercise 1): (1 + m) H K V numbers; it reads the
    w - 1 conv rows and writes the m draft rows (exercise 1's window; none for w < 2):
    (w - 1 + m) H (2 K + V) numbers, each of ``state_bytes``. An attention call over T cached
    tokens writes the draft's m entries and reads all T + m: (T + 2 m) kv_numbers numbers of
    ``kv_bytes`` each (``kv_numbers``: the whole layer's numbers a token, all heads together).
    The first whole T with (T + 2 m) kv_numbers kv_bytes >= the KDA bytes is ceil(KDA /
    (kv_numbers kv_bytes)) - 2 m, and at least 1: a context has at least one token (with a small
    state and a long draft the count goes to 0 or below: attention moves more bytes at every
    context).
    With m = 1 this is one decode step's T*_step (notes) plus the conv rows and the new
    entry; each extra draft token adds a state write (H K V numbers) to KDA but only two
    entries to attention, so T* grows about (m + 1) / 2 times: keeping every draft token's
    state costs bandwidth. At Kimi Linear's shape (H = 32, K = V = 128, w = 4) against its MLA
    cache (576 bf16 numbers a token) with a float32 state: 3,810 at m = 1 (one step's
    T*_step: 3,641), 9,393 at m = 4 (asserted in ``cases()``)."""
    rows = conv_size - 1 + draft if conv_size >= 2 else 0
    kda = state_bytes * heads * ((1 + draft) * key_dim * value_dim
                                 + rows * (2 * key_dim + value_dim))
    return max(1, math.ceil(kda / (kv_numbers * kv_bytes)) - 2 * draft)


def cases():
    assert [t_star(32, 128, 128, 4, 576, 4, 2, m) for m in (1, 4)] == [3810, 9393]  # 3's text

    def section_3(batch, h, hv, k, v, w, cb, m):  # the page's layout: one state, all float32
        return 4 * (batch * h * k * v + batch * max(w - 1, 0) * h * (2 * k + v))

    def inverted_by_solve(state, k, v, g, beta, rejected):  # right, but np.linalg.solve
        for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
            transition = (np.eye(len(k[t])) - beta[t] * np.outer(k[t], k[t])) * np.exp(g[t])
            state = np.linalg.solve(transition, state - beta[t] * np.outer(k[t], v[t]))
        return state

    return [
        ("07.1", draft_cache_bytes, {}, section_3),
        ("07.2", roll_back, {}, inverted_by_solve),
        ("07.2", roll_back_jnp, {}, lambda s, k, v, g, beta, rejected: s),
        ("07.3", t_star, {},
         lambda h, k, v, w, n, bs, bc, d: math.ceil(2 * h * k * v * bs / (n * bc))),
    ]
