"""Worked solutions to notebook 03's exercises (the chunkwise algorithm).

Try the exercises in the notebook first: its cells call ``kda_lib.teaching.exercises.check`` on your
answer. ``cases()`` feeds each solution, and a wrong answer, to its checker
(``tests/teaching/test_exercises.py``).
"""

from __future__ import annotations

import numpy as np


def _decay(gamma):
    """[t, s, d_k]: exp(gamma_t - gamma_s) where s <= t, 0 elsewhere (no exponent above 0)."""
    causal = np.tril(np.ones((len(gamma), len(gamma)), bool))
    return np.exp(np.where(causal[..., None], gamma[:, None] - gamma[None], -np.inf))


# 1. The backward pass through a chunk. Backpropagation runs dS_{t-1} = M_t^T dS_t from dS_C,
#    and M_t^T = D_t (I - beta_t k_t k_t^T): token t first erases delta'_t^T = beta_t k_t^T dS_t
#    (its backward pseudo-value), then decays: dS_{t-1} = D_t dS_t - (D_t k_t) delta'_t^T.
#    Unrolled down to 0 (step 1, mirrored): dS_in = Gamma_C dS_C - sum_t Gamma_t k_t delta'_t^T
#    = Gamma_C dS_C - K_in^T Delta', and from C down to t:
#    dS_t = Gamma_C Gamma_t^-1 dS_C - sum_{s > t} Gamma_s Gamma_t^-1 k_s delta'_s^T.
#    Put that into delta'_t (step 2, mirrored): delta'_t^T = beta_t (Gamma_C Gamma_t^-1 k_t)^T dS_C
#    - sum_{s > t} L'_ts delta'_s^T with L'_ts = beta_t k_t^T Gamma_s Gamma_t^-1 k_s, STRICTLY UPPER
#    (a token sees the later ones), every exponent gamma_s - gamma_t <= 0 for s > t. So
#    (I + L') Delta' = diag(beta) K_out dS_C, for every dS_C: the system is lhs = I + L' (unit
#    upper triangular) and rhs = diag(beta) K_out, the right-hand side holding the keys decayed to
#    the chunk END; K~' = lhs^-1 rhs and M^T = Gamma_C - K_in^T K~'.
#    (lhs^-1 rhs equals diag(beta) (I + L^T)^-1 K_out, the transpose of step 4's M, by the
#    push-through identity diag(beta) (I + G^T diag(beta))^-1 = (I + diag(beta) G^T)^-1 diag(beta).)
def wy_backward_system(k, g, beta):
    gamma = np.cumsum(g, axis=0)
    later = np.einsum("tc,sc,stc->ts", k, k, _decay(gamma))  # [t, s]: s > t kept below
    L_back = beta[:, None] * later * np.triu(np.ones((len(beta), len(beta))), 1)  # L'
    K_out = k * np.exp(gamma[-1] - gamma)  # rows Gamma_C Gamma_t^-1 k_t
    return np.eye(len(beta)) + L_back, beta[:, None] * K_out


# 1, written differently: float32 jnp, L' row by row with every exponent gamma_s - gamma_t <= 0.
def wy_backward_system_by_rows(k, g, beta):
    import jax.numpy as jnp

    k, g = jnp.asarray(k, jnp.float32), jnp.asarray(g, jnp.float32)
    gamma, C = jnp.cumsum(g, axis=0), len(beta)
    rows = [jnp.concatenate([jnp.zeros(t + 1), beta[t] * jnp.einsum(
        "c,sc->s", k[t], k[t + 1:] * jnp.exp(gamma[t + 1:] - gamma[t]))]) for t in range(C)]
    return jnp.eye(C) + jnp.stack(rows), beta[:, None] * k * jnp.exp(gamma[-1] - gamma)


# 2. Two chunks into one. Step 3 for the second chunk, entered by S_C:
#    Delta_2 = V~2 - K~2 S_C, and step 4 for the first: S_C = M_1 S_in + E_1 with
#    M_1 = Gamma^(1) - K_out1^T K~1, E_1 = K_out1^T V~1 (S_in: the state entering the first). So
#    Delta_2 = (V~2 - K~2 K_out1^T V~1) - K~2 (Gamma^(1) - K_out1^T K~1) S_in:
#    the merged chunk's K~ stacks K~1 on K~2 Gamma^(1) - (K~2 K_out1^T) K~1, and its V~ stacks V~1
#    on V~2 - (K~2 K_out1^T) V~1. (K~2 Gamma^(1) is K~2 with its keys decayed from the merged
#    chunk's start.) Only C2 x C1 coupling products, no solve: the same doubling by which
#    unit_lower_inverse builds a chunk's (I + L)^-1 from 2 x 2 diagonal blocks, merged pairwise.
def merge_chunks(K_tilde1, V_tilde1, K_out1, gamma1, K_tilde2, V_tilde2):
    coupling = K_tilde2 @ K_out1.T  # [C2, C1]
    K_tilde = np.concatenate([K_tilde1, K_tilde2 * np.exp(gamma1) - coupling @ K_tilde1])
    V_tilde = np.concatenate([V_tilde1, V_tilde2 - coupling @ V_tilde1])
    return K_tilde, V_tilde


# 2, written differently: float32 jnp, through the first chunk's map (M_1, E_1) as matrices.
def merge_chunks_by_maps(K_tilde1, V_tilde1, K_out1, gamma1, K_tilde2, V_tilde2):
    import jax.numpy as jnp

    f32 = (jnp.asarray(a, jnp.float32) for a in (K_tilde1, V_tilde1, K_out1, K_tilde2, V_tilde2))
    K_tilde1, V_tilde1, K_out1, K_tilde2, V_tilde2 = f32
    M1 = jnp.diag(jnp.exp(jnp.asarray(gamma1, jnp.float32))) - K_out1.T @ K_tilde1
    E1 = K_out1.T @ V_tilde1
    return (jnp.concatenate([K_tilde1, K_tilde2 @ M1]),
            jnp.concatenate([V_tilde1, V_tilde2 - K_tilde2 @ E1]))


def cases():
    def forward_system(k, g, beta):  # step 3's system (I + L, diag(beta) K_in), echoed
        gamma = np.cumsum(g, axis=0)
        L = np.tril(beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, _decay(gamma)), -1)
        return np.eye(len(beta)) + L, beta[:, None] * k * np.exp(gamma)

    def unmerged(K_tilde1, V_tilde1, K_out1, gamma1, K_tilde2, V_tilde2):  # stacked, uncoupled
        return np.concatenate([K_tilde1, K_tilde2]), np.concatenate([V_tilde1, V_tilde2])

    return [
        ("03.1", wy_backward_system, {}, forward_system),
        ("03.1", wy_backward_system_by_rows, {}, forward_system),
        ("03.2", merge_chunks, {}, unmerged),
        ("03.2", merge_chunks_by_maps, {}, unmerged),
    ]
