"""One rule for ordering results measured over seeds, used by notebooks 08 and 09.

Two sets of per-seed scores ``a`` and ``b`` (1-D, at least two seeds each) are *ordered* only
when the gap between their means exceeds both a floor ``min_gap`` (a difference too small to
matter for the question asked) and two standard errors of that gap,
``2 * sqrt(var(a) / n_a + var(b) / n_b)`` (sample variances, ``ddof=1``). Otherwise they are
*level*. With three seeds this is a demanding bar: a single stalled seed widens the spread
enough to make two mixers level, which is the point.
"""

from __future__ import annotations

import numpy as np

DEFAULT_MIN_GAP = 0.01


def _scores(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(
            f"{name} must be a 1-D sequence of at least two per-seed scores; got "
            f"shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite; got {array.tolist()}")
    return array


def threshold(a, b, min_gap: float = DEFAULT_MIN_GAP) -> float:
    """The smallest gap between the means of ``a`` and ``b`` that the rule calls real."""
    a, b = _scores("a", a), _scores("b", b)
    if not (isinstance(min_gap, (int, float)) and not isinstance(min_gap, bool) and min_gap >= 0):
        raise ValueError(f"min_gap must be a number >= 0; got {min_gap!r}")
    standard_error = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return float(max(min_gap, 2.0 * standard_error))


def ordering(a, b, min_gap: float = DEFAULT_MIN_GAP) -> str:
    """``">"`` when ``a``'s mean is above ``b``'s by more than :func:`threshold`, ``"<"`` when
    below, else ``"level"``. Whether higher is better (accuracy) or worse (bits per byte) is
    the caller's to say."""
    bar = threshold(a, b, min_gap)
    gap = float(np.mean(a) - np.mean(b))
    return "level" if abs(gap) <= bar else ">" if gap > 0 else "<"
