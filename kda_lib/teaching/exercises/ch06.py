"""Checkers of notebook 06's exercises (delayed copy, the conv reach, clearing the states)."""

from __future__ import annotations

import math

from kda_lib.teaching.exercises import checker


@checker("06.1")
def chance_level(answer, *, vocab_size: int):
    """The cross-entropy (nats) of the uniform prediction over ``vocab_size`` tokens."""
    if not isinstance(answer, (int, float)) and not hasattr(answer, "__float__"):
        return "give one number: the loss in nats"
    if not math.isclose(float(answer), math.log(vocab_size), rel_tol=1e-5):
        return "the loss is -sum_v p(v) log p(v) with p uniform; nats use the natural log"
    return None


@checker("06.2")
def conv_positions(answer, *, last: int, conv_reach: int):
    """The positions the conv-only model's prediction at ``last`` depends on."""
    try:
        got = sorted(int(t) for t in answer)
    except TypeError:
        return "give a list of positions (ints)"
    want = list(range(last - conv_reach, last + 1))
    if got == want:
        return None
    if len(got) != len(want):
        return f"you listed {len(got)} positions; count the tokens every layer's conv adds"
    return "the right number of positions, not the right ones: the last position sees itself"


@checker("06.3")
def late_clearing(answer, *, p: int, seq_len: int, delay: int, conv_size: int):
    """The positions t >= p whose token (at t - delay) has no path left when the states and
    every conv history above layer 0 are cleared at p: it lies more than w - 1 before p."""
    try:
        got = sorted(int(t) for t in answer)
    except TypeError:
        return "give a list of positions t (ints), each at least p"
    want = [t for t in range(p, seq_len) if t - delay < p - (conv_size - 1)]
    if got == want:
        return None
    if any(t < p or t >= seq_len for t in got):
        return f"positions must lie in p..T-1 = {p}..{seq_len - 1}"
    return "which tokens can still enter through layer 0's kept conv history after the clearing?"
