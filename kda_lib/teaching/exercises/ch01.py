"""Checkers of notebook 01's exercises (from linear attention to KDA).

The answers are numbers, arrays or small NumPy functions; every checker recomputes the expected
result in float64 (with :func:`kda_lib.kda_step` where the library has it) and returns a hint
that never contains the expected values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.reference import kda_step
from kda_lib.teaching.exercises import checker


@checker("01.1")
def partial_writes(answer, *, beta, writes):
    """``answer``: the fraction of ``v`` that an empty memory returns for ``k`` after ``writes``
    writes of the same unit-key pair with write strength ``beta``."""
    if not np.isscalar(answer) and np.ndim(answer) != 0:
        return "the answer is one number (a fraction of v)"
    if abs(float(answer) - (1 - (1 - beta) ** writes)) > 1e-9:
        return (
            "each write multiplies the error on the written key by (1 - beta); "
            "an empty memory starts at error -v"
        )
    return None


@checker("01.2")
def orthonormal_pass(answer, *, keys, values):
    """``answer``: the memory ``S [K, V]`` after one delta-rule pass (beta = 1) over the pairs
    ``keys [n, K]`` (orthonormal rows) and ``values [n, V]``."""
    keys, values = np.asarray(keys, np.float64), np.asarray(values, np.float64)
    S = np.asarray(answer, np.float64)
    if S.shape != (keys.shape[1], values.shape[1]):
        return f"S should have shape {(keys.shape[1], values.shape[1])}, got {S.shape}"
    if np.abs(keys @ S - values).max() > 1e-9 * max(1.0, np.abs(values).max()):
        return "some pair is not recalled exactly: did every pair get one beta = 1 write?"
    return None


@checker("01.3")
def negative_eigenvalues(answer, *, key_dim):
    """``answer(beta, k)``: the sorted eigenvalues of ``I - beta k k^T`` (``k`` a unit vector of
    length ``key_dim``), and ``max |eigenvalue| <= 1`` for beta in [0, 2]."""
    k = np.random.default_rng(1).normal(size=key_dim)
    k /= np.linalg.norm(k)
    for beta in (0.5, 1.5, 2.0):
        got = np.sort(np.asarray(answer(beta, k), np.float64))
        expected = np.sort(np.r_[1 - beta, np.ones(key_dim - 1)])
        if got.shape != expected.shape:
            return f"expected {key_dim} eigenvalues, got shape {got.shape}"
        if np.abs(got - expected).max() > 1e-9:
            return f"wrong eigenvalues at beta = {beta}: which direction does k k^T act on?"
    return None


@checker("01.4")
def gated_delta_step(answer, *, key_dim, value_dim):
    """``answer(S, k, v, alpha, beta)``: the gated delta rule's next state ``[K, V]`` (float64
    NumPy; ``S [K, V]``, ``k [K]`` unit, ``v [V]``, scalars ``alpha`` in (0, 1], ``beta``)."""
    rng = np.random.default_rng(4)
    for alpha, beta in ((0.9, 0.7), (0.5, 1.0), (1.0, 0.3)):
        S = rng.normal(size=(key_dim, value_dim))
        k = rng.normal(size=key_dim)
        k /= np.linalg.norm(k)
        v = rng.normal(size=value_dim)
        got = np.asarray(answer(S, k, v, alpha, beta), np.float64)
        with jax.enable_x64(True):
            row = lambda x: jnp.asarray(x, jnp.float64)[None, None]  # noqa: E731
            expected, _ = kda_step(
                row(S),
                row(k),
                row(k),
                row(v),
                row(np.full(key_dim, np.log(alpha))),
                jnp.full((1, 1), beta, jnp.float64),
            )
        expected = np.asarray(expected[0, 0])
        if got.shape != expected.shape:
            return f"the state should have shape {expected.shape}, got {got.shape}"
        if np.abs(got - expected).max() > 1e-9 * max(1.0, np.abs(expected).max()):
            return (
                f"wrong state at alpha = {alpha}, beta = {beta}: the write corrects what the "
                "decayed state recalls for k"
            )
    return None
