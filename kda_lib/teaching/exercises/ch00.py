"""Checkers of notebook 00's exercises (quick start).

Each checker recomputes the reference from the inputs the notebook passes (``q, k, g: [B, T, H,
K]``, ``v: [B, T, H, V]``, ``beta: [B, T, H]``) with :func:`kda_lib.kda_recurrent` and compares
the student's array with it; a hint never contains the expected values.
"""

from __future__ import annotations

import numpy as np

from kda_lib.ops.reference import kda_recurrent
from kda_lib.teaching.exercises import checker


def _mismatch(answer, expected, what: str) -> str | None:
    """None if ``answer`` matches ``expected`` to float32 rounding, else a hint naming ``what``."""
    answer = np.asarray(answer, np.float64)
    expected = np.asarray(expected, np.float64)
    if answer.shape != expected.shape:
        return f"{what} should have shape {expected.shape}, got {answer.shape}"
    if not np.isfinite(answer).all():
        return f"{what} has NaN or inf entries"
    scale = max(float(np.abs(expected).max()), 1.0)
    if np.abs(answer - expected).max() > 1e-4 * scale:
        return f"{what} differs from kda_recurrent's by more than float32 rounding"
    return None


@checker("00.1")
def chunk_size_16(answer, *, q, k, v, g, beta):
    """``answer``: the outputs ``[B, T, H, V]`` of ``kda_chunked(..., chunk_size=16)``."""
    return _mismatch(answer, kda_recurrent(q, k, v, g, beta)[0], "the outputs")


@checker("00.2")
def carried_state(answer, *, q, k, v, g, beta):
    """``answer``: outputs ``[B, T - T // 2, H, V]`` of the second half, run from the state
    after the first half."""
    half = q.shape[1] // 2
    expected = kda_recurrent(q, k, v, g, beta)[0][:, half:]
    hint = _mismatch(answer, expected, "the second half's outputs")
    if hint and np.shape(answer) == expected.shape:
        hint += " (did the run start from the first half's final state?)"
    return hint
