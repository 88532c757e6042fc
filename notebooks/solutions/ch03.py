"""Worked solutions to notebook 03's exercises (the chunkwise algorithm).

Try the exercises in the notebook first: its cells call ``kda_lib.teaching.exercises.check`` on your
answer. ``cases()`` feeds each solution, and a wrong answer, to its checker
(``tests/teaching/test_exercises.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.chunked import chunk_affine_maps


# 1. One token per chunk: chunk_affine_maps on a chunk of C = 1 returns the token's own map.
def one_token_map(k, g, beta, v):
    """(M_t, E_t) of one token, from chunk_affine_maps with C = 1 (float64)."""
    with jax.enable_x64(True):
        to = lambda a: jnp.asarray(a, jnp.float64)[None, None, None, None]  # noqa: E731
        maps = chunk_affine_maps(to(k), to(k), to(v), to(g), to(beta), scale=1.0)
    return np.asarray(maps.transition)[0, 0, 0], np.asarray(maps.state_ext)[0, 0, 0]


# 2. No decay: step 4 with Gamma = I, M = I - K^T K~, K~ = (I + L)^-1 diag(beta) K.
def no_decay_map(k, beta):
    C = k.shape[0]
    L = beta[:, None] * (k @ k.T) * np.tril(np.ones((C, C)), -1)
    k_tilde = np.linalg.solve(np.eye(C) + L, beta[:, None] * k)
    return np.eye(k.shape[1]) - k.T @ k_tilde


# 3. Flop-optimal chunk sizes: evaluate the count for every candidate.
def flop_optimal(T, K, V, candidates=(16, 32, 64, 128, 256)):
    from kda_lib.ops import costs

    return {
        scan: min(candidates, key=lambda C, s=scan: costs.chunked_flops(T, C, K, V, s))
        for scan in ("sequential", "associative")
    }


# 4. The sequential pass without K x K maps: correct the values with the entering state,
#    carry the state, then every chunk's outputs.
def state_pass(w, u, q_in, k_out, attn_qk, keep, s0):
    state, entering, corrected = s0, [], []
    for n in range(w.shape[0]):
        entering.append(state)
        corrected.append(u[n] - w[n] @ state)  # Delta = U - W S
        state = keep[n][:, None] * state + k_out[n].T @ corrected[-1]
    outputs = [
        q_in[n] @ s + attn_qk[n] @ d
        for n, (s, d) in enumerate(zip(entering, corrected, strict=True))
    ]
    return np.concatenate(outputs), state


# 5. Gated DeltaNet's scores: one C x C decay mask times q k^T.
def gdn_scores(q, k, g, scale):
    gamma = np.cumsum(g)
    mask = np.exp(np.tril(gamma[:, None] - gamma[None, :]))  # exponents <= 0 kept
    return scale * (q @ k.T) * mask * np.tril(np.ones((len(g), len(g))))


def cases():
    rng = np.random.default_rng(3)
    K, V, C = 6, 5, 8
    k1 = rng.standard_normal(K)
    k1 /= np.linalg.norm(k1)
    token = dict(k=k1, g=-rng.uniform(0.01, 1, K), beta=0.7, v=rng.standard_normal(V))
    m1, e1 = one_token_map(**token)
    kc = rng.standard_normal((C, K))
    kc /= np.linalg.norm(kc, axis=1, keepdims=True)
    chunk = dict(k=kc, beta=rng.uniform(0.1, 0.9, C))
    sizes = dict(T=4096, K=128, V=128)

    def no_delta(w, u, q_in, k_out, attn_qk, keep, s0):  # forgets the values' correction
        return state_pass(np.zeros_like(w), u, q_in, k_out, attn_qk, keep, s0)

    return [
        ("03.1", (m1, e1), token, (np.diag(np.exp(token["g"])), e1)),
        ("03.2", no_decay_map(**chunk), chunk, np.eye(K) - chunk["k"].T @ chunk["k"]),
        ("03.3", flop_optimal(**sizes), sizes, {"sequential": 64, "associative": 64}),
        ("03.4", state_pass, {}, no_delta),
        (
            "03.5",
            gdn_scores,
            {},
            lambda q, k, g, scale: scale * (q @ k.T) * np.tril(np.ones((len(g), len(g)))),
        ),
    ]
