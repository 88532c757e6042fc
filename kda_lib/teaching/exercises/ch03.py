"""Checkers of notebook 03's exercises (the chunkwise algorithm), on chunks drawn at each call,
judged by value in float64 (float32 answers pass, relative 1e-5). Every call has a chunk longer
than d_k (a product of transitions does not determine a chunk's factor there) and forget bursts
(gates of -12288: exp(-gamma_t) overflows float32, float64 and x86's long double). Gates are
multiples of 1/1024 and every gamma_t is above -2^14, so gamma_t - gamma_s is exact in float32."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex

BURST = -12288.0  # a forget burst: exp(-gamma) overflows float32, float64 and long double


def _close(actual, expected, tol=1e-5) -> bool:
    return ex.close(actual, expected, tol, floor=1.0)


def _chunk(rng, C, K, V, bursts):
    """Unit keys k [C, K], values [C, V], log decays g [C, K] (multiples of 1/1024; ``bursts``:
    one entry in eight a burst, at least one, one per channel at most, none in channel 0), beta."""
    k = rng.standard_normal((C, K))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    g = -rng.integers(10, 600, (C, K)) / 1024.0
    if bursts:  # at least one, before the last token; channel 0 never (K~ is not all zeros)
        burst = rng.random((C, K)) < 0.125
        burst[:, 0], burst[rng.integers(max(C - 1, 1)), rng.integers(1, K)] = False, True
        g[burst & (np.cumsum(burst, axis=0) <= 1)] = BURST
    return k, rng.standard_normal((C, V)), g, rng.uniform(0.1, 0.9, C)


def _decay(gamma):
    """[t, s, K]: exp(gamma_t - gamma_s) for s <= t, 0 above (every exponent formed <= 0)."""
    causal = np.tril(np.ones((len(gamma), len(gamma)), bool))
    return np.exp(np.where(causal[..., None], gamma[:, None] - gamma[None], -np.inf))


def _forward_factors(k, v, g, beta):
    """Step 3 and 4: (K~, V~, K_out, gamma_C) of one chunk."""
    gamma = np.cumsum(g, axis=0)
    L = np.tril(beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, _decay(gamma)), -1)
    inverse = np.linalg.inv(np.eye(len(beta)) + L)
    k_in, k_out = k * np.exp(gamma), k * np.exp(gamma[-1] - gamma)
    return inverse @ (beta[:, None] * k_in), inverse @ (beta[:, None] * v), k_out, gamma[-1]


def _backward_system(k, g, beta):
    """(I + L', diag(beta) K_out), whose solution is K~': L'_ts = beta_t k_t^T Gamma_s
    Gamma_t^-1 k_s (s > t, else 0), K_out rows Gamma_C Gamma_t^-1 k_t."""
    gamma = np.cumsum(g, axis=0)
    upper = np.einsum("tc,sc,stc->ts", k, k, _decay(gamma)) * np.triu(np.ones((len(g),) * 2), 1)
    k_out = k * np.exp(gamma[-1] - gamma)
    return np.eye(len(beta)) + beta[:, None] * upper, beta[:, None] * k_out


def _system_hint(a, b, k, g, beta, where) -> str:
    """Why ``(a, b)`` is not 03.1's system (the first slip found)."""
    want_a, gamma = _backward_system(k, g, beta)[0], np.cumsum(g, axis=0)
    if np.abs(np.tril(a, -1)).max() > 1e-5 * max(1.0, np.abs(a).max()):
        forward = np.eye(len(beta)) + np.tril(
            beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, _decay(gamma)), -1)
        echo = " (that is step 3's I + L, the forward order)" if _close(a, forward) else ""
        return (f"lhs is wrong {where}{echo}: running back, which tokens' delta' does delta'_t "
                "see, earlier or later ones?")
    if not _close(np.diag(a), np.ones(len(beta))):
        return f"lhs's diagonal is not all ones {where}: delta'_t enters its own row once"
    if not _close(a, want_a):
        return (f"lhs is wrong above the diagonal {where} (it must be exactly I + L', no row "
                "scaled or combined): unroll dS_t from dS_C as in step 1; which decay and which "
                "beta multiply k_t^T k_s?")
    echo = " (that is step 3's, the forward one)" if _close(b, beta[:, None] * k * np.exp(
        gamma)) else ""
    return (f"rhs is wrong {where}{echo}: which keys, decayed over which tokens and scaled by "
            "what, meet dS_C in delta'_t?")


@ex.checker("03.1")
def backward_system(answer, rng):
    """``answer(k, g, beta) -> (lhs [C, C], rhs [C, K])``: the backward pass's system ``lhs K~' =
    rhs`` (``M^T = Gamma_C - K_in^T K~'``), exactly ``lhs = I + L'``, ``L'_ts = beta_t k_t^T
    Gamma_s Gamma_t^-1 k_s`` (s > t; no row scaled or combined), ``rhs = diag(beta) K_out``."""
    for bursts, longer in ((True, True), (False, True), (True, False)):
        K = int(rng.integers(3, 7))
        C = int(rng.integers(K + 3, 3 * K + 4) if longer else rng.integers(2, K))
        k, _, g, beta = _chunk(rng, C, K, 1, bursts)
        got, hint = ex.call_answer(answer, k.copy(), g.copy(), beta.copy(),
                                   name="wy_backward_system(k, g, beta)")
        hint = hint or ex.parts(got, "two arrays, (lhs, rhs): lhs K~' = rhs", dict(
            shape=(C, C), inputs=(k, g), what="lhs"), dict(shape=(C, K), inputs=(k, g), what="rhs"))
        if hint:  # e^(-gamma_t) overflows after a burst: some entries finite (not all-NaN arrays)
            part = [np.asarray(x, float) for x in got] if "NaN or inf" in hint else []
            return hint + (" (this chunk has a forget burst: form each exponent, a difference of "
                           "cumulative log decays that is <= 0, before exp)"
                           if bursts and any(np.isfinite(x).any() for x in part) else "")
        a, b = (np.asarray(x, np.float64) for x in got)
        want_a, want_b = _backward_system(k, g, beta)
        if not (_close(a, want_a) and _close(b, want_b)):
            return _system_hint(a, b, k, g, beta, f"at C = {C}, d_k = {K}")
        if not _close(np.linalg.solve(a, b), np.linalg.solve(want_a, want_b), 1e-4):
            return f"lhs^-1 rhs is not K~' at C = {C}, d_k = {K}"


def _merge_problem(rng, bursts):
    K, V = int(rng.integers(3, 7)), int(rng.integers(2, 5))
    c1, c2 = (int(c) for c in rng.integers(2, 2 * K + 3, 2))
    if bursts:  # the combined chunk longer than d_k
        c2 = max(c2, K + 2 - c1)
    k, v, g, beta = _chunk(rng, c1 + c2, K, V, bursts)
    first = _forward_factors(k[:c1], v[:c1], g[:c1], beta[:c1])
    second = _forward_factors(k[c1:], v[c1:], g[c1:], beta[c1:])[:2]
    return (*first, *second), _forward_factors(k, v, g, beta)[:2]


@ex.checker("03.2")
def merged_chunks(answer, rng):
    """``answer(K_tilde_i, V_tilde_i, K_out_i, gamma_i, K_tilde_next, V_tilde_next) -> (K_tilde,
    V_tilde)``: chunks i and i + 1's K~, V~ taken as one, from their factors (chunk i + 1's from
    its own start); compared with step 3 on the combined chunk."""
    for bursts in (True, False, True):
        given, (want_w, want_u) = _merge_problem(rng, bursts)
        size = f"C = {len(given[0])} + {len(given[4])} (chunks i, i + 1), d_k = {given[0].shape[1]}"
        name = "merge_chunks(K_tilde_i, V_tilde_i, K_out_i, gamma_i, K_tilde_next, V_tilde_next)"
        got, hint = ex.call_answer(answer, *(a.copy() for a in given), name=name)
        if hint := hint or ex.parts(got, "two arrays, (K_tilde, V_tilde)", dict(
                shape=want_w.shape, inputs=given, what="K_tilde"), dict(
                shape=want_u.shape, inputs=given, what="V_tilde")):
            return hint
        for part, want, what in ((0, want_w, "K_tilde (the merged K~)"), (1, want_u, "V_tilde")):
            if not _close(got[part], want):
                first = _close(np.asarray(got[part])[: len(given[0])], want[: len(given[0])])
                return f"{what} is wrong at {size}, " + ("its rows of the second chunk (i + 1): "
                    "its tokens now see chunk i's too; what state enters them?" if first else
                    "its rows of the first chunk (i): do those tokens see any of chunk i + 1's?")
