"""kda_lib.teaching.viz.one_step, notebook 00's picture of one KDA step (teacher final s16, 00
defect 6): the state it draws last is the recurrence's next state, and it draws every move."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from kda_lib.teaching import viz  # noqa: E402


def test_one_step_draws_the_recurrences_next_state():
    rng = np.random.default_rng(0)
    state, v = rng.normal(size=(4, 6)), rng.normal(size=6)
    q, k = (x / np.linalg.norm(x) for x in rng.normal(size=(2, 4)))
    g, beta = -rng.uniform(0, 2, size=4), 0.7
    fig, new = viz.one_step(state, q, k, v, g, beta)
    decayed = np.exp(g)[:, None] * state
    want = (np.eye(4) - beta * np.outer(k, k)) @ decayed + beta * np.outer(k, v)
    np.testing.assert_allclose(new, want, atol=1e-12)
    titles = [ax.get_title() for ax in fig.axes]
    assert sum("decay" in t or "erase" in t or "write" in t or "read" in t for t in titles) == 4
    viz.plt.close(fig)


def test_one_step_scales_its_states_by_all_four_and_draws_a_zero_state():
    """Engineer s16, 1: the colour range covers every drawn state (S_t larger than S_{t-1} is not
    clipped), and a zero S_{t-1} (the first token) still has a range."""
    k = np.array([1.0, 0.0, 0.0])
    for state in (np.zeros((3, 2)), np.full((3, 2), 0.01)):
        fig, new = viz.one_step(state, k, k, np.array([4.0, -3.0]), np.zeros(3), 1.0)
        for image in [im for ax in fig.axes[:4] for im in ax.get_images()]:
            low, high = image.get_clim()
            assert low < 0 < high and max(-low, high) >= np.abs(new).max()
        viz.plt.close(fig)
