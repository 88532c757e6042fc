"""Checkers of notebook 00: section 1's output from a hidden state ``S`` read once (``S^T vec``)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex


@ex.machinery
def _memory(state):
    """``(read, calls)``: ``read(vec) = state^T vec`` for one ``vec [K]``, counted."""
    calls = []

    def read(vec):
        vec = np.asarray(vec, np.float64)
        if vec.shape != (state.shape[0],):
            raise ValueError(f"read takes one vector of {state.shape[0]} numbers, got {vec.shape}")
        calls.append(vec)
        return state.T @ vec

    return read, calls


def _tokens(rng, tokens, K, V):
    """A unit query [K], unit keys [T, K], values [T, V], g in [-1, -0.05], beta in (0.1, 0.9)."""
    k, q = rng.standard_normal((tokens, K)), rng.standard_normal(K)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    return (q / np.linalg.norm(q), k, rng.standard_normal((tokens, V)),
            -rng.uniform(0.05, 1.0, (tokens, K)), rng.uniform(0.1, 0.9, tokens))


def _output(state, q, k, v, g, beta, order=1, decay=True, write=True, decay_first=False):
    """``S_T^T q / sqrt(K)`` (slips: transitions applied oldest first, no decay, no write, the
    decay applied to q before the erase: ``(I - beta k k^T) D`` transposed without reversing)."""
    vec, out = q.copy(), np.zeros(state.shape[1])  # vec: q carried back to the old state
    for t in range(len(beta))[::-order]:
        out += write * beta[t] * (k[t] @ vec) * v[t]
        vec = np.exp(g[t]) * vec if decay_first else vec
        vec = vec - beta[t] * (k[t] @ vec) * k[t]
        vec = vec if decay_first else (np.exp(g[t]) if decay else 1.0) * vec
    return (state.T @ vec + out) / np.sqrt(len(q))


def _read_once(answer, rng, many: bool, name: str) -> str | None:
    for _ in range(3):
        K, V = (int(n) for n in rng.integers(3, 9, 2))
        state = rng.standard_normal((K, V))
        q, k, v, g, beta = _tokens(rng, int(rng.integers(2, 6)) if many else 1, K, V)
        read, calls = _memory(state)
        given = (q, k, v, g, beta) if many else (q, k[0], v[0], g[0], float(beta[0]))
        got, hint = ex.call_answer(answer, read, *(np.copy(a) for a in given), name=name)
        if not hint and len(calls) > 1:
            return (f"your function read the memory {len(calls)} times: the output needs one "
                    "read of the old state, along one vector (which?)")
        if hint := hint or ex.refuse_degenerate(got, shape=(V,), inputs=(v[0], v[-1]), what="o"):
            return hint
        if ex.close(got, _output(state, q, k, v, g, beta), 1e-4, 1.0):
            continue
        slips = [((state.T @ q) / np.sqrt(K), "that is the old memory's read: the tokens wrote "
                  "and decayed it first"),
                 (_output(state, q, k, v, g, beta, write=False), "the write adds beta k v^T: what "
                  "does q read of it?"),
                 (_output(state, q, k, v, g, beta, decay=False), "the decay scales the old "
                  "state's rows (key channels): where does D meet q?"),
                 (_output(state, q, k, v, g, beta, decay_first=True), "transposing (I - beta k "
                  "k^T) D reverses the order of the two: which of them meets q first?"),
                 (_output(state, q, k, v, g, beta) * np.sqrt(K), "o is S^T q / sqrt(d_k)")]
        if many:
            slips.append((_output(state, q, k, v, g, beta, order=-1), "the newest token's "
                          "transition is the last one applied to the state: which meets q first?"))
        return next((text for want_slip, text in slips if ex.close(got, want_slip, 1e-4, 1.0)), (
            "o is off: what does S_t^T q contain of the old state S, and what of the newest "
            "write?"))


@ex.checker("00.1")
def one_token(answer, rng):
    """``answer(read, q, k, v, g, beta) -> o [V]``: one token's output, the old state read once."""
    return _read_once(answer, rng, False, "output_after_one(read, q, k, v, g, beta)")


@ex.checker("00.2")
def many_tokens(answer, rng):
    """``answer(read, q, k, v, g, beta) -> o [V]``: ``S_T^T q / sqrt(K)``, S_0 read once."""
    return _read_once(answer, rng, True, "output_after(read, q, k, v, g, beta)")
