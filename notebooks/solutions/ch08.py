"""Worked solutions of notebook 08's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

from math import factorial

import numpy as np


def vote_level(n_pairs: int, probs) -> float:
    """1: the vote answers every query with the most frequent of the n values (drawn
    independently, value i with probability p_i); it is right at as many queries as that value
    occurs, so its accuracy is E[M] / n, M the largest count. E[M] = sum_{k >= 1} P(M >= k), and
    P(M < k) sums, over the count vectors (c_1, ..., c_m) with every c_i < k and sum n, the
    multinomial n! prod_i p_i^c_i / c_i!: a dynamic programme over the values, f[r] = sum over
    the values so far of prod p_i^c_i / c_i! with r draws placed, each value taking j < k of
    them (the exponential generating function's coefficients). Exact, float64; every f[r] <= 1,
    so nothing overflows. (The hint's first step, a random pair's value, is right with
    probability 1 / n + (n - 1) / n sum_i p_i^2: the pair itself, or another drawn the same.)"""
    n, p = n_pairs, np.asarray(probs, np.float64)
    expected = 0.0
    for k in range(1, n + 1):
        f = np.zeros(n + 1)
        f[0] = 1.0
        for p_i in p:
            g = np.zeros(n + 1)
            for j in range(min(k, n + 1)):  # this value takes j draws
                g[j:] += f[: n + 1 - j] * p_i**j / factorial(j)
            f = g
        expected += 1 - f[n] * factorial(n)  # 1 - P(M < k)
    return expected / n


def beyond_reach(inputs, mask, reach: int):
    """2: replay each row's pushes and pops with a stack of *positions* (not values: a value
    pushed again later is another push); after token t the top is the position t' of the push
    whose value is the answer. A scored position is beyond reach when t - t' > reach (a pop's
    answer is at least 2 back: the popped push sits between)."""
    inputs, mask = np.asarray(inputs), np.asarray(mask, bool)
    out = np.zeros(inputs.shape, bool)
    for b, row in enumerate(inputs):
        stack = []
        for t, token in enumerate(row):
            if token == 1:  # POP
                if stack:
                    stack.pop()
            else:  # PUSH token
                stack.append(t)
            out[b, t] = bool(mask[b, t]) and bool(stack) and t - stack[-1] > reach
    return out


def three_time_scales(half_lives, gaps=(0.5, 0.5, 0.5)) -> dict:
    """3: A = (I - beta k k^T) D, D = diag(d_i) with the decays d_i = e^(g_i), is similar to
    D - u u^T (u_i^2 = beta d_i k_i^2), a rank-one downdate of a diagonal matrix, whose
    eigenvalues lam interlace the decays. Pick decays just above the wanted lam (d_1 > lam_1 >
    d_2 > lam_2 > ...); the secular equation gives u_i^2 = prod_j (d_i - lam_j) /
    prod_{j != i} (d_i - d_j) > 0; a unit key fixes beta = sum_i u_i^2 / d_i and
    k_i^2 = u_i^2 / (beta d_i). Then the filter is a sum of the three exponentials and q (three
    weights) comes from least squares. ``gaps``: where each decay sits in its gap, from its lam
    (0) to the next lam up, or 1 (1); near 0 the head is as right, its q longer (|q| = 265 at
    (0.001, 0.001, 0.5) on the page's half-lives), but beta = sum_i u_i^2 / d_i shrinks with the
    gaps: at 0.1 each it is 0.033 for half-lives (2.27, 9.05, 33.69), below the exercise's 0.05."""
    lam = np.sort(0.5 ** (1 / np.asarray(half_lives, np.float64)))[::-1]
    decays = lam + np.asarray(gaps) * np.append(1 - lam[0], -np.diff(lam))  # strictly interlacing
    u2 = np.array([np.prod(a - lam) / np.prod([a - b for b in decays if b != a]) for a in decays])
    beta = float(np.sum(u2 / decays))
    k = np.sqrt(u2 / (beta * decays))
    lag = np.arange(16)  # three weights: any 3 or more lags fit them exactly
    target = np.mean([lam_i**lag for lam_i in lam], axis=0)
    a = (np.eye(3) - beta * np.outer(k, k)) @ np.diag(decays)
    basis, vec = [], beta * k
    for _ in lag:
        basis.append(vec)
        vec = a @ vec
    q = np.linalg.lstsq(np.asarray(basis), target, rcond=None)[0]
    return dict(decays=decays.tolist(), beta=beta, k=k.tolist(), q=q.tolist())


def cases():
    scales = dict(half_lives=(1.0, 8.0, 64.0), length=256)
    return [
        ("08.1", vote_level, {}, lambda n, p: 1 / n + (n - 1) / n * np.sum(np.square(p))),
        ("08.2", beyond_reach, {}, lambda inputs, mask, reach: beyond_reach(  # ">= reach"
            inputs, mask, reach - 1)),
        ("08.3", three_time_scales, scales,
         lambda lives: dict(three_time_scales(lives), decays=[0.99, 0.9, 0.5])),
    ]
