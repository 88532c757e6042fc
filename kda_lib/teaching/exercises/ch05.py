"""Checkers of notebook 05's exercises (a long halo, composing summaries, the bytes crossover,
the fold for any rank count)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("05.1")
def long_halo(answer, *, ranks: int, local_len: int, halo_size: int):
    """What the last rank receives from halo_exchange (positions numbered from 1, 0 = none)."""
    start = (ranks - 1) * local_len - halo_size
    want = np.concatenate(
        [np.zeros(max(-start, 0)), np.arange(max(start, 0), start + halo_size) + 1]
    )
    if np.shape(answer) != want.shape:
        return f"give the first halo_size = {halo_size} entries rank R - 1 receives, as a list"
    hint = refuse_degenerate(answer, shape=want.shape, what="the halo")
    if hint:
        return hint
    if np.array_equal(np.asarray(answer, np.float64), want):
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
    rng = np.random.default_rng(5)
    a, b, c = _random_maps(rng, 3)
    state = rng.standard_normal((4, 3))
    name = "compose(first, second)"
    ab, hint = call_answer(answer, a, b, name=name)
    if hint:
        return hint
    if not (isinstance(ab, (tuple, list)) and len(ab) == 2):
        return "compose should return the pair (M, E)"
    for got, shape, what in ((ab[0], (4, 4), "M"), (ab[1], (4, 3), "E")):
        hint = refuse_degenerate(got, shape=shape, inputs=(*a, *b), what=what)
        if hint:
            return hint
    bc, hint = call_answer(answer, b, c, name=name)
    grouped, hint = (None, hint) if hint else call_answer(answer, ab, c, name=name)
    other, hint = (None, hint) if hint else call_answer(answer, a, bc, name=name)
    if hint:
        return hint
    ab, grouped, other = ([np.asarray(x) for x in pair] for pair in (ab, grouped, other))
    if not np.allclose(_apply(ab, state), _apply(b, _apply(a, state))):
        return "applying compose(first, second) must equal applying first, then second"
    if not all(np.allclose(x, y) for x, y in zip(grouped, other, strict=True)):
        return "the composition should not depend on the grouping"
    return None


def _gathers_more(t, ranks, key_dim, value_dim) -> bool:
    return (ranks - 1) / ranks * t * (3 * key_dim + value_dim + 1) > (
        (ranks - 1) * key_dim * (key_dim + value_dim)
    )


@checker("05.3")
def bytes_crossover(answer, **_):
    """``answer(ranks, key_dim, value_dim) -> T``: the first whole T at which gathering
    (R-1)/R T (3K + V + 1) numbers exceeds passing (R-1) K (K + V); the checker tries sizes of
    its own."""
    for sizes in ((8, 128, 128), (4, 64, 128), (16, 128, 64), (2, 32, 32), (64, 256, 256)):
        got, hint = call_answer(answer, *sizes, name="crossover(ranks, key_dim, value_dim)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="T")
        if hint:
            return hint
        if not (_gathers_more(got, *sizes) and not _gathers_more(got - 1, *sizes)):
            early = "too early" if not _gathers_more(got, *sizes) else "too late"
            return f"{early} for (ranks, key_dim, value_dim) = {sizes}: the first whole T"
    return None


def _primitive_counts(jaxpr, counts: dict) -> dict:
    """How often each primitive occurs in ``jaxpr``, its sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _primitive_counts(inner, counts)
    return counts


# A Python loop traces one composition per rank here (256 matrix products and more); a
# jax.lax.associative_scan takes 2 log2 R - 1 = 15 rounds
# (kda_lib.lab.costs.associative_scan_rounds), each one batched composition of two matrix
# products: about 30 traced products (the worked solution traces 32).
_TRACED_RANKS = 256


def _sequential_route(answer) -> str | None:
    """A hint if ``answer`` folds the ranks one after another: a sequential loop primitive
    (lax.scan, fori_loop, while_loop) in its jaxpr, or (a Python loop) at least one matrix
    product per rank at R = 256, where the 2 log2 R - 1 = 15 rounds of an associative scan
    trace about 30."""
    import jax
    import jax.numpy as jnp

    r = _TRACED_RANKS
    try:
        traced = jax.make_jaxpr(answer)(jnp.zeros((r, 4, 4)), jnp.zeros((r, 4, 3)))
    except Exception as error:  # noqa: BLE001 - a student's function may fail any way
        return (
            f"tracing entering_states with jax raised {type(error).__name__}: write it with "
            "jnp and jax.lax (it runs under jax.make_jaxpr), not NumPy"
        )
    counts = _primitive_counts(traced.jaxpr, {})
    if counts.get("scan", 0) or counts.get("while", 0):
        return "lax.scan or a fori/while loop takes R sequential steps: use an associative scan"
    if counts.get("dot_general", 0) >= r // 4:
        return (
            f"at R = {r} your function traces {counts['dot_general']} matrix products, about "
            "one per rank (a Python loop?): an associative scan's 2 log2 R - 1 rounds need far "
            "fewer"
        )
    return None


@checker("05.4")
def fold_any_ranks(answer, **_):
    """entering_states(ms, es): the state entering every rank, for any number of ranks."""
    rng = np.random.default_rng(6)
    for r in (3, 5, 8):
        maps = _random_maps(rng, r)
        ms, es = np.stack([m for m, _ in maps]), np.stack([e for _, e in maps])
        want, state = [], np.zeros((4, 3))
        for summary in maps:
            want.append(state)
            state = _apply(summary, state)
        got, hint = call_answer(answer, ms, es, name="entering_states(ms, es)")
        hint = hint or refuse_degenerate(
            got, shape=(r, 4, 3), inputs=(es,), what=f"the states for R = {r}"
        )
        if hint:
            return hint
        got = np.asarray(got)
        if not np.allclose(got, np.stack(want), rtol=1e-4, atol=1e-5):
            if np.allclose(got[:-1], np.stack(want)[1:], rtol=1e-4, atol=1e-5):
                return "off by one: rank 0 receives zeros, rank 1 the state after rank 0"
            return f"wrong states for R = {r}"
    return _sequential_route(answer)
