"""Checkers of notebook 01's exercises: parameters drawn at each call, the named edge cases last."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex

# CPU s at GRID^2 points, watched: closed forms ms, worked loop 1.1 s, Fractions ~60 s (notes)
TIME_LIMIT_S = 20.0
GRID = 1000  # 01.1's, 02.2's last call: GRID^2 parameters as arrays; ms for the closed form

f32 = lambda *xs: [np.asarray(x, np.float32).astype(np.float64) for x in xs]  # noqa: E731


def on_grid(answer, name, params, want) -> str | None:
    """A hint unless ``answer(*params)`` returns ``want(*params)`` (1e-5) within TIME_LIMIT_S."""
    where, wants = f"on a grid of {GRID**2:,} parameters passed as arrays", want(*params)
    got, hint = ex.call_answer(answer, *params, name=name, limit_s=TIME_LIMIT_S, slow=f"{name} "
        f"took over {TIME_LIMIT_S:.0f} s of CPU time {where}: use array operations")
    got = list(got) if np.shape(got)[:1] == (len(wants),) and np.ndim(got) > 1 else got
    if hint or (hint := ex.parts(got, f"{len(wants)} arrays", *[{"allow_zeros": True}] * 2)):
        return hint if "took over" in hint else f"{hint} ({where}: use array operations)"
    for got_i, want_i in zip(got, wants, strict=True):
        if np.size(got_i) != np.size(want_i):
            return f"shape {np.shape(got_i)} {where} of shape {np.shape(want_i)}: array operations"
        got_i = np.reshape(np.asarray(got_i, np.float64), np.shape(want_i))
        if (bad := ~(np.abs(got_i - want_i) <= 1e-5 * abs(want_i))).any():
            at = ", ".join(f"{p.flat[np.argmax(bad)]!r}" for p in params)
            return f"wrong {where}, first at {at}: scalar trials passed; is it array-safe?"
    return None


@ex.checker("01.1")
def write_map(answer, rng):
    """``answer(beta, alpha) -> (lam, zeta_inf)``; last, float32-exact as a gate makes them: alpha
    ~ 1e-8, beta ~ 1e-9 (10^10 steps), 1 - alpha ~ 1e-7 (float32 parts: at float32's values)."""
    uniform = lambda low, high: round(float(rng.uniform(low, high)), 4)
    tiny = lambda scale, low=1.0, high=3.0: float(np.float32(rng.uniform(low, high) * scale))
    for beta, alpha in [(uniform(0.1, 0.9), uniform(0.6, 0.99)), (uniform(0.1, 0.9), 1.0),
                        (1.0, uniform(0.6, 0.99)), (uniform(0.1, 0.9), tiny(1e-8)),
                        (tiny(1e-9), 1.0), (tiny(1e-9), 1.0 - int(rng.integers(1, 6)) * 2.0**-24)]:
        where = f"at beta = {beta!r}, alpha = {alpha!r}"
        got, hint = ex.call_answer(answer, beta, alpha, name="write_map", limit_s=TIME_LIMIT_S,
                                   slow=f"write_map took over {TIME_LIMIT_S:.0f} CPU s {where}")
        hint = hint or ex.parts(got, "the pair (lam, zeta_inf)", dict(shape=(), what="lam",
            allow_zeros=beta == 1.0 or alpha < 1e-6), dict(shape=(), what="zeta_inf"))
        if hint and not (beta < 1e-6 and "NaN or inf" in hint):
            return hint
        at = [[(beta, alpha)] + [f32(beta, alpha)] * (np.asarray(x).dtype == "f4") for x in got]
        if not any(ex.close(got[0], a * (1 - b)) for b, a in at[0]):
            return f"lam is wrong {where}: " + (
                "each step decays first, then writes: what does each do to the gap?"
                if ex.close(got[0], 1 - beta) and alpha < 1 else "writes move zeta by lam beta, "
                "lam^2 beta, ... here, soon near its rounding: a lam read off simulated writes "
                "keeps few digits" if alpha < 1e-6 else "follow the fraction zeta through one "
                "step: decay, then section 2's write; zeta -> lam zeta + (what?)")
        if not any(ex.close(got[1], b / (1 - a + a * b)) for b, a in at[1]):
            return f"zeta_inf is wrong {where}: " + (
                "with decay the memory never holds all of v" if beta > 1e-6 and alpha < 1
                and ex.close(got[1], 1.0) else "each step decays first, then writes: yours is the "
                "limit of a write, then a decay" if alpha < 1 and ex.close(got[1], alpha * beta
                / (1 - alpha + alpha * beta)) else "the limit is the fraction one more step leaves "
                "unchanged" if beta > 1e-6 else "lam is within 1e-6 of 1: 10^10 steps to simulate;"
                " 1 - lam from a float32 lam keeps no digits (float64: 7): simplify it by hand")
    betas = rng.permutation(np.r_[rng.uniform(0.05, 0.95, GRID - 2), 2e-9, 1.0])
    alphas = rng.permutation(np.r_[rng.uniform(0.5, 1, GRID - 3), 1.0, 2e-8, 1 - 3 * 2.0**-24])
    return on_grid(answer, "write_map(beta, alpha)", np.meshgrid(*f32(betas, alphas)),
                   lambda b, a: (a * (1 - b), b / (1 - a + a * b)))


@ex.checker("01.2")
def sweep_error(answer, rng):
    """``answer(mu, v1, v2, m) -> e [V]``: pair 1's recall error after ``m`` sweeps (beta = 1,
    S = 0, unit keys of overlap ``mu``): mu of each sign, m = 0, mu = 0, 1, -1, last |mu| < 1e-6."""
    drawn, sweeps = lambda: round(float(rng.uniform(0.2, 0.95)), 3), lambda: int(rng.integers(1, 7))
    tiny = float(f"{rng.choice([-1, 1]) * rng.uniform(1, 10):.3f}e-7"), int(rng.integers(2, 4))
    many = float(rng.choice([-1, 1]) * (1 - rng.integers(1, 5) / 4096)), int(rng.integers(3e3, 4e3))
    for mu, m in [(drawn(), sweeps()), (-drawn(), sweeps()), (drawn(), 0), (0.0, sweeps()),
                  (0.0, 0), (1.0, sweeps()), (-1.0, sweeps()), tiny, many]:
        V = int(rng.integers(2, 7))
        v1, v2 = rng.standard_normal(V), rng.standard_normal(V)
        got, hint = ex.call_answer(answer, mu, v1.copy(), v2.copy(), m, refuse=dict(
            shape=(V,), inputs=(v1, v2), what="the error", allow_zeros=abs(mu) < 1e-3 and m > 0),
            name="sweep_error(mu, v1, v2, m)", limit_s=TIME_LIMIT_S, slow=f"sweep_error took over "
            f"{TIME_LIMIT_S:.0f} CPU s at m = {m}: exact (fractions) sweeps grow too long numbers")
        if hint:
            return hint
        tol = 1e-5 * (1 + m) ** 0.5  # (float32 loops over m sweeps round m times)
        if not ex.close(got, want := -v1 if m == 0 else mu ** (2 * m - 1) * (v2 - mu * v1), tol):
            return f"wrong at mu = {mu}, m = {m}: " + ("the exercise's error is S^T k_1 - v_1, "
                "not v_1 - S^T k_1 (the sign)" if ex.close(got, -want, tol) else "no sweep: "
                "S = 0; what does pair 1 read?" if m == 0 else "the error is far below float64's "
                "rounding of S^T k_1 - v_1 here (about 1e-16 of v_1): a float64 simulation or fit "
                "of sweeps gives noise; find what a sweep does to the error as a formula in mu"
                if 0 < abs(mu) < 1e-3 else
                "one sweep writes both pairs: follow pair 1's error through pair 1's write, "
                "then pair 2's" if ex.close(got, mu**m * (v2 - mu * v1), 1e-5) else
                "after pair 1's write its error is 0; what does pair 2's write (section 3's "
                "disturbance formula) do to it?" if m == 1 else
                "follow both errors through one whole sweep: what does it do to pair 1's?")
