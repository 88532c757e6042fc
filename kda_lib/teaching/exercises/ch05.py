"""Checkers of notebook 05's exercises (a long halo, composing summaries, the bytes crossover,
the fold for any rank count)."""

from __future__ import annotations

import numpy as np

from kda_lib.checks import is_int
from kda_lib.teaching.exercises import checker


@checker("05.1")
def long_halo(answer, *, ranks: int, local_len: int, halo_size: int):
    """What the last rank receives from halo_exchange (positions numbered from 1, 0 = none)."""
    start = (ranks - 1) * local_len - halo_size
    want = np.concatenate(
        [np.zeros(max(-start, 0)), np.arange(max(start, 0), start + halo_size) + 1]
    )
    got = np.asarray(answer, dtype=float).ravel()
    if got.shape != want.shape:
        return f"give the first halo_size = {halo_size} entries rank R - 1 receives"
    if np.array_equal(got, want):
        return None
    return "the halo holds the tokens just before the rank's slice, from as many ranks as needed"


def _random_maps(rng, count, k_dim=4, v_dim=3):
    return [
        (rng.standard_normal((k_dim, k_dim)) / 2, rng.standard_normal((k_dim, v_dim)))
        for _ in range(count)
    ]


def _apply(summary, state):
    return summary[0] @ state + summary[1]


@checker("05.2")
def compose_summaries(answer, **_):
    """compose(first, second): the summary of first's slice followed by second's."""
    if not callable(answer):
        return "give a function compose(first, second) -> (M, E)"
    rng = np.random.default_rng(5)
    a, b, c = _random_maps(rng, 3)
    state = rng.standard_normal((4, 3))
    try:
        ab = [np.asarray(x) for x in answer(a, b)]
        grouped = [np.asarray(x) for x in answer(answer(a, b), c)]
        other = [np.asarray(x) for x in answer(a, answer(b, c))]
    except Exception as error:  # noqa: BLE001 - a student's function may fail any way
        return f"your function raised {type(error).__name__}"
    if not np.allclose(_apply(ab, state), _apply(b, _apply(a, state))):
        return "applying compose(first, second) must equal applying first, then second"
    if not all(np.allclose(x, y) for x, y in zip(grouped, other, strict=True)):
        return "the composition should not depend on the grouping"
    return None


@checker("05.3")
def bytes_crossover(answer, *, ranks: int, key_dim: int, value_dim: int):
    """The first T at which gathering (R-1)/R T (3K + V + 1) exceeds (R-1) K (K + V)."""
    if not is_int(answer, None):
        return "give a whole number of tokens"

    def gathers_more(t):
        return (ranks - 1) / ranks * t * (3 * key_dim + value_dim + 1) > (
            (ranks - 1) * key_dim * (key_dim + value_dim)
        )

    if gathers_more(answer) and not gathers_more(answer - 1):
        return None
    return "too early" if not gathers_more(answer) else "gathering already moves more before that"


@checker("05.4")
def fold_any_ranks(answer, **_):
    """entering_states(ms, es): the state entering every rank, for any number of ranks."""
    if not callable(answer):
        return "give a function entering_states(ms, es) -> [R, K, V]"
    rng = np.random.default_rng(6)
    for r in (3, 5, 8):
        maps = _random_maps(rng, r)
        ms, es = np.stack([m for m, _ in maps]), np.stack([e for _, e in maps])
        want, state = [], np.zeros((4, 3))
        for summary in maps:
            want.append(state)
            state = _apply(summary, state)
        try:
            got = np.asarray(answer(ms, es))
        except Exception as error:  # noqa: BLE001 - a student's function may fail any way
            return f"your function raised {type(error).__name__} for R = {r}"
        if got.shape != (r, 4, 3):
            return f"for R = {r} expected shape {(r, 4, 3)}, got {got.shape}"
        if not np.allclose(got, np.stack(want), rtol=1e-4, atol=1e-5):
            if np.allclose(got[:-1], np.stack(want)[1:], rtol=1e-4, atol=1e-5):
                return "off by one: rank 0 receives zeros, rank 1 the state after rank 0"
            return f"wrong states for R = {r}"
    return None
