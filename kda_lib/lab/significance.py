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
    """``values`` as float64 per-seed scores: real numbers only (a bool or a string is a
    TypeError naming ``name``), 1-D, at least two, finite."""
    raw = np.asarray(values)
    # a list's own items: np.asarray would turn [1.0, True] into floats silently
    listed = list(values) if isinstance(values, (list, tuple)) else []
    loose = raw.ravel().tolist() if raw.dtype == object else []
    if (
        raw.dtype.kind not in "iufO"
        or any(isinstance(x, (bool, np.bool_, str, bytes)) for x in listed + loose)
        or not all(isinstance(x, (int, float, np.integer, np.floating)) for x in loose)
    ):
        raise TypeError(
            f"{name} must hold real numbers (per-seed scores; not bools or strings), got "
            f"{values!r:.80}"
        )
    array = raw.astype(np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(
            f"{name} must be a 1-D sequence of at least two per-seed scores; got "
            f"shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite; got {array.tolist()}")
    return array


def _scaled(a, b, min_gap):
    """``(a / s, b / s, min_gap / s, s)`` with ``s`` the largest magnitude (1 for all zeros):
    means and variances of scores near 1.7e308 would overflow to inf unscaled."""
    if not (isinstance(min_gap, (int, float)) and not isinstance(min_gap, bool) and min_gap >= 0):
        raise ValueError(f"min_gap must be a number >= 0; got {min_gap!r}")
    if not np.isfinite(min_gap):
        raise ValueError(f"min_gap must be finite; got {min_gap!r}")
    scale = float(max(np.abs(a).max(), np.abs(b).max())) or 1.0
    return a / scale, b / scale, min_gap / scale, scale


def _scaled_bar_and_gap(a, b, min_gap):
    a, b, gap_floor, scale = _scaled(_scores("a", a), _scores("b", b), min_gap)
    standard_error = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return max(gap_floor, 2.0 * standard_error), float(a.mean() - b.mean()), scale


def threshold(a, b, min_gap: float = DEFAULT_MIN_GAP) -> float:
    """The smallest gap between the means of ``a`` and ``b`` that the rule calls real (inf
    only when that gap itself exceeds the largest float)."""
    bar, _, scale = _scaled_bar_and_gap(a, b, min_gap)
    with np.errstate(over="ignore"):
        return float(np.float64(bar) * scale)


def ordering(a, b, min_gap: float = DEFAULT_MIN_GAP) -> str:
    """``">"`` when ``a``'s mean is above ``b``'s by more than :func:`threshold`, ``"<"`` when
    below, else ``"level"``. Whether higher is better (accuracy) or worse (bits per byte) is
    the caller's to say. Compared in units of the largest score, so no mean overflows."""
    bar, gap, _ = _scaled_bar_and_gap(a, b, min_gap)
    return "level" if abs(gap) <= bar else ">" if gap > 0 else "<"
