"""Checkers of notebook 07's exercises (the decode cache, a two-piece prefill, the crossover)."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.checks import is_int
from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("07.1")
def state_only_cache(answer, *, batch: int, num_heads: int, key_dim: int, value_dim: int):
    """The cache of a layer without convolutions: its float32 states alone."""
    hint = refuse_degenerate(answer, shape=(), integer=True, what="the cache size in bytes")
    if hint:
        return hint
    if not is_int(answer, None):
        return "give the cache size in bytes, an int"
    states = batch * num_heads * key_dim * value_dim * 4
    if int(answer) == states:
        return None
    if int(answer) > states:
        return "more than the states: did the layer really have conv_size=0?"
    return "count every head's K x V state, 4 bytes per float32 number"


@checker("07.2")
def two_piece_prefill(answer, *, full, prompt=None):
    """The outputs of a prompt prefilled in two calls equal the full pass ``full``; ``prompt``
    (the layer's input, optional) must not come back unchanged."""
    full = np.asarray(full)
    if np.shape(answer) != full.shape:
        return (
            f"expected shape {full.shape} (both halves concatenated on axis 1), "
            f"got {np.shape(answer)}"
        )
    inputs = () if prompt is None else (prompt,)
    hint = refuse_degenerate(answer, shape=full.shape, inputs=inputs, what="the outputs")
    if hint:
        return hint
    answer = np.asarray(answer)
    err = np.linalg.norm(answer - full) / np.linalg.norm(full)
    if err < 1e-5:
        return None
    return "the second call must start from the cache the first one returned"


def _t_star(heads, key_dim, value_dim, kv_numbers, state_bytes, cache_bytes) -> int:
    return math.ceil(2 * heads * key_dim * value_dim * state_bytes / (kv_numbers * cache_bytes))


_CASES = [  # (heads, key_dim, value_dim, kv_numbers, state_bytes, cache_bytes)
    (16, 128, 128, 4096, 4, 4),
    (16, 128, 128, 1024, 4, 2),
    (16, 128, 128, 576, 4, 2),
    (8, 64, 128, 192, 2, 2),
    (2, 32, 32, 96, 4, 2),
    (32, 128, 64, 4000, 4, 2),
]


@checker("07.3")
def decode_crossover(answer, **_):
    """A function giving the smallest context at which an attention decode step moves at least
    the bytes of a KDA step (state read and written)."""
    for case in _CASES:
        got, hint = call_answer(answer, *case, name="t_star(...)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what=f"T for {case}")
        if hint:
            return hint
        want = _t_star(*case)
        if got != want:
            if got is not None and np.isclose(float(got), want / 2, atol=1):
                return f"off by a factor of 2 for {case}: the state is read and written back"
            return f"wrong for arguments {case}; is it the smallest whole T?"
    return None
