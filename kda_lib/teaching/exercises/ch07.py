"""Checkers of notebook 07's exercises (the cache that rolls back a draft, rolling the state
back over rejected draft tokens, the crossover of a verify call). Every call draws its inputs
afresh (``seed``, printed in each hint, repeats a call).

07.2 refuses linear-algebra routines three ways: Python frames of ``numpy.linalg``, ``scipy``'s
``linalg`` and ``sparse`` and jax's linalg and ``jax.scipy.sparse.linalg`` (``cg``, ``bicgstab``,
``gmres``; ``np.linalg.norm`` excepted); C routines, which run no Python frame: while the answer
runs, ``np.linalg._umath_linalg``'s ufuncs, ``lapack_lite``'s and ``scipy.linalg``'s LAPACK
wrappers are replaced by stubs that refuse and ctypes refuses to look up a LAPACK symbol (any
spelling: ``LAPACKE_sgesv``, ``scipy_dgesv_``, ``DGETRF``), and an answer naming or holding one
(or a program compiled before it ran, or its executables) is refused before it runs; and, for
any route left, by value and by memory, not by speed: every draft's last token (and for
d_k >= 8 every third) has beta in (1.2, 1.8) (a negative eigenvalue 1 - beta along k), where an
iteration by powers of beta k k^T (Richardson, a Neumann series) diverges while the closed form
holds, and every draft has ``d_k`` of 200,003 to 500,009, where any d_k x d_k array (40 GB even
at one byte a number: a dense inverse, a solve or Gauss-Jordan by hand) cannot be allocated,
with the process's address space capped (Linux) so that holds where the kernel overcommits
memory too: the rule is checked at every size tried, not at one probe an answer could single
out (teacher t0203's 07-6: dense below d_k = 1000, the closed form above). The closed-form
rollback needs O(d_k d_v) memory and time a token; ``HANG_S`` only stops an answer that never
returns. An iteration written by hand that converges for every beta != 1, O(d_k d_v) a step, is
accepted, as the exercise text says: matrix-free conjugate gradient (exact in two iterations),
Richardson on the normal equations M_t^T M_t X = M_t^T B (positive definite): the answer's own
work, which no checker can tell from the closed form by its values, memory or speed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import time
import types

import numpy as np

from kda_lib.teaching.exercises import (
    COMPILED_HINT,
    again,
    checker,
    machinery,
    refuse_degenerate,
    seeded,
)
from kda_lib.teaching.exercises._routes import call_own_work, modules_entered
from kda_lib.teaching.exercises.ch01 import _time_limit, _TooSlow


def _window_rows(conv_size: int, draft: int) -> int:
    """Rows of conv inputs that give the history after any prefix of a ``draft``-token draft:
    the last ``conv_size - 1`` before each, ``conv_size - 1 + draft`` in all (none for
    ``conv_size`` < 2: such a conv keeps no history)."""
    return conv_size - 1 + draft if conv_size >= 2 else 0


def _cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes,
                 draft):
    """The cache that rolls a grouped-value-head KDA layer back to any prefix of a ``draft``-token
    draft: ``draft + 1`` float32 states B HV K V, and one window of conv input rows
    (:func:`_window_rows`) of q, k (H K each) and v (HV V), ``conv_bytes`` bytes a number."""
    conv = batch * _window_rows(conv_size, draft) * (2 * num_heads * key_dim
                                                     + num_v_heads * value_dim)
    return 4 * (draft + 1) * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


# per layer: (conv_size, num_v_heads / num_heads, conv bytes): HV = H once, conv_size 0 to 4
_LAYOUTS = ((0, 2, 2), (4, 1, 4), (4, 4, 2), (1, 2, 2), (2, 3, 2), (3, 4, 4))


def _layers(rng):
    """Six layers (B, H, HV, K, V, w, conv bytes, draft) of :data:`_LAYOUTS`, sizes and drafts
    (1 to 8 tokens) drawn from ``rng``."""
    out = []
    for conv_size, group, conv_bytes in _LAYOUTS:
        heads = int(rng.integers(1, 5))
        out.append((int(rng.integers(1, 6)), heads, heads * group, int(rng.choice([4, 8, 16, 32])),
                    int(rng.choice([8, 12, 16, 32])), conv_size, conv_bytes,
                    int(rng.integers(1, 9))))
    return out


def _cache_hint(case, got: int) -> str:
    """Why ``got`` is not 07.1's bytes for ``case``: the named slips, else a question."""
    b, h, hv, k, v, w, cb, n = case
    conv = b * (2 * h * k + hv * v) * cb
    states = 4 * b * hv * k * v
    if got == states * (n + 1) + conv * max(w - 1, 0) * (n + 1):
        return "a conv history per prefix: the m + 1 histories overlap; one window holds them all"
    if got == states * n + conv * _window_rows(w, n):
        return "the m states after the draft tokens, but 0 tokens accepted is a prefix too"
    if got == states * (n + 1) + conv * max(w - 1 + n, 0):
        return f"conv_size = {w} keeps no history, before or after a draft"
    if got == states + conv * max(w - 1, 0):
        return "that is the cache of one state (no draft): which prefixes must it reach?"
    return "how many states, which tensors have H heads and which HV, how many conv rows?"


@checker("07.1")
def layer_cache_bytes(answer, *, seed=None):
    """``answer(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes, draft)
    -> int``: the bytes of the cache that rolls a grouped-value-head KDA layer back to any prefix
    of a ``draft``-token draft (float32 states, one window of conv rows of ``conv_bytes`` bytes a
    number), tried on layers drawn at each call."""
    seed, rng = seeded(seed)
    for case in _layers(rng):
        got, hint = call_own_work(answer, *case,
                                  name="draft_cache_bytes(B, H, HV, K, V, w, conv_bytes, draft)")
        hint = hint or refuse_degenerate(got, shape=(), what=f"bytes for {case}")
        if hint:
            return hint + again(seed)
        if float(got) != round(float(got)):
            return f"bytes for {case} should be a whole number" + again(seed)
        if int(round(float(got))) != _cache_bytes(*case):
            return f"wrong for {case}: " + _cache_hint(case, int(round(float(got)))) + again(seed)
    return None


_INVERSES = ("numpy.linalg", "scipy.linalg", "scipy.sparse", "jax._src.numpy.linalg",
             "jax._src.lax.linalg", "jax._src.scipy.linalg", "jax._src.scipy.sparse", "torch")
# the public modules jax's linear algebra is held under (``jnp.linalg.solve.__module__``)
_INVERSES_PUBLIC = ("jax.numpy.linalg", "jax.scipy.linalg", "jax.scipy.sparse")
# the functions of those modules that multiply, not solve (numpy 2's array-API spellings)
_PRODUCTS = ("norm", "vector_norm", "outer", "vecdot", "matmul", "matrix_transpose",
             "tensordot", "trace", "diagonal", "cross", "multi_dot")
# C linear-algebra routes (no Python frame), matched in a name lowered with underscores dropped
# (``LAPACKE_sgesv``, ``scipy_sgesv_``, ``DGETRF``): LAPACK's solvers and factorizations by
# their stems, numpy's private gufuncs, scipy's wrappers, and ctypes' raw symbol lookups
_C_ROUTE = re.compile(
    r"lapack|umathlinalg|spsolve|splu|funcptr|dlsym|indll"
    r"|[sdcz](ge|po|sy|he|gb|gt|pt|pp|sp|tr)(sv|trf|tri|trs|con|qrf|lsd|lss|lsy|sdd|svd)")


def _c_route_name(name: str) -> bool:
    """Whether ``name`` (an identifier, a string constant, a C symbol) names a C
    linear-algebra route (:data:`_C_ROUTE`)."""
    return bool(_C_ROUTE.search(name.lower().replace("_", "")))


HANG_S = 60.0  # the closed form takes milliseconds at the largest d_k
_SLOW = ("your function took over {:.0f} s at d_k = {}: the closed-form rollback is O(d_k d_v) "
         "a token; is yours O(d_k^2)?")
_DENSE = ("your function ran out of memory at d_k = {:,}: a d_k x d_k float32 array takes "
          "{:,.0f} GB there. Undo each token in O(d_k d_v) memory, no d_k x d_k matrix")
_HEADROOM = 2**35  # bytes of address space an answer may add at the largest d_k (32 GiB)


@contextlib.contextmanager
def _address_space_capped(headroom: int = _HEADROOM):
    """Cap this process's address space at its present size plus ``headroom`` while the block
    runs (Linux; elsewhere nothing), so a d_k x d_k allocation fails even where the kernel
    overcommits memory; the previous limit is restored. Yields a list that holds True after the
    block if the block changed the limit (an answer lifting it, or lowering the hard limit)."""
    changed: list[bool] = []
    try:
        import resource

        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield changed
        return
    cap = min(x for x in (size + headroom, soft, hard) if x != resource.RLIM_INFINITY)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield changed
    finally:
        now = resource.getrlimit(resource.RLIMIT_AS)
        changed.extend([True] if now != (cap, hard) else [])
        if now[1] == hard:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        else:  # a lowered hard limit cannot be raised again: the lowest soft limit under it
            low = now[1] if soft == resource.RLIM_INFINITY else min(soft, now[1])
            resource.setrlimit(resource.RLIMIT_AS, (low, now[1]))


_C_MODULES = ("numpy.linalg._umath_linalg", "numpy.linalg.lapack_lite", "scipy.linalg._flapack",
              "scipy.linalg.lapack")


def _c_routine_items():
    """``(module, name, routine)`` of every C linear-algebra routine of :data:`_C_MODULES`
    already imported (ufuncs, LAPACK wrappers, builtins)."""
    for module_name in _C_MODULES:
        module = sys.modules.get(module_name)
        for name, value in list(vars(module).items()) if module else ():
            if isinstance(value, (np.ufunc, types.BuiltinFunctionType)) or (
                    type(value).__name__ == "fortran"):
                yield module, name, value


def _c_routines() -> set[int]:
    """The ids of the C linear-algebra routines already imported."""
    return {id(value) for _, _, value in _c_routine_items()}


@machinery
def _refusing(name: str, used: list[str]):
    def refuse(*_args, **_kwargs):
        used.append(name)
        raise RuntimeError(f"{name} is a linear-algebra routine: refused in this exercise")

    return refuse


@machinery
def _symbol_refusing(original, used: list[str]):
    """``original`` (a ctypes symbol lookup: ``CDLL.__getitem__``, ``_ctypes.dlsym``), refusing
    the C linear-algebra routes' names (:func:`_c_route_name`)."""

    def lookup(library, name, *args):
        if isinstance(name, (str, bytes)) and _c_route_name(str(name)):
            used.append(f"ctypes {name}")
            raise RuntimeError(f"{name} is a linear-algebra routine: refused in this exercise")
        return original(library, name, *args)

    return lookup


def _symbol_lookups() -> list[tuple[object, str, object]]:
    """``(owner, name, lookup)`` of ctypes' symbol lookups (a ctypes.CDLL's attribute or item,
    ``_ctypes.dlsym``), where ctypes is imported."""
    ctypes, raw = sys.modules.get("ctypes"), sys.modules.get("_ctypes")
    out = [(ctypes.CDLL, "__getitem__", ctypes.CDLL.__dict__["__getitem__"])] if ctypes else []
    return out + [(raw, "dlsym", raw.dlsym)] if raw and hasattr(raw, "dlsym") else out


@contextlib.contextmanager
def _c_routines_refused():
    """While the block runs, every routine of :func:`_c_routine_items` is replaced by a stub
    that records its name in the list yielded and raises, and ctypes refuses to look up a C
    linear-algebra routine by name; the originals are restored after."""
    used: list[str] = []
    saved = list(_c_routine_items())
    lookups = _symbol_lookups()
    for module, name, _ in saved:
        setattr(module, name, _refusing(f"{module.__name__}.{name}", used))
    for owner, name, lookup in lookups:
        setattr(owner, name, _symbol_refusing(lookup, used))
    try:
        yield used
    finally:
        for owner, name, value in saved + lookups:
            setattr(owner, name, value)


def _held_route(fn) -> str | None:
    """What ``fn`` (an object an answer holds) is, when it runs a linear-algebra routine or code
    the checker cannot watch: ``"c"`` for a C linear-algebra symbol (a ctypes function, a
    library that looked one up, its name) or a Python function of :data:`_INVERSES` (held, not
    yet run), ``"compiled"`` for a program compiled before the answer ran (a
    ``jax.stages.Compiled``, its executables, its fast call); else ``None``."""
    ctypes = sys.modules.get("ctypes")
    if isinstance(fn, str):  # a symbol's name, held to be looked up
        return "c" if fn.isidentifier() and _c_route_name(fn) else None
    if ctypes is not None and isinstance(fn, ctypes._CFuncPtr):
        return "c" if _c_route_name(str(getattr(fn, "__name__", ""))) else None
    if ctypes is not None and isinstance(fn, ctypes.CDLL):  # the symbols it looked up before
        return next(("c" for x in vars(fn).values() if _held_route(x) == "c"), None)
    module = getattr(fn, "__module__", None)
    if callable(fn) and isinstance(module, str) and module.startswith(
            _INVERSES + _INVERSES_PUBLIC) and getattr(
                getattr(fn, "__code__", None), "co_name", getattr(fn, "__name__", "")
            ) not in _PRODUCTS:
        return "c"  # a linear-algebra function of Python (np.linalg.solve, jax's cg), held
    kind = type(fn).__module__ + "." + type(fn).__qualname__
    if kind in _COMPILED_TYPES or getattr(getattr(fn, "_cache_miss", None), "__name__",
                                          None) == "aot_cache_miss":
        return "compiled"
    return None


_COMPILED_TYPES = {"jax._src.stages.Compiled", "jax._src.interpreters.pxla.MeshExecutable",
                   "jax._src.interpreters.pxla.ExecuteReplicated", "jaxlib._jax.LoadedExecutable"}


def _names_c_route(answer, depth: int = 4) -> str | None:
    """The hint for ``answer`` when its code (its nested functions, closures, partials, the
    containers they hold, its default arguments and the functions of its module it names,
    ``depth`` levels deep) names or holds a C linear-algebra routine or a compiled program;
    else ``None``."""
    routines, seen, todo = _c_routines(), set(), [(answer, depth)]
    while todo:
        fn, level = todo.pop()
        if id(fn) in seen or level < 0:
            continue
        seen.add(id(fn))
        held = "c" if id(fn) in routines else _held_route(fn)
        if held:
            return COMPILED_HINT if held == "compiled" else _INVERSE_HINT
        if isinstance(fn, (dict, list, tuple, set)):
            items = list(fn.values() if isinstance(fn, dict) else fn)[:64]
            todo += [(x, level - 1) for x in items]
        if isinstance(fn, functools.partial):
            todo += [(x, level) for x in (fn.func, *fn.args, *fn.keywords.values())]
        defaults = getattr(fn, "__defaults__", None) or ()  # def f(..., solve=np.linalg.solve)
        todo += [(x, level - 1) for x in (*defaults, *(getattr(fn, "__kwdefaults__", None)
                                                        or {}).values())]
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        codes = [code]
        while codes:
            c = codes.pop()
            strings = [x for x in c.co_consts if isinstance(x, str) and x.isidentifier()]
            if any(_c_route_name(n) for n in (*c.co_names, *strings)):
                return _INVERSE_HINT
            codes += [x for x in c.co_consts if isinstance(x, type(c))]
            names = getattr(fn, "__globals__", {})
            todo += [(names[n], level - 1) for n in c.co_names if n in names]
        for cell in getattr(fn, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                todo.append((cell.cell_contents, level - 1))
    return None


_INVERSE_HINT = (
    "your answer runs a linear-algebra routine (an inverse, a solve, a factorization): undo "
    "each token with the inverse of its transition written out by hand, O(d_k d_v) a token"
)


def _draft(rng, tokens: int, key_dim: int, value_dim: int):
    """A head's state before a draft and the draft's unit keys, values, log decays and write
    strengths (beta in [0.1, 0.6], g in [-0.4, 0]: each token's transition well conditioned;
    the last beta and every third is in [1.2, 1.8]: 1 - beta < 0 along k)."""
    k = rng.standard_normal((tokens, key_dim))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = rng.uniform(0.1, 0.6, tokens)
    beta[::3] = rng.uniform(1.2, 1.8, len(beta[::3]))
    beta[-1] = rng.uniform(1.2, 1.8)  # rejected in every draft: a series diverges at every size
    return (rng.standard_normal((key_dim, value_dim)), k,
            rng.standard_normal((tokens, value_dim)), -0.4 * rng.random((tokens, key_dim)),
            beta)


def draft_states(state, k, v, g, beta):
    """The state after each draft token, ``[n + 1, K, V]`` (the first: ``state``), float64:
    decay, then the delta-rule write (notebook 01's recurrence)."""
    out = [np.asarray(state, np.float64)]
    for k_t, v_t, g_t, b_t in zip(k, v, g, beta, strict=True):
        s = np.exp(g_t)[:, None] * out[-1]
        out.append(s + b_t * np.outer(k_t, v_t - k_t @ s))
    return np.stack(out)


# K, V, n, rejected: odd d_k (XLA handles their squares' sizes cleanly), each so large that a
# d_k x d_k array does not fit the capped address space even at one byte a number (>= 40 GB)
# drafts: d_v of 1 to 3; 1, 2 and all of a draft's tokens rejected; the cheapest first, so that
# an answer refused at the first draft (a series that diverges on its last token) is cheap; the
# last at d_k = 500,009, where no d_k x d_k array fits any one machine or accelerator even at
# one byte a number (250 GB), whatever the address-space limit
_DRAFTS = ((220_013, 1, 2, 1), (210_011, 2, 4, 4), (200_003, 3, 5, 2), (500_009, 1, 2, 1))


def _roll_back_call(answer, *args):
    """``(got, hint)`` of ``answer(*args)``: its own work (no kda_lib, no linear-algebra
    routine, no d_k x d_k array: every draft's is too large to allocate) within ``HANG_S``."""
    held = _names_c_route(answer)
    if held:
        return None, held
    start, key_dim = time.monotonic(), np.shape(args[0])[0]
    try:
        with (_time_limit(HANG_S), _address_space_capped() as limit_changed,
              _c_routines_refused() as c_routines,
              modules_entered(_INVERSES, allowed=_PRODUCTS) as inverses):
            got, hint = call_own_work(answer, *args,
                                      name="roll_back(state, k, v, g, beta, rejected)")
    except _TooSlow:
        return None, _SLOW.format(HANG_S, key_dim)
    if limit_changed:
        return None, ("your function changed the address-space limit (resource.setrlimit): the "
                      "limit is the rule's check. Undo each token in O(d_k d_v) memory")
    if inverses or c_routines:
        return None, _INVERSE_HINT
    if hint and ("MemoryError" in hint or "RESOURCE_EXHAUSTED" in hint):
        return None, _DENSE.format(key_dim, 4 * key_dim**2 / 1e9)
    if hint is None and time.monotonic() - start > HANG_S:
        return None, _SLOW.format(HANG_S, key_dim)
    return got, hint


@checker("07.2")
def roll_back(answer, *, seed=None):
    """``answer(state, k, v, g, beta, rejected) -> [K, V]``: the state after the first
    ``n - rejected`` of ``n`` draft tokens, from the state after all ``n`` (one head) and the
    draft's unit keys ``k [n, K]``, values ``v [n, V]``, log decays ``g [n, K]`` and write
    strengths ``beta [n]``; without a linear-algebra routine (inverse, solve), a d_k x d_k
    array or kda_lib; the draft drawn at each call. How: every draft at d_k >= 200,003 (a
    d_k x d_k array: >= 40 GB at one byte a number; the address space is capped), a beta in
    (1, 2) in every draft (a series in beta diverges), library solvers refused whether called,
    held (code, closures, partials, default arguments) or reached through ctypes; linalg's
    products (``outer``, ``vecdot``, ``norm``, ...) are allowed. An iteration of the answer's
    own that converges (conjugate gradient, Richardson on the normal equations) passes: it is
    no closed form, but it is O(d_k d_v) a token."""
    seed, rng = seeded(seed)
    for key_dim, value_dim, tokens, rejected in _DRAFTS:
        s0, k, v, g, beta = _draft(rng, tokens, key_dim, value_dim)
        last = draft_states(s0, k, v, g, beta)[-1]  # the expected states: after the call
        # copies: an answer may update its arguments in place (checked against the originals)
        got, hint = _roll_back_call(answer, *(x.copy() for x in (last, k, v, g, beta)), rejected)
        where = f"for m = {tokens}, rejected = {rejected}"
        hint = hint or refuse_degenerate(got, shape=s0.shape, inputs=(last,),
                                         what=f"the state {where}")
        if hint:
            return hint + again(seed)
        states = draft_states(s0, k, v, g, beta)
        got, want = np.asarray(got, np.float64), states[tokens - rejected]
        if np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want):
            continue
        for off in (-1, 1):
            n = tokens - rejected + off
            if 0 <= n <= tokens and np.linalg.norm(got - states[n]) <= 1e-4 * np.linalg.norm(
                    states[n]):
                return (f"off by one token {where}: undo exactly the last `rejected` tokens"
                        + again(seed))
        return _roll_back_hint(got, want, last, k, v, beta, rejected, where) + again(seed)
    return None


def _roll_back_hint(got, want, last, k, v, beta, rejected, where) -> str:
    """The hint of a wrong roll-back: the decay left in place (the write and I - beta k k^T
    undone, no division by e^g), a diverged series (a state 10x too large), or neither."""
    undecayed = np.asarray(last, np.float64)
    for t in range(len(beta) - 1, len(beta) - 1 - rejected, -1):
        undecayed = undecayed - beta[t] / (1 - beta[t]) * np.outer(k[t], v[t] - k[t] @ undecayed)
    if np.linalg.norm(got - undecayed) <= 1e-4 * np.linalg.norm(undecayed):
        return (f"wrong {where}: the write and I - beta k k^T are undone, but M_t = "
                "(I - beta k k^T) D_t: what undoes D_t?")
    diverged = np.linalg.norm(got) > 10 * np.linalg.norm(want)
    return (f"wrong {where}" + (" (some beta > 1 here: a series in beta k k^T diverges)"
                                if diverged else "")
            + ": write S_(t-1) from S_t = M_t S_(t-1) + E_t; what undoes I - beta k k^T "
            "exactly, for a unit k?")


def _kda_verify_bytes(heads, key_dim, value_dim, conv_size, state_bytes, draft):
    """Bytes a KDA verify call of a ``draft``-token draft moves: the state read once and the
    state after each token written, the conv history's w - 1 rows read and the draft's rows
    written (none for conv_size < 2), all of ``state_bytes`` bytes a number."""
    return state_bytes * heads * ((1 + draft) * key_dim * value_dim
                                  + _window_rows(conv_size, draft) * (2 * key_dim + value_dim))


def _t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes, draft):
    kda = _kda_verify_bytes(heads, key_dim, value_dim, conv_size, state_bytes, draft)
    return max(1, math.ceil(kda / (kv_numbers * kv_bytes)) - 2 * draft)


def _cases(rng):
    """Seven (heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes, draft),
    conv_size 4, 4, 4, 0, 1, 2, 3, drafts of 1 to 8 tokens, drawn from ``rng``; an eighth, a
    small head against a large cache and a long draft, where the count gives T <= 0 (T* = 1);
    and a ninth whose kv_numbers x kv_bytes divides the KDA bytes: attention moves exactly
    as many bytes at T* (a floor + 1 in place of the ceiling is one too many there)."""
    out = [(int(rng.choice([8, 16, 32])), int(rng.choice([64, 128])), int(rng.choice([64, 128])),
            w, int(rng.integers(96, 4097)), int(rng.choice([2, 4])), int(rng.choice([2, 4])),
            int(rng.integers(1, 9))) for w in (4, 4, 4, 0, 1, 2, 3, int(rng.integers(0, 5)))]
    *head, n, bs, bc, d = out.pop()
    whole = _kda_verify_bytes(*head, bs, d) // bc  # a multiple of 256: divisors in [96, 4096]
    n = int(rng.choice([m for m in range(96, 4097) if whole % m == 0]))
    return out + [(1, 8, 8, int(rng.integers(0, 5)), int(rng.integers(2048, 4097)),
                   int(rng.choice([2, 4])), int(rng.choice([2, 4])), int(rng.integers(4, 17))),
                  (*head, n, bs, bc, d)]


def _t_star_hint(case, got: int) -> str:
    """Why ``got`` is not 07.3's T* for ``case``: the named slips, else a question."""
    h, k, v, w, n, bs, bc, d = case
    raw = math.ceil(_kda_verify_bytes(h, k, v, w, bs, d) / (n * bc)) - 2 * d
    if raw < 1 and got < 1:
        return ("attention moves more bytes here even at the smallest context: T is a number "
                "of tokens, at least 1")
    if raw >= 1 and got == raw + 1 and _kda_verify_bytes(h, k, v, w, bs, d) % (n * bc) == 0:
        return (f"at T = {raw} attention moves exactly the KDA call's bytes: 'no fewer' "
                "includes equality (the quotient is a whole number here)")
    if h > 1 and got == max(1, math.ceil(_kda_verify_bytes(h, k, v, w, bs, d) / (h * n * bc))
                                - 2 * d):
        return ("that reads kv_numbers as one head's: it counts the whole layer's numbers per "
                "token, all heads together (576 for MLA)")
    if got == _t_star(h, k, v, w, n, bs, bc, 1) and d > 1:
        return f"that is a draft of one token; this one has {d}"
    if got == math.ceil(2 * h * k * v * bs / (n * bc)):
        return ("that is one decode step's T*_step (the state read and written); count the "
                "verify call's states, conv rows, entries")
    one_state = _kda_verify_bytes(h, k, v, w, bs, d) - (d - 1) * h * k * v * bs
    if d > 1 and got == max(1, math.ceil(one_state / (n * bc)) - 2 * d):
        return "one state written: the call keeps the state after every draft token (exercise 1)"
    return "count both calls' bytes; is it the smallest whole T >= 1?"


@checker("07.3")
def decode_crossover(answer, *, seed=None):
    """``answer(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes,
    draft)``: the smallest whole context T >= 1 at which an attention call verifying a
    ``draft``-token draft (write its entries, read all T + draft) moves at least the bytes of a
    KDA verify call (state read, the state after each token written, conv rows read and written,
    in the state's dtype), on shapes drawn at each call (one where the count gives T <= 0)."""
    seed, rng = seeded(seed)
    for case in _cases(rng):
        got, hint = call_own_work(answer, *case, name="t_star(...)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, allow_zeros=True,
                                         what=f"T for {case}")
        if hint:
            return hint + again(seed)
        if int(got) != _t_star(*case):
            return f"wrong for {case}: " + _t_star_hint(case, int(got)) + again(seed)
    return None
