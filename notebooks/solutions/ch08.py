"""Worked solutions of notebook 08's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import numpy as np


def mqar_chance(vocab_size: int) -> float:
    """1: token 0 is filler, (V - 1) // 2 tokens are keys, the rest values (kda_lib.lab.tasks.mqar):
    uniform guessing among the values is right once in n_values."""
    n_values = vocab_size - 1 - (vocab_size - 1) // 2
    return 1 / n_values


def solved_cells(accuracy: dict, solved: float) -> list:
    """2: average each (task, mixer, T) cell over its seeds; it is solved at the protocol's level
    (``setting["solved"]``, 0.99 in the recorded sweep) or above. Not the lowest seed, the median
    or the best seed: the protocol judges a cell by its mean."""
    return sorted(cell for cell, acc in accuracy.items() if np.mean(acc) >= solved)


def conv_reach_queries(inputs, mask, num_pairs: int, conv_reach: int) -> int:
    """3: pair i's value sits at 2 i + 1; a query at t is within reach if t - (2 i + 1) <= reach."""
    inputs, mask = np.asarray(inputs), np.asarray(mask)
    value_pos = {int(k): 2 * i + 1 for i, k in enumerate(inputs[0 : 2 * num_pairs : 2])}
    return sum(int(t - value_pos[int(inputs[t])] <= conv_reach) for t in np.flatnonzero(mask))


def three_time_scales(half_lives, length: int) -> dict:
    """4: A = (I - beta k k^T) D, D = diag(d_i) with the decays d_i = e^(g_i), is similar to
    D - u u^T (u_i^2 = beta d_i k_i^2), a rank-one downdate of a diagonal matrix, whose
    eigenvalues lam interlace the decays. Pick decays just above the wanted lam (d_1 > lam_1 >
    d_2 > lam_2 > ...); the secular equation gives u_i^2 = prod_j (d_i - lam_j) /
    prod_{j != i} (d_i - d_j) > 0; a unit key fixes beta = sum_i u_i^2 / d_i and
    k_i^2 = u_i^2 / (beta d_i). Then the filter is a sum of the three exponentials and q (three
    weights) comes from least squares."""
    lam = np.sort(0.5 ** (1 / np.asarray(half_lives, np.float64)))[::-1]
    decays = lam + 0.2 * np.append(1 - lam[0], -np.diff(lam))  # strictly interlacing
    u2 = np.array([np.prod(a - lam) / np.prod([a - b for b in decays if b != a]) for a in decays])
    beta = float(np.sum(u2 / decays))
    k = np.sqrt(u2 / (beta * decays))
    lag = np.arange(length)
    target = np.mean([lam_i**lag for lam_i in lam], axis=0)
    a = (np.eye(3) - beta * np.outer(k, k)) @ np.diag(decays)
    basis, vec = [], beta * k
    for _ in lag:
        basis.append(vec)
        vec = a @ vec
    q = np.linalg.lstsq(np.asarray(basis), target, rcond=None)[0]
    return dict(decays=decays.tolist(), beta=beta, k=k.tolist(), q=q.tolist())


def cases():
    accuracy = {
        ("mqar", "kda", 64): [0.99, 1.0],
        ("mqar", "gdn", 64): [0.5, 0.7],
        ("stack", "kda", 64): [0.8, 0.85],
        ("stack", "gdn", 64): [0.95, 0.8],
        ("mqar", "gdn", 128): [0.995, 0.99],
        ("stack", "kda", 128): [0.99, 0.985],  # 0.9875 on average: not solved
    }

    def off_by_one(inputs, mask, num_pairs, conv_reach):  # "within" read as strictly closer
        return conv_reach_queries(inputs, mask, num_pairs, conv_reach - 1)

    scales = dict(half_lives=(1.0, 8.0, 64.0), length=256)
    head = three_time_scales(**scales)
    return [
        ("08.1", mqar_chance, {}, lambda v: 1 / (v - 1)),
        ("08.2", solved_cells, dict(accuracy=accuracy, solved=0.99),
         lambda acc, level: [c for c, a in acc.items() if min(a) >= level]),  # every seed
        ("08.3", conv_reach_queries, {}, off_by_one),
        ("08.4", head, scales, dict(head, decays=[0.99, 0.9, 0.5])),
    ]
