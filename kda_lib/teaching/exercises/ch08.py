"""Checkers of notebook 08's exercises (chance, solved settings, the conv reach, time scales)."""

from __future__ import annotations

import numpy as np

from kda_lib.checks import is_int
from kda_lib.lab.tasks import chance_accuracy
from kda_lib.teaching.exercises import checker, refuse_degenerate


@checker("08.1")
def mqar_chance(answer, *, vocab_size: int):
    """Uniform guessing among MQAR's value tokens."""
    hint = refuse_degenerate(answer, shape=(), what="the accuracy")
    if hint:
        return hint
    value = float(answer)
    if np.isclose(value, chance_accuracy("mqar", vocab_size=vocab_size, num_pairs=1)):
        return None
    return "count the value tokens: token 0 is the filler, (V - 1) // 2 tokens are keys"


def _solved(accuracy: dict, threshold: float = 0.9) -> set:
    return {(task, t) for (task, _, t), acc in accuracy.items() if np.mean(acc) >= threshold}


@checker("08.2")
def solved_settings(answer, *, accuracy: dict):
    """The (task, T) pairs where some mixer's mean accuracy over seeds reaches 0.9."""
    if isinstance(answer, (str, bytes, dict)) or np.ndim(answer) == 0:
        return "give a list of (task, T) pairs"
    try:
        got = {(str(task), int(t)) for task, t in answer}
    except (TypeError, ValueError, OverflowError):  # not pairs, or a NaN or inf T
        return "give a list of (task, T) pairs, T an int"
    if any(not isinstance(task, str) for task, _ in answer):
        return "each pair is (task name, T), the task a string"
    want = _solved(accuracy)
    if got == want:
        return None
    if got > want:
        return "some of these no mixer solves: average over the seeds first"
    return "a setting is solved if any one mixer reaches the threshold"


@checker("08.3")
def conv_reach_queries(answer, *, inputs, mask, num_pairs: int, conv_reach: int):
    """Queries whose value lies within ``conv_reach`` tokens before them."""
    inputs, mask = np.asarray(inputs), np.asarray(mask)
    value_pos = {int(k): 2 * i + 1 for i, k in enumerate(inputs[0 : 2 * num_pairs : 2])}
    want = sum(int(t - value_pos[int(inputs[t])] <= conv_reach) for t in np.flatnonzero(mask))
    hint = refuse_degenerate(answer, shape=(), integer=True, allow_zeros=want == 0, what="count")
    if hint:
        return hint
    if not is_int(answer, None):
        return "give a count, an int"
    if int(answer) == want:
        return None
    return "the value of pair i sits at position 2 i + 1; compare with each query's position"


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
    if not ((alphas > 0).all() and (alphas <= 1).all() and 0 < beta <= 1):
        return "a decay must lie in (0, 1] and beta in (0, 1]"
    if not np.isclose(np.linalg.norm(k), 1.0):
        return "the key must have unit norm (the layer L2-normalises it)"
    lag = np.arange(length)
    target = np.mean([(0.5 ** (1 / h)) ** lag for h in half_lives], axis=0)
    got = head_filter(alphas, beta, k, q, length)
    error = np.linalg.norm(got - target) / np.linalg.norm(target)
    if error < 1e-6:
        return None
    return f"the head's filter is {error:.2g} off (relative L2); are A's eigenvalues the three r's?"
