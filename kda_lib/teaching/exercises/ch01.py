"""Checkers of notebook 01's exercises (from linear attention to KDA).

Every answer is a small NumPy function, which the checker calls on inputs of its own; it
recomputes the expected result in float64 (with :func:`kda_lib.kda_step` where the library has
it) and returns a hint that never contains the expected values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.reference import kda_step
from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("01.1")
def partial_writes(answer, **_):
    """``answer(beta, writes)``: the fraction of ``v`` that an empty memory returns for ``k``
    after ``writes`` writes of the same unit-key pair with write strength ``beta``; the checker
    tries its own ``(beta, writes)``."""
    for beta, writes in ((0.5, 3), (0.3, 1), (0.9, 4), (0.2, 7), (1.5, 2)):
        got, hint = call_answer(answer, beta, writes, name="recalled_fraction(beta, writes)")
        hint = hint or refuse_degenerate(got, shape=(), what="the fraction")
        if hint:
            return hint
        if abs(float(got) - (1 - (1 - beta) ** writes)) > 1e-9:
            return (
                f"wrong at beta = {beta}, writes = {writes}: each write multiplies the error on "
                "the written key by (1 - beta); an empty memory starts at error -v"
            )
    return None


def _delta_pass(keys, values):
    S = np.zeros((keys.shape[1], values.shape[1]))
    for k, v in zip(keys, values, strict=True):
        S = S + np.outer(k, v - k @ S)
    return S


@checker("01.2")
def one_pass(answer, **_):
    """``answer(keys [n, K], values [n, V]) -> S [K, V]``: the memory after one delta-rule pass
    (beta = 1) from an empty memory. The checker tries orthonormal keys (every pair comes back
    exactly) and generic unit keys (where a linear solve is not one pass)."""
    rng = np.random.default_rng(2)
    K, V = 6, 4
    ortho = np.linalg.qr(rng.normal(size=(K, K)))[0].T
    generic = rng.normal(size=(K + 2, K))
    generic /= np.linalg.norm(generic, axis=1, keepdims=True)
    for keys, kind in ((ortho, "orthonormal"), (generic[:4], "generic"), (generic, "generic")):
        values = rng.normal(size=(len(keys), V))
        got, hint = call_answer(answer, keys, values, name="one_pass(keys, values)")
        hint = hint or refuse_degenerate(got, shape=(K, V), inputs=(keys, values), what="S")
        if hint:
            return hint
        S = np.asarray(got, np.float64)
        want = _delta_pass(keys, values)
        if np.abs(S - want).max() > 1e-9 * max(1.0, np.abs(want).max()):
            if kind == "generic":
                return (
                    f"right for orthonormal keys, not for {len(keys)} generic unit keys: one "
                    "pass writes each pair once, in order (a linear solve or least squares is "
                    "not what the delta rule computes)"
                )
            return "some pair is not recalled exactly: did every pair get one beta = 1 write?"
    return None


@checker("01.3")
def negative_eigenvalues(answer, *, key_dim):
    """``answer(beta, k)``: the sorted eigenvalues of ``I - beta k k^T`` (``k`` a unit vector of
    length ``key_dim``), and ``max |eigenvalue| <= 1`` for beta in [0, 2]."""
    k = np.random.default_rng(1).normal(size=key_dim)
    k /= np.linalg.norm(k)
    for beta in (0.5, 1.5, 2.0):
        got, hint = call_answer(answer, beta, k, name="eigenvalues(beta, k)")
        hint = hint or refuse_degenerate(got, shape=(key_dim,), inputs=(k,), what="eigenvalues")
        if hint:
            return hint
        got = np.sort(np.asarray(got, np.float64))
        expected = np.sort(np.r_[1 - beta, np.ones(key_dim - 1)])
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
        got, hint = call_answer(answer, S, k, v, alpha, beta, name="gdn_step(S, k, v, alpha, beta)")
        hint = hint or refuse_degenerate(got, shape=S.shape, inputs=(S,), what="the state")
        if hint:
            return hint
        got = np.asarray(got, np.float64)
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
        if np.abs(got - expected).max() > 1e-9 * max(1.0, np.abs(expected).max()):
            return (
                f"wrong state at alpha = {alpha}, beta = {beta}: the write corrects what the "
                "decayed state recalls for k"
            )
    return None
