"""Checkers of notebook 08's exercises (chance, solved cells, the conv reach, time scales)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


def _mqar_values(vocab_size: int) -> int:
    """How many value tokens MQAR draws from at ``vocab_size``."""
    return vocab_size - 1 - (vocab_size - 1) // 2


@checker("08.1")
def mqar_chance(answer, **_):
    """``answer(vocab_size) -> float``: uniform guessing among MQAR's value tokens, tried on
    vocabularies of the checker's own (odd and even), the last two drawn at check time between
    10^5 and 10^6 and compared to 1e-7 relative (a table made in advance, or 2 / V beside one,
    misses them), without calling kda_lib."""
    drawn = 2 * int(np.random.default_rng().integers(5 * 10**4, 5 * 10**5))
    for size in (8, 9, 17, 32, 101, drawn, drawn + 1):
        got, hint = call_own_work(answer, size, name="mqar_chance(vocab_size)")
        hint = hint or refuse_degenerate(got, shape=(), what=f"the accuracy at V = {size}")
        if hint:
            return hint
        if not np.isclose(float(got), 1 / _mqar_values(size), rtol=1e-7, atol=1e-8 * (size < 200)):
            return (
                f"wrong at V = {size}: draw MQAR sequences at this V and at its neighbours "
                "(make_task('mqar', vocab_size=V, num_pairs=...)) and count the ids that ever "
                "appear as values"
            )
    return None


def _solved(accuracy: dict, solved: float) -> set:
    """The cells whose mean accuracy over seeds reaches ``solved``."""
    return {cell for cell, acc in accuracy.items() if np.mean(acc) >= solved}


# (accuracy, solved) of the checker's own: the mean reaches the level where the lowest seed
# does not, the median and the best seed reach it where the mean does not, a mean exactly at
# the level (reaching it), and a level other than the recorded one
_OWN_CASES = (
    ({("mqar", "kda", 64): [1.0, 0.985], ("stack", "gdn", 64): [0.999, 0.999, 0.95],
      ("stack", "kda", 128): [0.99, 0.985], ("palindrome", "attention", 128): [0.4, 0.6],
      ("mqar", "mamba2", 128): [0.99, 0.99]}, 0.99),
    ({("mqar", "gdn", 128): [0.96, 0.97], ("stack", "mamba2", 64): [0.9, 0.99, 0.99],
      ("palindrome", "kda", 64): [1.0, 0.93], ("stack", "attention", 128): [0.95, 0.95]}, 0.95),
)  # fmt: skip


def _cells(got) -> tuple[set | None, str | None]:
    """The answer's (task, mixer, T) cells, or a hint on their form."""
    if isinstance(got, (str, bytes, dict)) or (
        not isinstance(got, (set, frozenset)) and np.ndim(got) == 0
    ):
        return None, "return a list of (task, mixer, T) cells"
    try:
        cells = [(task, mixer, t) for task, mixer, t in got]
    except (TypeError, ValueError):
        return None, "return a list (or set) of (task, mixer, T) cells"
    if any(not isinstance(name, str) for task, mixer, _ in cells for name in (task, mixer)):
        return None, "each cell is (task name, mixer name, T), the names strings"
    try:
        whole = all(
            not isinstance(t, (bool, str, bytes)) and float(t) == int(t) for *_, t in cells
        )
    except (TypeError, ValueError, OverflowError):  # a NaN, inf or non-number T
        whole = False
    if not whole:
        return None, "each T is a whole number of tokens (an int, not a string)"
    return {(task, mixer, int(t)) for task, mixer, t in cells}, None


@checker("08.2")
def solved_cells(answer, *, accuracy: dict, solved: float):
    """``answer(accuracy, solved) -> list of (task, mixer, T)``: the cells whose mean test
    accuracy over seeds reaches ``solved``, tried on ``accuracy`` (the recorded sweep's, at its
    ``setting["solved"]``) and on cases of the checker's own."""
    trials = [("the recorded sweep", accuracy, solved)]
    trials += [(f"the checker's case {i}", *case) for i, case in enumerate(_OWN_CASES, 1)]
    for where, acc, level in trials:
        copy = {cell: list(a) for cell, a in acc.items()}
        got, hint = call_own_work(answer, copy, level, name="solved_cells(accuracy, solved)")
        got, hint = (None, hint) if hint else _cells(got)
        if hint:
            return hint
        want = _solved(acc, level)
        if got - want:
            return (
                f"on {where} some of these cells stay below the solved level: a cell is "
                "judged by its mean over the seeds, unrounded"
            )
        if want - got:
            return (
                f"on {where} some solved cells are missing: judge each cell by its mean (a "
                "mean equal to the level reaches it)"
            )
    return None


def _reach_count(inputs, mask, num_pairs: int, conv_reach: int) -> int:
    """The queries whose value lies at most ``conv_reach`` tokens before them."""
    value_pos = {int(k): 2 * i + 1 for i, k in enumerate(inputs[0 : 2 * num_pairs : 2])}
    return sum(int(t - value_pos[int(inputs[t])] <= conv_reach) for t in np.flatnonzero(mask))


def _sequences():
    """MQAR sequences of the checker's own, drawn afresh at each check: pairs first, then each
    key queried once, in a random order, among filler (token 0), the first two queries right
    after the pairs; the reach is one query's distance to its value (so one lies exactly
    ``reach`` tokens back, and at least one beyond), drawn per sequence."""
    rng = np.random.default_rng()
    out = []
    for num_pairs, length in ((4, 16), (6, 24), (3, 12), (5, 20), (6, 28), (4, 20)) * 3:
        keys = rng.choice(np.arange(1, 16), num_pairs, replace=False)
        values = rng.choice(np.arange(16, 32), num_pairs)
        inputs = np.zeros(length, np.int32)
        inputs[0 : 2 * num_pairs : 2], inputs[1 : 2 * num_pairs : 2] = keys, values
        mask = np.zeros(length, bool)
        late = rng.choice(np.arange(2 * num_pairs + 3, length), num_pairs - 2, replace=False)
        spots = np.concatenate([[2 * num_pairs, 2 * num_pairs + 1], np.sort(late)])
        order = rng.permutation(num_pairs)  # query j asks for pair order[j]
        inputs[spots], mask[spots] = keys[order], True
        reach = int(rng.choice(np.sort(spots - (2 * order + 1))[:-1]))  # one query beyond
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
        if int(got) == _reach_count(inputs, mask, num_pairs, reach - 1) != want:
            return "a value exactly conv_reach tokens back is within reach (<=, not <)"
        if int(got) != want:
            return "pair i's value sits at position 2 i + 1; compare with each query's position"
    return None


def head_filter(decays, beta, k, q, length: int) -> np.ndarray:
    """beta q^T A^tau k for tau < length, A = (I - beta k k^T) Diag(decays)."""
    decays, k, q = (np.asarray(a, np.float64) for a in (decays, k, q))
    a = (np.eye(k.size) - beta * np.outer(k, k)) @ np.diag(decays)
    out, vec = [], beta * k
    for _ in range(length):
        out.append(q @ vec)
        vec = a @ vec
    return np.asarray(out)


@checker("08.4")
def three_time_scales(answer, *, half_lives, length: int):
    """A KDA head whose filter is the mean of three exponentials."""
    if not isinstance(answer, dict) or set(answer) != {"decays", "beta", "k", "q"}:
        return "give a dict with the keys decays, beta, k, q"
    for name in ("decays", "k", "q"):
        hint = refuse_degenerate(answer[name], shape=(len(half_lives),), what=name)
        if hint:
            return hint + f" ({name} needs {len(half_lives)} entries, one per channel)"
    hint = refuse_degenerate(answer["beta"], shape=(), what="beta")
    if hint:
        return hint
    decays, k, q = (np.asarray(answer[n], np.float64) for n in ("decays", "k", "q"))
    beta = float(answer["beta"])
    if not ((decays > 0).all() and (decays <= 1).all() and 0.05 <= beta <= 1):
        return "a decay must lie in (0, 1] and beta in [0.05, 1] (a real delta-rule write)"
    if np.linalg.norm(q) > 100:
        return "keep |q| <= 100: a query that large only hides a tiny beta"
    if not np.isclose(np.linalg.norm(k), 1.0):
        return "the key must have unit norm (the layer L2-normalises it)"
    lag = np.arange(length)
    target = np.mean([(0.5 ** (1 / h)) ** lag for h in half_lives], axis=0)
    got = head_filter(decays, beta, k, q, length)
    error = np.linalg.norm(got - target) / np.linalg.norm(target)
    if error < 1e-6:
        return None
    return (
        f"the head's filter is {error:.2g} off (relative L2); are A's eigenvalues the three "
        "per-token ratios 2^(-1/h), h the half-lives?"
    )
