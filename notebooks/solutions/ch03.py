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


# 2. Two chunks into one: chunks i and i + 1 (NOTATION's [i]: S_[i] enters chunk i). Step 3 for
#    chunk i + 1, entered by S_[i+1]: Delta_[i+1] = V~_[i+1] - K~_[i+1] S_[i+1], and step 4 for
#    chunk i: S_[i+1] = M_[i] S_[i] + E_[i] with M_[i] = Gamma_C,[i] - K_out,[i]^T K~_[i] and
#    E_[i] = K_out,[i]^T V~_[i] (Gamma_C,[i] = diag(e^gamma_C,[i]), the decay across chunk i). So
#    Delta_[i+1] = (V~_[i+1] - K~_[i+1] K_out,[i]^T V~_[i]) - K~_[i+1] M_[i] S_[i]: the merged
#    chunk's K~ stacks K~_[i] on K~_[i+1] Gamma_C,[i] - (K~_[i+1] K_out,[i]^T) K~_[i], and its V~
#    stacks V~_[i] on V~_[i+1] - (K~_[i+1] K_out,[i]^T) V~_[i]. (K~_[i+1] Gamma_C,[i] is K~_[i+1]
#    with its keys decayed from chunk i's start.) Only C_[i+1] x C_[i] coupling products, no solve:
#    the same doubling by which unit_lower_inverse builds a chunk's (I + L)^-1 from 2 x 2 diagonal
#    blocks, merged pairwise. In code, _i and _next stand for [i] and [i+1].
def merge_chunks(K_tilde_i, V_tilde_i, K_out_i, gamma_i, K_tilde_next, V_tilde_next):
    coupling = K_tilde_next @ K_out_i.T  # [C_[i+1], C_[i]]
    K_tilde = np.concatenate([K_tilde_i, K_tilde_next * np.exp(gamma_i) - coupling @ K_tilde_i])
    V_tilde = np.concatenate([V_tilde_i, V_tilde_next - coupling @ V_tilde_i])
    return K_tilde, V_tilde


# 2, written differently: float32 jnp, through chunk i's map (M_[i], E_[i]) as matrices.
def merge_chunks_by_maps(K_tilde_i, V_tilde_i, K_out_i, gamma_i, K_tilde_next, V_tilde_next):
    import jax.numpy as jnp

    f32 = (jnp.asarray(a, jnp.float32) for a in (K_tilde_i, V_tilde_i, K_out_i, K_tilde_next,
                                                 V_tilde_next))
    K_tilde_i, V_tilde_i, K_out_i, K_tilde_next, V_tilde_next = f32
    M_i = jnp.diag(jnp.exp(jnp.asarray(gamma_i, jnp.float32))) - K_out_i.T @ K_tilde_i
    E_i = K_out_i.T @ V_tilde_i
    return (jnp.concatenate([K_tilde_i, K_tilde_next @ M_i]),
            jnp.concatenate([V_tilde_i, V_tilde_next - K_tilde_next @ E_i]))


def cases():
    def forward_system(k, g, beta):  # step 3's system (I + L, diag(beta) K_in), echoed
        gamma = np.cumsum(g, axis=0)
        L = np.tril(beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, _decay(gamma)), -1)
        return np.eye(len(beta)) + L, beta[:, None] * k * np.exp(gamma)

    def unmerged(K_tilde_i, V_tilde_i, K_out_i, gamma_i, K_tilde_next, V_tilde_next):  # uncoupled
        return np.concatenate([K_tilde_i, K_tilde_next]), np.concatenate([V_tilde_i, V_tilde_next])

    return [
        ("03.1", wy_backward_system, {}, forward_system),
        ("03.1", wy_backward_system_by_rows, {}, forward_system),
        ("03.2", merge_chunks, {}, unmerged),
        ("03.2", merge_chunks_by_maps, {}, unmerged),
    ]
