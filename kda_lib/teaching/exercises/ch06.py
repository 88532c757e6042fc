"""Checkers of notebook 06's exercises (a blind model's floor on a skewed vocabulary, a dilated
conv stack's positions, clearing at every ``period`` tokens)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from kda_lib.teaching.exercises import (
    SCIPY,
    again,
    call_answer,
    checker,
    holds_scipy,
    refuse_degenerate,
    seeded,
)

_SKEWED = (  # token distributions of the checker's own: Zipf, with zeros, two-valued
    [0.5, 0.25, 0.125, 0.125],
    [0.7, 0.1, 0.1, 0.1, 0.0, 0.0],
    list(np.arange(1, 17)[::-1] / np.arange(1, 17).sum()),
    [0.25, 0.25, 0.25, 0.25],
    list(1 / np.arange(1, 101) / (1 / np.arange(1, 101)).sum()),
)


def _random_probs(rng):
    """A distribution drawn at check time (so a table of the fixed trials fails), one zero."""
    p = rng.dirichlet(np.full(int(rng.integers(3, 12)), 0.5))
    p[-1] = 0.0
    return list(p / p.sum())


def _listed(got):
    """A set of positions, sorted into a list (the checkers compare sorted positions)."""
    return sorted(got) if isinstance(got, (set, frozenset)) else got


_ENTROPY_HINT = ("blind_floor(probs) uses {}, which does the derivation: write the entropy "
                 "-sum_v p(v) log p(v) yourself (numpy), 0 log 0 counting as 0")


def _floor_call(answer, probs):
    """``(got, hint)`` of ``answer(probs)``: its own work, no kda_lib, no scipy or jax.scipy."""
    holding = holds_scipy(answer)
    if holding:
        return None, _ENTROPY_HINT.format(holding)
    return call_answer(answer, list(probs), name="blind_floor(probs)",
                       refused={p: _ENTROPY_HINT.format(p) for p in SCIPY})


@checker("06.1")
def blind_floor(answer, *, seed=None):
    """``answer(probs) -> (loss, accuracy)``: the lowest cross-entropy (nats) and the highest
    accuracy of a model that cannot see the token it must copy, when tokens are drawn i.i.d.
    from ``probs`` (zeros allowed): the entropy of ``probs`` and its largest entry. The
    checker's distributions and one drawn (``seed`` repeats it); scipy and jax.scipy (their
    entropies) are refused."""
    seed, rng = seeded(seed)
    hint = _floor_hint(answer, [*_SKEWED, _random_probs(rng)])
    return hint and hint + again(seed)


def _floor_hint(answer, trials) -> str | None:
    for probs in trials:
        got, hint = _floor_call(answer, probs)
        hint = hint or refuse_degenerate(got, shape=(2,), what="(loss, accuracy)")
        if hint:
            return hint
        loss, acc = (float(g) for g in np.ravel(got))
        p = np.asarray(probs, np.float64)
        entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
        if math.isclose(loss, math.log(len(p)), rel_tol=1e-5) and not math.isclose(
            entropy, math.log(len(p)), rel_tol=1e-5
        ):
            return "log |V| is the floor of the uniform stream only; the tokens here are skewed"
        if math.isclose(loss, entropy / math.log(2), rel_tol=1e-5) and len(p) > 2:
            return "that loss is in bits; the notebook's losses are in nats"
        # abs_tol: probs rounded to float32 move a near-zero entropy by ~3e-8 nats (relative
        # 6e-4 at seed 35's 0.999996), and jax.numpy computes in float32; the fixed trials'
        # entropies (0.94 nats or more) keep rel_tol in charge there
        if not math.isclose(loss, entropy, rel_tol=1e-5, abs_tol=1e-6):
            return "wrong loss: what should a model predict when it cannot see the source token?"
        if math.isclose(acc, 1 / len(p), rel_tol=1e-6) and p.max() > 1 / len(p) + 1e-9:
            return "1/|V| is the uniform stream's accuracy; which guess is right most often here?"
        if not math.isclose(acc, float(p.max()), rel_tol=1e-6):
            return "wrong accuracy: the best blind guess is one fixed token"
    return None


# (last, widths, dilations): gaps (2, 2 / 1, 4), WaveNet-style doubling, a width 1, clipping at 0
_STACKS = (
    (20, (2, 2), (1, 4)),
    (31, (4, 4), (1, 4)),
    (12, (3,), (2,)),
    (30, (2, 2, 2), (1, 2, 4)),
    (9, (3, 2), (3, 1)),
    (25, (1, 4), (5, 2)),
    (4, (4, 3), (1, 3)),
)


def _seen(last, widths, dilations):
    """The positions the stacked dilated convolutions let ``last`` see, ascending."""
    offsets = {sum(j * d for j, d in zip(js, dilations, strict=True))
               for js in itertools.product(*(range(w) for w in widths))}
    return sorted(last - o for o in offsets if o <= last)


@checker("06.2")
def dilated_positions(answer, *, seed=None):
    """``answer(last, widths, dilations) -> positions``: the positions an output at ``last``
    depends on in a conv-only stack whose layer i has a causal conv of width ``widths[i]`` and
    dilation ``dilations[i]`` (taps at t, t - d, ..., t - (w - 1) d). The checker tries stacks
    of its own, some with gaps in the positions, and one drawn (``seed`` repeats it)."""
    seed, rng = seeded(seed)
    depth = int(rng.integers(1, 4))
    drawn = (int(rng.integers(5, 40)), tuple(int(w) for w in rng.integers(1, 5, depth)),
             tuple(int(d) for d in rng.integers(1, 6, depth)))
    hint = _positions_hint(answer, [*_STACKS, drawn])
    return hint and hint + again(seed)


def _positions_hint(answer, stacks) -> str | None:
    for last, widths, dilations in stacks:
        got, hint = call_answer(answer, last, list(widths), list(dilations),
                                name="seen_positions(last, widths, dilations)")
        got = _listed(got)
        hint = hint or refuse_degenerate(got, integer=True, allow_zeros=True, what="positions")
        if hint:
            return hint
        got = sorted(int(t) for t in np.ravel(got))
        want = _seen(last, widths, dilations)
        if got == want:
            continue
        where = f"at last = {last}, widths {widths}, dilations {dilations}"
        if any(t < 0 for t in got):
            return f"negative positions {where}: the sequence starts at 0"
        if len(set(got)) != len(got):
            return f"a position listed twice {where}"
        span = sum(d * (w - 1) for w, d in zip(widths, dilations, strict=True))
        if got == list(range(max(0, last - span), last + 1)):
            return f"wrong {where}: the reach is right; does a dilated stack see all of it?"
        return f"wrong {where}: which offsets can the taps of the layers add up to?"
    return None


# (seq_len, delay, conv_size, period): some positions lost, some kept after each clearing
_PERIODIC = ((32, 8, 4, 12), (40, 6, 3, 10), (48, 10, 4, 16), (30, 5, 2, 7), (64, 12, 5, 20))


def _lost(seq_len, delay, conv_size, period):
    """The positions whose input ``delay`` tokens back was cleared (before the last clearing,
    beyond the conv's reach)."""
    return [t for t in range(delay, seq_len)
            if t >= period and t - delay < (t // period) * period - (conv_size - 1)]


@checker("06.3")
def periodic_clearing(answer, *, seed=None):
    """``answer(seq_len, delay, conv_size, period) -> positions``: the scored positions t whose
    token (at t - delay) has no path left when the states and the conv histories above layer 0
    are cleared at every multiple of ``period`` (period, 2 period, ...). The checker's cases
    and one drawn (``seed`` repeats it)."""
    seed, rng = seeded(seed)
    delay, conv_size = int(rng.integers(3, 12)), int(rng.integers(2, 6))
    period = int(rng.integers(delay + 1, 3 * delay + 2))
    drawn = (int(rng.integers(2 * period, 5 * period)), delay, conv_size, period)
    hint = _lost_hint(answer, [*_PERIODIC, drawn])
    return hint and hint + again(seed)


def _lost_hint(answer, cases) -> str | None:
    for case in cases:
        got, hint = call_answer(answer, *case,
                                name="lost_positions(seq_len, delay, conv_size, period)")
        got = _listed(got)
        hint = hint or refuse_degenerate(got, integer=True, allow_zeros=True, what="positions")
        if hint:
            return hint
        if np.ndim(got) != 1:
            return "give a list (or set) of positions t (ints)"
        got = sorted(int(t) for t in got)
        want = _lost(*case)
        if got == want:
            continue
        seq_len, delay, conv_size, period = case
        if len(set(got)) != len(got):
            return "give each position once"
        if any(t < delay or t >= seq_len for t in got):
            return f"positions must be scored ones, delay..T-1 = {delay}..{seq_len - 1}"
        first_only = [t for t in range(max(delay, period), seq_len)
                      if t - delay < period - (conv_size - 1)]
        if got == first_only:
            return f"wrong for {case}: only the first clearing counted; which matters at t?"
        return f"wrong for {case}: after the last clearing before t, which tokens keep a path?"
    return None
