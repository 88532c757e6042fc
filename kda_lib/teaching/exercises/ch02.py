"""Checkers of notebook 02's exercises (gating and decay); hints never contain the answer.

Every answer is a function the checker calls on inputs of its own, so a number read off the
notebook, or an array computed for the notebook's own inputs, cannot pass; nor can a function
that runs ``kda_lib`` code (the notebook's ``mixing``, say). The expected value is computed in
float64 after the answer ran; float32 answers are accepted (relative 1e-5).
"""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate, seeded


def _close(got, want, tol=1e-5) -> bool:
    return abs(float(got) - want) <= tol * max(abs(want), 1e-2)


@checker("02.1")
def half_erasing_input(answer, *, seed=None):
    """``answer(a, lower_bound) -> f``: the raw gate input ``f`` (bias 0) at which one token of
    the safe gate ``g = lower_bound * sigmoid(a f)`` erases exactly half of a channel, for a rate
    ``a > 0`` and ``lower_bound < -ln 2``. Four pairs drawn afresh at every call (``seed`` repeats
    a call), so no table of answers keyed on the inputs passes."""
    seed, rng = seeded(seed)
    rates = np.exp(rng.uniform(np.log(0.25), np.log(32.0), 4))  # a from 1/4 to 32
    # lower_bound below -ln 2: one where half is erased above f = 0, three below; none near
    # -2 ln 2 (f near 0, where float32's logit loses the digits a relative tolerance asks for)
    bounds = -np.concatenate([rng.uniform(0.75, 1.2, 1), rng.uniform(1.7, 10.0, 3)])
    for a, bound in zip(rates.tolist(), bounds.tolist(), strict=True):
        got, hint = call_answer(
            answer, a, bound, name="half_erasing_input(a, lower_bound)", own_code=True
        )
        hint = hint or refuse_degenerate(got, shape=(), what="the input f")
        if hint:
            return hint
        p = np.log(2.0) / -bound  # sigmoid(a f) that makes g = -ln 2
        if not _close(got, np.log(p / (1 - p)) / a):
            return (
                f"wrong at a = {a!r}, lower_bound = {bound!r} (seed {seed}): which g keeps "
                "exactly half, and which sigmoid(a f) gives that g?"
            )
    return None


def _unit(rng, size):
    x = rng.normal(size=size)
    return x / np.linalg.norm(x)


@checker("02.2")
def older_occurrence(answer, **_):
    """``answer(k, gamma_a, gamma_b, beta) -> Omega_ts``: the weight the read at t puts on the
    older occurrence s of the unit key ``k [K]`` (q_t = k_t = k), written at s, again at r
    (s < r < t) and at t, each with ``beta``, the tokens in between writing nothing;
    ``gamma_b [K]`` sums the log decays of tokens s+1..r, ``gamma_a [K]`` those of r+1..t.
    The checker recomputes it in float64 as the product of the transitions."""
    rng = np.random.default_rng(23)
    for K, beta in ((5, 0.7), (8, 0.3), (4, 0.9)):
        k = _unit(rng, K)
        gamma_a, gamma_b = -rng.uniform(0.05, 2.0, K), -rng.uniform(0.05, 2.0, K)
        got, hint = call_answer(
            answer,
            k,
            gamma_a,
            gamma_b,
            beta,
            name="older_weight(k, gamma_a, gamma_b, beta)",
            own_code=True,
        )
        hint = hint or refuse_degenerate(got, shape=(), what="Omega_ts")
        if hint:
            return hint
        erase = np.eye(K) - beta * np.outer(k, k)  # I - beta k k^T, the writes at r and t
        want = beta * k @ erase @ np.diag(np.exp(gamma_a)) @ erase @ np.diag(np.exp(gamma_b)) @ k
        if not _close(got, float(want)):
            return (
                f"wrong at K = {K}, beta = {beta}: write Omega_ts = beta q_t^T M_t ... M_(s+1) "
                "k_s with the two writes that are not D; does the middle write act on a "
                "decayed k?"
            )
    return None
