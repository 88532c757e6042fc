"""Checkers of notebook 00's exercises (quick start).

Both exercises ask for a function, which the checker calls on inputs of its own (``q, k, g:
[B, H, K]``, ``v: [B, H, V]``, ``beta: [B, H]``, a state that no run of the notebook produced)
and compares with :mod:`kda_lib.ops.reference`; the answer may not run any ``kda_lib`` code
(:func:`~kda_lib.teaching.exercises.call_answer` with ``own_code``). A hint never contains the
expected values.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from kda_lib.ops import reference
from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate

_SIZES = ((1, 2, 8, 6), (2, 1, 4, 4))  # (B, H, K, V): K != V catches a transpose, K == V an echo


def _inputs(seed: int, batch: int, heads: int, key_dim: int, value_dim: int):
    """Unit q, k, log decays g < 0, values, beta in (0, 1) and a random state ``[B, H, K, V]``,
    float32 ``jnp`` arrays, for one token (drawn with NumPy: nothing to compile)."""
    rng = np.random.default_rng(seed)
    shape = (batch, heads, key_dim)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    arrays = (
        rng.standard_normal((batch, heads, key_dim, value_dim)),
        unit(rng.standard_normal(shape)),
        unit(rng.standard_normal(shape)),
        rng.standard_normal((batch, heads, value_dim)),
        -rng.uniform(0.05, 1.0, shape),
        rng.uniform(0.1, 0.9, (batch, heads)),
    )
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def _far(answer, expected) -> bool:
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    return bool(np.abs(answer - expected).max() > 1e-4 * max(float(np.abs(expected).max()), 1.0))


def _one_token(answer, name: str, transposed: bool, seed: int) -> str | None:
    for offset, sizes in enumerate(_SIZES):
        args = _inputs(seed + offset, *sizes)
        given = (jnp.swapaxes(args[0], -1, -2),) + args[1:] if transposed else args
        result, hint = call_answer(answer, *given, name=name, own_code=True)
        if hint:
            return hint
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            return "the function should return the pair (new_state, o)"
        want_state, want_o = reference.kda_step(*args)
        if transposed:
            want_state = jnp.swapaxes(want_state, -1, -2)
        for got, want, what in ((result[0], want_state, "new_state"), (result[1], want_o, "o")):
            hint = refuse_degenerate(got, shape=want.shape, inputs=given, what=what)
            if hint:
                return hint
        if _far(result[0], want_state):
            return "new_state is off: decay S by exp(g) per key channel first, then correct " \
                "what the decayed state recalls for k by beta" + (
                    " (the key channels are the last axis here)" if transposed else "")
        if _far(result[1], want_o):
            return "o is off: read the new state with q, scaled by 1 / sqrt(K)"
    return None


@checker("00.1")
def one_step(answer, **_):
    """``answer(state, q, k, v, g, beta) -> (new_state [B, H, K, V], o [B, H, V])``: one token
    of section 1's equation (``q, k, g [B, H, K]``, ``v [B, H, V]``, ``beta [B, H]``)."""
    return _one_token(answer, "my_step(state, q, k, v, g, beta)", False, 0)


@checker("00.2")
def transposed_state(answer, **_):
    """``answer(state_vk, q, k, v, g, beta) -> (new_state_vk [B, H, V, K], o [B, H, V])``: the
    same step with the state stored value-major, ``state_vk[b, h] = S^T`` (the layout of
    kernels that keep ``[V, K]`` tiles)."""
    return _one_token(answer, "step_vk(state_vk, q, k, v, g, beta)", True, 10)
