"""Checkers for notebook 03 (the chunkwise algorithm); worked solutions in
``notebooks/solutions/ch03.py``. Each recomputes what it needs in float64 and returns None (right)
or a hint that does not give the answer away."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, forbidding, refuse_degenerate


def _close(actual, expected, tol=1e-9) -> bool:
    actual = np.asarray(actual, np.float64)
    return actual.shape == np.shape(expected) and bool(
        np.all(np.abs(actual - expected) <= tol * (1 + np.abs(expected)))
    )


@checker("03.1")
def one_token_per_chunk(answer, **_):
    """answer: ``fn(k, g, beta, v) -> (M, E)``, one token's map ``S -> M S + E`` (``k, g``
    [K], ``v`` [V], float64 NumPy) from the recurrence, without ``chunk_affine_maps``."""
    from kda_lib.ops import chunked

    rng = np.random.default_rng(31)
    for K, V in ((6, 5), (4, 4)):  # K == V: an echoed outer product has E's shape
        k = rng.standard_normal(K)
        k /= np.linalg.norm(k)
        g, v = -rng.uniform(0.01, 1.0, K), rng.standard_normal(V)
        beta = float(rng.uniform(0.2, 0.9))
        with forbidding(answer, [(chunked, "chunk_affine_maps")]) as called:
            pair, hint = call_answer(answer, k, g, beta, v, name="token_map(k, g, beta, v)")
        if called:
            return "derive the map from the recurrence; chunk_affine_maps is what it checks"
        if hint:
            return hint
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            return "token_map should return the pair (M, E)"
        for got, shape, what in ((pair[0], (K, K), "M"), (pair[1], (K, V), "E")):
            hint = refuse_degenerate(got, shape=shape, inputs=(k, g, v), what=what)
            if hint:
                return hint
        m_t = (np.eye(K) - beta * np.outer(k, k)) @ np.diag(np.exp(g))
        if not _close(pair[0], m_t):
            return "M should be the token's transition: decay first, then the delta correction"
        if not _close(pair[1], beta * np.outer(k, v)):
            return "E should be what the token writes into an empty state"
    return None


def _wy_factor(k, beta):
    C = k.shape[0]
    L = np.tril(beta[:, None] * (k @ k.T), -1)
    return np.linalg.solve(np.eye(C) + L, beta[:, None] * k)


@checker("03.2")
def no_decay(answer, **_):
    """answer: ``fn(k, beta) -> K~ [C, K]``, the WY factor of a chunk without decay (keys ``k``
    [C, K] unit rows, ``beta`` [C]), with which ``M = I - K^T K~``. The checker also tries a
    chunk longer than d_k, where K~ cannot be read back from M."""
    rng = np.random.default_rng(32)
    for C, K in ((4, 6), (8, 6), (6, 6)):
        k = rng.standard_normal((C, K))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        beta = rng.uniform(0.1, 0.9, C)
        got, hint = call_answer(answer, k, beta, name="wy_factor(k, beta)")
        hint = hint or refuse_degenerate(got, shape=(C, K), inputs=(k,), what="K~")
        if hint:
            return hint
        if not _close(got, _wy_factor(k, beta), 1e-8):
            product = np.eye(K)
            for k_t, b_t in zip(k, beta, strict=True):
                product = (np.eye(K) - b_t * np.outer(k_t, k_t)) @ product
            if _close(np.eye(K) - k.T @ np.asarray(got, np.float64), product, 1e-8):
                return f"I - K^T K~ is right at C = {C}, but K~ is not step 2's solution"
            return (
                f"wrong at C = {C}: with g = 0 step 2's system is (I + L) K~ = diag(beta) K, "
                "L strictly lower triangular"
            )
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
    """The inputs of exercise 03.3 for one head: ``(intra, s0, reference)`` with ``intra`` a
    dict of chunk-major float64 arrays (``w``, ``u``, ``q_in``, ``k_out`` [N, C, .],
    ``attn_qk`` [N, C, C], ``keep`` [N, K]) from ``kda_lib.ops.chunked``, and ``reference`` the
    recurrence's ``(outputs [T, V], final state [K, V])``. ``q_in`` is the notebook's
    ``Q_in`` (rows ``Gamma_t q_t``, not scaled: section 4 and NOTATION apply ``1 / sqrt(d_k)``
    in the output equation); ``kda_lib.ops.chunked`` folds the scale into it, so it is divided
    out here."""
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
    intra["q_in"] = intra["q_in"] * np.sqrt(q.shape[1])  # Q_in of section 4: unscaled
    return intra, s0, (np.asarray(o)[0, :, 0], np.asarray(s)[0, 0])


@checker("03.3")
def state_pass(answer, *, seed=0):
    """answer: ``fn(w, u, q_in, k_out, attn_qk, keep, s0) -> (outputs [T, V], final [K, V])``,
    the sequential pass without K x K maps, on chunk-major arrays of one head; ``q_in`` is
    section 4's unscaled ``Q_in``, the output ``O = Q_in S / sqrt(d_k) + P Delta``."""
    intra, s0, (o_ref, s_ref) = state_pass_inputs(seed)
    args = tuple(intra[n] for n in ("w", "u", "q_in", "k_out", "attn_qk", "keep")) + (s0,)
    result, hint = call_answer(
        answer, *args, name="state_pass(w, u, q_in, k_out, attn_qk, keep, s0)"
    )
    if hint:
        return hint
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return "the function should return a pair (outputs [T, V], final state [K, V])"
    for got, want, what in ((result[0], o_ref, "the outputs"), (result[1], s_ref, "the state")):
        hint = refuse_degenerate(got, shape=want.shape, inputs=args, what=what)
        if hint:
            return hint
    if not _close(result[1], s_ref):
        return "final state: S' = Gamma_C S + K_out^T Delta with Delta = U - W S, chunk by chunk"
    if not _close(result[0], o_ref):
        if _close(result[0] * np.sqrt(s0.shape[0]), o_ref):
            return "outputs: the scale 1 / sqrt(d_k) applies to the Q_in S term only"
        return "outputs: O = Q_in S / sqrt(d_k) + P Delta with S the state entering the chunk"
    return None


def _gdn_expected(q, k, g, scale):
    C = len(g)
    gamma = np.cumsum(g)
    diff = np.where(np.tril(np.ones((C, C))) > 0, gamma[:, None] - gamma[None], -np.inf)
    return scale * (q @ k.T) * np.exp(diff)


@checker("03.4")
def gdn_scores(answer, *, seed=0):
    """answer: ``fn(q, k, g, scale) -> P``: Gated DeltaNet's causal decayed scores of one chunk
    (q, k [C, K], g [C] one log decay per token) as one ``C x C`` mask times ``q k^T``, with no
    exponent above 0 formed. The checker runs it at C = 8 and at C = 64 with strong decay,
    where such an exponent overflows float64 (exp(x) is inf beyond x = 709)."""
    rng = np.random.default_rng(seed)
    for C, K, low, high in ((8, 6, 0.01, 0.5), (64, 4, 10.0, 15.0)):
        q, k = rng.standard_normal((C, K)), rng.standard_normal((C, K))
        g = -rng.uniform(low, high, C)
        try:
            with np.errstate(over="raise", invalid="raise"):
                p, hint = answer(q, k, g, 0.5), None
        except FloatingPointError:
            return (
                f"at C = {C} with log decays down to {-high:g} per token an exponent "
                "overflowed: form exp(gamma_t - gamma_s) only where s <= t"
            )
        except Exception as error:  # noqa: BLE001 - a student's function may fail any way
            return f"gdn_scores raised {type(error).__name__}"
        hint = refuse_degenerate(p, shape=(C, C), inputs=(q, k), what="P")
        if hint:
            return hint + (" (an exponent above 0 overflowed?)" if C == 64 else "")
        if not _close(p, _gdn_expected(q, k, g, 0.5)):
            return (
                f"wrong at C = {C}: P_ts = scale q_t.k_s exp(gamma_t - gamma_s) for s <= t, "
                "0 above the diagonal"
            )
    return None
