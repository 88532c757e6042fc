"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.norms import l2_normalize
from kda_lib.teaching import explain


def exercise_1(g=-0.01):
    """``exp(g t) = 1/2`` gives ``t = ln 2 / (-g)``: about 69.3 tokens at ``g = -0.01``."""
    return np.log(2) / -g


def exercise_2(lower_bound=-1.0):
    """The safe gate keeps ``g >= lower_bound``, so a token keeps at least ``exp(lower_bound)``
    of a channel and erases at most ``1 - exp(lower_bound)`` (0.632 at -1)."""
    return 1 - np.exp(lower_bound)


def exercise_3(q, k, g):
    """With beta = 1 and ``q_t = k_t`` (unit): ``S_t^T k_t = (1 - beta) (D_t S_{t-1})^T k_t +
    beta v_t = v_t``, so ``o_t = v_t`` and every row of the mixing matrix is one-hot."""
    return explain.kda_mixing_matrix(q, k, g, jnp.ones(q.shape[0]), scale=1.0)


def cases():
    keys = jax.random.split(jax.random.key(0), 2)
    k = l2_normalize(jax.random.normal(keys[0], (24, 16)))
    g = -0.1 * jax.random.uniform(keys[1], (24, 16))
    context = {"q": k, "k": k, "g": g}
    wrong_3 = explain.kda_mixing_matrix(k, k, g, jnp.full(24, 0.9), scale=1.0)
    return [
        ("02.1", exercise_1(-0.01), {"g": -0.01}, 0.01 / np.log(2)),
        ("02.2", exercise_2(-1.0), {"lower_bound": -1.0}, np.exp(-1.0)),
        ("02.3", exercise_3(**context), context, wrong_3),
    ]
