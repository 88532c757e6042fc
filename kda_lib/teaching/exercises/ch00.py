"""Checkers of notebook 00's exercises (quick start).

Both exercises ask for a function, which the checker calls on inputs of its own (``q, k, g:
[B, T, H, K]``, ``v: [B, T, H, V]``, ``beta: [B, T, H]``, a state ``[B, H, K, V]`` that no run
of the notebook produced) and compares with :mod:`kda_lib.ops.reference`; a hard-coded array, a
run of the notebook's own inputs or the full run sliced cannot pass. A hint never contains the
expected values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import kda_lib
from kda_lib.ops import api, chunked, reference
from kda_lib.teaching.exercises import call_answer, checker, forbidding, refuse_degenerate

_SIZES = ((1, 2, 8, 6), (2, 1, 4, 4))  # (B, H, K, V): K != V catches a transpose, K == V an echo
_KERNELS = [(kda_lib, n) for n in ("kda", "kda_chunked", "kda_recurrent", "kda_step")] + [
    (reference, "kda_recurrent"),
    (reference, "kda_step"),
    (chunked, "kda_chunked"),
    (api, "kda"),
]


def _inputs(seed: int, batch: int, heads: int, key_dim: int, value_dim: int, seq_len: int = 1):
    """Unit q, k, log decays g < 0, values, beta in (0, 1) and a random state, float32."""
    keys = jax.random.split(jax.random.key(seed), 6)
    shape = (batch, seq_len, heads, key_dim)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return dict(
        state=jax.random.normal(keys[0], (batch, heads, key_dim, value_dim)),
        q=unit(jax.random.normal(keys[1], shape)),
        k=unit(jax.random.normal(keys[2], shape)),
        v=jax.random.normal(keys[3], (batch, seq_len, heads, value_dim)),
        g=-jax.random.uniform(keys[4], shape, minval=0.05, maxval=1.0),
        beta=jax.random.uniform(keys[5], (batch, seq_len, heads), minval=0.1, maxval=0.9),
    )


def _far(answer, expected) -> bool:
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    return bool(np.abs(answer - expected).max() > 1e-4 * max(float(np.abs(expected).max()), 1.0))


@checker("00.1")
def one_step(answer, **_):
    """``answer(state, q, k, v, g, beta) -> (new_state [B, H, K, V], o [B, H, V])``: one token
    of section 1's equation (``q, k, g [B, H, K]``, ``v [B, H, V]``, ``beta [B, H]``)."""
    for seed, sizes in enumerate(_SIZES):
        x = {n: a[:, 0] if n != "state" else a for n, a in _inputs(seed, *sizes).items()}
        args = (x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"])
        with forbidding(answer, _KERNELS) as called:
            result, hint = call_answer(answer, *args, name="my_step(state, q, k, v, g, beta)")
        if called:
            return "write the step from section 1's equation, without kda_lib's KDA functions"
        if hint:
            return hint
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            return "my_step should return the pair (new_state, o)"
        want_state, want_o = reference.kda_step(*args)
        for got, want, what in ((result[0], want_state, "new_state"), (result[1], want_o, "o")):
            hint = refuse_degenerate(got, shape=want.shape, inputs=args, what=what)
            if hint:
                return hint
        if _far(result[0], want_state):
            return "new_state is off: decay S by exp(g) per key channel first, then correct " \
                "what the decayed state recalls for k by beta"
        if _far(result[1], want_o):
            return "o is off: read the new state with q, scaled by 1 / sqrt(K)"
    return None


@checker("00.2")
def carried_state(answer, **_):
    """``answer(state, q, k, v, g, beta) -> outputs [B, T, H, V]`` of the tokens run from
    ``state [B, H, K, V]``."""
    for seed, sizes in enumerate(_SIZES):
        x = _inputs(10 + seed, *sizes, seq_len=5)
        args = (x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"])
        result, hint = call_answer(answer, *args, name="resume(state, q, k, v, g, beta)")
        if hint:
            return hint
        want = reference.kda_recurrent(*args[1:], initial_state=x["state"])[0]
        hint = refuse_degenerate(result, shape=want.shape, inputs=args, what="the outputs")
        if hint:
            return hint
        if _far(result, want):
            from_zero = reference.kda_recurrent(*args[1:])[0]
            if not _far(result, from_zero):
                return "these are the outputs of a run from the zero state: pass initial_state"
            return "the outputs differ from a run started from state"
    return None
