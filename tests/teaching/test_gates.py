"""Notebook 02's figures and gate explorer (``kda_lib.teaching.gates``): the rows' order, the
halving tokens the explorer sorts by, and sliders that hold every default explore() takes."""

from __future__ import annotations

import jax
import matplotlib
import numpy as np
import pytest

from kda_lib.teaching import gates

matplotlib.use("Agg")


def _rows(figure) -> np.ndarray:
    """The first panel's image, one row per channel as drawn (top first)."""
    return np.asarray(figure.axes[0].images[0].get_array())


def test_rows_are_sorted_by_memory_ties_by_what_is_kept_at_the_end():
    g = np.full((8, 4), -0.05)
    g[:, 1], g[:, 2] = -0.5, -0.01  # channel 2 keeps most, channel 1 least
    g[-1, 3] = -0.3  # channel 3 ties channel 0's memory but keeps less at the last token
    figure = gates.plot_cumulative_decay([("", g, np.array([5.0, 1.0, 9.0, 5.0]))], floor=-6.0,
                                         title="")
    kept = np.cumsum(g, axis=0).T / np.log(10)
    np.testing.assert_allclose(_rows(figure), kept[[2, 0, 3, 1]])


def test_the_explorer_sorts_by_the_token_at_which_each_channel_halved():
    """Channels sharing a, b and g_min differ only by the random input: the explorer sorts them by
    the first token at which each keeps half or less (teacher 2026-12-06, 12), not by a rate."""
    f = 0.5 * jax.random.normal(jax.random.key(0), (1, 48, 1, 16))
    seen = gates.measure(f, a_log=0.5, dt_bias_value=-3.0, bound=-5.0)
    kept = np.cumsum(seen["g"], axis=0)
    first = np.array([np.argmax(kept[:, c] <= -np.log(2)) + 1 for c in range(16)], float)
    first[(kept > -np.log(2)).all(axis=0)] = np.inf
    np.testing.assert_array_equal(seen["halved"], first)
    assert seen["measured"] == np.median(first) and np.isfinite(first).sum() > 8
    figure = gates.plot_cumulative_decay([("", seen["g"], seen["halved"])], floor=-6.0, title="")
    drawn_first = [np.argmax(row <= -np.log(2) / np.log(10)) + 1 for row in _rows(figure)]
    assert drawn_first == sorted(drawn_first, reverse=True)


@pytest.mark.parametrize("bound", [-5.0, -0.05, -0.005])
def test_sliders_hold_every_bound_kda_gate_takes(bound, monkeypatch):
    """A lower_bound in (-0.1, 0) was clamped by the slider to -0.1, which tripped explore()'s
    check of the sliders against the defaults (teacher 2026-12-06, 16)."""
    widgets = pytest.importorskip("ipywidgets")
    display = pytest.importorskip("IPython.display")
    shown = []
    monkeypatch.setattr(display, "display", shown.append)
    f = jax.random.normal(jax.random.key(1), (1, 24, 1, 8))
    defaults = dict(a_log=0.5, dt_bias_value=-3.0, bound=bound, gate="safe")
    seen = gates.explore(dict(f_head=f, floor=-6.0), defaults, interactive=True)
    (box,) = shown
    sliders = [w for row in box.children[:2] for w in row.children]
    assert isinstance(box, widgets.VBox) and [w.value for w in sliders] == [*defaults.values()]
    assert seen["rate_at_zero"] > 0
