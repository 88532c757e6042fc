"""Checkers of notebook 05: context parallelism's backward pass (no autodiff, ``TIME_LIMIT_S``)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex
from kda_lib.teaching.exercises.ch04 import AUTODIFF

_RANKS = (2, 3, 5, 8)  # K = 4, V = 3
_LARGE = (32, 64, 128)  # R, K, V of the last trial
TIME_LIMIT_S = 10.0
_SLOW = ("your function took over {:g} CPU s, the time limit, at R, K, V = {}: the backward "
         "fold is R small matrix products; a Python loop over every element can exceed the "
         "limit (on a slow CPU even if right), and so do finite differences: use matrix products")
_close = lambda got, want: np.allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5)


def _problem(rng, ranks: int, key_dim: int = 4, value_dim: int = 3):
    """Summaries ``ms [R, K, K]`` (spectral norm about 1), ``es``, own-output gradients ``hs``."""
    ms = rng.standard_normal((ranks, key_dim, key_dim)) / (2 * np.sqrt(key_dim))
    return (ms, rng.standard_normal((ranks, key_dim, value_dim)),
            rng.standard_normal((ranks, key_dim, value_dim)))


def state_gradients_reference(ms, hs):
    """``gs[r] = hs[r] + ms[r]^T gs[r + 1]``, ``gs[R - 1] = hs[R - 1]`` (float64)."""
    gs, g = np.zeros_like(hs), np.zeros(hs.shape[1:])
    for r in range(len(ms) - 1, -1, -1):
        gs[r] = g = hs[r] + ms[r].T @ g
    return gs


def summary_cotangents_reference(ms, es, hs):
    """``des[r] = gs[r + 1]``, ``dms[r] = gs[r + 1] S[r]^T`` (the last rank's 0), float64."""
    gs = state_gradients_reference(ms, hs)
    after = np.concatenate([gs[1:], np.zeros_like(gs[:1])])  # the gradient leaving each rank
    states = [np.zeros(es.shape[1:])]  # S^(r), the state entering rank r
    for m, e in zip(ms[:-1], es[:-1], strict=True):
        states.append(m @ states[-1] + e)
    return np.einsum("rkv,rjv->rkj", after, np.stack(states)), after


def _call(answer, *args, name, refuse=None):
    """``call_answer`` refusing autodiff, within ``TIME_LIMIT_S``."""
    size = f"{len(args[0])}, {args[-1].shape[1]}, {args[-1].shape[2]}"
    return ex.call_answer(answer, *args, name=name, refused=AUTODIFF, limit_s=TIME_LIMIT_S,
                          slow=_SLOW.format(TIME_LIMIT_S, size), refuse=refuse)


@ex.checker("05.1")
def backward_fold(answer, rng, **_):
    """``state_gradients(ms, hs) -> gs [R, K, V]``: the loss's gradient for the state entering
    every rank, from the summaries ``ms`` and the own-output gradients ``hs``."""
    for ranks, *size in [(r,) for r in _RANKS] + [_LARGE]:
        ms, _, hs = _problem(rng, ranks, *size)
        got, hint = _call(answer, ms, hs, name="state_gradients(ms, hs)", refuse=dict(
            shape=hs.shape, inputs=(hs,), what=f"the gradients for R = {ranks}"))
        if hint:
            return hint
        if _close(got, state_gradients_reference(ms, hs)):
            continue
        if _close(got, state_gradients_reference(np.swapaxes(ms, 1, 2), hs)):
            return (f"wrong for R = {ranks}: S' = M S + E sends a gradient back through M's "
                    "transpose, not M")
        if _close(np.asarray(got)[-1], hs[-1]) is False and _close(np.asarray(got)[0], hs[0]):
            return f"wrong for R = {ranks}: which rank's gradient is known first?"
        return (f"wrong for R = {ranks}: the state entering rank r reaches the loss through "
                "rank r's own outputs and through the state it hands to rank r + 1")


@ex.checker("05.2")
def summary_gradients(answer, rng, **_):
    """``summary_cotangents(ms, es, hs) -> (dms [R, K, K], des [R, K, V])``: the loss's gradient
    for every rank's summary ``(M, E)`` (the all-gather's backward)."""
    for ranks, *size in [(r,) for r in _RANKS[1:]] + [_LARGE]:  # at R = 2 every dms is 0
        ms, es, hs = _problem(rng, ranks, *size)
        got, hint = _call(answer, ms, es, hs, name="summary_cotangents(ms, es, hs)")
        if hint := hint or ex.parts(got, "the pair (dms, des)", *(dict(
                shape=a.shape, inputs=(ms, es, hs), what=f"{w} for R = {ranks}")
                for a, w in ((ms, "dms"), (es, "des")))):
            return hint
        want = summary_cotangents_reference(ms, es, hs)
        if not _close(got[1], want[1]):
            return (f"des wrong for R = {ranks}: E^(r) enters the loss only through the state "
                    "it adds to, S^(r + 1)")
        if _close(got[0], np.swapaxes(want[0], 1, 2)):
            return f"dms for R = {ranks} is transposed: which index of M meets the state?"
        if not _close(got[0], want[0]):
            return (f"dms wrong for R = {ranks}: M^(r) multiplies the state entering rank r; "
                    "which gradient does the product pass on?")
