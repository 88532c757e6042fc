"""Worked solutions of notebook 00's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import jax.numpy as jnp

import kda_lib


def my_step(state, q, k, v, g, beta):
    """1: one token of ``S_t = (I - beta k k^T) diag(e^g) S_{t-1} + beta k v^T``,
    ``o_t = S_t^T q / sqrt(K)``, batched over ``[B, H]``. Decay first; the write then corrects
    what the decayed state recalls for ``k``: ``(I - beta k k^T) D S + beta k v^T
    = D S + beta k (v - (D S)^T k)^T``."""
    decayed = jnp.exp(g)[..., None] * state  # diag(e^g) S: row i (key channel i) times e^{g_i}
    recalled = jnp.einsum("bhk,bhkv->bhv", k, decayed)
    new_state = decayed + beta[..., None, None] * k[..., :, None] * (v - recalled)[..., None, :]
    o = jnp.einsum("bhk,bhkv->bhv", q, new_state) * q.shape[-1] ** -0.5
    return new_state, o


def resume(state, q, k, v, g, beta):
    """2: the run continues from ``state`` (what ``output_final_state=True`` returned for the
    tokens before): pass it as ``initial_state``."""
    return kda_lib.kda_recurrent(q, k, v, g, beta, initial_state=state)[0]


def cases():
    def undecayed_step(state, q, k, v, g, beta):  # forgets diag(e^g)
        return my_step(state, q, k, v, jnp.zeros_like(g), beta)

    def from_zero(state, q, k, v, g, beta):  # forgets the carried state
        return kda_lib.kda_recurrent(q, k, v, g, beta)[0]

    return [
        ("00.1", my_step, {}, undecayed_step),
        ("00.2", resume, {}, from_zero),
    ]
