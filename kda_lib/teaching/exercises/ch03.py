"""Checkers for notebook 03 (the chunkwise algorithm); worked solutions in
``notebooks/solutions/ch03.py``. Each calls the answer on inputs of its own (refusing any answer
that runs ``kda_lib`` code), recomputes the expected value in float64 and returns None (right)
or a hint that does not give the answer away. Float32 answers are accepted (relative 1e-5)."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, machinery, refuse_degenerate


def _close(actual, expected, tol=1e-5) -> bool:
    actual = np.asarray(actual, np.float64)
    return actual.shape == np.shape(expected) and bool(
        np.all(np.abs(actual - expected) <= tol * max(1.0, float(np.abs(expected).max())))
    )


def _wy_factor_reversed(k, beta):
    C = k.shape[0]
    upper = np.triu(beta[:, None] * (k @ k.T), 1)  # beta_t k_t . k_s for s > t
    return np.linalg.solve(np.eye(C) + upper, beta[:, None] * k)


def _product(k, beta, reverse):
    product = np.eye(k.shape[1])
    for k_t, b_t in zip(k, beta, strict=True):
        m_t = np.eye(k.shape[1]) - b_t * np.outer(k_t, k_t)
        product = product @ m_t if reverse else m_t @ product
    return product


@checker("03.1")
def no_decay_reversed(answer, **_):
    """answer: ``fn(k, beta) -> K~' [C, K]`` with ``M_1 M_2 ... M_C = I - K^T K~'`` for a chunk
    without decay (keys ``k`` [C, K] unit rows, ``beta`` [C], ``M_t = I - beta_t k_t k_t^T``):
    the factor of M^T, the backward order, as the solution of one triangular system. The
    checker also tries a chunk longer than d_k, where K~' cannot be read back from the product;
    it computes the expected factor in float64 after the answer ran."""
    rng = np.random.default_rng(32)
    for C, K in ((4, 6), (8, 6), (6, 6)):
        k = rng.standard_normal((C, K))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        beta = rng.uniform(0.1, 0.9, C)
        got, hint = call_answer(answer, k, beta, name="wy_factor_reversed(k, beta)", own_code=True)
        hint = hint or refuse_degenerate(got, shape=(C, K), inputs=(k,), what="K~'")
        if hint:
            return hint
        if not _close(got, _wy_factor_reversed(k, beta)):
            m = np.eye(K) - k.T @ np.asarray(got, np.float64)
            if _close(m, _product(k, beta, reverse=False)):
                return f"at C = {C} I - K^T K~' is M_C ... M_1, step 3's order; wanted M_1 ... M_C"
            if _close(m, _product(k, beta, reverse=True)):
                return f"I - K^T K~' is right at C = {C}, but K~' is not a triangular solve's"
            return (
                f"wrong at C = {C}: with g = 0, what is M^T in terms of step 3's K~, and which "
                "triangular system (lower or upper?) gives that factor directly?"
            )
    return None


def _gdn_expected(q, k, g, scale):
    C = len(g)
    gamma = np.cumsum(g)
    diff = np.where(np.tril(np.ones((C, C))) > 0, gamma[:, None] - gamma[None], -np.inf)
    return scale * (q @ k.T) * np.exp(diff)


_EXP_PRIMITIVES = ("exp", "exp2", "pow", "expm1")


@machinery
def _largest_exponent_jax(answer, args) -> tuple[float, object] | None:
    """``(largest exponent, outputs)`` of ``answer`` run through its jaxpr equation by equation
    (JAX answers, jitted or not), or None if it does not trace with JAX (a NumPy answer)."""
    import jax

    try:
        closed = jax.make_jaxpr(lambda q, k, g: answer(q, k, g, args[3]))(*args[:3])
    except Exception:  # noqa: BLE001 - NumPy code fails on tracers in many ways
        return None
    largest = [-math.inf]

    def run(jaxpr, consts, values):
        env = dict(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, values, strict=True))
        read = lambda v: v.val if hasattr(v, "val") else env[v]  # noqa: E731 - a Literal or Var
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            inner = eqn.params.get("jaxpr")
            if "callback" in eqn.primitive.name:  # Python run by JAX: not watched here
                largest[0] = math.inf
            if eqn.primitive.name in ("pjit", "jit", "closed_call", "core_call") and inner:
                outs = run(inner.jaxpr, inner.consts, ins)
            else:
                if eqn.primitive.name in _EXP_PRIMITIVES and np.size(ins[-1]):
                    largest[0] = max(largest[0], float(np.max(np.asarray(ins[-1]))))
                outs = eqn.primitive.bind(*ins, **eqn.params)
                outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in jaxpr.outvars]

    outs = run(closed.jaxpr, closed.consts, [np.asarray(a, np.float32) for a in args[:3]])
    return largest[0], jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(
            jax.eval_shape(lambda q, k, g: answer(q, k, g, args[3]), *args[:3])
        ),
        outs,
    )


@contextlib.contextmanager
@machinery
def _numpy_exponents():
    """While the block runs, NumPy's and ``jnp``'s ``exp``, ``exp2``, ``expm1``, ``power``
    (the exponent), ``jax.lax``'s, ``math.exp`` and JAX's exp primitives bound on concrete
    values record the largest exponent they are given (a name imported before the call, or a
    ``jit`` inside the answer that does not trace with JAX as a whole, escapes)."""
    import jax
    import jax.numpy as jnp

    largest = [-math.inf]
    names = ("exp", "exp2", "expm1", "power", "float_power")
    patched = [(m, n) for m in (np, jnp) for n in names] + [(math, "exp")]
    patched += [(jax.lax, n) for n in ("exp", "exp2", "expm1", "pow")]
    patched += [(getattr(jax.lax, n), "bind") for n in ("exp_p", "exp2_p", "expm1_p", "pow_p")]
    originals = [(m, n, getattr(m, n)) for m, n in patched]

    def watch(fn):
        def watched(*args, **kwargs):
            try:
                exponent = np.asarray(args[-1] if len(args) > 1 else args[0], np.float64)
            except Exception:  # noqa: BLE001 - a tracer: the jaxpr run sees it instead
                exponent = np.zeros(0)
            if "where" in kwargs and exponent.size:  # np.exp(x, where=mask): the masked x
                exponent = exponent[np.broadcast_to(kwargs["where"], exponent.shape)]
            if exponent.size:
                largest[0] = max(largest[0], float(np.nanmax(exponent)))
            return fn(*args, **kwargs)

        return watched

    for module, name, fn in originals:
        setattr(module, name, watch(fn))
    try:
        yield largest
    finally:
        for module, name, fn in originals:
            if name == "bind":
                del module.bind  # back to the class's method
            else:
                setattr(module, name, fn)


@contextlib.contextmanager
@machinery
def _overflows():
    """While the block runs, NumPy records each overflow (any array or scalar op) in the list
    yielded instead of warning; an answer's ``np.errstate``/``np.seterr`` keep that setting."""
    seen: list[str] = []
    record = lambda kind, _flag: seen.append(kind)  # noqa: E731
    real = (np.errstate, np.seterr, np.seterrcall)
    np.errstate = lambda **kw: real[0](**{**kw, "over": "call", "call": record})
    np.seterr = lambda **kw: real[1](**{**kw, "over": "call"})
    np.seterrcall = lambda _fn: real[2](record)
    try:
        with real[0](over="call", call=record):
            yield seen
    finally:
        np.errstate, np.seterr, np.seterrcall = real


@checker("03.2")
def gdn_scores(answer, *, seed=0):
    """answer: ``fn(q, k, g, scale) -> P``: Gated DeltaNet's causal decayed scores of one chunk
    (q, k [C, K], g [C] one log decay per token) as one ``C x C`` mask times ``q k^T``, with no
    exponent above 0 formed. The checker runs it at C = 8, at C = 64 with strong decay and at
    C = 16 with decay so strong that any exponent above 0 overflows, and watches every exponent
    by value: NumPy's overflow flag and Python's ``OverflowError`` (any route: ``np.e ** x``, an
    ``exp`` bound before the call), NumPy's, ``jnp``'s and ``math``'s exp functions, JAX's exp
    primitives (the answer run equation by equation; a host callback counts as unwatched)."""
    rng = np.random.default_rng(seed)
    # the last chunk: every step decays by e^-12000 or less, so any exponent above 0 overflows
    # (float32, float64, long double): NumPy's overflow flag and Python's OverflowError see
    # what is computed, whatever the name (np.e ** x, a bound exp); the jaxpr run sees values
    for C, K, low, high in ((8, 6, 0.01, 0.5), (64, 4, 10.0, 15.0), (16, 4, 1.2e4, 1.3e4)):
        q, k = rng.standard_normal((C, K)), rng.standard_normal((C, K))
        g = -rng.uniform(low, high, C)
        from kda_lib.teaching.exercises import library_calls

        with library_calls() as entered, _overflows() as overflowed:
            traced = _largest_exponent_jax(answer, (q, k, g, 0.5))
        if entered:
            return "your answer runs kda_lib code; write the scores yourself (NumPy or jnp)"
        if traced is None:
            with _numpy_exponents() as largest, _overflows() as overflowed:
                p, hint = call_answer(
                    answer, q, k, g, 0.5, name="gdn_scores(q, k, g, scale)", own_code=True
                )
            if hint and not ("raised OverflowError" in hint or "FloatingPointError" in hint):
                return hint
            largest = math.inf if hint else largest[0]
        else:
            largest, p = traced
        if largest > 0 or overflowed:
            return (
                f"at C = {C} an exponent above 0 was formed (it overflows for strong decay "
                "even where it is masked afterwards): form exp(gamma_t - gamma_s) only where "
                "s <= t"
            )
        hint = refuse_degenerate(p, shape=(C, C), inputs=(q, k), what="P")
        if hint:
            return hint
        if not _close(p, _gdn_expected(q, k, g, 0.5)):
            return (
                f"wrong at C = {C}: P_ts = scale q_t.k_s exp(gamma_t - gamma_s) for s <= t, "
                "0 above the diagonal"
            )
    return None
