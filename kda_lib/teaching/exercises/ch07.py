"""Checkers of notebook 07's exercises (the decode cache, a two-piece prefill, the crossover)."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.checks import is_int
from kda_lib.teaching.exercises import checker


@checker("07.1")
def state_only_cache(answer, *, batch: int, num_heads: int, key_dim: int, value_dim: int):
    """The cache of a layer without convolutions: its float32 states alone."""
    if not is_int(answer, None):
        return "give the cache size in bytes, an int"
    states = batch * num_heads * key_dim * value_dim * 4
    if int(answer) == states:
        return None
    if int(answer) > states:
        return "more than the states: did the layer really have conv_size=0?"
    return "count every head's K x V state, 4 bytes per float32 number"


@checker("07.2")
def two_piece_prefill(answer, *, full):
    """The outputs of a prompt prefilled in two calls equal the full pass."""
    answer, full = np.asarray(answer), np.asarray(full)
    if answer.shape != full.shape:
        return (
            f"expected shape {full.shape} (both halves concatenated on axis 1), got {answer.shape}"
        )
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
    if not callable(answer):
        return (
            "give a function t_star(heads, key_dim, value_dim, kv_numbers, state_bytes, "
            "cache_bytes)"
        )
    for case in _CASES:
        try:
            got = answer(*case)
        except Exception as error:  # noqa: BLE001 - a student's function may fail any way
            return f"your function raised {type(error).__name__} for arguments {case}"
        want = _t_star(*case)
        if got != want:
            if got is not None and np.isclose(float(got), want / 2, atol=1):
                return f"off by a factor of 2 for {case}: the state is read and written back"
            return f"wrong for arguments {case}; is it the smallest whole T?"
    return None
