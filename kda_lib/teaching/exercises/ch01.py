"""Checkers of notebook 01's exercises: parameters drawn at each call, the named edge cases last."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex

TIME_LIMIT_S = 5.0  # the closed form takes microseconds; 10^10 simulated steps take minutes


@ex.checker("01.1")
def write_map(answer, rng):
    """``answer(beta, alpha) -> (lam, zeta_inf)``; last, float32-exact: alpha ~ 1e-8 (lam read off
    simulated writes keeps few digits), beta ~ 1e-9 (10^10 steps to simulate), 1 - alpha ~ 1e-7."""
    uniform = lambda low, high: round(float(rng.uniform(low, high)), 4)
    tiny = lambda scale: float(np.float32(rng.uniform(1.0, 3.0) * scale))
    for beta, alpha in [(uniform(0.1, 0.9), uniform(0.6, 0.99)), (uniform(0.1, 0.9), 1.0),
                        (1.0, uniform(0.6, 0.99)), (uniform(0.1, 0.9), tiny(1e-8)),
                        (tiny(1e-9), 1.0), (tiny(1e-9), 1.0 - int(rng.integers(1, 6)) * 2.0**-24)]:
        where = f"at beta = {beta!r}, alpha = {alpha!r}"
        got, hint = ex.call_answer(answer, beta, alpha, name="write_map", limit_s=TIME_LIMIT_S,
                                   slow=f"write_map took over {TIME_LIMIT_S:.0f} s {where}")
        hint = hint or ex.parts(got, "the pair (lam, zeta_inf)", dict(shape=(), what="lam",
            allow_zeros=beta == 1.0 or alpha < 1e-6), dict(shape=(), what="zeta_inf"))
        if hint and not (beta < 1e-6 and "NaN or inf" in hint):
            return hint
        if not ex.close(got[0], alpha * (1 - beta)):
            return f"lam is wrong {where}: " + (
                "each step decays first, then writes: what does each do to the gap?"
                if ex.close(got[0], 1 - beta) and alpha < 1 else "the third simulated write "
                "moves zeta by lam^2 beta here, near float64's rounding: lam read off simulated "
                "fractions keeps few digits" if alpha < 1e-6 else "follow the fraction zeta "
                "through one step: decay, then section 2's write; zeta -> lam zeta + (what?)")
        if not ex.close(got[1], beta / (1 - alpha + alpha * beta)):
            return f"zeta_inf is wrong {where}: " + (
                "with decay the memory never holds all of v" if beta > 1e-6 and alpha < 1
                and ex.close(got[1], 1.0) else "the limit is the fraction one more step leaves "
                "unchanged" if beta > 1e-6 else "lam is within 1e-6 of 1: 10^10 steps to simulate;"
                " 1 - lam from a float32 lam keeps no digits (float64: 7): simplify it by hand")


@ex.checker("01.2")
def sweep_error(answer, rng):
    """``answer(mu, v1, v2, m) -> e [V]``: pair 1's recall error after ``m`` sweeps (beta = 1,
    from S = 0, unit keys of overlap ``mu``): drawn mu of both signs, m = 0, mu = 0, 1, -1, last
    |mu| < 1e-6, where the error after two sweeps is below float64's rounding of S^T k_1 - v_1."""
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
