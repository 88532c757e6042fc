"""Checkers of notebook 00: section 1's output from a hidden state ``S`` read once (``S^T vec``)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex
from kda_lib.teaching.exercises.ch04 import AUTODIFF  # jax.vjp of one's own step: refused


@ex.machinery
def _memory(state):
    """``(read, calls)``: ``read(vec) = state^T vec`` for one ``vec [K]``, counted."""
    calls = []

    def read(vec):
        if (vec := np.asarray(vec, np.float64)).shape != (state.shape[0],):
            raise ValueError(f"read takes one vector of {state.shape[0]} numbers, got {vec.shape}")
        calls.append(vec)
        return state.T @ vec

    return read, calls


def _output(state, q, k, v, g, beta, order=1, decay=True, write=True, decay_first=False,
            read_by="vec"):
    """``S_T^T q / sqrt(K)`` (slips: transitions applied oldest first, no decay, no write, the
    decay applied to q before the erase, each write read by ``read_by`` "q" or "after" it)."""
    vec, out = q.copy(), np.zeros(state.shape[1])  # vec: q carried back to the old state
    for t in range(len(beta))[::-order]:
        reader = q if read_by == "q" else vec
        pre, post = (np.exp(g[t]), 1.0) if decay_first else (1.0, np.exp(g[t]) if decay else 1.0)
        vec = post * (pre * vec - beta[t] * (k[t] @ (pre * vec)) * k[t])
        out += write * beta[t] * (k[t] @ (vec if read_by == "after" else reader)) * v[t]
    return (state.T @ vec + out) / np.sqrt(len(q))


def _read_once(answer, rng, many: bool, name: str) -> str | None:
    for _ in range(3):  # K != V: o / sqrt(d_v) for o / sqrt(d_k) is refused
        K, V = (int(n) for n in rng.choice(np.arange(3, 9), 2, replace=False))
        state = rng.standard_normal((K, V))
        T = int(rng.integers(2, 6)) if many else 1  # unit q [K] and k [T, K], v [T, V], g in
        k, q = rng.standard_normal((T, K)), rng.standard_normal(K)  # [-1, -0.05], beta in (.1, .9)
        q, k, v, g, beta = (q / np.linalg.norm(q), k / np.linalg.norm(k, axis=1, keepdims=True),
                            rng.standard_normal((T, V)), -rng.uniform(0.05, 1.0, (T, K)),
                            rng.uniform(0.1, 0.9, T))
        read, calls = _memory(state)
        given = (q, k, v, g, beta) if many else (q, k[0], v[0], g[0], float(beta[0]))
        got, hint = ex.call_answer(answer, read, *map(np.copy, given), name=name, refused=AUTODIFF)
        if not hint and len(calls) > 1:
            return (f"your function read the memory {len(calls)} times: the output needs one "
                    "read of the old state, along one vector (which?)")
        if hint := hint or ex.refuse_degenerate(got, shape=(V,), inputs=(v[0], v[-1]), what="o"):
            return hint
        o = lambda **slip: _output(state, q, k, v, g, beta, **slip)  # noqa: B023
        if ex.close(got, o(), 1e-4, 1.0):
            continue
        slips = [((state.T @ q) / np.sqrt(K), "that is the old memory's read: the tokens wrote "
                  "and decayed it first"),
                 (o(write=False), "the write adds beta k v^T: what does q read of it?"),
                 (o(decay=False), "the decay scales the old state's rows (key channels): where "
                  "does D meet q?"),
                 (o(decay_first=True), "transposing (I - beta k k^T) D reverses the order of the "
                  "two: which of them meets q first?"),
                 (o(read_by="after"), "a token's write is read by the vector that reaches the "
                  "token (q itself for the newest), before its own erase and decay"),
                 *[(o() * np.sqrt(K / n), "o is S^T q / sqrt(d_k), d_k = len(q)") for n in (1, V)],
                 (o(order=-1), "the newest token's transition is the last one applied to the "
                  "state: which meets q first?"),
                 (o(read_by="q"), "token t's write passes through the transitions of the tokens "
                  "after it: which vector reads it?")]
        return next((text for want_slip, text in slips if ex.close(got, want_slip, 1e-4, 1.0)), (
            "o is off: what does q read of the old state S, and of each token's write?"))


@ex.checker("00.1")
def one_token(answer, rng):
    """``answer(read, q, k, v, g, beta) -> o [V]``: one token's output, the old state read once."""
    return _read_once(answer, rng, False, "output_after_one(read, q, k, v, g, beta)")


@ex.checker("00.2")
def many_tokens(answer, rng):
    """``answer(read, q, k, v, g, beta) -> o [V]``: ``S_T^T q / sqrt(K)``, S_0 read once."""
    return _read_once(answer, rng, True, "output_after(read, q, k, v, g, beta)")
