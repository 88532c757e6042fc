"""Checkers of notebook 01's exercises at parameters drawn at each call, the named edge cases
among them, last where a float64 simulation or fit gives rounding noise (the hints say so)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex


@ex.checker("01.1")
def write_map(answer, rng):
    """``answer(beta, alpha) -> (lam, zeta_inf)``: each decay-then-write step multiplies the gap
    ``zeta_inf - zeta`` of the recalled fraction by ``lam``; ``zeta_inf`` is its limit. Last: beta,
    1 - alpha near 1e-14, where no float64 simulation nears zeta_inf and 1 - lam keeps 2 digits."""
    uniform = lambda low, high: round(float(rng.uniform(low, high)), 4)
    tiny = lambda: float(f"{rng.uniform(0.5, 3.0):.4f}e-14")
    for beta, alpha in [(uniform(0.1, 0.9), uniform(0.6, 0.99)), (uniform(0.1, 0.9), 1.0),
                        (1.0, uniform(0.6, 0.99)), (tiny(), 1.0), (tiny(), 1.0 - tiny())]:
        got, hint = ex.call_answer(answer, beta, alpha, name="write_map(beta, alpha)")
        hint = hint or ex.parts(got, "the pair (lam, zeta_inf)", dict(
            shape=(), what="lam", allow_zeros=beta == 1.0), dict(shape=(), what="zeta_inf"))
        if hint and not (beta < 1e-6 and "NaN or inf" in hint):
            return hint
        where = f"at beta = {beta!r}, alpha = {alpha!r}"
        if not ex.close(got[0], alpha * (1 - beta)):
            return f"lam is wrong {where}: " + (
                "each step decays first, then writes: what does each do to the gap?"
                if ex.close(got[0], 1 - beta) and alpha < 1 else "follow the fraction zeta "
                "through one step: decay, then section 2's write; zeta -> lam zeta + (what?)")
        if not ex.close(got[1], beta / (1 - alpha + alpha * beta)):
            return f"zeta_inf is wrong {where}: " + (
                "with decay the memory never holds all of v" if beta > 1e-6 and alpha < 1
                and ex.close(got[1], 1.0) else "the limit is the fraction one more step leaves "
                "unchanged" if beta > 1e-6 else "float32 rounds 1 - beta and alpha to 1 here: "
                "compute in float64" if np.asarray(got[1]).dtype.itemsize < 8 else "lam differs "
                "from 1 in its 14th digit here: 1 - lam formed from lam (measured or not) keeps "
                "about 2 digits, and no float64 simulation gets near zeta_inf: simplify 1 - lam by "
                "hand so that zeta_inf subtracts no nearly equal numbers")


@ex.checker("01.2")
def sweep_error(answer, rng):
    """``answer(mu, v1, v2, m) -> e [V]``: pair 1's recall error ``S^T k_1 - v_1`` after ``m``
    sweeps (beta = 1, pair 1 then pair 2, from S = 0, unit keys of overlap ``mu``): drawn mu of
    both signs, m = 0, mu = 0 (each and both), 1, -1, and last |mu| < 1e-6, where the error
    after two sweeps is below float64's rounding of S^T k_1 - v_1."""
    drawn, sweeps = lambda: round(float(rng.uniform(0.2, 0.95)), 3), lambda: int(rng.integers(1, 7))
    tiny = float(f"{rng.choice([-1, 1]) * rng.uniform(1, 10):.3f}e-7"), int(rng.integers(2, 4))
    for mu, m in [(drawn(), sweeps()), (-drawn(), sweeps()), (drawn(), 0), (0.0, sweeps()),
                  (0.0, 0), (1.0, sweeps()), (-1.0, sweeps()), tiny]:
        V = int(rng.integers(2, 7))
        v1, v2 = rng.standard_normal(V), rng.standard_normal(V)
        got, hint = ex.call_answer(answer, mu, v1.copy(), v2.copy(), m, refuse=dict(
            shape=(V,), inputs=(v1, v2), what="the error", allow_zeros=abs(mu) < 1e-3 and m > 0),
            name="sweep_error(mu, v1, v2, m)")
        if hint:
            return hint
        if not ex.close(got, -v1 if m == 0 else mu ** (2 * m - 1) * (v2 - mu * v1), 1e-5):
            return f"wrong at mu = {mu}, m = {m}: " + ("no sweep: S = 0; what does pair 1 read?"
                if m == 0 else "the error is far below float64's rounding of S^T k_1 - v_1 here "
                "(about 1e-16 of v_1): a float64 simulation or fit of sweeps gives noise; find "
                "what a sweep does to the error as a formula in mu" if 0 < abs(mu) < 1e-3 else
                "one sweep writes both pairs: follow pair 1's error through pair 1's write, "
                "then pair 2's" if ex.close(got, mu**m * (v2 - mu * v1), 1e-5) else
                "after pair 1's write its error is 0; what does pair 2's write (section 3's "
                "disturbance formula) do to it?" if m == 1 else
                "follow both errors through one whole sweep: what does it do to pair 1's?")
