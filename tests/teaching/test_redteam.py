"""A red team for every checker of notebooks 00-05 (issue 54, item 4): each exercise is attacked
mechanically, and the test fails if any attack is accepted.

Attacks, the shortcuts an honest student may take (deliberate tampering is out of the checkers'
scope, ``kda_lib/teaching/exercises/__init__.py``): answers that are NaN, inf, zeros, a
constant, of the wrong shape or dtype (as values, and as functions whose outputs are so made);
every function of ``kda_lib`` (public and private, module level) whose signature takes the
exercise's arguments, and ``functools.partial``, ``jax.jit`` and lambda wrappers of each; the
other exercises' worked solutions; answers that break the exercise's stated rule. Every value
and function the notebook defines before its exercise cells is fed to them in the notebook's
own kernel while test_notebooks executes it (tests/teaching/namespace_attack.py, run by
run_nbval.py). Correct answers written differently
(the worked solution and at least one other form from ``notebooks/solutions/chNN.py``: float32
``jnp``, NumPy, a loop) must be there; tests/teaching/test_exercises.py runs each through its
checker.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import time

import numpy as np
import pytest

from kda_lib.teaching import exercises

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "notebooks" / "solutions"

# exercise id -> (notebook source stem, number of arguments the answer function takes)
EXERCISES = {
    "00.1": ("00_quickstart", 6),
    "00.2": ("00_quickstart", 6),
    "01.1": ("01_delta_rule", 2),
    "01.2": ("01_delta_rule", 4),
    "02.1": ("02_gating_and_decay", 3),
    "02.2": ("02_gating_and_decay", 1),
    "03.1": ("03_chunkwise_algorithm", 3),
    "03.2": ("03_chunkwise_algorithm", 6),
    "04.1": ("04_kda_layer", 3),
    "04.1b": ("04_kda_layer", 4),
    "04.2": ("04_kda_layer", 4),
    "04.3": ("04_kda_layer", 5),
    "05.1": ("05_context_parallel", 2),
    "05.2": ("05_context_parallel", 3),
}
IDS = sorted(EXERCISES)


def _load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"redteam_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _right_answers() -> dict[str, list]:
    """Every correct answer of ``cases()`` in the solutions of 00-05, by exercise id."""
    right: dict[str, list] = {}
    for chapter in sorted({stem[:2] for stem, _ in EXERCISES.values()}):
        for exercise_id, answer, context, _ in _load(SOLUTIONS / f"ch{chapter}.py").cases():
            assert not context, f"{exercise_id}: the red team assumes no context arguments"
            right.setdefault(exercise_id, []).append(answer)
    return right


def _refused(exercise_id: str, answer) -> bool:
    hint = exercises.verdict(exercise_id, answer)
    return isinstance(hint, str) and bool(hint)


def test_every_exercise_of_00_to_05_is_attacked():
    for chapter in ("00", "01", "02", "03", "04", "05"):
        exercises._checker_for(f"{chapter}.1")  # imports the chapter's checkers
    known = sorted(i for i in exercises._CHECKERS if i[:2] in {"00", "01", "02", "03", "04", "05"})
    assert known == IDS


def test_every_exercise_has_correct_answers_written_differently():
    """The solution and at least one other correct form per exercise; each passes its checker
    in tests/teaching/test_exercises.py::test_solutions_pass_and_wrong_answers_fail (the same
    ``cases()``)."""
    few = [i for i in IDS if len(_right_answers()[i]) < 2]
    assert not few, f"exercises with fewer than two correct forms: {few}"


# ------------------------------------------------------------------ degenerate answers
def _spoiled(x, how: str):
    x = np.asarray(x)
    return {
        "nan": np.full(x.shape, np.nan),
        "inf": np.full(x.shape, np.inf),
        "-inf": np.full(x.shape, -np.inf),
        "zeros": np.zeros(x.shape),
        "constant 0.5": np.full(x.shape, 0.5),
        "constant 1": np.ones(x.shape),
        "one entry more": np.append(np.ravel(x.astype(np.float64)), 1.0),
        "one axis more": x[None],
        "two axes more": x[None, None],
        "complex": x.astype(np.complex128) + 1j,
        "strings": x.astype(str),
        "booleans": x != 0,
    }[how]


HOW = ["nan", "inf", "-inf", "zeros", "constant 0.5", "constant 1", "one entry more",
       "one axis more", "complex", "strings", "booleans"]


def _spoiling(answer, how: str):
    def spoiled(*args):
        out = answer(*args)
        if isinstance(out, (tuple, list)):
            return type(out)(_spoiled(part, how) for part in out)
        return _spoiled(out, how)

    return spoiled


# scalar answers whose checkers also take the number as a 1-element array (r02 02-9)
ONE_ELEMENT_OK = ("02.1", "02.2")


def _wrong_structure(answer):
    def first_only(*args):
        out = answer(*args)
        return out[0] if isinstance(out, (tuple, list)) else (out, out)

    return first_only


@pytest.mark.parametrize("exercise_id", IDS)
def test_degenerate_answers_are_refused(exercise_id):
    right = _right_answers()[exercise_id][0]
    hows = HOW
    if exercise_id in ONE_ELEMENT_OK:  # a scalar's one axis more is the right 1-element array
        hows = [how if how != "one axis more" else "two axes more" for how in HOW]
    attacks = [(f"outputs {how}", _spoiling(right, how)) for how in hows]
    attacks += [("wrong structure", _wrong_structure(right)), ("returns None", lambda *a: None)]
    attacks += [(f"the argument handed back ({i})", lambda *a, i=i: a[i])
                for i in range(EXERCISES[exercise_id][1])]
    attacks += [(repr(v), v) for v in (np.nan, np.inf, 0, 0.5, 1, np.zeros(3), "text", [1.0])]
    accepted = [name for name, attack in attacks if not _refused(exercise_id, attack)]
    assert not accepted, f"{exercise_id} accepted: {accepted}"


# ------------------------------------------------------------------ the library itself
@functools.cache
def _library_functions() -> tuple:
    """Every function defined at module level in a ``kda_lib`` module (public and private,
    jitted and wrapped ones included), the exercise checkers excepted."""
    found = {}
    for info in pkgutil.walk_packages(importlib.import_module("kda_lib").__path__, "kda_lib."):
        if info.name.startswith("kda_lib.teaching.exercises"):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001, S112 - an optional backend missing here
            continue
        for obj in vars(module).values():
            own = getattr(obj, "__module__", None) == module.__name__
            if own and (inspect.isfunction(obj) or hasattr(obj, "__wrapped__")) and callable(obj):
                found[id(obj)] = obj
    return tuple(found.values())


def _fits(fn, arity: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(arity))
    except (TypeError, ValueError):
        return False
    return True


def _wrappers(fn):
    import jax

    yield "itself", fn
    yield "functools.partial", functools.partial(fn)
    yield "lambda", lambda *a: fn(*a)
    try:
        yield "jax.jit", jax.jit(fn)
    except Exception:  # noqa: BLE001, S110 - jit refuses some callables outright
        pass


@pytest.mark.parametrize("exercise_id", IDS)
def test_every_library_function_that_fits_and_its_wrappers_are_refused(exercise_id):
    arity = EXERCISES[exercise_id][1]
    fitting = [fn for fn in _library_functions() if _fits(fn, arity)]
    assert fitting, "the search found no library function to try"
    accepted = [
        f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)} ({how})"
        for fn in fitting
        for how, attack in _wrappers(fn)
        if not _refused(exercise_id, attack)
    ]
    assert not accepted, f"{exercise_id} accepted library routes: {accepted}"


def test_the_library_search_reaches_private_and_kernel_functions():
    names = {f"{fn.__module__}.{fn.__name__}" for fn in _library_functions()
             if hasattr(fn, "__name__")}
    assert {"kda_lib.ops.reference.kda_step", "kda_lib.ops.chunked.chain_states"} <= names
    assert any(n.rsplit(".", 1)[1].startswith("_") for n in names), "private functions"


# ------------------------------------------------------------------ other exercises' answers
@pytest.mark.parametrize("exercise_id", IDS)
def test_the_other_exercises_solutions_are_refused(exercise_id):
    accepted = [
        (other, getattr(answer, "__name__", repr(answer)))
        for other, answers in _right_answers().items()
        if other != exercise_id
        for answer in answers
        if not _refused(exercise_id, answer)
    ]
    assert not accepted, f"{exercise_id} accepted other exercises' solutions: {accepted}"


def fold_loss(ms, es, hs, nudges=None, xp=np):
    """05's loss sum_r <hs[r], S[r]> through the forward fold S[r + 1] = ms[r] S[r] + es[r]
    (``es`` None: no drive) from S[0] = 0, each state S[r] nudged by ``nudges[r]`` as it enters
    (None: not nudged); ``xp`` numpy, or jax.numpy to differentiate it."""
    total, s = 0.0, xp.zeros(hs.shape[1:])
    for r in range(len(ms)):
        s = s if nudges is None else s + nudges[r]
        total, s = total + xp.sum(hs[r] * s), ms[r] @ s + (0 if es is None else es[r])
    return total


# ------------------------------------------------------------------ tokamax's KDA code
def _one_read_by(step):
    """00.1 right through a library step: the write term from ``step`` on a zero state, the rest
    from one read (the step's own output on the state it cannot see)."""
    import jax.numpy as jnp

    def output_after_one(read, q, k, v, g, beta):
        zeros = jnp.zeros((1, 1, len(q), len(v)))
        _, o = step(zeros, *(jnp.asarray(x)[None, None] for x in (q, k, v, g)),
                    jnp.asarray([[beta]]))
        x = np.exp(g) * (q - beta * (k @ q) * k)
        return np.asarray(o[0, 0]) + read(x) / np.sqrt(len(q))

    return output_after_one


def _tokamax_step(state, q, k, v, g, beta):
    """Section 1's step by tokamax's reference (heads-first ``[H, B, T, K]``, one token)."""
    import jax.numpy as jnp
    from tokamax._src.ops.kda import reference

    t = lambda x: jnp.swapaxes(x, 0, 1)[:, :, None]  # noqa: E731
    o, new = reference.kimi_delta_attention(
        t(q), t(k), t(v), t(g), t(beta), a_log=None, delta_time_bias=None,
        scale=q.shape[-1] ** -0.5, initial_state=state[:, None], output_final_state=True,
        use_qk_l2norm=False, use_gate_in_kernel=False, segment_ids=None, lower_bound=None,
        context_parallel_metadata=None, max_num_segments=None)
    return new[:, 0], jnp.swapaxes(o[:, :, 0], 0, 1)


def test_library_and_tokamax_routes_are_refused_and_right_without_the_guard(monkeypatch):
    """The guard refuses kda_lib's and tokamax's KDA code alike: 00.1 through either step (the
    write term from a zero state) is refused, and tokamax's is accepted with the guard told to
    let tokamax through (the attack is right: only the guard refuses it)."""
    from kda_lib.ops import reference

    assert _refused("00.1", _one_read_by(reference.kda_step))
    pytest.importorskip("tokamax")
    answer = _one_read_by(_tokamax_step)
    assert _refused("00.1", answer)
    monkeypatch.setattr(exercises, "OTHER_KDA", ())
    assert not _refused("00.1", answer), "the attack is right: only the guard refuses it"


def _factored_backward(exp):
    """03.1 with U and K_out factored through exp(-gamma_t) (``exp`` applied to every exponent,
    a positive one included): after a forget burst that exponent is 1024 or more."""

    def wy_backward_system(k, g, beta):
        gamma = np.cumsum(g, axis=0)
        with np.errstate(all="ignore"):
            grow, shrink = exp(-gamma), exp(gamma)  # e^{-gamma_t}, e^{gamma_s}
            U = np.triu(beta[:, None] * ((k * grow) @ (k * shrink).T), 1)
            return np.eye(len(beta)) + U, beta[:, None] * k * grow * shrink[-1]

    return wy_backward_system


def test_positive_exponents_give_wrong_values_whatever_the_route():
    """03.1 is judged by values alone: an exponent above 0, formed by ``np.exp``, the ``**``
    operator, a ``umath.exp`` or ``exp`` bound before the call, ``np.vectorize`` of
    ``math.exp``, in x86's 80-bit long double (up to e^11356), or capped (at 5, at 700),
    overflows or is far off after a forget burst (-12288)."""
    import math

    from numpy import exp as bound_exp
    from numpy._core import umath

    capped = np.vectorize(lambda d: math.exp(min(d, 5.0)))
    routes = {
        "np.exp": np.exp,
        "np.e ** x": lambda x: np.e**x,
        "exp bound before": bound_exp,
        "umath.exp capped at 700": lambda x: umath.exp(np.minimum(x, 700.0)),
        "np.exp capped at 5": lambda x: np.exp(np.minimum(x, 5.0)),
        "np.vectorize(math.exp(min(d, 5)))": capped,
        "2 ** (x / ln 2) capped": lambda x: 2.0 ** (np.minimum(x, 1000.0) / np.log(2.0)),
        "np.exp in long double (review 2026-12-06, #4)": lambda x: np.exp(np.longdouble(x)),
    }
    accepted = [name for name, exp in routes.items()
                if not _refused("03.1", _factored_backward(exp))]
    assert not accepted, f"03.1 accepted factored exponents: {accepted}"


# ------------------------------------------------------------------ rule breakers
def _rule_breakers():
    import jax
    import jax.numpy as jnp

    def grads_by_autodiff(ms, hs):  # 05.1 right, but jax.grad derives it
        return jax.grad(lambda n: fold_loss(ms, None, hs, n, jnp))(jnp.zeros(hs.shape))

    def grads_by_linear_transpose(ms, hs):  # 05.1: the forward fold's transpose, by jax
        def fold(nudges):
            out, s = [], jnp.zeros(hs.shape[1:])
            for r in range(len(ms)):
                s = s + nudges[r]
                out.append(s)
                s = ms[r] @ s
            return jnp.stack(out)

        return jax.linear_transpose(fold, jnp.zeros(hs.shape))(jnp.asarray(hs))[0]

    def grads_forward(ms, hs):  # 05.1 folded left to right (the forward direction)
        gs, g = [], np.zeros(hs.shape[1:])
        for m, h in zip(ms, hs, strict=True):
            g = h + m.T @ g
            gs.append(g)
        return np.stack(gs)

    def cotangents_by_vjp(ms, es, hs):  # 05.2 right, but jax.vjp derives it
        loss = functools.partial(fold_loss, hs=hs, xp=jnp)
        return jax.vjp(loss, jnp.asarray(ms), jnp.asarray(es))[1](1.0)

    def cotangents_own_gradient(ms, es, hs):  # 05.2 with des[r] = gs[r], not gs[r + 1]
        gs = grads_forward(ms[::-1], hs[::-1])[::-1]
        return np.zeros(ms.shape) + 1.0, gs

    def limit_simulated(beta, alpha):  # 01.1: the page's writes run 10^4 times, r read off
        f = [0.0]  # the last two gaps: wrong where beta is tiny (the limit is not reached)
        for _ in range(10_000):
            f.append(alpha * f[-1] + beta * (1 - alpha * f[-1]))
        return ((f[-1] - f[-2]) / (f[-2] - f[-3]) if f[-2] != f[-3] else 0.0), f[-1]

    def _writes(beta, alpha, n):  # the page's decay-then-write steps, f read off S^T k
        k, v, S, f = np.array([1.0, 0.0]), np.array([0.6, -0.8]), np.zeros((2, 2)), []
        for _ in range(n):
            S = alpha * S
            S = S + beta * np.outer(k, v - S.T @ k)
            f.append((S.T @ k) @ v / (v @ v))
        return f

    def three_writes_measured(beta, alpha):  # 01.1 (review 2026-12-06, #5): r from 3 writes
        f1, f2, f3 = _writes(beta, alpha, 3)  # the ratio of successive differences
        r = (f3 - f2) / (f2 - f1) if f2 != f1 else 0.0
        return r, f1 / (1 - r)

    def limit_converged(beta, alpha):  # 01.1: lam derived, the writes run until zeta stops moving
        lam, zeta = alpha * (1 - beta), 0.0  # right to 1e-7, but some 10^10 steps at beta ~ 1e-9
        while (after := lam * zeta + beta) != zeta:
            zeta = after
        return lam, zeta

    def limit_from_float32_r(beta, alpha):  # 01.1: float32 lam, zeta_inf = beta / (1 - lam)
        import jax.numpy as jnp  # (right in float64; float32's 1 - lam keeps no digit at 1e-9)

        r = jnp.float32(alpha) * (1 - jnp.float32(beta))
        return r, jnp.float32(beta) / (1 - r)

    def _sweeps(mu, v1, v2, n):  # pair 1's error S^T k_1 - v_1 after each of n simulated sweeps
        keys = np.array([[1.0, 0.0], [mu, np.sqrt(max(1 - mu * mu, 0.0))]])
        S, errors = np.zeros((2, len(v1))), []
        for _ in range(n):
            for k, v in zip(keys, (v1, v2), strict=True):
                S = S + np.outer(k, v - S.T @ k)
            errors.append(S.T @ keys[0] - v1)
        return errors

    def two_sweeps_extrapolated(mu, v1, v2, n):  # 01.2 (review 2026-12-06, #5): mu^2 measured
        if n == 0:
            return -np.asarray(v1)
        e1, e2 = _sweeps(mu, np.asarray(v1), np.asarray(v2), 2)
        factor = (e2 @ e1) / (e1 @ e1) if e1 @ e1 > 0 else 0.0
        return e1 * factor ** (n - 1)

    def sweeps_simulated(mu, v1, v2, n):  # 01.2: the n sweeps run, the error read off
        return _sweeps(mu, np.asarray(v1), np.asarray(v2), n)[-1] if n else -np.asarray(v1)

    def factor_per_write(mu, v1, v2, n):  # 01.2: one write's disturbance factor, not a sweep's
        return mu**n * (np.asarray(v2) - mu * np.asarray(v1))

    def formula_at_zero_sweeps(mu, v1, v2, n):  # 01.2 (review 2026-12-06, #8): n >= 1's formula
        return mu ** (2 * n - 1) * (np.asarray(v2) - mu * np.asarray(v1))

    def exact_fit_per_point(beta, alpha):  # 01.1 (review 00-05, #1): 3 writes in exact
        from fractions import Fraction  # rationals, lam the ratio of differences: right at every
        # point (no rounding); at the grid of 10^6 points, one simulation each, some 25 s

        def fit(b, a):
            z = [Fraction(0)]
            for _ in range(3):
                z.append(a * z[-1] + b * (1 - a * z[-1]))
            lam = (z[3] - z[2]) / (z[2] - z[1]) if z[2] != z[1] else Fraction(0)
            return float(lam), float(z[1] / (1 - lam)) if lam != 1 else 1.0

        pairs = [fit(Fraction(b), Fraction(a))
                 for b, a in zip(np.ravel(beta), np.ravel(alpha), strict=True)]
        return tuple(np.reshape(x, np.shape(beta)) for x in zip(*pairs, strict=True))

    def exact_sweeps(mu, v1, v2, n):  # 01.2 (review 00-05, #1): the sweeps in exact rationals,
        from fractions import Fraction  # S = k1 c1^T + k2 c2^T read through the Gram matrix

        mu, vs = Fraction(mu), [[Fraction(x) for x in v] for v in (v1, v2)]
        c = [[Fraction(0)] * len(v1) for _ in range(2)]
        read = lambda j: [c[j][e] + mu * c[1 - j][e] for e in range(len(v1))]  # noqa: E731
        for _ in range(n):
            for t in (0, 1):
                c[t] = [c_e + v_e - r_e for c_e, v_e, r_e in zip(c[t], vs[t], read(t), strict=True)]
        return np.array([float(r - v) for r, v in zip(read(0), vs[0], strict=True)])

    def exact_solve_per_point(beta):  # 02.2 (review 00-05, #1): three writes of k = (3, 4)/5
        from fractions import Fraction as F  # under two rational decays, exact; a 2x2 solve

        def psi(b):
            def omega(A, B):  # b k^T (I - b k k^T) A (I - b k k^T) B k
                x = [B[i] * k[i] for i in (0, 1)]
                for D in (None, A):
                    x = [A[i] * x[i] for i in (0, 1)] if D else x
                    x = [x[i] - b * (k[0] * x[0] + k[1] * x[1]) * k[i] for i in (0, 1)]
                return b * (k[0] * x[0] + k[1] * x[1])

            k, rows = [F(3, 5), F(4, 5)], []
            for A, B in (([F(1, 2), F(1, 3)], [F(1, 5), F(1, 7)]), ([F(2, 3), F(1, 4)], [1, 1])):
                ab, a, bb = (sum(k[i] ** 2 * X[i] for i in (0, 1)) for X in
                             ([A[0] * B[0], A[1] * B[1]], A, B))
                rows.append((ab, a * bb, omega(A, B)))
            (p, q, r), (s, t, u) = rows
            det = p * t - q * s
            return float((r * t - q * u) / det), float((p * u - s * r) / det)

        return tuple(np.array(x) for x in zip(*map(psi, map(F, np.ravel(beta))), strict=True))

    def grads_by_jet(ms, hs):  # 05.1 by jax.experimental.jet, one probe per entry
        from jax.experimental import jet

        loss = functools.partial(fold_loss, ms, None, hs, xp=jnp)
        out, zeros = np.zeros(hs.shape), jnp.zeros(hs.shape)
        for i in np.ndindex(hs.shape):
            out[i] = jet.jet(loss, (zeros,), ((zeros.at[i].set(1.0),),))[1][0]
        return out

    def grads_by_differences(ms, hs):  # 05.1: one-sided differences of the forward fold
        base, out = np.zeros(hs.shape), np.zeros(hs.shape)
        es = np.zeros(hs.shape)
        for i in np.ndindex(hs.shape):
            nudge = base.copy()
            nudge[i] = 1.0
            out[i] = fold_loss(ms, es, hs, nudge) - fold_loss(ms, es, hs, base)
        return out

    def do_ten_percent_off_on_ordinary_rows(o, eta, dn, eps):  # 04.2 (teacher review): right on
        # the rows near eps (gradients ~300), 1.1 x on every other row: a whole-array scale (the
        # largest |do|, a near-eps row's) let it through
        o, eta, dn = (np.asarray(a, np.float64) for a in (o, eta, dn))
        r = np.sqrt(np.mean(o**2, -1, keepdims=True) + eps)
        right = eta * dn / r - o * np.sum(eta * dn * o, -1, keepdims=True) / (o.shape[-1] * r**3)
        return np.where(r < 10 * np.sqrt(eps), right, 1.1 * right)

    def cotangents_by_differences(ms, es, hs):  # 05.2: central differences, every entry
        zero, grads = np.zeros(hs.shape), []
        for which in (0, 1):
            grad = np.zeros((ms, es)[which].shape)
            for i in np.ndindex(grad.shape):
                up, down = [ms.copy(), es.copy()], [ms.copy(), es.copy()]
                up[which][i] += 1e-3
                down[which][i] -= 1e-3
                grad[i] = (fold_loss(*up, hs, zero) - fold_loss(*down, hs, zero)) / 2e-3
            grads.append(grad)
        return tuple(grads)

    return [
        ("01.1", limit_simulated),
        ("01.1", three_writes_measured),
        ("01.1", limit_converged),
        ("01.1", limit_from_float32_r),
        ("01.2", factor_per_write),
        ("01.2", two_sweeps_extrapolated),
        ("01.2", sweeps_simulated),
        ("01.2", formula_at_zero_sweeps),
        ("01.1", exact_fit_per_point),
        ("01.2", exact_sweeps),
        ("02.2", exact_solve_per_point),
        ("04.2", do_ten_percent_off_on_ordinary_rows),
        ("05.1", grads_by_jet),
        ("05.1", grads_by_differences),
        ("05.2", cotangents_by_differences),
        ("05.1", grads_by_autodiff),
        ("05.1", grads_by_linear_transpose),
        ("05.1", grads_forward),
        ("05.2", cotangents_by_vjp),
        ("05.2", cotangents_own_gradient),
    ]


def refused_by_time(exercise_id: str, answer, seconds: float = 0.25, **context) -> bool:
    """Whether ``answer``, right but slow by construction (a simulation of 10^10 steps, finite
    differences over 2.6e5 entries: minutes at the checker's largest trial), is refused for its
    time, with every checker's limit lowered to ``seconds`` (the limit, 2 to 10 s, is all such an
    answer costs a test; the hint must name the time)."""
    from kda_lib.teaching.exercises import ch01, ch04, ch05

    with pytest.MonkeyPatch.context() as patch:
        for module in (ch01, ch04, ch05):
            patch.setattr(module, "TIME_LIMIT_S", seconds)
        hint = exercises.verdict(exercise_id, answer, **context)
    return isinstance(hint, str) and "took over" in hint


# rule breakers that only the time limit refuses: right values, too slow at the last trial
_SLOW_RULE_BREAKERS = ("limit_converged", "grads_by_differences", "cotangents_by_differences",
                       "exact_fit_per_point", "exact_sweeps", "exact_solve_per_point")


def test_answers_that_break_the_stated_rule_are_refused():
    accepted = [(i, fn.__name__) for i, fn in _rule_breakers()
                if not (refused_by_time(i, fn) if fn.__name__ in _SLOW_RULE_BREAKERS
                        else _refused(i, fn))]
    assert not accepted, f"rule breakers accepted: {accepted}"


@pytest.mark.timeout(60)  # a stop that did not come: fail, not hang
def test_a_slow_answer_that_swallows_exceptions_is_stopped():
    """A loop whose body catches every Exception (an honest way to skip bad steps) is still
    stopped at its limit: the stop is no Exception, and it comes again every 50 ms (Python drops
    one raised in a finaliser)."""
    def swallowing():
        x = 0
        while True:
            try:
                x += 1
            except Exception:  # noqa: BLE001, S112
                continue

    start = time.monotonic()
    got, hint = exercises.call_answer(swallowing, limit_s=0.1, slow="slow")
    assert (got, hint) == (None, "slow") and time.monotonic() - start < 5


def test_01_precise_simulations_pass_as_the_page_says():
    """Notebook 01's exercise preamble (teacher s15, defects 6 and 7): the checkers judge values
    only, so a simulation in enough digits passes. 01.1's trials are values a float32 gate makes
    (beta near 1e-9, alpha 1 or a few float32 ulps below it): there zeta_inf read off two
    simulated float64 writes (lam the ratio of the two gaps, zeta_inf their geometric limit)
    keeps about 7 digits and passes, as beta / (1 - lam) does (a row of the solutions' cases);
    01.2's memory simulated in 80-digit decimals passes too (the review's shortcut)."""
    from decimal import Decimal, localcontext

    def two_writes_geometric_limit(beta, alpha):  # teacher s13, #1: refused then, at a trial
        z1 = np.float64(beta)  # with lam 1e-15 from 1 that no float32 gate makes
        z2 = alpha * z1 + beta * (1 - alpha * z1)
        lam = (z2 - z1) / z1
        return lam, z1 / (1 - lam)

    def decimal_sweeps(mu, v1, v2, m):  # two explicit keys, section 3's write, 80 digits
        with localcontext() as context:
            context.prec = 80
            mu = Decimal(mu)
            keys = [(Decimal(1), Decimal(0)), (mu, (1 - mu * mu).sqrt())]
            values = [[Decimal(x) for x in v] for v in (v1, v2)]
            S = [[Decimal(0)] * len(v1) for _ in range(2)]
            for _ in range(m):
                for (a, b), v in zip(keys, values, strict=True):
                    fix = [v[e] - a * S[0][e] - b * S[1][e] for e in range(len(v))]
                    S = [[S[0][e] + a * fix[e] for e in range(len(v))],
                         [S[1][e] + b * fix[e] for e in range(len(v))]]
            return np.array([float(S[0][e] - values[0][e]) for e in range(len(v1))])

    for seed in range(3):
        assert exercises.verdict("01.1", two_writes_geometric_limit, seed=seed) is None
        assert exercises.verdict("01.2", decimal_sweeps, seed=seed) is None


def test_the_time_limit_counts_cpu_time_not_waiting():
    """A right answer on a busy machine is not refused for the time other processes took (teacher
    s13, #11: 01.1's np.vectorize answer, 0.5 s alone, refused 2 of 5 times beside a two-worker
    pytest): the limit counts this process's CPU time, so an answer waiting 0.3 s passes a 0.1 s
    limit that an answer computing for 0.3 s does not."""
    def waiting():
        time.sleep(0.3)
        return 1.0

    def computing():
        start = time.process_time()
        while time.process_time() - start < 0.3:
            pass
        return 1.0

    assert exercises.call_answer(waiting, limit_s=0.1, slow="slow") == (1.0, None)
    assert exercises.call_answer(computing, limit_s=0.1, slow="slow") == (None, "slow")


def test_a_stop_that_lands_in_the_watch_comes_again_at_once():
    """An answer calling small Python functions under the hook (a call of it at every call):
    stopped within seconds of its limit (04.2's finite differences ran 13-21 s past a 0.25 s
    limit when the stop came again only every second)."""
    from kda_lib.teaching.exercises.ch04 import AUTODIFF

    def many_calls():
        x = np.ones(4)
        while True:
            np.mean(x)

    start = time.monotonic()
    got, hint = exercises.call_answer(many_calls, refused=AUTODIFF, limit_s=0.1, slow="slow")
    assert hint == "slow" and time.monotonic() - start < 2.5  # one stop a second: 3 to 10 s


# ------------------------------------------------------------------ echoes of notebooks 02 and 03
def _page_echoes_02_03():
    """(exercise, answer, should pass): the pages' own formulas and cells, library routes, and
    correct answers written differently (float32 jnp, a loop)."""
    import jax
    import jax.numpy as jnp

    from kda_lib.ops.chunked import unit_lower_inverse
    from kda_lib.teaching import explain

    def one_window(n, ratio, width):  # 02.1: all n in one fixed window, rho^n
        return (np.log(ratio) / np.log(width)) ** n

    def from_the_lowest(n, ratio, width):  # 02.1: the window at the lowest draw, never cut
        return min(1.0, n * (np.log(ratio) / np.log(width)) ** (n - 1))

    def linear_span(n, ratio, width):  # 02.1: spans measured in tau, not log(tau)
        rho = min((ratio - 1) / (width - 1), 1.0)
        return n * rho ** (n - 1) - (n - 1) * rho**n

    def monte_carlo(n, ratio, width):  # 02.1: 10^5 simulated heads
        u = np.random.default_rng(0).uniform(0, np.log(width), (10**5, n))
        return float(np.mean(np.ptp(u, axis=1) < np.log(ratio)))

    def page_bound(n, ratio, width):  # 02.1: section 2's "below 1e-8", echoed
        return 1e-8

    def spread_jnp(n, ratio, width):  # 02.1 right, float32 jnp
        rho = jnp.minimum(jnp.log(jnp.float32(ratio)) / jnp.log(jnp.float32(width)), 1.0)
        return n * rho ** (n - 1) - (n - 1) * rho**n

    def spread_one_element(n, ratio, width):  # 02.1 right, as a 1-element array (r02 02-9)
        rho = min(np.log(ratio) / np.log(width), 1.0)
        return np.array([n * rho ** (n - 1) - (n - 1) * rho**n])

    def older_one_element(beta):  # 02.2 right, each coefficient a 1-element array
        return np.array([beta * (1 - beta)]), np.array([-(beta**2) * (1 - beta)])

    def latest_formula(beta):  # 02.2: the statement's latest-occurrence formula, echoed
        return beta * (1 - beta), 0.0

    def scalar_intuition(beta):  # 02.2: right only for a scalar gate
        return beta * (1 - beta) ** 2, 0.0

    def by_library_stream(beta):  # 02.2: the page's mixing matrix, fitted on two streams
        def omega(x, a, b):
            keys, g = np.ones((3, 1)), np.log([[1.0], [b], [a]])
            return explain.kda_mixing_matrix(keys, keys, g, np.full(3, beta), scale=1.0)[2, 0]
        return omega(1.0, 1.0, 1.0) - omega(0.5, 1.0, 0.5), 0.0

    def rebuilt_two_channel(beta):  # 02.2 (review 2026-12-06, #5): the product formula on a
        k, rows, weights = np.ones(2) / np.sqrt(2), [], []  # 2-channel key and diagonal decays
        step = np.eye(2) - beta * np.outer(k, k)  # matching (kk_ts, kk_tsp, kk_sps), solved
        for x, a, b in ((0.5, 0.6, 0.7), (0.2, 0.5, 0.3)):  # for (psi1, psi2) on two
            d, sign = np.sqrt(abs(x - a * b)), np.sign(x - a * b)
            A, B = np.diag([a + d, a - d]), np.diag([b + sign * d, b - sign * d])
            weights.append(beta * k @ step @ A @ step @ B @ k)
            rows.append([k @ A @ B @ k, (k @ A @ k) * (k @ B @ k)])
        return tuple(np.linalg.solve(np.array(rows), np.array(weights)))

    def coefficients_swapped(beta):  # 02.2: c2 for c1
        return -(beta**2) * (1 - beta), beta * (1 - beta)

    def older_jnp(beta):  # 02.2 right, float32 jnp
        b = jnp.float32(beta)
        return b * (1 - b), -b * b * (1 - b)

    def cubic_fit(beta):  # 02.2 right (teacher 2026-12-06, 14): (psi1, psi2) solved from weights
        k = np.ones(2) / np.sqrt(2)  # of NumPy matrices at 7 betas, fitted by cubics, rounded
        A, B = np.diag([0.9, 0.3]), np.diag([0.4, 0.8])  # to 1e-6: a formula in beta after all
        rows = [[k @ A @ B @ k, (k @ A @ k) * (k @ B @ k)], [k @ A @ A @ k, (k @ A @ k) ** 2]]
        betas = np.linspace(0.2, 0.8, 7)
        psi = [np.linalg.solve(rows, [b * k @ (np.eye(2) - b * np.outer(k, k)) @ A @ (np.eye(2) - b
               * np.outer(k, k)) @ D @ k for D in (B, A)]) for b in betas]
        fits = [np.round(np.polyfit(betas, column, 3), 6) for column in np.transpose(psi)]
        return tuple(np.polyval(c, beta) for c in fits)  # (no float(): arrays at the last trial)

    def _decay(gamma):  # [t, s, K]: e^(gamma_t - gamma_s) for s <= t, masked before exp
        causal = np.tril(np.ones((len(gamma), len(gamma)), bool))[..., None]
        return np.exp(np.where(causal, gamma[:, None] - gamma[None], -np.inf))

    def _k_out(k, g):
        gamma = np.cumsum(g, axis=0)
        return k * np.exp(gamma[-1] - gamma)

    def _upper(k, g, beta):  # U_ts = beta_t k_t^T Gamma_s Gamma_t^-1 k_s, s > t
        gamma = np.cumsum(g, axis=0)
        return np.triu(beta[:, None] * np.einsum("tc,sc,stc->ts", k, k, _decay(gamma)), 1)

    def _backward_factor(k, g, beta):  # K~' by the backward recurrence, dS_C = I
        X, rows = np.eye(k.shape[1]), []
        for t in reversed(range(len(beta))):
            rows.append(beta[t] * (k[t] @ X))
            X = np.exp(g[t])[:, None] * (X - np.outer(k[t], rows[-1]))
        return np.stack(rows[::-1])

    def step3_cell(k, g, beta):  # 03.1: section 3's step 3 system (I + L, diag(beta) K_in)
        gamma = np.cumsum(g, axis=0)
        L = np.tril(beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, _decay(gamma)), -1)
        return np.eye(len(beta)) + L, beta[:, None] * k * np.exp(gamma)

    def step3_reversed(k, g, beta):  # 03.1: step 3 on the chunk read backwards, flipped back
        a, b = step3_cell(k[::-1], g[::-1], beta[::-1])
        return a[::-1, ::-1], b[::-1]

    def old_answer(k, g, beta):  # 03.1: last round's no-decay answer, the gates ignored
        return np.eye(len(beta)) + np.triu(beta[:, None] * (k @ k.T), 1), beta[:, None] * k

    def no_solve(k, g, beta):  # 03.1: I in place of I + U
        return np.eye(len(beta)), beta[:, None] * _k_out(k, g)

    def identity(k, g, beta):  # 03.1: a trivial default of the right shapes
        return np.eye(len(beta)), np.eye(*k.shape)

    def recurrence(k, g, beta):  # 03.1: the page's backward recurrence run, K~' as B, A = I
        return np.eye(len(beta)), _backward_factor(k, g, beta)

    def jacobian_of_forward(k, g, beta):  # 03.1: jax.jacobian of a forward loop, A = I
        def final(v):  # S_C[:, 0] from S_0 = 0 and values v [C, 1]
            s = jnp.zeros((k.shape[1], 1), v.dtype)
            for t in range(len(beta)):
                s = jnp.exp(g[t])[:, None] * s
                s = s + beta[t] * jnp.outer(k[t], v[t] - k[t] @ s)
            return s[:, 0]

        jac = jax.jacobian(final)(jnp.zeros((len(beta), 1)))[:, :, 0]
        return np.eye(len(beta)), np.asarray(jac).T

    def any_upper_system(k, g, beta):  # 03.1: a unit upper A, B = A K~': it solves to K~'
        a = np.eye(len(beta)) + np.triu(np.ones((len(beta),) * 2), 1)
        return a, a @ _backward_factor(k, g, beta)

    def beta_of_the_later_token(k, g, beta):  # 03.1: I + L^T (beta_s, not beta_t)
        return np.eye(len(beta)) + _upper(k, g, beta) * beta / beta[:, None], _k_out(k, g)

    def upper_by_library(k, g, beta):  # 03.1 right, after a call of the library's inverse
        unit_lower_inverse(jnp.eye(len(beta)))
        return np.eye(len(beta)) + _upper(k, g, beta), beta[:, None] * _k_out(k, g)

    def back_substitution(k, g, beta):  # 03.1 right, U built entry by entry, exponents <= 0
        gamma, C = np.cumsum(g, axis=0), len(beta)
        a = np.eye(C)
        for t in range(C):
            for s in range(t + 1, C):
                a[t, s] = beta[t] * (k[t] * np.exp(gamma[s] - gamma[t]) * k[s]).sum()
        return a, beta[:, None] * _k_out(k, g)

    def transposed_float32(k, g, beta):  # 03.1 right: I + diag(beta) L^T diag(beta)^-1, f32
        gamma = np.cumsum(g, axis=0)
        L = np.tril(beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, _decay(gamma)), -1)
        lt = jnp.asarray(L.T, jnp.float32) * beta[:, None] / beta[None]
        return jnp.eye(len(beta)) + lt, jnp.asarray(beta[:, None] * _k_out(k, g), jnp.float32)

    def old_gdn_scores(q, k, g, scale):  # last round's 03.2 answer
        gamma = np.cumsum(g)
        return scale * (q @ k.T) * np.exp(np.tril(gamma[:, None] - gamma)) * np.tril(q @ k.T != 0)

    def unmerged(W1, U1, K_out1, gamma1, W2, U2):  # 03.2: the two chunks stacked
        return np.concatenate([W1, W2]), np.concatenate([U1, U2])

    def decay_only(W1, U1, K_out1, gamma1, W2, U2):  # 03.2: the decay across chunk 1, no erase
        return np.concatenate([W1, W2 * np.exp(gamma1)]), np.concatenate([U1, U2])

    def first_map(W1, U1, K_out1, gamma1, W2, U2):  # 03.2: step 4's (M_1, E_1), echoed
        return np.diag(np.exp(gamma1)) - K_out1.T @ W1, K_out1.T @ U1

    def transposed_map(W1, U1, K_out1, gamma1, W2, U2):  # 03.2: M_1^T in place of M_1
        m1 = np.diag(np.exp(gamma1)) - K_out1.T @ W1
        return np.concatenate([W1, W2 @ m1.T]), np.concatenate([U1, U2 - W2 @ K_out1.T @ U1])

    def divided_capped(W1, U1, K_out1, gamma1, W2, U2):  # 03.2: Gamma^-1, its exponent capped
        coupling = W2 @ K_out1.T
        grown = W2 * np.exp(np.minimum(-gamma1, 5.0))
        return np.concatenate([W1, grown - coupling @ W1]), np.concatenate([U1, U2 - coupling @ U1])

    def merged_identity(W1, U1, K_out1, gamma1, W2, U2):  # 03.2: a trivial default
        C = len(W1) + len(W2)
        return np.eye(C, W1.shape[1]), np.eye(C, U1.shape[1])

    def merged_loop(W1, U1, K_out1, gamma1, W2, U2):  # 03.2 right: row by row, NumPy loops
        W, U = [*W1], [*U1]
        for w2, u2 in zip(W2, U2, strict=True):
            c = K_out1 @ w2  # [C1]: row t's coupling to the first chunk's tokens
            W.append(w2 * np.exp(gamma1) - c @ W1)
            U.append(u2 - c @ U1)
        return np.array(W), np.array(U)

    return [
        ("02.1", one_window, False), ("02.1", from_the_lowest, False),
        ("02.1", linear_span, False), ("02.1", monte_carlo, False), ("02.1", page_bound, False),
        ("02.1", spread_jnp, True), ("02.1", spread_one_element, True),
        ("02.2", latest_formula, False), ("02.2", scalar_intuition, False),
        ("02.2", by_library_stream, False), ("02.2", coefficients_swapped, False),
        ("02.2", rebuilt_two_channel, False),
        ("02.2", older_jnp, True), ("02.2", older_one_element, True), ("02.2", cubic_fit, True),
        ("03.1", step3_cell, False), ("03.1", step3_reversed, False),
        ("03.1", old_answer, False), ("03.1", no_solve, False), ("03.1", identity, False),
        ("03.1", recurrence, False), ("03.1", jacobian_of_forward, False),
        ("03.1", any_upper_system, False), ("03.1", beta_of_the_later_token, False),
        ("03.1", upper_by_library, False),
        ("03.1", back_substitution, True), ("03.1", transposed_float32, True),
        ("03.2", old_gdn_scores, False), ("03.2", unmerged, False), ("03.2", decay_only, False),
        ("03.2", first_map, False), ("03.2", transposed_map, False),
        ("03.2", divided_capped, False), ("03.2", merged_identity, False),
        ("03.2", merged_loop, True),
    ]


def test_echoes_of_the_pages_of_02_and_03_are_refused_and_rewrites_accepted():
    wrong = [(i, fn.__name__) for i, fn, ok in _page_echoes_02_03() if _refused(i, fn) == ok]
    assert not wrong, f"refused a right answer or accepted a wrong one: {wrong}"


def test_measured_answers_are_told_that_only_a_formula_gets_there():
    """01.1's r read off three simulated writes, 01.2's error extrapolated from two simulated
    sweeps (or all n run) and 02.2's coefficients solved from weights computed on a rebuilt key
    (review 2026-12-06, #5) are right to rounding at the drawn parameters: each is refused at an
    edge trial, where the measurement is rounding noise (01.1: alpha near 1e-8; 02.2: a few ulps
    of the weight), with a hint that says so; so is 01.1's zeta_inf formed as beta / (1 - lam)
    from a float32 lam (right in float64) where beta is near 1e-9."""
    shortcuts = {fn.__name__: (i, fn) for i, fn in _rule_breakers()}
    shortcuts.update((fn.__name__, (i, fn)) for i, fn, _ in _page_echoes_02_03())
    for name, said in (("three_writes_measured", "lam^2 beta"),
                       ("limit_from_float32_r", "float32 lam keeps no digits"),
                       ("two_sweeps_extrapolated", "noise"), ("sweeps_simulated", "noise"),
                       ("rebuilt_two_channel", "rounding noise")):
        exercise_id, answer = shortcuts[name]
        hint = exercises.verdict(exercise_id, answer)
        assert hint and said in hint and "e-" in hint.split(":")[0], (name, hint)


def test_02_1_refuses_the_beta_law_from_scipy_and_jax():
    """The span of d_k uniform draws is Beta(d_k - 1, 2): scipy's cdf or betainc (a ufunc, held),
    jax.scipy's and jax.lax's betainc do the exercise (teacher 2026-12-06, 15); each is refused
    with the hint that says so, and the same formula by hand passes."""
    import jax
    import scipy.special
    import scipy.stats

    def chi(ratio, width):
        return min(np.log(ratio) / np.log(width), 1.0)

    routes = {
        "scipy.stats": lambda n, r, w: scipy.stats.beta.cdf(chi(r, w), max(n - 1, 1e-9), 2),
        "scipy.special.betainc": lambda n, r, w: scipy.special.betainc(max(n - 1, 1e-9), 2,
                                                                        chi(r, w)),
        "jax": lambda n, r, w: float(jax.scipy.special.betainc(max(n - 1, 1e-9), 2.0, chi(r, w))),
        "jax._src.lax.special": lambda n, r, w: float(jax.lax.betainc(max(n - 1, 1e-9), 2.0,
                                                                      chi(r, w))),
    }
    for name, route in routes.items():
        hint = exercises.verdict("02.1", route, seed=3)
        assert hint and "span's law for you: derive it yourself" in hint, (name, hint)
    by_hand = lambda n, r, w: n * chi(r, w) ** (n - 1) - (n - 1) * chi(r, w) ** n  # noqa: E731
    assert exercises.verdict("02.1", by_hand, seed=3) is None


def test_04_2_draws_its_shapes_per_call():
    """A table keyed on 04.2's trial shapes of one call misses those of another."""
    shapes = []
    right = _right_answers()["04.2"][0]
    for seed in (1, 2):
        exercises.verdict("04.2", lambda *a: shapes.append(np.shape(a[0])) or right(*a), seed=seed)
    assert len(shapes) == 6 and shapes[:3] != shapes[3:], shapes


def test_hints_name_the_mistake_not_a_symptom():
    """02.1's simulation (0 where the chance is tiny) is told a simulation cannot get there, not
    only that it is 0; 03.1's exp(-gamma_t) * exp(gamma_s) is told to form the exponent before
    exp, not only that it overflowed; 07.2's roll-back that never divides by e^g is told so, not
    that a series diverges; a NaN 02.1 gets the shared refusal, not a slip's hint."""
    def monte_carlo(n, ratio, width):
        u = np.random.default_rng(0).uniform(0, np.log(width), (10**4, n))
        return float(np.mean(np.ptp(u, axis=1) < np.log(ratio)))

    hint = exercises.verdict("02.1", monte_carlo)
    assert hint and "simulation" in hint, hint
    hint = exercises.verdict("02.1", lambda *a: float("nan"))
    assert hint and "NaN" in hint, hint
    hint = exercises.verdict("03.1", _factored_backward(np.exp))
    assert hint and "before exp" in hint, hint

    def undecayed(state, k, v, g, beta, rejected):  # the write and I - beta k k^T undone only
        state = np.asarray(state, np.float64)
        for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
            state = state - beta[t] / (1 - beta[t]) * np.outer(k[t], v[t] - k[t] @ state)
        return state

    hint = exercises.verdict("07.2", undecayed, seed=0)
    assert hint and "D_t" in hint and "diverges" not in hint, hint


def test_03_1_hints_do_not_name_the_answer():
    """03.1 asks "upper or lower, which decays, which right-hand side?" (teacher t02, D10): a
    wrong lhs or rhs gets a question back, never the triangle, K_out or its beta."""
    right = _right_answers()["03.1"][0]

    def forward_system(k, g, beta):  # step 3's (I + L, diag(beta) K_in)
        gamma = np.cumsum(g, axis=0)
        decay = np.exp(np.minimum(gamma[:, None] - gamma[None], 0.0))
        lower = np.tril(beta[:, None] * np.einsum("tc,sc,tsc->ts", k, k, decay), -1)
        return np.eye(len(beta)) + lower, beta[:, None] * k * np.exp(gamma)

    def rhs_from_start(k, g, beta):  # right lhs, step 3's rhs
        return right(k, g, beta)[0], forward_system(k, g, beta)[1]

    def rhs_without_beta(k, g, beta):  # right lhs, rhs without its beta
        a, b = right(k, g, beta)
        return a, np.asarray(b) / beta[:, None]

    for wrong in (forward_system, rhs_from_start, rhs_without_beta):
        hint = exercises.verdict("03.1", wrong)
        assert hint, wrong.__name__
        leaked = [w for w in ("upper", "K_out", "its end", "its beta", "diag(beta)") if w in hint]
        assert not leaked, (wrong.__name__, leaked, hint)


def test_03_hints_point_without_the_method_or_a_wrong_cause():
    """Teacher review of 03-04 (fifth, defect 7): an all-NaN 03.1 answer is not blamed on a forget
    burst (the factored exponents still are: test_hints_name_the_mistake_not_a_symptom); 03.2's
    hint to the second chunk's rows asks what enters it instead of spelling the method (S_C from
    step 4 as a function of S_in), and wrong rows of the first chunk are told so."""
    right = _right_answers()["03.2"][0]

    def all_nan(k, g, beta):
        return np.full((len(beta), len(beta)), np.nan), np.full(k.shape, np.nan)

    def unmerged(W1, U1, K_out1, gamma1, W2, U2):  # the second chunk's factors, not coupled
        return np.concatenate([W1, W2]), np.concatenate([U1, U2])

    def first_rows_doubled(*given):  # right rows of the second chunk, the first chunk's doubled
        w, u = (np.array(a, np.float64) for a in right(*given))
        w[: len(given[0])] *= 2
        u[: len(given[0])] *= 2
        return w, u

    def factored(k, g, beta):  # exponents apart, masked by a product: lhs all NaN after a burst
        gamma, C = np.cumsum(g, 0), len(beta)  # at token 1 (inf * 0 in every masked entry)
        with np.errstate(all="ignore"):
            up = ((k * np.exp(-gamma)) @ (k * np.exp(gamma)).T) * np.triu(np.ones((C, C)), 1)
            return np.eye(C) + beta[:, None] * up, beta[:, None] * k * np.exp(gamma[-1] - gamma)

    for seed in range(10):
        hint = exercises.verdict("03.1", all_nan, seed=seed)
        assert hint and "NaN" in hint and "burst" not in hint, (seed, hint)
        hint = exercises.verdict("03.1", factored, seed=seed)  # teacher s13: 43 of 100 missed it
        assert hint and "forget burst" in hint, (seed, hint)
        hint = exercises.verdict("03.2", unmerged, seed=seed)
        assert hint and "second chunk" in hint and "what state enters" in hint, (seed, hint)
        leaked = [w for w in ("S_C", "S_in", "step 4", "function of") if w in hint]
        assert not leaked, (seed, leaked, hint)
        hint = exercises.verdict("03.2", first_rows_doubled, seed=seed)
        assert hint and "rows of the first chunk" in hint, (seed, hint)


def test_review_d_hints_name_the_slip():
    """Strict-teacher review D (defects 1 and 6): 02.1's density integral without a d_k = 1 case
    (0 there, where the chance is 1) is told one draw spans nothing, not that a simulation cannot
    see it; 01.2 with the error as v - S^T k (the sign flipped) is told the sign."""
    def density_integral(n, ratio, width):  # integral of n (n - 1) x^(n-2) (1 - x) from 0 to chi
        chi = min(np.log(ratio) / np.log(width), 1.0)
        return n * chi ** (n - 1) - (n - 1) * chi**n if n > 1 else 0.0

    def flipped(mu, v1, v2, m):  # 01.2's closed form for v_1 - S^T k_1
        return v1 if m == 0 else -(mu ** (2 * m - 1)) * (v2 - mu * v1)

    for seed in range(8):
        hint = exercises.verdict("02.1", density_integral, seed=seed)
        assert hint and "one draw spans nothing" in hint and "simulation" not in hint, hint
        hint = exercises.verdict("01.2", flipped, seed=seed)
        assert hint and "the sign" in hint, hint


def test_s14_02_1_a_quadrature_just_above_1_is_judged_by_its_value():
    """Teacher s14, defect 4: 02.1's range test was stricter than its value test. The span's
    density n (n - 1) x^(n-2) (1 - x) integrated by the midpoint rule gives 1 + 4e-10 where the
    chance is 1: accepted (within the value test's 1e-5), while 1 + 1e-3 is told a probability
    lies in [0, 1], and so is a negative chance."""
    def quadrature(n, ratio, width, shift=0.0):  # shift: added where the chance is 1
        chi = min(np.log(ratio) / np.log(width), 1.0)
        if n == 1:
            return 1.0 + shift
        x = (np.arange(200_000) + 0.5) / 200_000 * chi
        return float(np.sum(n * (n - 1) * x ** (n - 2) * (1 - x)) * chi / 200_000) + (
            shift if chi == 1.0 else 0.0)

    assert quadrature(40, 200.0, 100.0) > 1 + 1e-12  # past 1: the former range test refused it
    for seed in range(3):
        assert exercises.verdict("02.1", quadrature, seed=seed) is None, seed
        hint = exercises.verdict("02.1", lambda *a: quadrature(*a, shift=1e-3), seed=seed)
        assert hint and "a probability lies in [0, 1]" in hint, (seed, hint)
        hint = exercises.verdict("02.1", lambda *a: -quadrature(*a), seed=seed)
        assert hint and "a probability lies in [0, 1]" in hint, (seed, hint)


def test_s14_05_slow_hint_names_the_limit_not_a_method():
    """Teacher s14, defect 10: a right 05.1 answer that is merely slow (a Python loop over every
    element of M^T g) is told the time limit and that such a loop can exceed it, not blamed for
    finite differences it did not use."""
    def element_loop(ms, hs):
        ranks, key_dim, value_dim = hs.shape
        gs, g = np.zeros_like(hs), np.zeros((key_dim, value_dim))
        for r in range(ranks - 1, -1, -1):
            new = hs[r].copy()
            for i in range(key_dim):
                for j in range(key_dim):
                    for c in range(value_dim):
                        new[i, c] += ms[r][j, i] * g[j, c]
            gs[r] = g = new
        return gs

    from kda_lib.teaching.exercises import ch05

    ms, _, hs = ch05._problem(np.random.default_rng(0), 5)  # right, if slow
    np.testing.assert_allclose(element_loop(ms, hs), ch05.state_gradients_reference(ms, hs),
                               rtol=1e-12, atol=1e-12)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ch05, "TIME_LIMIT_S", 0.25)
        hint = exercises.verdict("05.1", element_loop, seed=0)
    assert hint and "took over 0.25 CPU s, the time limit" in hint, hint
    assert "loop over every element can exceed" in hint and "cannot get there" not in hint, hint
