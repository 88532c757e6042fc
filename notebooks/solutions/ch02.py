"""Worked solutions of notebook 02's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import explain


def half_life(g):
    """1: ``exp(g t) = 1/2`` gives ``t = ln 2 / (-g)``, channel by channel: about 69.3 tokens at
    ``g = -0.01``."""
    return np.log(2) / -np.asarray(g)


def erased_at_most(lower_bound):
    """2: the safe gate keeps ``g >= lower_bound``, so a token keeps at least
    ``exp(lower_bound)`` of a channel and erases at most ``1 - exp(lower_bound)`` (0.632 at -1)."""
    return 1 - np.exp(lower_bound)


def full_overwrite(q, k, g):
    """3: with beta = 1 and ``q_t = k_t`` (unit), ``S_t^T k_t = (1 - beta) (D_t S_{t-1})^T k_t +
    beta v_t (k_t^T k_t) = v_t``: ``o_t = v_t`` whatever came before, so row t of the mixing
    matrix is one-hot at t, and Omega is the identity (the decays ``g`` play no part)."""
    return np.eye(len(q))


def cases():
    def by_library_at_beta_09(q, k, g):  # a write strength below 1 keeps some of the past
        return np.asarray(explain.kda_mixing_matrix(q, k, g, np.full(len(q), 0.9), scale=1.0))

    return [
        ("02.1", half_life, {}, lambda g: 1 / (-np.asarray(g) * np.log(2))),
        ("02.2", erased_at_most, {}, np.exp),
        ("02.3", full_overwrite, {}, by_library_at_beta_09),
    ]
