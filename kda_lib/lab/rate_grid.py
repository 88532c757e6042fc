"""Choosing a learning rate on validation: a grid whose best rate lies strictly inside.

:func:`tune_rate` scores each rate of a starting grid through a callable (one training run per
rate, scored on validation only: the caller never hands it a test score); lower is better,
e.g. validation bits per byte, and a NaN score (a diverged run) counts as the worst; a tuple
score is compared entry by entry (e.g. ``(not solved, steps to solve, -accuracy)``). When the
best rate is the smallest or the largest tried, one rate a ``factor`` beyond that edge is added
and scored, up to ``max_extensions`` times per side, so the chosen rate is a minimum the grid
brackets; when the extensions run out first, the result says so (``inside`` False) rather than
pretending. Rates are rounded to 3 significant digits (:func:`round_rate`), so a rate reached
by extension names the same run in every process that reaches it (a resumed or a concurrent
one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kda_lib.checks import check_int, is_number


def round_rate(rate: float) -> float:
    """``rate`` to 3 significant digits (``0.0030000001`` -> ``0.003``)."""
    return float(f"{rate:.3g}")


def parse_grid(text: str | list[float]) -> list[float]:
    """``"0.001,0.003,0.01"`` (or a list of rates, e.g. one parsed already) -> the rates,
    rounded (:func:`round_rate`) and sorted.

    Raises:
      ValueError: an entry that is not a number > 0, or two entries that round alike.
    """
    entries = text if isinstance(text, (list, tuple)) else str(text).split(",")
    try:
        rates = [float(x) for x in entries]
    except (TypeError, ValueError):
        raise ValueError(f"grid must be rates > 0, comma-separated; got {text!r}") from None
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"grid must be rates > 0, comma-separated; got {text!r}")
    rounded = sorted(round_rate(r) for r in rates)
    if len(set(rounded)) < len(rounded):
        raise ValueError(f"grid names a rate twice (to 3 significant digits): {text!r}")
    return rounded


def add_grid_arguments(parser, unit: str) -> None:
    """``--grid``, ``--grid-factor`` and ``--max-extensions`` on ``parser`` (argparse), for a
    record script that tunes one rate per ``unit`` (e.g. ``"model"``)."""
    parser.add_argument("--grid", default="0.001,0.003,0.01", help=f"starting rates (each {unit})")
    parser.add_argument("--grid-factor", type=float, default=3.0, help="an extension's factor")
    parser.add_argument("--max-extensions", type=int, default=2, help="per side of the grid")


def _worst_if_nan(score):
    return math.inf if isinstance(score, float) and math.isnan(score) else score


def tune_rate(
    score: Callable[[float], float | tuple],
    grid: Sequence[float],
    *,
    factor: float,
    max_extensions: int,
) -> dict:
    """The rate of ``grid`` (extended past an edge best) with the lowest ``score(rate)``.

    Args:
      score: ``rate -> number`` or a tuple compared in order, lower is better (a validation
        score); called once per rate.
      grid: the starting rates (> 0; rounded by :func:`round_rate`).
      factor: an extension multiplies the largest (divides the smallest) rate by it; > 1.
      max_extensions: extensions allowed per side; >= 0.

    Returns:
      ``{"rates": sorted rates tried, "scores": their scores, "best": the best rate (ties go to
      the smaller), "inside": whether it lies strictly between the smallest and the largest
      rate tried, "extensions": {"low": n, "high": n}}``.
    """
    if not (is_number(factor) and factor > 1):
        raise ValueError(f"factor must be a number > 1, got {factor!r}")
    check_int("max_extensions", max_extensions, 0)
    rates = sorted({round_rate(r) for r in grid if is_number(r) and r > 0})
    if not rates or len(rates) != len(grid):
        raise ValueError(f"grid must hold distinct rates > 0, got {list(grid)!r}")
    scores: dict[float, float] = {}
    extensions = {"low": 0, "high": 0}
    while True:
        for rate in rates:
            if rate not in scores:
                value = score(rate)
                scores[rate] = value if isinstance(value, tuple) else float(value)
        best = min(rates, key=lambda r: _worst_if_nan(scores[r]))
        if best == rates[0] and extensions["low"] < max_extensions:
            rates.insert(0, round_rate(best / factor))
            extensions["low"] += 1
        elif best == rates[-1] and extensions["high"] < max_extensions:
            rates.append(round_rate(best * factor))
            extensions["high"] += 1
        else:
            break
    return dict(
        rates=rates,
        scores=[scores[r] for r in rates],
        best=best,
        inside=rates[0] < best < rates[-1],
        extensions=extensions,
    )
