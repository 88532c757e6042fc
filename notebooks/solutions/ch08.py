"""Worked solutions of notebook 08's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import numpy as np


def mqar_chance(vocab_size: int) -> float:
    """1: token 0 is filler, (V - 1) // 2 tokens are keys, the rest values (kda_lib.lab.tasks.mqar):
    uniform guessing among the values is right once in n_values."""
    n_values = vocab_size - 1 - (vocab_size - 1) // 2
    return 1 / n_values


def holm_column(family: dict) -> dict:
    """2: per row, the differences d = KDA minus other (one per seed), t = mean(d) / (sd(d) /
    sqrt(n)) with the sd over n - 1; at n = 5 seeds t has 4 degrees of freedom, whose two-sided
    tail is p = 1 - u (3 - u^2) / 2, u = |t| / sqrt(t^2 + 4) (integrate the density (1 + t^2 /
    4)^(-5/2) with t = 2 tan theta). Holm: sort the m p values ascending, multiply the i-th by
    m - i + 1, take the running maximum (an adjusted value never falls), cap at 1."""
    rows = list(family)
    p = []
    for row in rows:
        d = np.subtract(*map(np.asarray, family[row]))
        n = d.size
        assert n == 5, "the closed form is the t tail at 4 degrees of freedom"
        t = d.mean() / (d.std(ddof=1) / np.sqrt(n))
        u = abs(t) / np.sqrt(t * t + 4)
        p.append(1 - u * (3 - u * u) / 2)
    order = np.argsort(p)
    adjusted, running = {}, 0.0
    for i, j in enumerate(order):
        running = max(running, (len(p) - i) * p[j])
        adjusted[rows[j]] = min(running, 1.0)
    return adjusted


def sign_flip_column(family: dict) -> dict:
    """3: under no difference each seed's difference d_i is as likely -d_i as d_i: the 2^n
    sign patterns are equally likely, and the exact two-sided p is the share of them whose
    |sum| reaches the observed |sum|, ties included (the observed pattern and its mirror always
    tie: p >= 2 / 2^n, 0.0625 at 5 seeds, whatever the scores). A zero difference may stay or
    go (it doubles both counts). Sums that tie in exact arithmetic may differ in their last bits:
    compare with a tolerance. Open part: Holm's first step in the 9-row claims family needs p <=
    0.05 / 9 = 0.0056, so 2 / 2^n <= 0.0056: n >= 9 seeds (2 / 512 = 0.0039), all one way."""
    out = {}
    for row, (a, b) in family.items():
        d = np.subtract(a, b)
        n = d.size
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)  # every pattern
        sums = np.abs(signs @ d)
        out[row] = float(np.mean(sums >= abs(d.sum()) - 1e-9 * np.abs(d).sum()))
    return out


def three_time_scales(half_lives) -> dict:
    """4: A = (I - beta k k^T) D, D = diag(d_i) with the decays d_i = e^(g_i), is similar to
    D - u u^T (u_i^2 = beta d_i k_i^2), a rank-one downdate of a diagonal matrix, whose
    eigenvalues lam interlace the decays. Pick decays just above the wanted lam (d_1 > lam_1 >
    d_2 > lam_2 > ...); the secular equation gives u_i^2 = prod_j (d_i - lam_j) /
    prod_{j != i} (d_i - d_j) > 0; a unit key fixes beta = sum_i u_i^2 / d_i and
    k_i^2 = u_i^2 / (beta d_i). Then the filter is a sum of the three exponentials and q (three
    weights) comes from least squares."""
    lam = np.sort(0.5 ** (1 / np.asarray(half_lives, np.float64)))[::-1]
    decays = lam + 0.5 * np.append(1 - lam[0], -np.diff(lam))  # strictly interlacing, midway
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
    family = {  # 5 paired seeds a row: KDA's scores, the other's
        ("stack", 64, "gdn"): ([0.9, 0.85, 0.95, 0.8, 0.9], [0.85, 0.86, 0.9, 0.7, 0.84]),
        ("stack", 128, "gdn"): ([0.7, 0.72, 0.69, 0.75, 0.7], [0.66, 0.7, 0.65, 0.7, 0.68]),
        ("stack", 128, "mamba2"): ([0.7, 0.72, 0.69, 0.75, 0.7], [0.5, 0.8, 0.6, 0.74, 0.6]),
        ("mqar", 64, "steps"): ([900, 400, 700, 500, 600], [400, 400, 500, 400, 400]),
    }

    def unadjusted(fam):  # each row's own p (a family of one), not Holm's
        return {row: holm_column({row: pair})[row] for row, pair in fam.items()}

    scales = dict(half_lives=(1.0, 8.0, 64.0), length=256)
    return [
        ("08.1", mqar_chance, {}, lambda v: 1 / (v - 1)),
        ("08.2", holm_column, dict(family=family), unadjusted),
        ("08.3", sign_flip_column, dict(family=family),
         lambda fam: {row: p / 2 for row, p in sign_flip_column(fam).items()}),  # one tail
        ("08.4", three_time_scales, scales,
         lambda lives: dict(three_time_scales(lives), decays=[0.99, 0.9, 0.5])),
    ]
