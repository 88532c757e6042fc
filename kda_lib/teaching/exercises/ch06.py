"""Checkers of notebook 06's exercises (delayed copy, the conv reach, clearing the states)."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.teaching.exercises import checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


@checker("06.1")
def chance_level(answer, **_):
    """``answer(vocab_size) -> float``: the cross-entropy in bits of the uniform prediction over
    ``vocab_size`` tokens; tried on vocabularies of the checker's own (not the notebook's)."""
    for size in (2, 5, 16, 1000, 50257):
        got, hint = call_own_work(answer, size, name="chance_bits(vocab_size)")
        hint = hint or refuse_degenerate(got, shape=(), what=f"the loss at |V| = {size}")
        if hint:
            return hint
        if math.isclose(float(got), math.log(size), rel_tol=1e-5):
            return "that is in nats; a bit is log base 2"
        if not math.isclose(float(got), math.log2(size), rel_tol=1e-5):
            return f"wrong at |V| = {size}: the loss is -sum_v p(v) log2 p(v) with p uniform"
    return None


_STACKS = ((31, (4, 4)), (10, (4, 2, 3)), (3, (4, 4)), (20, (1, 4)), (50, (5, 5, 5, 5)))


@checker("06.2")
def conv_positions(answer, **_):
    """``answer(last, conv_sizes) -> positions``: the positions an output at ``last`` depends
    on in a conv-only stack whose layers' causal convs have widths ``conv_sizes``. The checker
    tries stacks of its own (mixed widths, a width of 1, ``last`` within the reach)."""
    for last, sizes in _STACKS:
        got, hint = call_own_work(
            answer, last, list(sizes), name="seen_positions(last, conv_sizes)"
        )
        hint = hint or refuse_degenerate(got, integer=True, allow_zeros=True, what="positions")
        if hint:
            return hint
        got = sorted(int(t) for t in np.ravel(got))
        want = list(range(max(0, last - sum(w - 1 for w in sizes)), last + 1))
        if got == want:
            continue
        if len(got) == len(want) + 1 or len(got) == len(want) - 1:
            return f"off by one at last = {last}, widths {sizes}: the last position sees itself"
        if any(t < 0 for t in got):
            return f"negative positions at last = {last}: the sequence starts at 0"
        return f"wrong at last = {last}, widths {sizes}: how many tokens back does each conv add?"
    return None


@checker("06.3")
def late_clearing(answer, *, p: int, seq_len: int, delay: int, conv_size: int):
    """The positions t >= p whose token (at t - delay) has no path left when the states and
    every conv history above layer 0 are cleared at p: it lies more than w - 1 before p."""
    hint = refuse_degenerate(answer, integer=True, allow_zeros=True, what="the positions")
    if hint or np.ndim(answer) != 1:
        return hint or "give a list of positions t (ints), each at least p"
    got = sorted(int(t) for t in answer)
    if len(set(got)) != len(got):
        return "give each position once"
    want = [t for t in range(p, seq_len) if t - delay < p - (conv_size - 1)]
    if want in ([], list(range(p, seq_len))):
        raise ValueError(f"p = {p} leaves no choice to make (every or no position lost)")
    if got == want:
        return None
    if any(t < p or t >= seq_len for t in got):
        return f"positions must lie in p..T-1 = {p}..{seq_len - 1}"
    return "which tokens can still enter through layer 0's kept conv history after the clearing?"
