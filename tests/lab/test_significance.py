"""The one ordering rule of notebooks 08 and 09 (kda_lib.lab.significance)."""

import numpy as np
import pytest

from kda_lib.lab import significance


def test_threshold_is_two_standard_errors_of_the_gap_or_the_floor():
    a, b = np.array([0.9, 0.8, 0.7]), np.array([0.5, 0.5, 0.5])
    assert significance.threshold(a, b) == pytest.approx(2 * np.sqrt(0.01 / 3))
    assert significance.threshold(b, b + 0.0, min_gap=0.05) == 0.05


def test_ordering_by_the_rule():
    a = np.array([0.9, 0.8, 0.7])
    assert significance.ordering(a, a - 0.2) == ">"  # gap 0.2 > 2 * 0.0816
    assert significance.ordering(a - 0.2, a) == "<"
    assert significance.ordering(a, a - 0.1) == "level"  # gap 0.1 < 0.163
    assert significance.ordering([0.5, 0.5], [0.505, 0.505]) == "level"  # under the floor
    assert significance.ordering([0.5, 0.5], [0.52, 0.52]) == "<"


@pytest.mark.parametrize("bad", [[0.5], [[0.5, 0.5]], [0.5, float("nan")]])
def test_bad_scores_are_refused(bad):
    with pytest.raises(ValueError, match="a must be"):
        significance.ordering(bad, [0.1, 0.2])


def test_bad_floor_is_refused():
    with pytest.raises(ValueError, match="min_gap"):
        significance.threshold([0.1, 0.2], [0.1, 0.2], min_gap=-1)


@pytest.mark.parametrize("scale", [1.7e308, -1.7e308, 1e308, 1e-308])
def test_ordering_does_not_overflow_near_the_largest_float(scale):
    """Means and variances are taken in units of the largest score: scores near 1.7e308 order
    as their small counterparts do (they overflowed to inf/NaN before)."""
    a, b = [1.0 * scale, 0.99 * scale, 1.0 * scale], [0.5 * scale, 0.51 * scale, 0.5 * scale]
    small = significance.ordering([1.0, 0.99, 1.0], [0.5, 0.51, 0.5], min_gap=0.0)
    assert significance.ordering(a, b, min_gap=0.0) == (small if scale > 0 else {">": "<"}[small])
    assert significance.ordering(a, a, min_gap=0.0) == "level"
    assert np.isfinite(significance.threshold(a, b, min_gap=0.0))


@pytest.mark.parametrize(
    "scores", [["0.5", "0.6"], [True, False], [0.5, True], [0.5, "x"], [None, 0.5], "ab"]
)
def test_ordering_refuses_bools_and_strings_naming_the_argument(scores):
    with pytest.raises(TypeError, match="a must hold real numbers"):
        significance.ordering(scores, [0.1, 0.2])
    with pytest.raises(TypeError, match="b must hold real numbers"):
        significance.threshold([0.1, 0.2], scores)
