"""Checkers of notebook 00's exercises (quick start): two variants of section 1's step that
the page does not show.

Both exercises ask for a function, which the checker calls on inputs of its own (``q, k:
[B, H, K]``, ``v: [B, H, V]``, ``beta: [B, H]``, the log decays ``g`` of the variant, a state
``[B, H, K, V]`` that no run of the notebook produced) and compares with its own float64 NumPy
step; the answer may not run any ``kda_lib``, tokamax or fla code
(:func:`~kda_lib.teaching.exercises.call_answer` with ``own_code``). A hint never contains the
expected values.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate

_SIZES = ((1, 2, 8, 6), (2, 1, 4, 4))  # (B, H, K, V): K != V catches a transpose, K == V an echo


def _inputs(seed: int, batch: int, heads: int, key_dim: int, value_dim: int, decay_dim: int):
    """A random state ``[B, H, K, V]``, unit q, k, values, log decays ``g < 0`` of
    ``[B, H, decay_dim]`` and beta in (0, 1), float32 ``jnp`` arrays, for one token (drawn with
    NumPy: nothing to compile)."""
    rng = np.random.default_rng(seed)
    shape = (batch, heads, key_dim)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    arrays = (
        rng.standard_normal((batch, heads, key_dim, value_dim)),
        unit(rng.standard_normal(shape)),
        unit(rng.standard_normal(shape)),
        rng.standard_normal((batch, heads, value_dim)),
        -rng.uniform(0.05, 1.0, (batch, heads, decay_dim)),
        rng.uniform(0.1, 0.9, (batch, heads)),
    )
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def _matrices(state, q, k, v, g, beta):
    """Float64 NumPy per (batch row, head): ``S [K, V]``, ``q, k, v, e^g`` and ``beta``."""
    for b in range(state.shape[0]):
        for h in range(state.shape[1]):
            yield (
                b,
                h,
                *(np.asarray(a, np.float64)[b, h] for a in (state, q, k, v)),
                np.exp(np.asarray(g, np.float64)[b, h]),
                float(beta[b, h]),
            )


def _expected(state, q, k, v, g, beta, *, write_first: bool):
    """The variant step, one matrix per head: ``write_first``: ``S_t = D [(I - beta k k^T) S
    + beta k v^T]`` (D = diag(e^g) on the key axis); else ``S_t = (I - beta k k^T) S D_v
    + beta k v^T`` (D_v = diag(e^g) on the value axis); ``o = S_t^T q / sqrt(K)``."""
    new, out = np.empty(np.shape(state)), np.empty(np.shape(v))
    for b, h, s, q_, k_, v_, decay, b_ in _matrices(state, q, k, v, g, beta):
        erase = np.eye(len(k_)) - b_ * np.outer(k_, k_)
        if write_first:
            s_t = np.diag(decay) @ (erase @ s + b_ * np.outer(k_, v_))
        else:
            s_t = erase @ s @ np.diag(decay) + b_ * np.outer(k_, v_)
        new[b, h], out[b, h] = s_t, s_t.T @ q_ / np.sqrt(len(k_))
    return new, out


def _page_step(state, q, k, v, g, beta):
    """Section 1's step (decay on the key axis, before the write): the echo the hints name."""
    new, out = np.empty(np.shape(state)), np.empty(np.shape(v))
    for b, h, s, q_, k_, v_, decay, b_ in _matrices(state, q, k, v, g, beta):
        s_t = (np.eye(len(k_)) - b_ * np.outer(k_, k_)) @ (decay[:, None] * s)
        new[b, h] = s_t + b_ * np.outer(k_, v_)
        out[b, h] = new[b, h].T @ q_ / np.sqrt(len(k_))
    return new, out


def _far(answer, expected) -> bool:
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    return bool(np.abs(answer - expected).max() > 1e-4 * max(float(np.abs(expected).max()), 1.0))


def _variant(answer, name: str, write_first: bool, seed: int, hints: tuple[str, str]) -> str | None:
    for offset, (b, h, k, v) in enumerate(_SIZES):
        args = _inputs(seed + offset, b, h, k, v, k if write_first else v)
        result, hint = call_answer(answer, *args, name=name, own_code=True)
        if hint:
            return hint
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            return "the function should return the pair (new_state, o)"
        want = _expected(*args, write_first=write_first)
        for got, expected, what in zip(result, want, ("new_state", "o"), strict=True):
            hint = refuse_degenerate(got, shape=expected.shape, inputs=args, what=what)
            if hint:
                return hint
        if write_first or k == v:  # section 1's step fits these shapes
            page = _page_step(*args)
            if not (_far(result[0], page[0]) or _far(result[1], page[1])):
                return "that is section 1's step (decay first, then write); this variant differs"
        for got, expected, hint in zip(result, want, hints, strict=True):
            if _far(got, expected):
                return hint
    return None


@checker("00.1")
def write_then_decay(answer, **_):
    """``answer(state, q, k, v, g, beta) -> (new_state [B, H, K, V], o [B, H, V])``: one token
    of ``S_t = diag(e^g) [(I - beta k k^T) S_{t-1} + beta k v^T]``, ``o = S_t^T q / sqrt(K)``
    (``q, k, g [B, H, K]``, ``v [B, H, V]``, ``beta [B, H]``)."""
    return _variant(
        answer,
        "step_write_first(state, q, k, v, g, beta)",
        True,
        0,
        (
            "new_state is off: the write corrects what the undecayed state recalls for k; the "
            "decay then scales every key channel (row) of the written state",
            "o is off: read the state after the decay with q, scaled by 1 / sqrt(K)",
        ),
    )


@checker("00.2")
def value_channel_decay(answer, **_):
    """``answer(state, q, k, v, g, beta) -> (new_state [B, H, K, V], o [B, H, V])``: one token
    of ``S_t = (I - beta k k^T) S_{t-1} diag(e^g) + beta k v^T`` with ``g [B, H, V]``, one decay
    per value channel (``q, k [B, H, K]``, ``v [B, H, V]``, ``beta [B, H]``)."""
    return _variant(
        answer,
        "step_value_decay(state, q, k, v, g, beta)",
        False,
        10,
        (
            "new_state is off: diag(e^g) now multiplies S from the right (it scales the value "
            "axis, the columns); the write corrects what that decayed state recalls for k",
            "o is off: read the new state with q, scaled by 1 / sqrt(K)",
        ),
    )
