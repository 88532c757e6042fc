"""Every exercise's worked solution (``notebooks/solutions/chNN.py``) passes its checker
(``kda_lib.teaching.exercises``), a wrong answer fails it, and every checker has a solution.

A solutions module defines ``cases()``: a list of ``(exercise_id, answer, context, wrong)``,
``context`` being the keyword arguments the notebook passes to ``check``.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib

import pytest

from kda_lib.teaching import exercises

SOLUTIONS = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "solutions"


def _load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"solutions_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULES = sorted(SOLUTIONS.glob("ch[0-9][0-9].py"))


@functools.cache
def _cases(path: pathlib.Path) -> list:
    """``path``'s cases, computed once per worker: the two tests below read the same ones (one
    xdist group, so one worker computes them)."""
    return _load(path).cases()


@pytest.mark.xdist_group("solutions")
@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_solutions_pass_and_wrong_answers_fail(path):
    cases = _cases(path)
    assert cases, f"{path.name} has no cases"
    for exercise_id, answer, context, wrong in cases:
        assert exercise_id.startswith(path.stem[2:] + "."), (path.name, exercise_id)
        assert exercises.verdict(exercise_id, answer, **context) is None, exercise_id
        hint = exercises.verdict(exercise_id, wrong, **context)
        assert isinstance(hint, str) and hint, f"{exercise_id}: a wrong answer passed"


@pytest.mark.xdist_group("solutions")
def test_every_checker_has_a_solution():
    solved = {case[0] for path in MODULES for case in _cases(path)}
    for path in sorted((pathlib.Path(exercises.__file__).parent).glob("ch[0-9][0-9].py")):
        exercises._checker_for(f"{path.stem[2:]}.1")  # imports the chapter's checkers
    missing = sorted(set(exercises._CHECKERS) - solved)
    assert not missing, f"checkers without a worked solution: {missing}"


def test_check_reports_without_revealing(capsys):
    with pytest.raises(ValueError, match="exercise_id"):
        exercises.check("3.1", 1)
    with pytest.raises(ValueError, match="no exercises for notebook 99"):
        exercises.check("99.1", 1)
