"""Exercise checkers: say whether a student's answer is right without printing the answer.

Each notebook's exercises leave an answer cell for the student (``answer = None`` to start) and
call ``check("03.2", answer, ...)``. A checker lives in ``kda_lib/teaching/exercises/chNN.py`` (one
module per notebook), registered with ``@checker("NN.M")``; it recomputes what it needs from
the arguments the notebook passes and returns ``None`` when the answer is right or a short hint
(never the expected value) when it is not. Worked solutions are in ``notebooks/solutions/``
(plain Python, one module per notebook), where a student goes after trying; the test suite
(``tests/teaching/test_exercises.py``) feeds every solution to its checker and asserts it passes,
and a
wrong answer to it and asserts it fails.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_CHECKERS: dict[str, Callable[..., str | None]] = {}


def checker(exercise_id: str) -> Callable[[Callable[..., str | None]], Callable[..., str | None]]:
    """Register ``fn(answer, **context) -> None | hint`` as the checker of ``exercise_id``
    ("NN.M": notebook NN, exercise M)."""

    def register(fn: Callable[..., str | None]) -> Callable[..., str | None]:
        if exercise_id in _CHECKERS:
            raise ValueError(f"exercise {exercise_id!r} has two checkers")
        _CHECKERS[exercise_id] = fn
        return fn

    return register


def _checker_for(exercise_id: str) -> Callable[..., str | None]:
    chapter = exercise_id.split(".")[0]
    if not (isinstance(exercise_id, str) and chapter.isdigit() and len(chapter) == 2):
        raise ValueError(f"exercise_id must look like 'NN.M', got {exercise_id!r}")
    try:
        importlib.import_module(f"{__name__}.ch{chapter}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.ch{chapter}":  # a missing import inside the chapter
            raise
        raise ValueError(
            f"no exercises for notebook {chapter} (exercise_id {exercise_id!r})"
        ) from err
    if exercise_id not in _CHECKERS:
        raise ValueError(f"no exercise {exercise_id!r}; known: {sorted(_CHECKERS)}")
    return _CHECKERS[exercise_id]


def verdict(exercise_id: str, answer: Any, **context: Any) -> str | None:
    """``None`` if ``answer`` solves ``exercise_id``, else a hint; raises if it was not tried
    (``answer is None``). The tests call this; notebooks call :func:`check`."""
    fn = _checker_for(exercise_id)
    if answer is None:
        raise ValueError(f"exercise {exercise_id}: no answer given")
    return fn(answer, **context)


def check(exercise_id: str, answer: Any, **context: Any) -> bool | None:
    """Print whether ``answer`` solves ``exercise_id``: ``True`` right, ``False`` wrong (with a
    hint), ``None`` not tried yet (``answer is None``). Never prints the expected answer."""
    fn = _checker_for(exercise_id)
    if answer is None:
        print(f"exercise {exercise_id}: not tried yet (replace None with your answer)")
        return None
    hint = fn(answer, **context)
    print(f"exercise {exercise_id}: " + ("right" if hint is None else f"not yet: {hint}"))
    return hint is None
