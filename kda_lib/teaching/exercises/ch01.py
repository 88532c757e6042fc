"""Checkers of notebook 01's exercises (from linear attention to KDA).

Every answer is a small function, which the checker calls on inputs of its own (refusing any
that runs ``kda_lib`` code); it recomputes the expected result in float64 and returns a hint
that never contains the expected values.
"""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("01.1")
def partial_writes(answer, **_):
    """``answer(beta, writes)``: the fraction of ``v`` that an empty memory returns for ``k``
    after ``writes`` writes of the same unit-key pair with write strength ``beta``; the checker
    tries its own ``(beta, writes)``."""
    for beta, writes in ((0.5, 3), (0.3, 1), (0.9, 4), (0.2, 7), (1.5, 2)):
        got, hint = call_answer(
            answer, beta, writes, name="recalled_fraction(beta, writes)", own_code=True
        )
        hint = hint or refuse_degenerate(got, shape=(), what="the fraction")
        if hint:
            return hint
        want = 1 - (1 - beta) ** writes  # relative 1e-6: a float32 answer passes
        if abs(float(got) - want) > 1e-6 * abs(want):
            return (
                f"wrong at beta = {beta}, writes = {writes}: each write multiplies the error on "
                "the written key by (1 - beta); an empty memory starts at error -v"
            )
    return None


@checker("01.2")
def two_key_sweeps(answer, **_):
    """``answer(c, v1, v2, sweeps) -> e1 [V]``: the recall error ``S^T k_1 - v_1`` of the first
    of two pairs (unit keys with overlap ``c = k_1 . k_2``, values ``v1, v2 [V]``) after
    ``sweeps`` one-pass sweeps (beta = 1, pair 1 then pair 2, from ``S = 0``). The checker
    simulates the sweeps in float64 on keys of its own."""
    rng = np.random.default_rng(12)
    for c, sweeps, V in ((0.6, 1, 3), (-0.3, 2, 5), (0.9, 5, 4), (0.0, 3, 2), (0.97, 40, 6)):
        v1, v2 = rng.standard_normal(V), rng.standard_normal(V)
        got, hint = call_answer(
            answer, c, v1, v2, sweeps, name="first_pair_error(c, v1, v2, sweeps)", own_code=True
        )
        hint = hint or refuse_degenerate(
            got, shape=(V,), inputs=(v1, v2), what="the error", allow_zeros=c == 0.0
        )
        if hint:
            return hint
        keys = np.array([[1.0, 0.0], [c, np.sqrt(1 - c * c)]])
        S = np.zeros((2, V))
        for _ in range(sweeps):
            for k, v in zip(keys, (v1, v2), strict=True):
                S = S + np.outer(k, v - k @ S)
        want = keys[0] @ S - v1
        if np.abs(np.asarray(got, np.float64) - want).max() > 1e-6 * max(1.0, np.abs(want).max()):
            return (
                f"wrong at c = {c}, sweeps = {sweeps}: follow both errors through one sweep "
                "with section 3's disturbance formula; how does e_1 change per sweep?"
            )
    return None
