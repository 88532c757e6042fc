"""Worked solutions to notebook 03's exercises (the chunkwise algorithm).

Try the exercises in the notebook first: its cells call ``kda_lib.teaching.exercises.check`` on your
answer. ``cases()`` feeds each solution, and a wrong answer, to its checker
(``tests/teaching/test_exercises.py``).
"""

from __future__ import annotations

import numpy as np


# 1. The other order, no decay. Step 3 gives M_C ... M_1 = I - K^T (I + L)^-1 diag(beta) K with
#    L strictly lower, L_ts = beta_t k_t . k_s. Each M_t is symmetric, so M_1 ... M_C is its
#    transpose, I - K^T diag(beta) (I + L^T)^-1 K, and diag(beta) (I + G diag(beta))^-1 =
#    (I + diag(beta) G)^-1 diag(beta) (G = the strictly upper part of K K^T) makes it
#    I - K^T K~' with (I + U) K~' = diag(beta) K, U_ts = beta_t k_t . k_s for s > t: the same
#    solve with an UPPER triangle (equivalently: step 3 on the chunk read backwards, flipped).
def wy_factor_reversed(k, beta):
    C = k.shape[0]
    U = beta[:, None] * (k @ k.T) * np.triu(np.ones((C, C)), 1)
    return np.linalg.solve(np.eye(C) + U, beta[:, None] * k)


# 2. Gated DeltaNet's scores: one C x C decay mask times q k^T.
def gdn_scores(q, k, g, scale):
    gamma = np.cumsum(g)
    mask = np.exp(np.tril(gamma[:, None] - gamma[None, :]))  # exponents <= 0 kept
    return scale * (q @ k.T) * mask * np.tril(np.ones((len(g), len(g))))


# 2, written differently: float32 jnp, the exponent set to -inf above the diagonal before exp.
def gdn_scores_jnp(q, k, g, scale):
    import jax.numpy as jnp

    gamma = jnp.cumsum(jnp.asarray(g, jnp.float32))
    causal = jnp.tril(jnp.ones((len(g), len(g)), bool))
    diff = jnp.where(causal, gamma[:, None] - gamma[None, :], -jnp.inf)
    return scale * (jnp.asarray(q, jnp.float32) @ jnp.asarray(k, jnp.float32).T) * jnp.exp(diff)


# 2, a Python loop over the lower triangle (float64).
def gdn_scores_loop(q, k, g, scale):
    gamma, C = np.cumsum(g), len(g)
    p = np.zeros((C, C))
    for t in range(C):
        for s in range(t + 1):
            p[t, s] = scale * (q[t] @ k[s]) * np.exp(gamma[t] - gamma[s])
    return p


def cases():
    def by_product(k, beta):  # the shortcut: the product, then K~' read back by least squares
        product = np.eye(k.shape[1])
        for k_t, b_t in zip(k, beta, strict=True):
            product = product @ (np.eye(k.shape[1]) - b_t * np.outer(k_t, k_t))
        return np.linalg.lstsq(k.T, np.eye(k.shape[1]) - product, rcond=None)[0]

    def wy_flipped_float32(k, beta):  # step 3 on the reversed chunk, flipped back, float32 jnp
        import jax.numpy as jnp

        k32, b32 = jnp.asarray(k, jnp.float32)[::-1], jnp.asarray(beta, jnp.float32)[::-1]
        L = jnp.tril(b32[:, None] * (k32 @ k32.T), -1)
        return jnp.linalg.solve(jnp.eye(len(b32)) + L, b32[:, None] * k32)[::-1]

    def wy_transposed(k, beta):  # M^T from step 3's factor: diag(beta) (I + L^T)^-1 K
        L = np.tril(beta[:, None] * (k @ k.T), -1)
        return beta[:, None] * np.linalg.solve((np.eye(len(beta)) + L).T, k)

    def undecayed(q, k, g, scale):
        return scale * (q @ k.T) * np.tril(np.ones((len(g), len(g))))

    return [
        ("03.1", wy_factor_reversed, {}, by_product),
        ("03.1", wy_flipped_float32, {}, by_product),
        ("03.1", wy_transposed, {}, by_product),
        ("03.2", gdn_scores, {}, undecayed),
        ("03.2", gdn_scores_jnp, {}, undecayed),
        ("03.2", gdn_scores_loop, {}, undecayed),
    ]
