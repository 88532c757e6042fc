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
