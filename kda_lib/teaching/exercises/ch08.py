"""Checkers of notebook 08's exercises (chance, solved cells, the conv reach, time scales)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


def _mqar_values(vocab_size: int) -> int:
    return vocab_size - 1 - (vocab_size - 1) // 2


@checker("08.1")
def mqar_chance(answer, **_):
    """``answer(vocab_size) -> float``: uniform guessing among MQAR's value tokens, tried on
    vocabularies of the checker's own (odd and even), without calling kda_lib."""
    for size in (8, 9, 17, 32, 101):
        got, hint = call_own_work(answer, size, name="mqar_chance(vocab_size)")
        hint = hint or refuse_degenerate(got, shape=(), what=f"the accuracy at V = {size}")
        if hint:
            return hint
        if not np.isclose(float(got), 1 / _mqar_values(size), rtol=1e-9):
            return (
                f"wrong at V = {size}: draw MQAR sequences at this V and at its neighbours "
                "(make_task('mqar', vocab_size=V, num_pairs=...)) and count the ids that ever "
                "appear as values"
            )
    return None


def _solved(accuracy: dict, solved: float) -> set:
    return {cell for cell, acc in accuracy.items() if np.mean(acc) >= solved}


@checker("08.2")
def solved_cells(answer, *, accuracy: dict, solved: float):
    """The (task, mixer, T) cells whose mean test accuracy over seeds reaches the protocol's
    ``solved`` level (the recorded sweep's ``setting["solved"]``)."""
    if isinstance(answer, (str, bytes, dict)) or (
        not isinstance(answer, (set, frozenset)) and np.ndim(answer) == 0
    ):
        return "give a list of (task, mixer, T) cells"
    try:
        cells = [(task, mixer, t) for task, mixer, t in answer]
    except (TypeError, ValueError):
        return "give a list (or set) of (task, mixer, T) cells"
    if any(not isinstance(name, str) for task, mixer, _ in cells for name in (task, mixer)):
        return "each cell is (task name, mixer name, T), the names strings"
    try:
        whole = all(not isinstance(t, bool) and float(t) == int(t) for *_, t in cells)
    except (TypeError, ValueError, OverflowError):  # a NaN, inf or non-number T
        whole = False
    if not whole:
        return "each T is a whole number of tokens"
    got = {(task, mixer, int(t)) for task, mixer, t in cells}
    want = _solved(accuracy, solved)
    if got == want:
        return None
    if got - want:
        return (
            "some of these cells stay below the solved level: average over the seeds first, "
            "and compare the unrounded means (0.98975 is below 0.99)"
        )
    return "some solved cells are missing: compare every cell's mean with the solved level"


def _reach_count(inputs, mask, num_pairs: int, conv_reach: int) -> int:
    value_pos = {int(k): 2 * i + 1 for i, k in enumerate(inputs[0 : 2 * num_pairs : 2])}
    return sum(int(t - value_pos[int(inputs[t])] <= conv_reach) for t in np.flatnonzero(mask))


def _sequences():
    """MQAR-like sequences of the checker's own: pairs first, then queries, some within reach
    (a query right after the pairs asking for the last keys)."""
    rng = np.random.default_rng(8)
    out = []
    for num_pairs, length, reach in ((4, 16, 3), (6, 24, 5), (3, 12, 1), (5, 20, 9)):
        keys = rng.choice(np.arange(1, 16), num_pairs, replace=False)
        values = rng.choice(np.arange(16, 32), num_pairs)
        inputs = np.zeros(length, np.int32)
        inputs[0 : 2 * num_pairs : 2], inputs[1 : 2 * num_pairs : 2] = keys, values
        mask = np.zeros(length, bool)
        order = np.concatenate([keys[::-1], rng.permutation(keys)])
        spots = np.arange(2 * num_pairs, length, 1)[: order.size]
        inputs[spots], mask[spots] = order[: spots.size], True
        out.append((inputs, mask, num_pairs, reach))
    return out


@checker("08.3")
def conv_reach_queries(answer, **_):
    """``answer(inputs, mask, num_pairs, conv_reach) -> int``: the queries whose value lies
    within ``conv_reach`` tokens before them, tried on sequences of the checker's own."""
    for inputs, mask, num_pairs, reach in _sequences():
        want = _reach_count(inputs, mask, num_pairs, reach)
        got, hint = call_own_work(
            answer, inputs.copy(), mask.copy(), num_pairs, reach,
            name="reach_count(inputs, mask, num_pairs, conv_reach)",
        )
        hint = hint or refuse_degenerate(
            got, shape=(), integer=True, allow_zeros=want == 0, what="the count"
        )
        if hint:
            return hint
        if int(got) != want:
            return "pair i's value sits at position 2 i + 1; compare with each query's position"
    return None


def head_filter(alphas, beta, k, q, length: int) -> np.ndarray:
    """beta q^T A^tau k for tau < length, A = (I - beta k k^T) Diag(alphas)."""
    alphas, k, q = (np.asarray(a, np.float64) for a in (alphas, k, q))
    a = (np.eye(k.size) - beta * np.outer(k, k)) @ np.diag(alphas)
    out, vec = [], beta * k
    for _ in range(length):
        out.append(q @ vec)
        vec = a @ vec
    return np.asarray(out)


@checker("08.4")
def three_time_scales(answer, *, half_lives, length: int):
    """A KDA head whose filter is the mean of three exponentials."""
    if not isinstance(answer, dict) or set(answer) != {"alphas", "beta", "k", "q"}:
        return "give a dict with the keys alphas, beta, k, q"
    for name in ("alphas", "k", "q"):
        hint = refuse_degenerate(answer[name], shape=(len(half_lives),), what=name)
        if hint:
            return hint + f" ({name} needs {len(half_lives)} entries, one per channel)"
    hint = refuse_degenerate(answer["beta"], shape=(), what="beta")
    if hint:
        return hint
    alphas, k, q = (np.asarray(answer[n], np.float64) for n in ("alphas", "k", "q"))
    beta = float(answer["beta"])
    if not ((alphas > 0).all() and (alphas <= 1).all() and 0.05 <= beta <= 1):
        return "a decay must lie in (0, 1] and beta in [0.05, 1] (a real delta-rule write)"
    if np.linalg.norm(q) > 100:
        return "keep |q| <= 100: a query that large only hides a tiny beta"
    if not np.isclose(np.linalg.norm(k), 1.0):
        return "the key must have unit norm (the layer L2-normalises it)"
    lag = np.arange(length)
    target = np.mean([(0.5 ** (1 / h)) ** lag for h in half_lives], axis=0)
    got = head_filter(alphas, beta, k, q, length)
    error = np.linalg.norm(got - target) / np.linalg.norm(target)
    if error < 1e-6:
        return None
    return f"the head's filter is {error:.2g} off (relative L2); are A's eigenvalues the three r's?"
