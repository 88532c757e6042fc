"""Worked solutions of notebook 05's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def compose(first, second):
    """1: S -> M2 (M1 S + E1) + E2 = (M2 M1) S + (M2 E1 + E2). Works on single maps [K, K]
    and on stacks [..., K, K] (as associative_scan passes them)."""
    (m1, e1), (m2, e2) = first, second
    return m2 @ m1, m2 @ e1 + e2


def compose_einsum(first, second):
    """1, written differently: float32 jnp, the products as einsums."""
    (m1, e1), (m2, e2) = ((jnp.asarray(m, jnp.float32), jnp.asarray(e, jnp.float32))
                          for m, e in (first, second))
    return jnp.einsum("...ij,...jk->...ik", m2, m1), jnp.einsum("...ij,...jv->...iv", m2, e1) + e2


def entering_states(ms, es):
    """2: an inclusive prefix scan of compose gives, at rank j, the summary of ranks 0..j;
    applied to the zero state that is its E part, the state *leaving* rank j. The state
    entering rank j is the one leaving rank j - 1 (zeros for rank 0): shift by one. The scan
    takes about 2 log2 R rounds of compositions instead of R sequential steps."""
    _, leaving = jax.lax.associative_scan(compose, (jnp.asarray(ms), jnp.asarray(es)))
    return jnp.concatenate([jnp.zeros_like(leaving[:1]), leaving[:-1]], axis=0)


def entering_states_exclusive(ms, es):
    """2, written differently: prepend the identity summary (I, 0) and drop the last rank, so
    the inclusive scan is already the exclusive one."""
    ms, es = jnp.asarray(ms), jnp.asarray(es)
    eye = jnp.eye(ms.shape[-1], dtype=ms.dtype)[None]
    ms = jnp.concatenate([eye, ms[:-1]])
    es = jnp.concatenate([jnp.zeros_like(es[:1]), es[:-1]])
    return jax.lax.associative_scan(compose_einsum, (ms, es))[1]


def cases():
    def loop_with_bug(ms, es):  # returns the leaving states, not the entering ones
        state, out = jnp.zeros(es.shape[1:]), []
        for m, e in zip(ms, es, strict=True):
            state = m @ state + e
            out.append(state)
        return jnp.stack(out)

    def loop(ms, es):  # right states, but a Python loop over the ranks (the exercise forbids it)
        state, out = jnp.zeros(es.shape[1:]), []
        for m, e in zip(ms, es, strict=True):
            out.append(state)
            state = (m[:, :, None] * state[None]).sum(1) + e  # no dot_general traced
        return jnp.stack(out)

    return [
        ("05.1", compose, {}, lambda a, b: (a[0] @ b[0], a[0] @ b[1] + a[1])),
        ("05.1", compose_einsum, {}, lambda a, b: (a[0] @ b[0], a[0] @ b[1] + a[1])),
        ("05.1", lambda a, b: tuple(np.asarray(x) for x in compose(a, b)), {},
         lambda a, b: (b[0] @ a[0], a[1] + b[1])),
        ("05.2", entering_states, {}, loop_with_bug),
        ("05.2", entering_states, {}, loop),
        ("05.2", entering_states_exclusive, {}, loop),
    ]
