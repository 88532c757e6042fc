"""Exercise checkers: say whether a student's answer is right, never printing the answer.

``check("03.2", answer)`` runs ``chNN.py``'s ``@checker("NN.M")`` on inputs drawn at every call
(``seed`` repeats one) and returns ``None`` (right) or a hint (solutions: ``notebooks/solutions/``).
**Scope.** Feedback to an honest attempt: wrong answers and shortcuts taken without meaning to
cheat (the library function at issue, the page's values, another exercise's solution, a fit of
trials, degenerate values) are refused with a hint. Deliberate tampering (the library's or
checker's source under another name, other processes or threads, patching NumPy) is out of scope.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

_CHECKERS: dict[str, Callable[..., str | None]] = {}


def checker(exercise_id: str) -> Callable:
    """Register ``fn(answer, rng, **context) -> None | hint`` for ``exercise_id``, called as
    ``(answer, seed=None, **context)`` (``rng`` from ``seed``; a hint names the seed)."""
    def register(fn: Callable[..., str | None]) -> Callable[..., str | None]:
        if exercise_id in _CHECKERS:
            raise ValueError(f"exercise {exercise_id!r} has two checkers")

        @functools.wraps(fn)
        def drawn(answer, *, seed=None, **context):
            seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
            hint = fn(answer, np.random.default_rng(seed), **context)
            return hint and f"{hint} (these inputs again: check(..., seed={seed}))"

        _CHECKERS[exercise_id] = drawn
        return _CHECKERS[exercise_id]
    return register


def refuse_degenerate(answer: Any, *, shape: Sequence[int] | None = None,
                      inputs: Sequence[Any] = (), what: str = "the answer", integer: bool = False,
                      allow_zeros: bool = False, infinite: bool = False) -> str | None:
    """``None`` if ``answer`` is finite (or +inf, where ``infinite``) real numbers (whole where
    ``integer``) of ``shape``, not all zeros (unless ``allow_zeros``) nor one of ``inputs`` handed
    back; else a hint."""
    if answer is None or callable(answer) or isinstance(answer, (str, bytes, dict, set)):
        return f"{what} should be numbers (an array or a number), got {type(answer).__name__}" + (
            " (a missing return?)" if answer is None else "")
    try:
        values = np.asarray(answer)
        if values.dtype.kind == "O":
            values = values.astype(np.float64)
    except OverflowError:  # a Python int past float64's range
        return f"{what} is too large for a float64 (over 1.8e308)"
    except Exception:  # noqa: BLE001 - ragged lists, objects and the like
        return f"{what} should be numbers (an array or a number)"
    if values.dtype.kind not in "iuf":
        return f"{what} should be real numbers (ints or floats), got dtype {values.dtype}"
    if shape is not None and values.shape != tuple(shape):
        return f"{what} should have shape {tuple(shape)}, got {values.shape}"
    if not (np.isfinite(values) | (infinite & (values == np.inf))).all():
        return f"{what} has NaN or inf entries"
    if integer and not (values.dtype.kind in "iu" or (values == np.round(values)).all()):
        return f"{what} should be whole numbers"
    if not allow_zeros and values.size and not values.any():
        return f"{what} is all zeros"
    for given in inputs:
        if values.size > 1 and np.shape(given) == values.shape and np.array_equal(given, values):
            return f"{what} is one of the inputs handed back unchanged"
    return None


def parts(got, what: str, *refuse: dict) -> str | None:
    """A hint unless ``got`` has one part per ``refuse``, each passing its refuse_degenerate."""
    vector = isinstance(getattr(got, "shape", None), tuple) and len(got.shape) == 1
    if not ((isinstance(got, (tuple, list)) or vector) and len(got) == len(refuse)):
        return f"return {what}"
    hints = (refuse_degenerate(g, **r) for g, r in zip(got, refuse, strict=True))
    return next(filter(None, hints), None)


def close(got, want, rtol: float = 1e-6, floor: float = 1e-300) -> bool:
    """Whether ``got`` is ``want`` to ``rtol`` of max ``|want|`` (at least ``floor``)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max(initial=0.0)), floor)
    return bool(np.abs(got - want).max(initial=0.0) <= rtol * scale)


def slip(got, slips, *args, tol: float = 1e-3) -> str | None:
    """The hint of the first ``(wrong, hint)`` of ``slips`` whose ``wrong(*args)`` ``got`` is."""
    with np.errstate(all="ignore"):
        return next((h for wrong, h in slips if np.allclose(got, wrong(*args), tol, tol)), None)


def first_miss(answer, trials, name: str, want: Callable, equal: Callable | None = None,
               **refuse) -> tuple[str | None, tuple | None]:
    """``(hint, None)`` at the first failed or degenerate call, ``(None, (args, got, want))``
    at the first wrong value (``equal``, else ``==``), ``(None, None)`` when all are right."""
    for args in trials:
        got, hint = call_answer(answer, *args, name=name, refuse=refuse)
        if hint:
            return hint, None
        expected = want(*args)
        if not (equal(got, expected) if equal else got == expected):
            return None, (args, got, expected)
    return None, None


SCIPY = ("scipy", "jax.scipy", "jax._src.scipy")  # the statistics libraries some exercises refuse


@functools.cache
def _scipy_ufuncs() -> dict[int, str]:
    try:
        import scipy.special
    except ImportError:
        return {}
    return {id(f): f"scipy.special.{n}" for n, f in vars(scipy.special).items()
            if isinstance(f, np.ufunc)}


def holds_scipy(answer, depth: int = 3) -> str | None:
    """The scipy or jax.scipy function or module that ``answer`` holds (closures, globals,
    defaults, containers, partials; ``depth`` deep) or imports in its code, else ``None``."""
    todo, seen = [(answer, depth)], set()
    while todo:
        x, level = todo.pop()
        module = x.__name__ if isinstance(x, types.ModuleType) else getattr(x, "__module__", None)
        if hit := _scipy_ufuncs().get(id(x)) or (
                module if isinstance(module, str) and module.startswith(SCIPY) else None):
            return hit
        codes, stack = [], [getattr(x, "__code__", None)]
        while stack:  # the code and the code nested in it
            if isinstance(code := stack.pop(), types.CodeType):
                codes.append(code)
                stack += code.co_consts
        if any(n == "scipy" or n.startswith("scipy.") for c in codes for n in c.co_names):
            return "scipy"
        if level < 0 or id(x) in seen or isinstance(x, (str, bytes, np.ndarray)):
            continue
        seen.add(id(x))
        if isinstance(x, (dict, list, tuple, set, frozenset)):
            todo += [(y, level - 1) for y in list(x.values() if isinstance(x, dict) else x)[:64]]
        if isinstance(x, functools.partial):
            todo += [(y, level) for y in (x.func, *x.args, *x.keywords.values())]
        names = getattr(x, "__globals__", None) or {}
        todo += [(names[n], level - 1) for c in codes for n in c.co_names if n in names]
        todo += [(y, level - 1) for y in (getattr(x, "__defaults__", None) or ())]
        todo += [(y, level - 1) for y in (getattr(x, "__kwdefaults__", None) or {}).values()]
        for cell in getattr(x, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                todo.append((cell.cell_contents, level - 1))
    return None


OTHER_KDA = ("tokamax", "fla")  # the other KDA libraries installed beside kda_lib
_WATCHED = 1_000_001  # the JAX context answers run in (_fresh_jax_context)
_RUNNING: list = []  # the answer running under a time limit (the alarm stops only it)


@functools.cache  # the hook asks at every call
def _library(module: str, others: tuple[str, ...]) -> bool:
    """Whether ``module`` is kda_lib's (the chapters count, this file not) or ``others``'s."""
    top = module.split(".")[0]
    return (top == "kda_lib" and module != __name__) or top in others


class _Stop(BaseException):
    """Stops an answer (no ``Exception``: an answer's ``except Exception`` does not catch it)."""


MACHINERY: set = set()  # code an answer may run although it lives in a checker (a given helper)


def machinery(fn):
    """Marks a function a checker hands to the answer (its code and nested code)."""
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        MACHINERY.add(code)
        stack += [c for c in code.co_consts if isinstance(c, type(code))]
    return fn


@contextlib.contextmanager
def _fresh_jax_context() -> Iterator[None]:
    """A JAX context (``jax_xla_profile_version``, in every jit cache key) only answers run in:
    a library function jitted on the page traces again there, where the hook sees it."""
    jax = sys.modules.get("jax")
    if jax is None:  # nothing jitted yet
        yield
        return
    before = jax.config.jax_xla_profile_version
    jax.config.update("jax_xla_profile_version", _WATCHED)
    try:
        yield
    finally:
        jax.config.update("jax_xla_profile_version", before)


def _alarm(_signum, _frame):
    if _RUNNING:
        raise _Stop


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """SIGPROF after ``seconds`` of CPU time (not wall: load-proof), then every 50 ms; main
    thread only; an outer timer re-armed."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    start, previous = time.process_time(), signal.signal(signal.SIGPROF, _alarm)
    outer, outer_every = signal.setitimer(signal.ITIMER_PROF, seconds, 0.05)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        if outer:
            signal.setitimer(signal.ITIMER_PROF, max(outer - (time.process_time() - start), 1e-3),
                             outer_every)


def _allowed(frame, prefixes: tuple[str, ...], allowed: tuple[str, ...]) -> bool:
    """Whether ``frame`` (a refused module's) runs for an ``allowed`` name or a dispatcher."""
    while frame is not None and (frame.f_globals.get("__name__") or "").startswith(prefixes):
        name = frame.f_code.co_name
        if name in allowed or name.endswith("_dispatcher"):
            return True
        frame = frame.f_back
    return False


def call_answer(answer: Any, *args: Any, name: str = "your function",
                refused: dict[str, str] | None = None, allowed: tuple[str, ...] = (),
                limit_s: float | None = None, slow: str = "",
                refuse: dict | None = None) -> tuple[Any, str | None]:
    """``(answer(*args), None)``, or ``(None, hint)`` when ``answer`` is not callable, raises,
    runs kda_lib's, tokamax's, fla's or a ``refused`` module's code (``allowed`` names pass) or
    ``limit_s`` CPU seconds (hint ``slow``); ``(result, hint)`` when ``refuse`` refuses it."""
    if not callable(answer):
        return None, f"answer with a function {name}, not a {type(answer).__name__}"
    refused = refused or {}
    prefixes = tuple(refused)
    stopped: list[str] = []

    def hook(frame, event, _arg):
        if event != "call" or stopped or frame.f_code in MACHINERY:
            return
        module = frame.f_globals.get("__name__") or ""
        if _library(module, OTHER_KDA):
            stopped.append(f"{name} runs {module} (kda_lib's, tokamax's or fla's code): the "
                           "exercise asks you to write it yourself (NumPy or jnp)")
        elif prefixes and module.startswith(prefixes) and not _allowed(frame, prefixes, allowed):
            stopped.append(next(h for p, h in refused.items() if module.startswith(p)))
        if stopped:
            raise _Stop

    start, result, previous = time.process_time(), None, sys.getprofile()
    try:
        with _fresh_jax_context(), _time_limit(limit_s):
            _RUNNING.append(answer)
            sys.setprofile(hook)
            try:
                result = answer(*args)
            finally:
                sys.setprofile(previous)
                _RUNNING.pop()
    except _Stop:
        return None, stopped[0] if stopped else slow
    except Exception as error:  # noqa: BLE001 - a student's function may fail any way
        message = str(error).splitlines()[0][:120] if str(error) else ""
        return None, f"{name} raised {type(error).__name__}" + (f": {message}" if message else "")
    if limit_s is not None and time.process_time() - start > limit_s:
        return None, slow
    return result, None if refuse is None else refuse_degenerate(result, **refuse)


def _checker_for(exercise_id: str) -> Callable[..., str | None]:
    chapter = exercise_id.split(".")[0] if isinstance(exercise_id, str) else ""
    if not (chapter.isdigit() and len(chapter) == 2):
        raise ValueError(f"exercise_id must be a string like '03.2', got {exercise_id!r}")
    try:
        importlib.import_module(f"{__name__}.ch{chapter}")  # a chapter of this package only
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.ch{chapter}":  # a missing import inside the chapter
            raise
        raise ValueError(f"no exercises for notebook {chapter} ({exercise_id!r})") from err
    if exercise_id not in _CHECKERS:
        raise ValueError(f"no exercise {exercise_id!r}; known: {sorted(_CHECKERS)}")
    return _CHECKERS[exercise_id]


def verdict(exercise_id: str, answer: Any, **context: Any) -> str | None:
    """``None`` if ``answer`` solves ``exercise_id``, else a hint (the tests' :func:`check`)."""
    fn = _checker_for(exercise_id)
    if answer is None:
        raise ValueError(f"exercise {exercise_id}: no answer given")
    return fn(answer, **context)


def check(exercise_id: str, answer: Any, **context: Any) -> bool | None:
    """Print whether ``answer`` solves ``exercise_id`` (True, False with a hint, None untried)."""
    fn = _checker_for(exercise_id)
    hint = "" if answer is None else fn(answer, **context)
    print(f"exercise {exercise_id}: " + ("not tried yet (replace None with your answer)" if (
        answer is None) else "right" if hint is None else f"not yet: {hint}"))
    return None if answer is None else hint is None
