"""Worked solutions to notebook 03's exercises (the chunkwise algorithm).

Try the exercises in the notebook first: its cells call ``kda_lib.teaching.exercises.check`` on your
answer. ``cases()`` feeds each solution, and a wrong answer, to its checker
(``tests/teaching/test_exercises.py``).
"""

from __future__ import annotations

import numpy as np


# 1. One token's map, from the recurrence: S_t = (I - beta k k^T) diag(e^g) S_{t-1} + beta k v^T
#    is affine in S_{t-1}, with M_t = (I - beta k k^T) diag(e^g) and E_t = beta k v^T.
def token_map(k, g, beta, v):
    return (np.eye(k.size) - beta * np.outer(k, k)) @ np.diag(np.exp(g)), beta * np.outer(k, v)


# 2. No decay: step 2 with Gamma = I is (I + L) K~ = diag(beta) K, L strictly lower triangular
#    with L_ts = beta_t k_t . k_s; then M = I - K^T K~ (step 4).
def wy_factor(k, beta):
    C = k.shape[0]
    L = beta[:, None] * (k @ k.T) * np.tril(np.ones((C, C)), -1)
    return np.linalg.solve(np.eye(C) + L, beta[:, None] * k)


# 3. The sequential pass without K x K maps: correct the values with the entering state,
#    carry the state, then every chunk's outputs, O = Q_in S / sqrt(d_k) + P Delta (section 4;
#    q_in is the unscaled Q_in).
def state_pass(w, u, q_in, k_out, attn_qk, keep, s0):
    state, entering, corrected = s0, [], []
    for n in range(w.shape[0]):
        entering.append(state)
        corrected.append(u[n] - w[n] @ state)  # Delta = U - W S
        state = keep[n][:, None] * state + k_out[n].T @ corrected[-1]
    scale = q_in.shape[-1] ** -0.5
    outputs = [
        scale * q_in[n] @ s + attn_qk[n] @ d
        for n, (s, d) in enumerate(zip(entering, corrected, strict=True))
    ]
    return np.concatenate(outputs), state


# 4. Gated DeltaNet's scores: one C x C decay mask times q k^T.
def gdn_scores(q, k, g, scale):
    gamma = np.cumsum(g)
    mask = np.exp(np.tril(gamma[:, None] - gamma[None, :]))  # exponents <= 0 kept
    return scale * (q @ k.T) * mask * np.tril(np.ones((len(g), len(g))))


def cases():
    def by_product(k, beta):  # the shortcut: M as the product, then K~ read back by least squares
        product = np.eye(k.shape[1])
        for k_t, b_t in zip(k, beta, strict=True):
            product = (np.eye(k.shape[1]) - b_t * np.outer(k_t, k_t)) @ product
        return np.linalg.lstsq(k.T, np.eye(k.shape[1]) - product, rcond=None)[0]

    def no_delta(w, u, q_in, k_out, attn_qk, keep, s0):  # forgets the values' correction
        return state_pass(np.zeros_like(w), u, q_in, k_out, attn_qk, keep, s0)

    return [
        ("03.1", token_map, {}, lambda k, g, beta, v: (np.diag(np.exp(g)), beta * np.outer(k, v))),
        ("03.2", wy_factor, {}, by_product),
        ("03.3", state_pass, {}, no_delta),
        (
            "03.4",
            gdn_scores,
            {},
            lambda q, k, g, scale: scale * (q @ k.T) * np.tril(np.ones((len(g), len(g)))),
        ),
    ]
