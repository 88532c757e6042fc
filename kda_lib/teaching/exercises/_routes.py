"""Checker helpers shared by notebooks 05-10: call a student's function while watching which
library code it runs, so an answer that hands the work to ``kda_lib`` is refused.

:func:`call_own_work` runs ``answer(*args)`` under a profile hook (every thread's) that
stops the answer at the first Python frame whose code lives in the ``kda_lib`` package (or in
tokamax or fla: :func:`~kda_lib.teaching.exercises.other_kda`; the
checkers' own reference functions included) outside the machinery that calls the answer;
``functools.partial``, ``jax.jit`` and lambdas around a library function all end in such a
frame, so they are refused too. :func:`modules_entered` watches for other code an exercise
rules out (JAX's autodiff, a matrix inverse).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import kda_lib
from kda_lib.teaching.exercises import (
    _WATCHED,
    HINTS,
    JAXPR_HINT,
    MACHINERY_CODE,
    _LibraryEntered,
    _retire_watched,
    call_answer,
    fresh_jax_context,
    holds_jaxpr,
    other_kda,
    watch_every_thread,
)

_LIBRARY = os.path.dirname(os.path.abspath(kda_lib.__file__)) + os.sep
_CHECKERS = os.path.join(_LIBRARY, "teaching", "exercises") + os.sep
# the machinery that calls the answer; the checkers (chNN.py) and their reference functions
# count as library code: an answer that calls them is refused
_MACHINERY = (_CHECKERS + "__init__.py", _CHECKERS + "_routes.py")


_KNOWN_FILES: dict[str, bool] = {}


def _is_library(filename: str) -> bool:
    """Whether ``filename`` (a code object's) is kda_lib's, the machinery excepted; remembered
    for absolute exact-``str`` names (a relative one resolves against the working directory)."""
    known = _KNOWN_FILES.get(filename) if type(filename) is str else None
    if known is None:
        path = os.path.abspath(filename)
        known = path.startswith(_LIBRARY) and path not in _MACHINERY
        if type(filename) is str and os.path.isabs(filename):
            _KNOWN_FILES[filename] = known
    return known


def call_own_work(
    answer: Any, *args: Any, name: str = "your function", allowed: tuple[str, ...] = ()
) -> tuple[Any, str | None]:
    """``(answer(*args), None)`` when ``answer`` ran without calling ``kda_lib`` (functions in
    modules whose dotted name ends with one of ``allowed`` excepted); else ``(None, hint)``
    (not callable, raised, or called the library: the call stops at the first library frame,
    as :func:`~kda_lib.teaching.exercises.library_calls` does)."""
    if holds_jaxpr(answer):
        return None, JAXPR_HINT.replace("your answer", name, 1)
    seen: list[str] = []

    def hook(frame, event, _arg):
        if (
            event == "call"
            and (_is_library(frame.f_code.co_filename)
                 or other_kda(frame.f_globals.get("__name__") or ""))
            and frame.f_code not in MACHINERY_CODE
        ):
            module = frame.f_globals.get("__name__", "")
            if not any(module.endswith(a) for a in allowed) and not seen:
                seen.append(f"{module}.{frame.f_code.co_name}")
                raise _LibraryEntered(module)

    try:
        # library_calls' context: a jitted library function compiled outside it traces again
        with watch_every_thread(hook, seen), fresh_jax_context(_WATCHED[0]):
            got, hint = call_answer(answer, *args, name=name)
    except _LibraryEntered:
        pass
    finally:
        if seen:
            _retire_watched()
    if seen and seen[0] in HINTS:
        return None, HINTS[seen[0]].replace("your answer", name, 1)
    if seen:
        return None, f"{name} calls kda_lib ({seen[0]}): derive it yourself, with numpy or math"
    return got, hint



@contextlib.contextmanager
def modules_entered(
    prefixes: tuple[str, ...], allowed: tuple[str, ...] = (), codes: frozenset = frozenset()
) -> Iterator[list[str]]:
    """While the block runs, record in the list yielded the first Python frame entered whose
    module's dotted name starts with one of ``prefixes`` (the machinery calling an answer
    excepted): e.g. ``("jax._src.interpreters.ad",)`` catches ``jax.grad``, ``jax.vjp`` and
    every other route through JAX's autodiff, ``("numpy.linalg",)`` ``np.linalg.inv``; the
    functions of those modules named in ``allowed`` (and what they call) are let through; a
    frame running one of ``codes`` (code objects) counts whatever its module. A trace hook
    (``sys.settrace``), so it runs beside :func:`call_own_work`'s profile hook; run the call in
    a :func:`fresh_jax_context` so a function jitted before is traced again."""
    seen: list[str] = []

    def trace(frame, _event, _arg):
        if not seen:
            module = frame.f_globals.get("__name__") or ""
            # (codes and ...): hashing a code object is dear, and this runs at every call
            if ((module.startswith(prefixes) or (codes and frame.f_code in codes))
                    and frame.f_code not in MACHINERY_CODE
                    and not frame.f_code.co_name.endswith("_dispatcher")):  # NumPy's relays
                caller = frame
                while caller is not None and not (  # an allowed function of those modules
                        caller.f_code.co_name in allowed
                        and (caller.f_globals.get("__name__") or "").startswith(prefixes)):
                    caller = caller.f_back
                if caller is None:
                    seen.append(f"{module}.{frame.f_code.co_name}")
        return None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield seen
    finally:
        sys.settrace(previous)
