"""Checkers of notebook 05's exercises (composing summaries, the fold for any rank count in
logarithmic depth). Answers that run ``kda_lib`` code are refused."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


def _random_maps(rng, count, k_dim=4, v_dim=3):
    return [
        (rng.standard_normal((k_dim, k_dim)) / 2, rng.standard_normal((k_dim, v_dim)))
        for _ in range(count)
    ]


def _apply(summary, state):
    return summary[0] @ state + summary[1]


@checker("05.1")
def compose_summaries(answer, **_):
    """compose(first, second): the summary of first's slice followed by second's."""
    rng = np.random.default_rng(5)
    a, b, c = _random_maps(rng, 3)
    state = rng.standard_normal((4, 3))
    name = "compose(first, second)"
    ab, hint = call_answer(answer, a, b, name=name, own_code=True)
    if hint:
        return hint
    if not (isinstance(ab, (tuple, list)) and len(ab) == 2):
        return "compose should return the pair (M, E)"
    for got, shape, what in ((ab[0], (4, 4), "M"), (ab[1], (4, 3), "E")):
        hint = refuse_degenerate(got, shape=shape, inputs=(*a, *b), what=what)
        if hint:
            return hint
    bc, hint = call_answer(answer, b, c, name=name, own_code=True)
    grouped, hint = (None, hint) if hint else call_answer(answer, ab, c, name=name, own_code=True)
    other, hint = (None, hint) if hint else call_answer(answer, a, bc, name=name, own_code=True)
    if hint:
        return hint
    ab, grouped, other = ([np.asarray(x) for x in pair] for pair in (ab, grouped, other))
    if not np.allclose(_apply(ab, state), _apply(b, _apply(a, state))):
        return "applying compose(first, second) must equal applying first, then second"
    if not all(np.allclose(x, y) for x, y in zip(grouped, other, strict=True)):
        return "the composition should not depend on the grouping"
    return None


def _sub_jaxprs(eqn) -> list:
    """Every body in ``eqn.params``: a Jaxpr or ClosedJaxpr, or a list or tuple of them (a
    cond's branches); a call, jax.checkpoint, cond, custom_jvp or custom_vjp hides one."""
    subs = []
    for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else (value,):
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                subs.append(inner)
    return subs


def _primitive_counts(jaxpr, counts: dict) -> dict:
    """How often each primitive occurs in ``jaxpr``, its sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
        for inner in _sub_jaxprs(eqn):
            _primitive_counts(inner, counts)
    return counts


def critical_path(jaxpr, in_depths=None) -> list[int]:
    """The depth of each output of ``jaxpr``: the most equations on any dependency path from
    the inputs to it, every body in an equation's params (call, jax.checkpoint, cond branch,
    custom_jvp/vjp) counted equation by equation. A body's inputs take their outer inputs'
    depths (all the deepest one's where the counts differ, as a cond's index); the equation's
    outputs, the deepest of its bodies'. A Python loop over R ranks chains at least R
    equations; ``jax.lax.associative_scan`` about 5 per round."""
    depth = dict(zip(jaxpr.invars, in_depths or [0] * len(jaxpr.invars), strict=True))
    get = lambda v: 0 if hasattr(v, "val") else depth.get(v, 0)  # noqa: E731 - Literal or Var
    for eqn in jaxpr.eqns:
        ins = [get(v) for v in eqn.invars]
        deepest, outs = max(ins, default=0), [max(ins, default=0) + 1] * len(eqn.outvars)
        for inner in _sub_jaxprs(eqn):
            same = len(inner.invars) == len(ins)
            got = critical_path(inner, ins if same else [deepest] * len(inner.invars))
            if len(got) != len(outs):  # a body whose outputs are not the equation's
                got = [max(got, default=0)] * len(outs)
            outs = [max(a, b) for a, b in zip(outs, got, strict=True)]
        depth.update(zip(eqn.outvars, outs, strict=True))
    return [get(v) for v in jaxpr.outvars]


# At R = 256 an associative scan's 2 log2 R - 1 = 15 rounds chain about 80 equations (the
# worked solution: 78); a loop over the ranks chains at least one per rank, 256. From R = 256
# to 1024 a logarithmic fold adds two rounds per doubling (depth x ~1.3); a fold in sqrt(R)
# blocks doubles its depth, a loop quadruples it.
_TRACED_RANKS = (256, 1024)
_CALLBACKS = ("pure_callback", "io_callback", "callback", "debug_callback")
# one equation each, yet an elimination (or iteration) inside: a dense block-bidiagonal solve
_SOLVES = ("lu", "triangular_solve", "cholesky", "custom_linear_solve", "qr", "geqrf",
           "householder_product", "svd", "eigh", "eig", "schur", "hessenberg", "tridiagonal",
           "tridiagonal_solve")


def _depth(answer, r: int):
    """(jaxpr, None) of ``answer`` traced at R = ``r``, or (None, hint)."""
    import jax
    import jax.numpy as jnp

    from kda_lib.teaching.exercises import library_calls

    try:
        with library_calls() as entered:
            traced = jax.make_jaxpr(answer)(jnp.zeros((r, 4, 4)), jnp.zeros((r, 4, 3)))
    except Exception as error:  # noqa: BLE001 - a student's function may fail any way
        return None, (
            f"tracing entering_states with jax raised {type(error).__name__}: write it with "
            "jnp and jax.lax (it runs under jax.make_jaxpr), not NumPy"
        )
    if entered:
        return None, "your answer runs kda_lib code; write the fold yourself with jax.lax"
    return traced, None


def _sequential_route(answer) -> str | None:
    """A hint if ``answer`` folds the ranks one after another: a sequential loop primitive
    (lax.scan, fori_loop, while_loop), a host callback or a linear solve or factorization
    (``_SOLVES``) in its jaxpr, a dependency chain of R / 2 = 128 equations or more at R = 256
    (a Python loop, however it writes the products or wraps them), or a chain that grows
    faster than logarithmically from R = 256 to 1024."""
    depths = []
    for r in _TRACED_RANKS:
        traced, hint = _depth(answer, r)
        if hint:
            return hint
        counts = _primitive_counts(traced.jaxpr, {})
        if counts.get("scan", 0) or counts.get("while", 0):
            return "lax.scan or a fori/while loop takes R sequential steps: use an associative scan"
        if any(counts.get(name, 0) for name in _CALLBACKS):
            return "a host callback hides the fold from jax: write it with jnp and jax.lax"
        if any(counts.get(name, 0) for name in _SOLVES):
            return (
                "a linear solve (or matrix factorization) hides a sequential elimination in one "
                "operation: build the fold from compose, the pair composition"
            )
        depths.append(max(critical_path(traced.jaxpr), default=0))
        if depths[-1] >= r // 2:
            return (
                f"at R = {r} your function chains {depths[-1]} operations one after another, "
                "about one or more per rank (a Python loop?): an associative scan's "
                "2 log2 R - 1 rounds chain far fewer"
            )
    if depths[1] > 1.5 * depths[0]:
        return (
            f"from R = 256 to 1024 your chain of dependent operations grows from {depths[0]} to "
            f"{depths[1]}: a logarithmic fold adds only two rounds per doubling of R"
        )
    return None


def _jitted(answer):
    import jax

    return jax.jit(answer) if callable(answer) else answer


@checker("05.2")
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
        # under jax.jit: the values checked are those of the traced program measured below
        got, hint = call_answer(_jitted(answer), ms, es, name="entering_states(ms, es)",
                                own_code=True)
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
