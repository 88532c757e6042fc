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
