"""Checkers of notebook 02: 02.1 a probability (no scipy), 02.2 two coefficients of beta."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from kda_lib.teaching import exercises as ex
from kda_lib.teaching.exercises.ch01 import GRID, f32, on_grid


def _scalar(got):
    """A 1-element array as the number it holds; anything else unchanged (refused later)."""
    with contextlib.suppress(Exception):  # ragged lists and the like: refused after
        return np.reshape(got, ()) if np.ndim(got) == 1 and np.size(got) == 1 else got
    return got


def _spread(n, ratio, width, how="right") -> float:
    """P(n log-uniform draws over ``width`` span less than ``ratio``), or a slip (``how``)."""
    rho = min(math.log(ratio) / math.log(width), 1.0)
    return {"one window": rho**n, "from the lowest": min(1.0, n * rho ** (n - 1))}.get(
        how, n * rho ** (n - 1) - (n - 1) * rho**n)


def _spreads(rng):
    """(d_k, ratio, width): the page's, two drawn, one of chance 1e-30..1e-12, two of chance 1."""
    width = float(rng.choice([10.0, 100.0, 1000.0]))
    drawn = lambda n_range, rho_range: (int(rng.integers(*n_range)), round(  # n, then rho
        width ** float(rng.uniform(*rho_range)), 3), width)
    while not 1e-30 < _spread(*(tiny := drawn((20, 65), (0.15, 0.5)))) < 1e-12:
        pass
    return [(32, 10.0, 100.0), drawn((2, 9), (0.3, 0.9)), drawn((10, 65), (0.5, 0.95)), tiny,
            (1, round(float(rng.uniform(1.5, 9.0)), 2), 100.0),
            (int(rng.integers(2, 40)), width * 2, width)]


_SPREAD_HINTS = {  # the slips of _spread, and what to say
    "one window": "that is the chance all fall in one fixed window: condition on the lowest draw",
    "from the lowest": "a window from the lowest draw can stick out of the range: cut it there"}
_BETA = (*ex.SCIPY, "jax._src.lax.special")  # scipy, jax.scipy, jax.lax.betainc: the span's law
_BETA_HINT = "spread_below uses {}, which evaluates the span's law for you: derive it yourself"
_PSI = [dict(shape=(), what=w, allow_zeros=True) for w in ("psi1", "psi2")]  # 02.2's two numbers


@ex.checker("02.1")
def spread_below(answer, rng):
    """``answer(d_k, ratio, width) -> p``: the chance that ``d_k`` log-uniform draws over a range
    ``width`` wide span less than ``ratio > 1``; no scipy, jax.scipy or jax.lax.betainc."""
    if holding := ex.holds_scipy(answer):
        return _BETA_HINT.format(holding)
    for n, ratio, width in _spreads(rng):
        where = f"at d_k = {n}, ratio = {ratio}, width = {width}"
        got, hint = ex.call_answer(answer, n, ratio, width, name="spread_below(d_k, ratio, width)",
                                   refused={p: _BETA_HINT.format(p) for p in _BETA})
        got = got if hint else _scalar(got)
        zero = not hint and np.ndim(got) == 0 and np.asarray(got).dtype.kind in "iuf" and got == 0
        if not (edge := n == 1 or ratio >= width) and zero:  # (at an edge the chance is 1)
            return (f"yours is 0 {where}, where the chance is small but not 0: a simulation "
                    "(sampling) cannot see such draws; derive the distribution of the span")
        if not zero and (hint := hint or ex.refuse_degenerate(got, shape=(), what="a probability")):
            return hint
        if ex.close(got, _spread(n, ratio, width), 1e-5):  # 1 + 4e-10 from a quadrature passes
            continue
        if not 0 <= float(got) <= 1:  # outside [0, 1], and not within the value test's 1e-5
            return f"yours is {float(got)!r} {where}: a probability lies in [0, 1]"
        if edge:
            return f"wrong {where}: " + ("one draw spans nothing; what is the chance it spans less"
                                         " than any ratio?" if n == 1 else "no draws can span "
                                         "more than the whole range")
        slip = next((text for how, text in _SPREAD_HINTS.items()
                     if ex.close(got, _spread(n, ratio, width, how), 1e-5)), None)
        return (f"wrong {where}: " + (slip or "in log(tau) the draws are uniform; rescaled to "
                "[0, 1], what is the chance d_k of them span under ln(ratio) / ln(width)?"))


@ex.checker("02.2")
def older_weight(answer, rng):
    """``answer(beta) -> (psi1, psi2)`` (the older of three writes of one unit key): four betas,
    one below 1e-14 (psi2 measured there is rounding noise), then 10^6 as one array."""
    for beta in [*(round(float(b), 3) for b in rng.uniform(0.05, 0.95, 4)),
                 float(f"{rng.uniform(1.0, 5.0):.3f}e-15")]:
        got, hint = ex.call_answer(answer, beta, name="older_weight(beta)")
        got = [*map(_scalar, got)] if isinstance(got, (tuple, list)) else got
        if hint := hint or ex.parts(got, "the pair (psi1, psi2)", *_PSI):
            return hint
        psi1, psi2 = (float(x) for x in got)
        right_psi1 = ex.close(psi1, beta * (1 - beta), 1e-5)
        if right_psi1 and ex.close(psi2, -beta**2 * (1 - beta), 1e-5):
            continue
        text = ("psi2's term is a few float64 ulps of a weight computed from the matrices "
                "(I - beta k k^T) here, so psi2 measured from such weights is rounding noise: "
                "derive it as a formula in beta" if beta < 1e-6 else
                "beta (1 - beta)^2 is the one-decay-for-all-channels weight: per channel the "
                "middle write removes beta (k^T D_s' ... D_(s+1) k) k, the decayed memory's "
                "projection on k"
                if ex.close(psi1, beta * (1 - beta) ** 2, 1e-5) and abs(psi2) < 1e-12 else
                "psi1 is right; psi2 is the middle write's share: what does k^T (I - beta k k^T) "
                "leave of k^T, and what remains of the decays around it?" if right_psi1 else
                "follow k from t back to s through the steps (I - beta k k^T) D: which factors "
                "does each write and each decay contribute?")
        return f"wrong at beta = {beta}: {text}"
    return on_grid(answer, "older_weight(beta)", f32(np.r_[rng.uniform(0.05, 0.95, GRID**2 - 1),
                   3e-15]), lambda b: (b * (1 - b), -b * b * (1 - b)))
