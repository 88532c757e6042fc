"""Checkers of notebook 08: the vote level, pops beyond the reach, three time scales."""

from __future__ import annotations

import contextlib
import math

import jax
import numpy as np

from kda_lib.lab import tasks
from kda_lib.teaching import exercises as ex
from kda_lib.teaching import recall_sweep as rs

VOTE_RTOL = 5e-5  # 08.1's: float32 (numpy, jnp) passes, <= 1.2e-5; 2e5 simulated sequences fail


def _vote_problem(got: float, n: int, p: np.ndarray) -> str | None:
    """None if ``got`` is the vote level of ``n`` pairs, values drawn with ``p``, else a hint."""
    want = rs.vote_accuracy(n, p.size, probs=p)
    if ex.close(got, want, VOTE_RTOL):
        return None
    where = f"wrong at n_pairs = {n}, {p.size} values ({'un' if np.ptp(p) else ''}equally likely)"
    if ex.close(got, 1 / n + (n - 1) / n * (p**2).sum(), VOTE_RTOL):
        return (f"{where}: that is guessing a random pair's value; the vote answers every query "
                "with the sequence's most frequent value (right at as many queries as it occurs)")
    if ex.close(got, n * want, VOTE_RTOL):
        return (f"{where}: that is the expected largest count, queries answered right; the "
                "accuracy divides it by n_pairs")
    if ex.close(got, 1 - np.cumsum([[math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(
            n)] for q in p], 1).prod(0).mean(), VOTE_RTOL):  # P(max < k) as a product of binomials
        return (f"{where}: the counts sum to n_pairs, so they are not independent: P(every count "
                "< k) is not the product of the values' binomial P(count < k); count joint draws")
    if abs(got - want) < 0.02:
        return (f"{where}: off by {abs(got - want):.1g}, an estimate's error (a simulation needs "
                "billions of draws for 5e-5): count exactly, E[max count] = sum_k P(max >= k)")
    return (f"{where}: accuracy = E[largest count of a value among the n_pairs draws] / n_pairs, "
            "each draw value i with probability probs[i]")


@ex.checker("08.1")
def vote_level(answer, rng, **_):
    """``answer(n_pairs, probs) -> float``, exact to 5e-5: uniform small cases and a drawn size
    (12-24 pairs, 12-128 values), then two drawn Dirichlet cases no uniform table covers."""
    n, m = int(rng.integers(12, 25)), int(rng.integers(12, 129))
    trials = [(k, np.full(v, 1 / v)) for k, v in ((1, 7), (3, 1), (2, 2), (5, 3), (n, m))]
    for n, p in trials + [(int(rng.integers(12, 25)), rng.dirichlet(np.full(int(rng.integers(
            12, 129)), a))) for a in (0.5, 5.0)]:
        got, hint = ex.call_answer(answer, n, p.copy(), name="vote_level(n_pairs, probs)",
                                   refuse=dict(shape=(), what="the vote level"))
        if hint or (hint := _vote_problem(float(got), n, p)):
            return hint


def _sources(inputs: np.ndarray, last_push: bool = False, by_value: bool = False) -> np.ndarray:
    """Where each position's stack top was pushed (-1: empty), or a slip's (last push, by value)."""
    out = np.full(inputs.shape, -1)
    for b, r in enumerate(inputs):
        stack: list[int] = []
        for t, token in enumerate(r.tolist()):
            stack = stack[:-1] if token == 1 else [*stack, t]  # a pop, else a push
            src = stack[-1] if stack else -1
            if src >= 0 and (last_push or by_value):  # the slip's: the last push, or its value's
                src = max(s for s in range(t + 1) if r[s] == r[src] or last_push and r[s] != 1)
            out[b, t] = src
    return out


def _reach_slips(inputs, mask, reach: int) -> dict:
    """Each slip's mask, and the hint it earns."""
    t, right = np.arange(inputs.shape[1]), _sources(inputs)
    beyond = lambda s, gap=reach, masked=True: (mask | (not masked)) & (s >= 0) & (t - s > gap)
    return {
        "a pop whose answer is exactly `reach` tokens back is within reach: beyond means "
        "t - (where it was pushed) > reach": [beyond(right, reach - 1), beyond(right, reach + 1)],
        "the answer is the top of the stack after the pop, not the last push (that one was "
        "popped): keep a stack": [beyond(_sources(inputs, last_push=True))],
        "values repeat: the same value pushed later is not the top's push; keep the positions "
        "of the pushes on the stack, not their values": [beyond(_sources(inputs, by_value=True))],
        "only positions the mask scores can be beyond reach: and your answer with `mask`":
            [beyond(right, masked=False)]}


def _reach_trials(rng):
    """(inputs, mask, reach): drawn stacks, their masks, random halves; two stacks by hand."""
    hand, out = np.array([[5, 7, 1, 3, 1, 1, 6], [5, 7, 3, 9, 1, 1, 1]]), []  # 2: 3 pops in a row
    for vocab, pop in ((4, 0.45), (6, 0.4)):
        inputs, _, mask = map(np.asarray, tasks.stack(jax.random.key(int(rng.integers(2**31))), 4,
                                                      64, vocab_size=vocab, pop_probability=pop))
        out += [(inputs, mask, int(rng.integers(2, 7))),
                (inputs, rng.random(mask.shape) < 0.5, int(rng.integers(2, 7)))]
    return out + [(hand, (hand == 1) & (_sources(hand) >= 0), r) for r in (1, 2, 4)]


@ex.checker("08.2")
def beyond_reach(answer, rng, **_):
    """``answer(inputs, mask, reach) -> [B, T] bool``: the scored stack positions whose answer
    was pushed more than ``reach`` tokens back; a hand example and drawn stacks and masks."""
    told = None  # for an answer that marks nothing or is the mask (a slip's too, at times)
    for inputs, mask, reach in _reach_trials(rng):
        got, hint = ex.call_answer(answer, inputs.copy(), mask.copy(), reach,
                                   name="beyond_reach(inputs, mask, reach)")
        if hint:
            return hint
        with contextlib.suppress(Exception):  # bools as 0 / 1; ragged: refuse_degenerate says so
            got = np.asarray(got, np.int8) if np.asarray(got).dtype == bool else got
        if hint := ex.refuse_degenerate(got, shape=inputs.shape, what="the mask", allow_zeros=True):
            return hint + " (bools, one per position of inputs)"
        if not np.isin(got, (0, 1)).all():
            return "the answer is a mask: True / False (or 1 / 0) at each position"
        want = np.asarray(tasks.beyond_reach_mask("stack", tasks.TaskBatch(
            inputs, inputs, mask), reach))
        if (got == want).all():
            continue
        if not got.any() or (got == mask).all():  # say so unless a later trial names the slip
            told = told or ("no position is marked" if not got.any() else "that is the mask itself"
                            ) + f": mark the scored positions whose answer is > {reach} tokens back"
            continue
        for text, slips in _reach_slips(inputs, mask, reach).items():
            if any((got == slip).all() for slip in slips):
                return f"{text} (reach {reach})"
        return (f"some positions are off (reach {reach}): at a scored pop the answer is the new "
                "top (none where the stack is empty: not beyond); find the position t' of the PUSH "
                "that put it there (a stack of positions) and mark t where t - t' > reach")
    return told


def head_filter(p, length: int) -> np.ndarray:
    """beta q^T A^tau k, tau < length, A = (I - beta k k^T) D; p = (decays of D, beta, k, q)."""
    decays, beta, k, q = p[:3], p[3], p[4:7], p[7:]
    a = (np.eye(3) - beta * np.outer(k, k)) @ np.diag(decays)
    return np.array([q @ np.linalg.matrix_power(a, tau) @ (beta * k) for tau in range(length)])


@ex.checker("08.3")
def three_time_scales(answer, rng, *, half_lives, length: int):
    """``answer(half_lives) -> dict(decays, beta, k, q)``: a head filtering by the mean of three
    exponentials of those half-lives; the page's, and three drawn. A fit (scipy, optax) refused."""
    derive = "a fit (scipy, optax, autodiff): derive the head (A's eigenvalues, secular equation)"
    ad = dict.fromkeys(("optax", "jax._src.interpreters.ad", "jax.experimental"), derive)
    drawn = tuple(round(float(rng.uniform(*b)), 2) for b in ((1, 3), (5, 20), (30, 120)))
    for lives in (tuple(half_lives), drawn):
        head, hint = (None, derive) if ex.holds_scipy(answer) else ex.call_answer(
            answer, lives, name="three_time_scales(half_lives)", refused=ad)
        if hint or (hint := _head_problem(head, lives, length)):
            return f"{hint} (half-lives {lives})"


def _head_problem(answer, half_lives, length: int) -> str | None:
    if not isinstance(answer, dict) or set(answer) != {"decays", "beta", "k", "q"}:
        return "return a dict with the keys decays, beta, k, q"
    for name, shape in (("decays", (3,)), ("k", (3,)), ("q", (3,)), ("beta", ())):
        if hint := ex.refuse_degenerate(answer[name], shape=shape, what=name):
            return hint + (f" ({name} needs 3 entries, one per channel)" if shape else "")
    decays, beta, k, q = (np.asarray(answer[n], float) for n in ("decays", "beta", "k", "q"))
    if not ((decays > 0).all() and (decays <= 1).all() and 0.05 <= beta <= 1 and np.isclose(
            np.linalg.norm(k), 1.0)):  # a real delta-rule write of the layer's L2-normalised key
        return (f"each decay in (0, 1], beta in [0.05, 1], the key of unit norm; got decays "
                f"{np.round(decays, 4).tolist()}, beta {beta:.3g}, |k| {np.linalg.norm(k):.3g}")
    want = np.mean([(0.5 ** (1 / h)) ** np.arange(length) for h in half_lives], axis=0)
    p, scale = np.concatenate([decays, [beta], k, q]), np.linalg.norm(want)
    # float32's slack: sum_i |p_i| ||d filter / d p_i|| 2^-21, each number off by 4 float32 eps;
    # q may be of any length, but at most 1e-3 (a huge q's cancellations cannot buy a wrong head)
    slack = min(1e-3, max(1e-6, 2.0**-21 * sum(np.linalg.norm(head_filter(p + s, length) - (
        head_filter(p - s, length))) / 2e-6 for s in 1e-6 * np.diag(np.abs(p))) / scale))
    error = np.linalg.norm(head_filter(p, length) - want) / scale
    eig = np.sort(np.linalg.eigvals((np.eye(3) - beta * np.outer(k, k)) @ np.diag(decays)).real)
    right = np.allclose(eig, np.sort(0.5 ** (1 / np.asarray(half_lives, float))), atol=1e-6)
    return None if error <= slack else (  # right eigenvalues: q (a scale, beta left out) is off
        f"the head's filter is {error:.2g} off (relative L2), more than float32 rounding of its "
        f"parameters allows ({slack:.2g}); " + ("A's eigenvalues are right, q is off: beta q^T A^nu"
        " k must be the mean itself (1 at lag 0)" if right else "A's eigenvalues (not D's decays: "
        "I - beta k k^T moves them) must be the three per-token ratios 2^(-1/h), h the half-lives"))
