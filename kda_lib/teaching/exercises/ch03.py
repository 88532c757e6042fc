"""Checkers for notebook 03 (the chunkwise algorithm); worked solutions in
``notebooks/solutions/ch03.py``. Each recomputes what it needs in float64 and returns None (right)
or a hint that does not give the answer away."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import checker

CANDIDATE_CHUNKS = (16, 32, 64, 128, 256)


def _close(actual, expected, tol=1e-9) -> bool:
    actual = np.asarray(actual, np.float64)
    return actual.shape == np.shape(expected) and bool(
        np.all(np.abs(actual - expected) <= tol * (1 + np.abs(expected)))
    )


def _pair(answer, name):
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
        return None, f"answer with a pair ({name})"
    return answer, None


@checker("03.1")
def one_token_per_chunk(answer, *, k, g, beta, v):
    """answer: ``(M, E)`` from ``chunk_affine_maps`` on a chunk holding one token."""
    pair, hint = _pair(answer, "transition, state_ext")
    if hint:
        return hint
    k, g, v = (np.asarray(a, np.float64) for a in (k, g, v))
    m_t = (np.eye(k.size) - beta * np.outer(k, k)) @ np.diag(np.exp(g))
    if not _close(pair[0], m_t):
        return "the transition should be the token's own M_t = (I - beta k k^T) D_t"
    if not _close(pair[1], beta * np.outer(k, v)):
        return "the state_ext should be what the token writes, E_t"
    return None


@checker("03.2")
def no_decay(answer, *, k, beta):
    """answer: ``M`` of a chunk without decay (keys ``k`` [C, K], ``beta`` [C]), from step 4."""
    k, beta = np.asarray(k, np.float64), np.asarray(beta, np.float64)
    product = np.eye(k.shape[1])
    for k_t, b_t in zip(k, beta, strict=True):
        product = (np.eye(k.shape[1]) - b_t * np.outer(k_t, k_t)) @ product
    if np.shape(answer) != product.shape:
        return f"M is {product.shape[0]} x {product.shape[0]} (d_k x d_k)"
    if not _close(answer, product, 1e-8):
        return "with g = 0, Gamma = I: M = I - K^T K~ with K~ = (I + L)^-1 diag(beta) K"
    return None


@checker("03.3")
def flop_optimal_chunk(answer, *, T, K, V):
    """answer: ``{"sequential": C, "associative": C}``, the chunk sizes among
    ``CANDIDATE_CHUNKS`` with the fewest forward flops (``kda_lib.ops.costs.chunked_flops``)."""
    from kda_lib.ops import costs

    if not (isinstance(answer, dict) and set(answer) == {"sequential", "associative"}):
        return "answer with a dict {'sequential': C, 'associative': C}"
    for scan, chunk in answer.items():
        best = min(CANDIDATE_CHUNKS, key=lambda c, scan=scan: costs.chunked_flops(T, c, K, V, scan))
        if chunk != best:
            return f"{scan}: evaluate chunked_flops(T, C, K, V, {scan!r}) for every candidate C"
    return None


def _random_chunks(seed, num_chunks=3, C=8, K=6, V=5):
    """One head's inputs, ``[T, ...]`` float64, with a per-channel gate."""
    rng = np.random.default_rng(seed)
    T = num_chunks * C
    q, k = (rng.standard_normal((T, K)) for _ in range(2))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((T, V))
    g = -rng.uniform(0.01, 0.5, (T, K))
    beta = rng.uniform(0.1, 0.9, T)
    s0 = rng.standard_normal((K, V))
    return q, k, v, g, beta, s0, C


def state_pass_inputs(seed=0):
    """The inputs of exercise 03.4 for one head: ``(intra, s0, reference)`` with ``intra`` a
    dict of chunk-major float64 arrays (``w``, ``u``, ``q_in``, ``k_out`` [N, C, .],
    ``attn_qk`` [N, C, C], ``keep`` [N, K]) from ``kda_lib.ops.chunked``, and ``reference`` the
    recurrence's ``(outputs [T, V], final state [K, V])``."""
    import jax
    import jax.numpy as jnp

    from kda_lib.ops.chunked import _intra_chunk
    from kda_lib.ops.reference import kda_recurrent

    q, k, v, g, beta, s0, C = _random_chunks(seed)
    n = q.shape[0] // C
    with jax.enable_x64(True):
        chunks = [jnp.asarray(a.reshape(n, C, *a.shape[1:])) for a in (q, k, v, g, beta)]
        intra = _intra_chunk(*chunks, scale=q.shape[1] ** -0.5)
        o, s = kda_recurrent(
            *(jnp.asarray(a)[None, :, None] for a in (q, k, v, g, beta)),
            initial_state=jnp.asarray(s0)[None, None],
            output_final_state=True,
        )
    intra = {name: np.asarray(a) for name, a in intra._asdict().items()}
    return intra, s0, (np.asarray(o)[0, :, 0], np.asarray(s)[0, 0])


@checker("03.4")
def state_pass(answer, *, seed=0):
    """answer: ``fn(w, u, q_in, k_out, attn_qk, keep, s0) -> (outputs [T, V], final [K, V])``,
    the sequential pass without K x K maps, on chunk-major arrays of one head."""
    if not callable(answer):
        return "answer with a function state_pass(w, u, q_in, k_out, attn_qk, keep, s0)"
    intra, s0, (o_ref, s_ref) = state_pass_inputs(seed)
    result = answer(
        intra["w"], intra["u"], intra["q_in"], intra["k_out"], intra["attn_qk"], intra["keep"], s0
    )
    pair, hint = _pair(result, "outputs [T, V], final state [K, V]")
    if hint:
        return "the function should return " + hint[len("answer with ") :]
    if not _close(pair[1], s_ref):
        return "final state: S' = keep * S + K_out^T (U - W S), chunk by chunk"
    if not _close(pair[0], o_ref):
        return "outputs: O = Q_in S + P (U - W S) with S the state entering the chunk"
    return None


@checker("03.5")
def gdn_scores(answer, *, seed=0):
    """answer: ``fn(q, k, g, scale) -> P``: Gated DeltaNet's causal decayed scores of one chunk
    (q, k [C, K], g [C] one log decay per token) as one ``C x C`` mask times ``q k^T``."""
    if not callable(answer):
        return "answer with a function gdn_scores(q, k, g, scale)"
    rng = np.random.default_rng(seed)
    C, K = 8, 6
    q, k = rng.standard_normal((C, K)), rng.standard_normal((C, K))
    g = -rng.uniform(0.01, 0.5, C)
    gamma = np.cumsum(np.repeat(g[:, None], K, axis=1), axis=0)  # every channel the same decay
    ratio = np.exp(gamma[:, None] - gamma[None])
    expected = 0.5 * np.einsum("tc,sc,tsc->ts", q, k, ratio) * np.tril(np.ones((C, C)))
    p = answer(q, k, g, 0.5)
    if np.shape(p) != (C, C):
        return "P is C x C"
    if not _close(p, expected):
        return "P_ts = scale q_t.k_s exp(gamma_t - gamma_s) for s <= t, 0 above the diagonal"
    return None
