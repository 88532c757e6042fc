"""Checkers of notebook 02's exercises (gating and decay); hints never contain the answer.

Every answer is a function the checker calls on inputs drawn afresh at each call (``seed``
repeats one), so a number read off the notebook, or a table keyed on the inputs, cannot pass;
nor can a function that runs ``kda_lib`` code (the notebook's ``mixing``, say). The expected
value is computed in float64 after the answer ran; float32 answers are accepted (relative 1e-5),
as a number, a 0-d array or a 1-element array. 02.2 hands the answer three numbers, not the key
and decays, so no stream is given to simulate: an answer has to derive the weight from them
(the closed form, or a key and decays rebuilt to match them).
"""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import again, call_answer, checker, refuse_degenerate, seeded


def _scalar(got):
    """A 1-element array as the number it holds; anything else unchanged (refused later)."""
    try:
        return np.reshape(got, ()) if np.ndim(got) == 1 and np.size(got) == 1 else got
    except Exception:  # noqa: BLE001 - ragged lists and the like: refused after
        return got


def _close(got, want, tol=1e-5, size=1e-2) -> bool:
    return abs(float(got) - want) <= tol * max(abs(want), size)


@checker("02.1")
def keeping_input(answer, *, seed=None):
    """``answer(zeta, m, a, lower_bound) -> f``: the constant raw gate input ``f`` (bias 0)
    at which a safe-gate channel, ``g = lower_bound * sigmoid(a f)`` per token, keeps the fraction
    ``zeta`` (``p`` here) of what it stored after ``m`` tokens, for a rate ``a > 0``. Four
    trials drawn afresh at every call, ``m >= 2`` (so the one-token answer is wrong; where it has
    no f, its NaN gets a hint that names m), ``p`` from e^-40 to e^-1."""
    seed, rng = seeded(seed)
    for _ in range(4):
        a = float(np.exp(rng.uniform(np.log(0.25), np.log(32.0))))  # a from 1/4 to 32
        bound = -float(rng.uniform(0.5, 5.0))
        x = float(rng.choice([-1, 1]) * rng.uniform(0.1, 0.45) + 0.5)  # sigmoid(a f), not 1/2
        lo, hi = int(np.ceil(1.0 / (-bound * x))), int(40.0 / (-bound * x))  # -ln p in [1, 40]
        n = int(rng.integers(max(lo, 2), max(hi, lo + 1, 3)))
        p = float(np.exp(n * bound * x))
        got, hint = call_answer(
            answer, p, n, a, bound, name="keeping_input(zeta, m, a, lower_bound)", own_code=True
        )
        got = got if hint else _scalar(got)
        one_token = np.log(p) / bound  # the sigmoid(a f) that keeps p after ONE token: > 1 here
        if not hint and one_token > 1 and not np.all(np.isfinite(np.asarray(got, float))):
            return (f"your f is not a finite number at zeta = {p!r}, m = {n}: a formula for "
                    f"one token has no f here (it would need sigmoid(a f) = {one_token:.3g} > 1); "
                    "the channel keeps zeta after m tokens" + again(seed))
        hint = hint or refuse_degenerate(got, shape=(), what="the input f")
        if hint:
            return hint
        s = np.log(p) / (n * bound)  # the sigmoid(a f) that keeps p after n tokens
        if not _close(got, np.log(s / (1 - s)) / a):
            return (
                f"wrong at zeta = {p!r}, m = {n}, a = {a!r}, lower_bound = {bound!r}: what does "
                "the channel keep after m equal tokens, and which sigmoid(a f) gives that?"
                + again(seed)
            )
    return None


def _unit(rng, size):
    x = rng.normal(size=size)
    return x / np.linalg.norm(x)


@checker("02.2")
def older_occurrence(answer, *, seed=None):
    """``answer(kk_ts, kk_tsp, kk_sps, beta) -> Omega_ts``: the weight the read at t puts on the
    older occurrence s of the unit key k (q_t = k_t = k), written at s, again at s' (s < s' < t)
    and at t, each with ``beta``, the tokens in between writing nothing, as a function of the three
    numbers k^T D_t...D_(s+1) k, k^T D_t...D_(s'+1) k and k^T D_s'...D_(s+1) k.
    They come from keys and decays drawn afresh at every call (one trial with one decay for all
    channels); the checker recomputes the weight in float64 as the product of the transitions."""
    seed, rng = seeded(seed)
    for K, beta, scalar in ((5, 0.7, False), (8, 0.3, False), (4, 0.9, True), (6, 0.5, False)):
        beta = float(np.clip(beta + rng.uniform(-0.05, 0.05), 0.05, 0.95))
        k = _unit(rng, K)
        gamma_a, gamma_b = -rng.uniform(0.05, 2.0, K), -rng.uniform(0.05, 2.0, K)
        if scalar:
            gamma_a, gamma_b = np.full(K, gamma_a[0]), np.full(K, gamma_b[0])
        A, B = np.diag(np.exp(gamma_a)), np.diag(np.exp(gamma_b))
        numbers = [float(k @ A @ B @ k), float(k @ A @ k), float(k @ B @ k)]
        got, hint = call_answer(
            answer, *numbers, beta, name="older_weight(kk_ts, kk_tsp, kk_sps, beta)", own_code=True
        )
        got = got if hint else _scalar(got)
        hint = hint or refuse_degenerate(got, shape=(), what="Omega_ts")
        if hint:
            return hint
        erase = np.eye(K) - beta * np.outer(k, k)  # I - beta k k^T, the writes at s' and t
        want = beta * k @ erase @ A @ erase @ B @ k
        if not _close(got, float(want)):
            return (
                f"wrong at beta = {beta!r} with kk_ts, kk_tsp, kk_sps = {numbers} "
                f"({'one decay for all channels' if scalar else 'one decay per channel'}): "
                "write Omega_ts = beta q_t^T M_t ... M_(s+1) k_s with the two writes that are "
                "not D; does the middle write act on a decayed k?" + again(seed)
            )
    return None
