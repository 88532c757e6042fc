"""Red team rows for notebooks 04-07's checkers from the strict-teacher review B (2026-12-06):
each slip it found passing, or refused with a hint that blamed another mistake, is refused at
every seed tried with the hint that names it; and the layout rule of 04.1 as the page now states
it (the checker reads which slot holds which input, not how the ring was written).
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from kda_lib.teaching import exercises

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _solutions(chapter: str):
    path = ROOT / "notebooks" / "solutions" / f"ch{chapter}.py"
    spec = importlib.util.spec_from_file_location(f"_redteam_0407_ch{chapter}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unscored_included(seq_len, delay, conv_size, period):
    """06.3 with "scored" forgotten: positions t < delay listed too (defect 13)."""
    return [t for t in range(period, seq_len)
            if t - delay < t // period * period - (conv_size - 1)]


def states_per_key_head(b, h, hv, k, v, w, cb, n):
    """07.1 with a state per key head, H, not per value head, HV (defect 15)."""
    right = _solutions("07").layer_cache_bytes(b, h, hv, k, v, w, cb, n)
    return right + 4 * (n + 1) * b * (h - hv) * k * v


def decay_undone_first(state, k, v, g, beta, rejected):
    """07.2 with D_t undone before I - beta k k^T: M_t's factors in the wrong order (defect 16)."""
    state = np.asarray(state, np.float64)
    for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
        w = (state - beta[t] * np.outer(k[t], v[t])) / np.exp(g[t])[:, None]
        state = w + beta[t] / (1 - beta[t]) * np.outer(k[t], k[t] @ w)
    return state


@pytest.mark.parametrize(("exercise_id", "slip", "named", "seeds"), [
    ("06.3", unscored_included, "scored ones", range(40)),
    ("07.1", states_per_key_head, "per value head", range(40)),
    ("07.2", decay_undone_first, "undo the left factor", range(3)),
], ids=["06.3-unscored", "07.1-H-for-HV", "07.2-factor-order"])
def test_review_b_slips_are_refused_with_their_own_hint(exercise_id, slip, named, seeds):
    for seed in seeds:
        hint = exercises.verdict(exercise_id, slip, seed=seed)
        assert hint and named in hint, (exercise_id, seed, hint)


def test_06_3_draws_a_period_below_the_delay_and_the_solution_passes():
    """The slip above is caught by a drawn case with period < delay (and conv_size <= period + 1,
    so t in [period, delay) loses its token); the worked solution passes every seed tried."""
    right = _solutions("06").lost_positions
    assert all(exercises.verdict("06.3", right, seed=seed) is None for seed in range(40))


def test_04_1_a_ring_rebuilt_by_np_roll_in_the_same_layout_passes():
    """04.1's rule is the layout the checker reads (defect 12): rolling the whole ring to oldest
    first and back every step, slot ``start`` overwritten in effect, is a right answer."""
    def rebuilt(ring, start, xi_t, kernel):
        oldest_first = np.roll(np.asarray(ring), -start, axis=1)
        window = np.concatenate([oldest_first, np.asarray(xi_t)[:, None]], axis=1)
        conv_t = np.einsum("bwc,wc->bc", window, np.asarray(kernel))
        width = len(kernel) - 1
        return np.roll(window[:, 1:], start + 1, axis=1), (start + 1) % width, conv_t

    assert all(exercises.verdict("04.1", rebuilt, seed=seed) is None for seed in range(10))
