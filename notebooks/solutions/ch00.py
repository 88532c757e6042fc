"""Worked solutions of notebook 00's exercises (checked by ``tests/teaching/test_exercises.py``).

Try the exercise first; each function is what the notebook's answer cell would hold.
"""

from __future__ import annotations

import jax

import kda_lib
from kda_lib.testing import random_kda_inputs


def exercise_1(q, k, v, g, beta):
    """Another chunk size: the chunked form with 16-token chunks (outputs ``[B, T, H, V]``)."""
    return kda_lib.kda_chunked(q, k, v, g, beta, chunk_size=16)[0]


def exercise_2(q, k, v, g, beta):
    """Carry the state: run the first half, then the second half from its final state."""
    half = q.shape[1] // 2
    first = [x[:, :half] for x in (q, k, v, g, beta)]
    second = [x[:, half:] for x in (q, k, v, g, beta)]
    _, state = kda_lib.kda_recurrent(*first, output_final_state=True)
    return kda_lib.kda_recurrent(*second, initial_state=state)[0]


def cases():
    inputs = random_kda_inputs(jax.random.key(0), 1, 100, 2, 16, 32)
    context = {name: inputs[name] for name in ("q", "k", "v", "g", "beta")}
    half = 50
    from_zero = kda_lib.kda_recurrent(*(x[:, half:] for x in context.values()))[0]
    return [
        ("00.1", exercise_1(**context), context, 1.01 * exercise_1(**context)),
        ("00.2", exercise_2(**context), context, from_zero),
    ]
