"""Checkers of notebook 01's exercises (from linear attention to KDA).

Every answer is a small function, which the checker calls on inputs of its own (refusing any
that runs ``kda_lib`` code); it recomputes the expected result in float64 and returns a hint
that never contains the expected values. Both exercises ask for a closed form: the last trial
uses a count (``writes``, ``sweeps``) of 10^9, which a write-by-write loop does not finish
within ``TIME_LIMIT_S`` (the call is stopped there on the main thread, refused after it
elsewhere). Those trials use beta = 1e-9 (c = 1 - 1e-9), below float32's resolution: a wrong
float32 or jax result there gets a hint about float64 instead of the generic refusal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, machinery, refuse_degenerate

TIME_LIMIT_S = 2.0
_SLOW = (
    "your function took over {:.0f} s at a count of 10^9: a simulation, write by write, "
    "cannot get there; derive the closed form"
)


class _TooSlow(BaseException):
    """Raised into a slow answer (a BaseException: an answer's ``except Exception`` inside its
    loop does not swallow it)."""


@machinery
def _stop(*_):
    raise _TooSlow(_SLOW.format(TIME_LIMIT_S))


@contextlib.contextmanager
def _time_limit():
    """Stop the block after ``TIME_LIMIT_S`` with SIGALRM (main thread only), restoring any
    timer set around it (a test's own limit) with the time it has left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _stop)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # re-arm the outer timer with what it had left (at least a moment)
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


def _call(answer, *args, name):
    """``call_answer`` (own code only) under the time limit; a slow call is refused."""
    start = time.monotonic()
    try:
        with _time_limit():
            got, hint = call_answer(answer, *args, name=name, own_code=True)
    except _TooSlow:
        return None, _SLOW.format(TIME_LIMIT_S)
    if hint is None and time.monotonic() - start > TIME_LIMIT_S:
        return None, _SLOW.format(TIME_LIMIT_S)
    return got, hint


def _low_precision(got) -> bool:
    """Whether ``got`` is floats narrower than float64 or a jax array of floats."""
    try:
        dtype = np.asarray(got).dtype
    except Exception:  # noqa: BLE001 - the shared refusals name what is wrong
        return False
    from_jax = type(got).__module__.split(".")[0] in ("jax", "jaxlib")
    return dtype.kind == "f" and (dtype.itemsize < 8 or from_jax)


_FLOAT32 = ("wrong {} in {}: {} is below float32's resolution (1 - 1e-9 rounds to 1); "
            "compute the closed form in NumPy float64")


# (beta, alpha, writes): no decay, decay, beta = 1, a tiny beta over 10^9 writes (the last)
_WRITES = ((0.5, 1.0, 3), (0.3, 0.9, 1), (0.9, 0.8, 4), (0.2, 0.95, 7), (1.0, 0.5, 5),
           (0.6, 0.7, 40), (1e-9, 1.0, 10**9), (2e-9, 1 - 1e-9, 10**9))


@checker("01.1")
def gated_partial_writes(answer, **_):
    """``answer(beta, alpha, writes)``: the fraction of ``v`` an empty memory returns for the
    unit key ``k`` after ``writes`` gated delta-rule writes of the same pair (decay the state
    by ``alpha``, then write with strength ``beta``); the checker tries its own arguments."""
    for beta, alpha, writes in _WRITES:
        got, hint = _call(answer, beta, alpha, writes,
                          name="recalled_fraction(beta, alpha, writes)")
        where = f"at beta = {beta}, alpha = {alpha}, writes = {writes}"
        tiny = hint is None and beta < 1e-6 and _low_precision(got) and np.shape(got) == ()
        hint = hint or refuse_degenerate(got, shape=(), what="the fraction")
        r = alpha * (1 - beta)  # f_n = r f_(n-1) + beta, f_0 = 0
        want = beta * -np.expm1(writes * np.log(r)) / (1 - r) if r > 0 else beta
        if tiny and (hint or abs(float(got) - want) > 1e-6 * abs(want)):
            return _FLOAT32.format(where, np.asarray(got).dtype, f"beta = {beta}")
        if hint:
            return hint
        if abs(float(got) - want) > 1e-6 * abs(want):
            if alpha == 1.0:
                return (f"wrong {where} (no decay): each write multiplies the error on the "
                        "written key by (1 - beta); an empty memory starts at error -v")
            return (f"wrong {where}: how does one decay-then-write step map the recalled "
                    "fraction f to the next one?")
    return None


_SWEEPS = ((0.6, 1, 3), (-0.3, 2, 5), (0.9, 5, 4), (0.0, 3, 2), (0.97, 40, 6),
           (1 - 1e-9, 10**9, 3))


@checker("01.2")
def two_key_sweeps(answer, **_):
    """``answer(c, v1, v2, sweeps) -> e1 [V]``: the recall error ``S^T k_1 - v_1`` of the first
    of two pairs (unit keys with overlap ``c = k_1 . k_2``, values ``v1, v2 [V]``) after
    ``sweeps`` one-pass sweeps (beta = 1, pair 1 then pair 2, from ``S = 0``). The reference is
    float64 simulation for small counts, the recurrence e_1 -> c^2 e_1 for 10^9 sweeps."""
    rng = np.random.default_rng(12)
    for c, sweeps, V in _SWEEPS:
        v1, v2 = rng.standard_normal(V), rng.standard_normal(V)
        got, hint = _call(answer, c, v1, v2, sweeps, name="first_pair_error(c, v1, v2, sweeps)")
        tiny = hint is None and 1 - abs(c) < 1e-6 and _low_precision(got) and np.shape(got) == (V,)
        hint = hint or refuse_degenerate(
            got, shape=(V,), inputs=(v1, v2), what="the error", allow_zeros=c == 0.0
        )
        if hint and not tiny:
            return hint
        keys = np.array([[1.0, 0.0], [c, np.sqrt(1 - c * c)]])
        S = np.zeros((2, V))
        for _ in range(min(sweeps, 1)):  # the first sweep simulated, then e_1 -> c^2 e_1
            for k, v in zip(keys, (v1, v2), strict=True):
                S = S + np.outer(k, v - k @ S)
        want = (keys[0] @ S - v1) * np.exp(2 * (sweeps - 1) * np.log(abs(c))) if c else (
            keys[0] @ S - v1)
        if sweeps <= 40:  # small counts: the simulation itself
            S = np.zeros((2, V))
            for _ in range(sweeps):
                for k, v in zip(keys, (v1, v2), strict=True):
                    S = S + np.outer(k, v - k @ S)
            want = keys[0] @ S - v1
        if hint or np.abs(np.asarray(got, np.float64) - want).max() > 1e-6 * max(
                1.0, np.abs(want).max()):
            if tiny:
                return _FLOAT32.format(f"at c = {c}, sweeps = {sweeps}", np.asarray(got).dtype,
                                       "1 - c = 1e-9")
            return (
                f"wrong at c = {c}, sweeps = {sweeps}: follow both errors through one sweep "
                "with section 3's disturbance formula; how does e_1 change per sweep?"
            )
    return None
