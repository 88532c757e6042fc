"""Checkers of notebook 02's exercises (gating and decay); hints never contain the answer.

Every answer is a function the checker calls on inputs of its own, so a number read off the
notebook, or an array computed for the notebook's own inputs, cannot pass; nor can a function
that runs ``kda_lib`` code (the notebook's ``mixing``, say).
"""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("02.1")
def safe_gate_floor(answer, **_):
    """``answer(lower_bound) -> fraction``: the largest fraction of a channel one token can
    erase under the safe gate with floor ``lower_bound`` in [-5, 0)."""
    for bound in (-1.0, -5.0, -0.1, -2.5):
        got, hint = call_answer(answer, bound, name="erased_at_most(lower_bound)", own_code=True)
        hint = hint or refuse_degenerate(got, shape=(), what="the fraction")
        if hint:
            return hint
        if abs(float(got) - (1 - np.exp(bound))) > 1e-6:
            return (
                f"wrong at lower_bound = {bound}: the most a token can decay is "
                "exp(lower_bound); what fraction does that remove?"
            )
    return None


def _unit_rows(rng, rows, cols):
    x = rng.normal(size=(rows, cols))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@checker("02.2")
def full_overwrite(answer, **_):
    """``answer(q, k, g) -> Omega [T, T]``: the mixing matrix of one head with ``q = k`` (unit
    rows, ``[T, K]``), log decays ``g [T, K]``, beta = 1 and scale 1. The checker recomputes it
    from the closed form (:func:`kda_lib.teaching.explain.mixing_matrix_by_products`)."""
    from kda_lib.teaching.explain import mixing_matrix_by_products

    rng = np.random.default_rng(23)
    for T, K in ((9, 5), (6, 6)):  # T == K: an echoed q has Omega's shape
        k = _unit_rows(rng, T, K)
        g = -rng.uniform(0.01, 0.5, (T, K))
        got, hint = call_answer(answer, k, k, g, name="full_overwrite(q, k, g)", own_code=True)
        hint = hint or refuse_degenerate(got, shape=(T, T), inputs=(k, g), what="Omega")
        if hint:
            return hint
        want = mixing_matrix_by_products(k, k, g, np.ones(T))
        if np.abs(np.asarray(got, np.float64) - want).max() > 1e-4:
            return (
                "not the mixing matrix at beta = 1: with q_t = k_t unit, what does the new "
                "state recall for k_t right after writing (k_t, v_t)?"
            )
    return None
