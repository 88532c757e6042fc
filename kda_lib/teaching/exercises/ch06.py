"""Checkers of notebook 06: a blind model's floor, a dilated stack's reach, periodic clearing."""

from __future__ import annotations

import itertools
import math

import numpy as np

from kda_lib.teaching import exercises as ex

_SKEWED = ([0.5, 0.25, 0.125, 0.125], [0.7, 0.1, 0.1, 0.1, 0.0, 0.0],  # Zipf, zeros, uniform
           list(np.arange(1, 17)[::-1] / np.arange(1, 17).sum()), [0.25] * 4,
           list(1 / np.arange(1, 101) / (1 / np.arange(1, 101)).sum()))
_ENTROPY_HINT = ("blind_floor(probs) uses {}, which does the derivation: write the entropy "
                 "-sum_v probs[v] log probs[v] yourself (numpy), 0 log 0 counting as 0")


@ex.checker("06.1")
def blind_floor(answer, rng):
    """``answer(probs) -> (loss, accuracy)``: the least cross-entropy (nats), the best accuracy of a
    model blind to the token it copies, tokens i.i.d. from ``probs`` (zeros allowed); no scipy."""
    drawn = rng.dirichlet(np.full(int(rng.integers(3, 12)), 0.5))
    drawn[-1] = 0.0  # one zero
    if holding := ex.holds_scipy(answer):
        return _ENTROPY_HINT.format(holding)
    for probs in [*_SKEWED, list(drawn / drawn.sum())]:
        got, hint = ex.call_answer(answer, list(probs), name="blind_floor(probs)",
                                   refused={p: _ENTROPY_HINT.format(p) for p in ex.SCIPY},
                                   refuse=dict(shape=(2,), what="(loss, accuracy)"))
        if hint:
            return hint
        (loss, acc), p = (float(g) for g in np.ravel(got)), np.asarray(probs, np.float64)
        entropy, uniform = float(-(p[p > 0] * np.log(p[p > 0])).sum()), math.log(len(p))
        if math.isclose(loss, uniform, rel_tol=1e-5) and not math.isclose(entropy, uniform,
                                                                          rel_tol=1e-5):
            return "log |V| is the floor of the uniform stream only; the tokens here are skewed"
        if math.isclose(loss, entropy / math.log(2), rel_tol=1e-5) and len(p) > 2:
            return "that loss is in bits; the notebook's losses are in nats"
        # abs_tol: float32 probs move a near-zero entropy by ~3e-8 nats (jnp computes in float32)
        if not math.isclose(loss, entropy, rel_tol=1e-5, abs_tol=1e-6):
            return "wrong loss: what should a model predict when it cannot see the source token?"
        if math.isclose(acc, 1 / len(p), rel_tol=1e-6) and p.max() > 1 / len(p) + 1e-9:
            return "1/|V| is the uniform stream's accuracy; which guess is right most often here?"
        if not math.isclose(acc, float(p.max()), rel_tol=1e-6):
            return "wrong accuracy: the best blind guess is one fixed token"


def _positions(answer, args, name):
    """``(sorted positions, None)`` of ``answer(*args)`` (list, array, set) or ``(None, hint)``."""
    got, hint = ex.call_answer(answer, *args, name=name)
    got = sorted(got) if isinstance(got, (set, frozenset)) else got
    hint = hint or ex.refuse_degenerate(got, integer=True, allow_zeros=True, what="positions")
    if not hint and np.ndim(got) != 1:
        hint = "give a list (or set) of positions t (ints)"
    return (None, hint) if hint else (sorted(int(t) for t in got), None)


# (last, widths, dilations): gaps (2, 2 / 1, 4), WaveNet-style doubling, a width 1, clipping at 0
_STACKS = ((20, (2, 2), (1, 4)), (31, (4, 4), (1, 4)), (12, (3,), (2,)),
           (30, (2, 2, 2), (1, 2, 4)), (9, (3, 2), (3, 1)), (25, (1, 4), (5, 2)),
           (4, (4, 3), (1, 3)))


def _seen(last, widths, dilations):
    """The positions the stacked dilated convolutions let ``last`` see, ascending."""
    offsets = {sum(j * d for j, d in zip(js, dilations, strict=True))
               for js in itertools.product(*(range(w) for w in widths))}
    return sorted(last - o for o in offsets if o <= last)


@ex.checker("06.2")
def dilated_positions(answer, rng):
    """``answer(last, widths, dilations) -> positions`` an output at ``last`` sees, layer i a causal
    conv of width ``widths[i]``, dilation ``dilations[i]`` (taps t, t - d, ..., t - (w - 1) d)."""
    depth = int(rng.integers(1, 4))
    drawn = (int(rng.integers(5, 40)), tuple(int(w) for w in rng.integers(1, 5, depth)),
             tuple(int(d) for d in rng.integers(1, 6, depth)))
    for last, widths, dilations in [*_STACKS, drawn]:
        got, hint = _positions(answer, (last, list(widths), list(dilations)),
                               "seen_positions(last, widths, dilations)")
        if hint or got != _seen(last, widths, dilations):
            where = f"at last = {last}, widths {widths}, dilations {dilations}"
            span = sum(d * (w - 1) for w, d in zip(widths, dilations, strict=True))
            return hint or (
                f"negative positions {where}: the sequence starts at 0" if min(got, default=0) < 0
                else f"a position listed twice {where}" if len(set(got)) != len(got)
                else f"wrong {where}: the reach is right; does a dilated stack see all of it?"
                if got == list(range(max(0, last - span), last + 1))
                else f"wrong {where}: which offsets can the taps of the layers add up to?")


_PERIODIC = ((32, 8, 4, 12), (40, 6, 3, 10), (48, 10, 4, 16), (30, 5, 2, 7), (64, 12, 5, 20),
             (40, 9, 3, 4), (64, 10, 4, 6),  # (T, delay, w, period); these two: lost either way
             (32, 8, 4, 2), (24, 6, 4, 2),  # w - 1 > period: p' is not p - period
             (32, 8, 4, 3), (40, 9, 5, 2), (30, 7, 3, 2))  # period | w - 1: at p - w + 1 counts


def _lost(seq_len, delay, conv_size, period, upper=True, first_only=False, previous=False,
          strict=False):
    """Scored t whose token t - delay < p - (w - 1), p the last clearing at or before t (``upper``)
    or at or before that one's p - (w - 1); slips: ``first_only``, the first clearing only;
    ``previous``, the clearing before p for the kept histories (right only when w - 1 <= period);
    ``strict``, the last clearing strictly before p - (w - 1) (wrong when period divides w - 1)."""
    last = lambda t: min(t // period * period, period if first_only else t)
    cut = ((lambda t: last(t) - period) if previous
           else lambda t: last(last(t) - conv_size + 1 - strict))
    return [t for t in range(delay, seq_len) if (p := last(t) if upper else cut(t)) > 0
            and t - delay < p - conv_size + 1]


@ex.checker("06.3")
def periodic_clearing(answer, rng):
    """``answer(seq_len, delay, conv_size, period, clear_upper_convs)``: the t whose token has no
    path left, the page's model cleared (conv histories above layer 0 too?) every ``period``."""
    delay, conv_size = int(rng.integers(3, 12)), int(rng.integers(2, 6))
    periods = (int(rng.integers(delay + 1, 3 * delay + 2)), int(rng.integers(2, delay)))
    short = int(rng.integers(1, 4))  # a period shorter than w - 1: conv_size up to 6
    cases = [*_PERIODIC, *((delay + int(rng.integers(2 * p, 5 * p)), delay,
                            min(conv_size, p + 1), p) for p in periods),
             (delay + int(rng.integers(4 * short + 8, 40)), delay, int(rng.integers(short + 2, 7)),
              short)]
    for case in [(*c, True) for c in cases] + [(*c, False) for c in cases]:  # upper first
        got, hint = _positions(answer, case, "lost_positions(..., clear_upper_convs)")
        if hint or got != _lost(*case):
            seq_len, delay, *_, upper = case
            return hint or (
                "give each position once" if len(set(got)) != len(got)
                else f"positions must be scored ones, delay..T-1 = {delay}..{seq_len - 1}"
                if any(t < delay or t >= seq_len for t in got)
                else f"wrong for {case}: only the first clearing counted; which matters at t?"
                if upper and got == _lost(*case, first_only=True)
                else f"wrong for {case}: after the last clearing at or before t, which tokens "
                "keep a path?" if upper
                else f"wrong for {case}: here w - 1 > period; which clearing emptied layer 0's "
                "state before position p - (w - 1)?" if got == _lost(*case, previous=True)
                else f"wrong for {case}: layer 0's state was emptied at p - (w - 1) when that is "
                "a clearing: the last clearing at or before it, not strictly before"
                if got == _lost(*case, strict=True)
                else f"wrong for {case}: layer 1's kept history holds "
                "layer 0's outputs from before the clearing; which tokens can they carry?")
