"""Checkers of notebook 01's exercises (from linear attention to KDA).

Every answer is a small function, which the checker calls on inputs of its own (refusing any
that runs ``kda_lib`` code); it recomputes the expected result in float64 and returns a hint
that never contains the expected values. Both exercises ask for a closed form: the last trial
uses a count (``writes``, ``sweeps``) of 10^9, which a write-by-write loop does not finish
within ``TIME_LIMIT_S`` (the call is stopped there on the main thread, refused after it
elsewhere). Those trials use beta = 1e-9 (overlap 1 - 1e-9), below float32's resolution: a wrong
float32 or jax result there gets a hint about float64 instead of the generic refusal.

Repeated squaring of the transition (``np.linalg.matrix_power``, square-and-multiply on the
bits of the count) is fast but is not the asked closed form. The last value trials use counts
past 2^64 (2^100, 10^30: Python ints), where a closed form (``**``, ``exp``/``log``, even
``expm(n logm(M))``) still holds, at its limit in float64, while a loop over a fixed number of
the count's bits (a uint64 unpack) fails or is wrong. The stated rule "the same work at every
count" is enforced after the value trials (:func:`_rule_broken`), three ways: the count
is a :class:`Count`, an ``int`` that refuses to be taken apart bit by bit (``&``, ``>>``, ``%``,
``//``, ``divmod``, ``bit_length``); the Python lines the answer runs (library code included)
must not grow from a count of 1025 to 2^40 - 1, nor exceed ``_OWN_LINES_MAX`` in the answer's
own code (a loop of fixed length over the count's bits); and no jax code may run (the exercise
asks for NumPy float64). Call rules can be dodged (C calls such as ``itertools.accumulate``
over ``matrix_power``, code compiled under a library's filename), so the last trial of each
exercise asks for a value only the closed form gives: the limit, a count of ``math.inf``, which
a power of a matrix or a loop over the count's bits has no way to take.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import sysconfig
import threading
import time

import numpy as np

from kda_lib.teaching.exercises import (
    ANSWER_RUNNING,
    MACHINERY_CODE,
    again,
    call_answer,
    checker,
    machinery,
    refuse_degenerate,
    seeded,
)

TIME_LIMIT_S = 2.0
_SLOW = (
    "your function took over {:.0f} s at a count of 10^9: a simulation, write by write, "
    "cannot get there; derive the closed form"
)


class _TooSlow(BaseException):
    """Raised into a slow answer (a BaseException: an answer's ``except Exception`` inside its
    loop does not swallow it)."""


_TEACHING = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RETRY_S = 0.05  # SIGALRM repeats this often until the block ends


@machinery
def _stop(_signum, frame):
    # raised into the answer while it runs, never into the checkers' own code (setting up or
    # letting go of the watch); Python drops an exception raised in a finaliser or a weakref
    # callback (it prints it and goes on), so the stop comes again while the answer runs on
    if not ANSWER_RUNNING or frame is None or frame.f_code in MACHINERY_CODE or (
            frame.f_code.co_filename.startswith(_TEACHING)):
        return
    raise _TooSlow(_SLOW.format(TIME_LIMIT_S))


@contextlib.contextmanager
def _time_limit(seconds: float = TIME_LIMIT_S):
    """Stop the block after ``seconds`` with SIGALRM, raising :class:`_TooSlow` into the answer
    (main thread only) and again every ``_RETRY_S`` while it runs on, restoring any timer set
    around it (a test's own limit) with the time it has left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _stop)
    outer, outer_every = signal.setitimer(signal.ITIMER_REAL, seconds, _RETRY_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # re-arm the outer timer with what it had left (at least a moment)
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3),
                             outer_every)


def _call(answer, *args, name):
    """``call_answer`` (own code only) under the time limit; a slow call is refused."""
    start = time.monotonic()
    try:
        with _time_limit(TIME_LIMIT_S):  # read at each call (a test may lower it)
            got, hint = call_answer(answer, *args, name=name, own_code=True)
    except _TooSlow:
        return None, _SLOW.format(TIME_LIMIT_S)
    if hint is None and time.monotonic() - start > TIME_LIMIT_S:
        return None, _SLOW.format(TIME_LIMIT_S)
    return got, hint


_BITWISE = ("the count is not taken apart bit by bit here (a closed form has no use for its "
            "bits): repeated squaring is not the closed form; derive the formula")


class Count(int):
    """A count (``writes``, ``sweeps``) that works in arithmetic and as an exponent but refuses
    the operations repeated squaring runs on it (``n & 1``, ``n >> 1``, ``n % 2``, ``n // 2``,
    ``divmod(n, 2)``, ``n.bit_length()``): each raises a TypeError naming the rule."""

    def _refuse(self, *_):
        raise TypeError(_BITWISE)

    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _refuse
    __rshift__ = __rrshift__ = __lshift__ = __rlshift__ = _refuse
    __mod__ = __rmod__ = __floordiv__ = __rfloordiv__ = __divmod__ = __rdivmod__ = _refuse
    bit_length = bit_count = to_bytes = _refuse


machinery(Count._refuse)
_RULE_COUNTS = (1025, 2**40 - 1)  # 11 and 40 bits: squaring loops run 29 rounds more
_RULE_SLACK = 8  # lines a closed form may add between them (a branch on the count)
_JAX = "the exercise asks for NumPy float64 (no jax): write the closed form with NumPy"


_PACKAGE = "kda_lib.teaching.exercises"
_LIBRARY_PATHS = tuple(
    {f(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")
     for f in (str, os.path.realpath)}
) + ("<frozen", os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
_OWN_LINES_MAX = 32  # a closed form is a few lines of arithmetic, not a loop of them
_HUGE = 2**64  # counts from here on are past any fixed-width (uint64) unpack of the bits
_PAST_64_BITS = ("{} at {} = {} (a Python int past 64 bits): a closed form (** or exp/log) "
                 "holds at every count; a loop over a fixed number of the count's bits "
                 "does not. Derive the formula")
_LABELS = {2**100: "2^100", 10**30: "10^30"}
_LIMIT = ("{} at {} = math.inf, the limit after infinitely many: the closed form has a value "
          "there (x**inf = 0 for |x| < 1); repeated squaring, or a loop over the count's "
          "bits, has no infinite count. Derive the formula")


@machinery
def _from_machinery(frame) -> bool:
    """Whether the first caller of ``frame`` outside jax and contextlib is the checkers' own
    code (``call_answer``'s fresh jax context), not the answer."""
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module.split(".")[0] not in ("jax", "jaxlib", "contextlib"):
            return module.startswith(_PACKAGE) or frame.f_code in MACHINERY_CODE
        frame = frame.f_back
    return False


@machinery
def _lines_run(answer, *args, name):
    """``(line events, jax entered, hint)`` of one call of ``answer`` (every Python frame it
    runs, library code included; the checker's own frames excepted)."""
    lines, jax_seen = [0, 0], []  # all lines, the answer's own lines (not library code)

    def local(frame, event, _arg):
        if event == "line":
            lines[0] += 1
            lines[1] += not frame.f_code.co_filename.startswith(_LIBRARY_PATHS)
        return local

    def trace(frame, event, _arg):
        module = frame.f_globals.get("__name__") or ""
        if frame.f_code in MACHINERY_CODE or module.startswith(_PACKAGE):
            return None
        if module.split(".")[0] in ("jax", "jaxlib") and not _from_machinery(frame):
            jax_seen.append(module)
        return local

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        _, hint = _call(answer, *args, name=name)
    finally:
        sys.settrace(previous)
    return lines, bool(jax_seen), hint


def _rule_broken(answer, make_args, name) -> str | None:
    """A hint if ``answer`` runs jax, or runs more Python lines at a count of 2^40 - 1 than at
    1025 (``make_args(count)`` builds the arguments); each count is called once untraced
    first."""
    counts = []
    for count in _RULE_COUNTS:
        args = make_args(Count(count))
        _call(answer, *args, name=name)  # warm: first-call work (imports, caches) not counted
        lines, jax_seen, hint = _lines_run(answer, *args, name=name)
        if jax_seen:
            return _JAX
        if hint:
            return hint
        if lines[1] > _OWN_LINES_MAX:
            return (f"your own code ran {lines[1]} lines in one call (a loop?): a closed form "
                    "is a few lines of arithmetic, the same at every count")
        counts.append(lines[0])
    if counts[1] > counts[0] + _RULE_SLACK:
        return (f"your function runs {counts[0]} Python lines at a count of {_RULE_COUNTS[0]} "
                f"and {counts[1]} at 2^40 - 1: its work grows with the count (repeated "
                "squaring, e.g. np.linalg.matrix_power?); a closed form does the same work at "
                "every count")
    return None


def _low_precision(got) -> bool:
    """Whether ``got`` is floats narrower than float64 or a jax array of floats."""
    try:
        dtype = np.asarray(got).dtype
    except Exception:  # noqa: BLE001 - the shared refusals name what is wrong
        return False
    from_jax = type(got).__module__.split(".")[0] in ("jax", "jaxlib")
    return dtype.kind == "f" and (dtype.itemsize < 8 or from_jax)


def _rtol(got) -> float:
    """The relative tolerance away from the float64-only cases: float32's rounding over up to
    80 multiplications (about 5e-6) passes, a wrong exponent (a factor mu or r) does not."""
    return 2e-5 if _low_precision(got) else 1e-6


_FLOAT32 = ("wrong {} in {}: {} is below float32's resolution (1 - 1e-9 rounds to 1); "
            "compute the closed form in NumPy float64")


def _writes(rng):
    """(beta, alpha, writes) drawn from ``rng``: no decay, decay, beta = 1, a longer run, a tiny
    beta over 10^9 writes (twice), then counts past 2^64 (the limit beta / (1 - r), in float64)
    and ``math.inf``."""
    def beta():
        return round(float(rng.uniform(0.1, 0.9)), 3)

    def alpha():
        return round(float(rng.uniform(0.7, 0.99)), 3)

    def tiny():
        return round(float(rng.uniform(0.5, 3.0)), 3) * 1e-9

    return ((beta(), 1.0, int(rng.integers(2, 10))), (beta(), alpha(), int(rng.integers(1, 10))),
            (1.0, alpha(), int(rng.integers(2, 10))), (beta(), alpha(), int(rng.integers(10, 60))),
            (tiny(), 1.0, 10**9), (tiny(), 1 - 1e-9, 10**9), (beta(), alpha(), 10**30),
            (tiny(), 1.0, 2**100), (beta(), alpha(), math.inf))


@checker("01.1")
def gated_partial_writes(answer, *, seed=None):
    """``answer(beta, alpha, writes)``: the fraction of ``v`` an empty memory returns for the
    unit key ``k`` after ``writes`` gated delta-rule writes of the same pair (decay the state
    by ``alpha``, then write with strength ``beta``); the checker tries arguments drawn at
    each call (``seed`` repeats a call)."""
    seed, rng = seeded(seed)
    hint = _writes_hint(answer, _writes(rng))
    return hint and hint + again(seed)


def _writes_hint(answer, trials) -> str | None:
    for beta, alpha, writes in trials:
        got, hint = _call(answer, beta, alpha, writes,
                          name="recalled_fraction(beta, alpha, writes)")
        where = f"at beta = {beta}, alpha = {alpha}, writes = {writes}"
        tiny = hint is None and beta < 1e-6 and _low_precision(got) and np.shape(got) == ()
        hint = hint or refuse_degenerate(got, shape=(), what="the fraction")
        r = alpha * (1 - beta)  # f_n = r f_(n-1) + beta, f_0 = 0
        want = beta * -np.expm1(writes * np.log(r)) / (1 - r) if r > 0 else beta
        if tiny and (hint or abs(float(got) - want) > 1e-6 * abs(want)):
            return _FLOAT32.format(where, np.asarray(got).dtype, f"beta = {beta}")
        if writes >= _HUGE and (hint or abs(float(got) - want) > 1e-6 * abs(want)):
            return (_LIMIT if writes == math.inf else _PAST_64_BITS).format(
                "failed" if hint else "wrong", "writes", _LABELS.get(writes))
        if hint:
            return hint
        if abs(float(got) - want) > _rtol(got) * abs(want):
            if alpha == 1.0:
                return (f"wrong {where} (no decay): each write multiplies the error on the "
                        "written key by (1 - beta); an empty memory starts at error -v")
            return (f"wrong {where}: how does one decay-then-write step map the recalled "
                    "fraction f to the next one?")
    return _rule_broken(answer, lambda n: (0.6, 0.7, n), "recalled_fraction(beta, alpha, writes)")


def _sweeps(rng):
    """(mu, sweeps, V) drawn from ``rng``: a few sweeps (mu > 0, < 0, 0, near 1), mu = 1 - 1e-9
    over 10^9 sweeps, mu = 1 over 2^100, then 10^30 and ``math.inf`` (the last two: 0, the
    limit)."""
    def mu(low, high):
        return round(float(rng.uniform(low, high)), 3)

    def width():
        return int(rng.integers(2, 7))

    return ((mu(0.3, 0.9), int(rng.integers(1, 4)), width()),
            (-mu(0.2, 0.8), int(rng.integers(2, 6)), width()),
            (mu(0.8, 0.95), int(rng.integers(3, 7)), width()),
            (0.0, int(rng.integers(2, 5)), width()),
            (mu(0.95, 0.99), int(rng.integers(20, 41)), width()), (1 - 1e-9, 10**9, width()),
            (1.0, 2**100, width()), (mu(0.3, 0.9), 10**30, width()),
            (-mu(0.3, 0.9), math.inf, width()))


_NAME_2 = "first_pair_error(mu, v1, v2, sweeps)"


@checker("01.2")
def two_key_sweeps(answer, *, seed=None):
    """``answer(mu, v1, v2, sweeps) -> [V]``: the recall error ``S^T k_1 - v_1`` of the first
    of two pairs (unit keys with overlap ``mu = k_1 . k_2``, values ``v1, v2 [V]``) after
    ``sweeps`` one-pass sweeps (beta = 1, pair 1 then pair 2, from ``S = 0``). The reference is
    float64 simulation for small counts, the recurrence err_1 -> mu^2 err_1 for 10^9 sweeps;
    the arguments are drawn at each call (``seed`` repeats a call)."""
    seed, rng = seeded(seed)
    hint = _sweeps_hint(answer, rng)
    return hint and hint + again(seed)


def _sweeps_hint(answer, rng) -> str | None:
    for mu, sweeps, V in _sweeps(rng):
        v1, v2 = rng.standard_normal(V), rng.standard_normal(V)
        got, hint = _call(answer, mu, v1, v2, sweeps, name=_NAME_2)
        tiny = hint is None and 1 - abs(mu) < 1e-6 and _low_precision(got) and np.shape(got) == (V,)
        hint = hint or refuse_degenerate(
            got, shape=(V,), inputs=(v1, v2), what="the error",
            allow_zeros=mu == 0.0 or (sweeps >= _HUGE and abs(mu) < 1))
        if hint and not tiny and sweeps >= _HUGE:
            return (_LIMIT if sweeps == math.inf else _PAST_64_BITS).format(
                "failed", "sweeps", _LABELS.get(sweeps))
        if hint and not tiny:
            return hint
        keys = np.array([[1.0, 0.0], [mu, np.sqrt(1 - mu * mu)]])
        S = np.zeros((2, V))
        for _ in range(min(sweeps, 1)):  # the first sweep simulated, then err_1 -> mu^2 err_1
            for k, v in zip(keys, (v1, v2), strict=True):
                S = S + np.outer(k, v - k @ S)
        want = (keys[0] @ S - v1) * np.exp(2 * (sweeps - 1) * np.log(abs(mu))) if mu else (
            keys[0] @ S - v1)
        if sweeps <= 40:  # small counts: the simulation itself
            S = np.zeros((2, V))
            for _ in range(sweeps):
                for k, v in zip(keys, (v1, v2), strict=True):
                    S = S + np.outer(k, v - k @ S)
            want = keys[0] @ S - v1
        if hint or np.abs(np.asarray(got, np.float64) - want).max() > _rtol(got) * max(
                1.0, np.abs(want).max()):
            if tiny:
                return _FLOAT32.format(f"at mu = {mu}, sweeps = {sweeps}", np.asarray(got).dtype,
                                       "1 - mu = 1e-9")
            if sweeps >= _HUGE:
                return (_LIMIT if sweeps == math.inf else _PAST_64_BITS).format(
                    "wrong", "sweeps", _LABELS.get(sweeps))
            return (
                f"wrong at mu = {mu}, sweeps = {sweeps}: follow both errors through one sweep "
                "with section 3's disturbance formula; how does pair 1's error change per sweep?"
            )
    v1, v2 = rng.standard_normal(3), rng.standard_normal(3)
    return _rule_broken(answer, lambda n: (0.6, v1, v2, n), _NAME_2)
