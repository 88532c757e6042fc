"""Checkers of notebook 01's exercises: the two pieces of each closed form (a per-step factor, a
limit or a first value) as functions of parameters drawn at each call, the named edge cases
among them."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex

_FLOAT32 = ("at beta = {}: 1 - beta rounds to 1 in float32 (beta below its resolution), so "
            "1 - r is lost; compute in float64, or write f_inf without 1 - r")


@ex.checker("01.1")
def write_map(answer, rng):
    """``answer(beta, alpha) -> (r, f_inf)``: each decay-then-write step multiplies the gap
    ``f_inf - f`` of the recalled fraction by ``r``; ``f_inf`` is its limit."""
    uniform = lambda low, high: round(float(rng.uniform(low, high)), 4)
    # (beta, alpha): decay, no decay, beta = 1, tiny betas (below float32's resolution)
    for beta, alpha in [(uniform(0.1, 0.9), uniform(0.6, 0.99)), (uniform(0.1, 0.9), 1.0),
                        (1.0, uniform(0.6, 0.99)), (uniform(0.5, 3.0) * 1e-9, 1.0),
                        (uniform(0.5, 3.0) * 1e-9, uniform(0.9, 0.999))]:
        got, hint = ex.call_answer(answer, beta, alpha, name="write_map(beta, alpha)")
        hint = hint or ex.parts(got, "the pair (r, f_inf)", dict(
            shape=(), what="r", allow_zeros=beta == 1.0), dict(shape=(), what="f_inf"))
        r, limit = alpha * (1 - beta), beta / (1 - alpha + alpha * beta)
        where = f"at beta = {beta!r}, alpha = {alpha!r}"
        if beta < 1e-6 and ("NaN or inf" in hint if hint else not ex.close(got[1], limit)
                            and np.asarray(got[1]).dtype.itemsize < 8):
            return _FLOAT32.format(beta)
        if hint:
            return hint
        if not ex.close(got[0], r):
            text = ("each step decays first, then writes: what does each do to the gap?"
                    if ex.close(got[0], 1 - beta) and alpha < 1 else
                    "follow the fraction f through one step: decay, then section 2's write; "
                    "f -> r f + (what?)")
            return f"r is wrong {where}: {text}"
        if not ex.close(got[1], limit):
            text = ("with decay the memory never holds all of v"
                    if ex.close(got[1], 1.0) and alpha < 1 else
                    "the limit is the fraction one more step leaves unchanged")
            return f"f_inf is wrong {where}: {text}"


@ex.checker("01.2")
def sweep_map(answer, rng):
    """``answer(mu, v1, v2) -> (e1 [V], factor)``: pair 1's recall error after the first sweep
    (beta = 1, pair 1 then pair 2, from S = 0, unit keys of overlap ``mu``) and the factor each
    later sweep multiplies it by; mu drawn positive and negative, and 0, 1 and -1."""
    mus = [round(float(rng.uniform(0.2, 0.95)), 3), -round(float(rng.uniform(0.2, 0.95)), 3),
           0.0, 1.0, -1.0]
    for mu in mus:
        V = int(rng.integers(2, 7))
        v1, v2 = rng.standard_normal(V), rng.standard_normal(V)
        got, hint = ex.call_answer(answer, mu, v1.copy(), v2.copy(), name="sweep_map(mu, v1, v2)")
        hint = hint or ex.parts(got, "the pair (e1, factor)", dict(
            shape=(V,), inputs=(v1, v2), what="e1", allow_zeros=mu == 0.0), dict(
            shape=(), what="the factor", allow_zeros=mu == 0.0))
        if hint:
            return hint
        e1, where = mu * (v2 - mu * v1), f"at mu = {mu}"
        if not ex.close(got[0], e1, 1e-6) if mu else np.abs(np.asarray(got[0])).max() > 1e-12:
            return (f"e1 is wrong {where}: after pair 1's write its error is 0; what does pair 2's "
                    "write (section 3's disturbance formula) do to it?")
        if not ex.close(got[1], mu * mu) if mu else abs(float(got[1])) > 1e-12:
            text = ("one sweep writes both pairs: follow pair 1's error through pair 1's "
                    "write, then pair 2's" if ex.close(got[1], mu) or ex.close(got[1], abs(mu))
                    else "follow both errors through one whole sweep")
            return f"the factor is wrong {where}: {text}"
