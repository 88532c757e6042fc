"""kda_lib.lab.rate_grid: the best rate strictly inside the grid, by extension past an edge."""

import math

import pytest

from kda_lib.lab.rate_grid import parse_grid, round_rate, tune_rate


def valley(best: float, calls: list):
    """A score lowest at ``best`` (log-distance), recording every rate it is asked for."""

    def score(rate: float) -> float:
        calls.append(rate)
        return abs(math.log(rate / best))

    return score


def test_an_inside_best_needs_no_extension():
    calls = []
    grid = tune_rate(valley(0.003, calls), [0.01, 0.001, 0.003], factor=3, max_extensions=2)
    assert grid["rates"] == [0.001, 0.003, 0.01] and grid["best"] == 0.003 and grid["inside"]
    assert grid["extensions"] == {"low": 0, "high": 0} and sorted(calls) == grid["rates"]
    assert grid["scores"] == [pytest.approx(abs(math.log(r / 0.003))) for r in grid["rates"]]


def test_an_edge_best_extends_the_grid_until_inside_each_rate_scored_once():
    calls = []
    grid = tune_rate(valley(0.05, calls), [0.001, 0.003, 0.01], factor=3, max_extensions=2)
    assert grid["rates"] == [0.001, 0.003, 0.01, 0.03, 0.09] and grid["best"] == 0.03
    assert grid["inside"] and grid["extensions"] == {"low": 0, "high": 2}
    assert calls == [0.001, 0.003, 0.01, 0.03, 0.09]  # in order, none twice
    low = tune_rate(valley(1e-4, []), [0.001, 0.003], factor=2, max_extensions=3)
    assert low["rates"][:3] == [0.000125, 0.00025, 0.0005] and not low["inside"]
    assert low["extensions"] == {"low": 3, "high": 0} and low["best"] == 0.000125


def test_no_extension_left_says_not_inside_and_nan_is_the_worst():
    grid = tune_rate(valley(1.0, []), [0.001, 0.01], factor=3, max_extensions=0)
    assert grid["best"] == 0.01 and not grid["inside"] and len(grid["rates"]) == 2

    def diverging(rate):  # the largest rate diverges: never the best
        return math.nan if rate >= 0.01 else -rate

    grid = tune_rate(diverging, [0.001, 0.003, 0.01], factor=3, max_extensions=1)
    assert grid["best"] == 0.003 and grid["inside"] and math.isnan(grid["scores"][-1])


def test_rates_round_to_three_digits_and_bad_grids_are_refused():
    assert round_rate(0.0030000001) == 0.003 and round_rate(0.01 / 3) == 0.00333
    assert parse_grid("0.01, 0.001,0.003") == [0.001, 0.003, 0.01]
    assert parse_grid([0.01, 0.0030000001]) == [0.003, 0.01]  # a grid parsed already
    for bad in ("", "0.01,x", "0.01,-1", "0,0.01", "nan", "0.003,0.0030001", [None], []):
        with pytest.raises(ValueError, match="grid"):
            parse_grid(bad)
    score = valley(0.003, [])
    with pytest.raises(ValueError, match="factor must be a number > 1"):
        tune_rate(score, [0.003], factor=1, max_extensions=1)
    with pytest.raises(ValueError, match="max_extensions must be an int >= 0"):
        tune_rate(score, [0.003], factor=3, max_extensions=-1)
    for grid in ([], [0.003, 0.003], [0.003, -1]):
        with pytest.raises(ValueError, match="grid must hold distinct rates > 0"):
            tune_rate(score, grid, factor=3, max_extensions=1)


def test_tuple_scores_compare_entry_by_entry_and_ties_go_to_the_smaller_rate():
    """The synthetic sweep's order: (not solved, steps to solve, -accuracy); an edge best
    extends the grid as a number score does."""
    runs = {
        0.001: (True, 0, -0.4),
        0.003: (False, 900, -0.99),
        0.01: (False, 500, -0.99),
        0.03: (False, 500, -0.98),
        0.1: (True, 0, -0.1),
    }
    grid = tune_rate(runs.__getitem__, [0.001, 0.003, 0.01], factor=3, max_extensions=1)
    assert grid["rates"] == [0.001, 0.003, 0.01, 0.03] and grid["best"] == 0.01
    assert grid["inside"] and grid["scores"][2] == (False, 500, -0.99)
