"""Checkers of notebook 07's exercises (a grouped-value-head cache, rolling the state back over
rejected draft tokens, the crossover with everything counted). Every call draws its inputs
afresh (``seed``, printed in each hint, repeats a call).

07.2 refuses linear-algebra routines three ways: Python frames of ``numpy.linalg``, ``scipy``'s
``linalg`` and ``sparse`` and jax's linalg (``np.linalg.norm`` excepted); C routines, which run
no Python frame: while the answer runs, ``np.linalg._umath_linalg``'s ufuncs, ``lapack_lite``'s
and ``scipy.linalg``'s LAPACK wrappers are replaced by stubs that refuse, and an answer naming or
holding one is refused before it runs (a program compiled before the answer is refused by the
machinery); and, for any route left, by value and by memory, not by speed: every draft's last
token (and for d_k >= 8 every third) has beta in (1.2, 1.8) (a negative eigenvalue 1 - beta along
k), where an iteration by powers of beta k k^T (Richardson, a Neumann series) diverges while the
closed form holds, and the last draft has ``d_k = 999,999``, where any d_k x d_k array (4 TB in
float32: a dense inverse, a solve or Gauss-Jordan by hand) cannot be allocated, with the
process's address space capped (Linux) so that holds where the kernel overcommits memory too.
The closed-form rollback needs O(d_k d_v) memory and time a token; ``HANG_S`` only stops an
answer that never returns. Matrix-free conjugate gradient on each token's system (exact in a few
iterations, O(d_k d_v) a token) is accepted: a legitimate route no checker can tell from the
closed form by its values, memory or speed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
import types

import numpy as np

from kda_lib.teaching.exercises import again, checker, machinery, refuse_degenerate, seeded
from kda_lib.teaching.exercises._routes import call_own_work, modules_entered
from kda_lib.teaching.exercises.ch01 import _time_limit, _TooSlow


def _cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes):
    """A KDA layer's decode cache with grouped value heads: float32 states B HV K V, and for
    conv_size >= 1 the q, k (H K each) and v (HV V) conv histories of conv_size - 1 rows, in
    numbers of ``conv_bytes`` bytes."""
    conv = batch * max(conv_size - 1, 0) * (2 * num_heads * key_dim + num_v_heads * value_dim)
    return 4 * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


# per layer: (conv_size, num_v_heads / num_heads, conv bytes): HV = H once, conv_size 0 to 4
_LAYOUTS = ((0, 2, 2), (4, 1, 4), (4, 4, 2), (1, 2, 2), (2, 3, 2), (3, 4, 4))


def _layers(rng):
    """Six layers (B, H, HV, K, V, w, conv bytes) of :data:`_LAYOUTS`, sizes drawn from ``rng``."""
    out = []
    for conv_size, group, conv_bytes in _LAYOUTS:
        heads = int(rng.integers(1, 5))
        out.append((int(rng.integers(1, 6)), heads, heads * group, int(rng.choice([4, 8, 16, 32])),
                    int(rng.choice([8, 12, 16, 32])), conv_size, conv_bytes))
    return out


@checker("07.1")
def layer_cache_bytes(answer, *, seed=None):
    """``answer(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes) ->
    int``: the bytes of a grouped-value-head KDA layer's decode cache, float32 states and conv
    histories of ``conv_bytes`` bytes a number, tried on layers drawn at each call."""
    seed, rng = seeded(seed)
    for case in _layers(rng):
        got, hint = call_own_work(answer, *case, name="cache_bytes(B, H, HV, K, V, w, conv_bytes)")
        hint = hint or refuse_degenerate(got, shape=(), what=f"bytes for {case}")
        if hint:
            return hint + again(seed)
        if float(got) != round(float(got)):
            return f"bytes for {case} should be a whole number" + again(seed)
        want = _cache_bytes(*case)
        if int(round(float(got))) == want:
            continue
        b, h, hv, k, v, w, cb = case
        if int(round(float(got))) == 4 * (b * h * k * v + b * max(w - 1, 0) * h * (2 * k + v)):
            return f"wrong for {case}: that is section 3's layout (HV = H, all float32)" + again(
                seed)
        if w == 0:
            return f"wrong for {case}: with conv_size=0 there is no conv history at all" + again(
                seed)
        if w == 1:
            return f"wrong for {case}: a width-1 conv keeps no earlier rows" + again(seed)
        return (f"wrong for {case}: which tensors have H heads, which HV, and in which dtype?"
                + again(seed))
    return None


_INVERSES = ("numpy.linalg", "scipy.linalg", "scipy.sparse", "jax._src.numpy.linalg",
             "jax._src.lax.linalg", "jax._src.scipy.linalg", "torch")
# names of C linear-algebra routes (no Python frame): numpy's private gufuncs, LAPACK wrappers
_C_ROUTES = ("_umath_linalg", "lapack", "get_lapack_funcs", "_flapack", "dgesv", "sgesv",
             "dgetrf", "dgetri", "dposv", "spsolve", "splu")
HANG_S = 60.0  # the closed form takes milliseconds at the largest d_k
_SLOW = ("your function took over {:.0f} s at d_k = {}: the closed-form rollback is O(d_k d_v) "
         "a token; is yours O(d_k^2)?")
_DENSE = ("your function ran out of memory at d_k = {:,}: a d_k x d_k array takes {:.0f} TB "
          "there. Undo each token in O(d_k d_v) memory, no d_k x d_k matrix")
_HEADROOM = 2**35  # bytes of address space an answer may add at the largest d_k (32 GiB)


@contextlib.contextmanager
def _address_space_capped(headroom: int = _HEADROOM):
    """Cap this process's address space at its present size plus ``headroom`` while the block
    runs (Linux; elsewhere nothing), so a d_k x d_k allocation fails even where the kernel
    overcommits memory; the previous limit is restored."""
    try:
        import resource

        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    cap = min(x for x in (size + headroom, soft, hard) if x != resource.RLIM_INFINITY)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


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


@contextlib.contextmanager
def _c_routines_refused():
    """While the block runs, every routine of :func:`_c_routine_items` is replaced by a stub
    that records its name in the list yielded and raises; the originals are restored after."""
    used: list[str] = []
    saved = list(_c_routine_items())
    for module, name, _ in saved:
        setattr(module, name, _refusing(f"{module.__name__}.{name}", used))
    try:
        yield used
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _names_c_route(answer, depth: int = 4) -> bool:
    """Whether ``answer``'s code (its nested functions, closures, partials and the functions
    of its module it names, ``depth`` levels deep) names or holds a C linear-algebra routine."""
    routines, seen, todo = _c_routines(), set(), [(answer, depth)]
    while todo:
        fn, level = todo.pop()
        if id(fn) in seen or level < 0:
            continue
        seen.add(id(fn))
        if id(fn) in routines:
            return True
        if isinstance(fn, functools.partial):
            todo += [(x, level) for x in (fn.func, *fn.args, *fn.keywords.values())]
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        codes = [code]
        while codes:
            c = codes.pop()
            if any(n.startswith(_C_ROUTES) for n in c.co_names):
                return True
            codes += [x for x in c.co_consts if isinstance(x, type(c))]
            names = getattr(fn, "__globals__", {})
            todo += [(names[n], level - 1) for n in c.co_names if n in names]
        for cell in getattr(fn, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                todo.append((cell.cell_contents, level - 1))
    return False


_INVERSE_HINT = (
    "your answer runs a linear-algebra routine (an inverse, a solve, a factorization): undo "
    "each token with the inverse of its transition written out by hand, O(d_k d_v) a token"
)


def _draft(rng, tokens: int, key_dim: int, value_dim: int):
    """A head's state before a draft and the draft's unit keys, values, log decays and write
    strengths (beta in [0.1, 0.6], g in [-0.4, 0]: each token's transition well conditioned;
    the last beta, and for d_k >= 8 every third, is in [1.2, 1.8]: 1 - beta < 0 along k)."""
    k = rng.standard_normal((tokens, key_dim))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = rng.uniform(0.1, 0.6, tokens)
    if key_dim >= 8:
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


# K, V, n, rejected; the last: an odd d_k (XLA handles its square's size cleanly) at which a
# d_k x d_k float32 array is 4 TB
_DRAFTS = ((4, 3, 5, 2), (8, 4, 6, 3), (16, 8, 5, 5), (6, 6, 3, 1), (999_999, 1, 2, 1))
_BIG = _DRAFTS[-1][0]


def _roll_back_call(answer, *args):
    """``(got, hint)`` of ``answer(*args)``: its own work (no kda_lib, no linear-algebra
    routine, no d_k x d_k array at the largest d_k) within ``HANG_S``."""
    if _names_c_route(answer):
        return None, _INVERSE_HINT
    start, key_dim = time.monotonic(), np.shape(args[0])[0]
    capped = _address_space_capped() if key_dim == _BIG else contextlib.nullcontext()
    try:
        with (_time_limit(HANG_S), capped, _c_routines_refused() as c_routines,
              modules_entered(_INVERSES, allowed=("norm",)) as inverses):
            got, hint = call_own_work(answer, *args,
                                      name="roll_back(state, k, v, g, beta, rejected)")
    except _TooSlow:
        return None, _SLOW.format(HANG_S, key_dim)
    if inverses or c_routines:
        return None, _INVERSE_HINT
    if hint and ("MemoryError" in hint or "RESOURCE_EXHAUSTED" in hint):
        return None, _DENSE.format(key_dim, 4 * key_dim**2 / 1e12)
    if hint is None and time.monotonic() - start > HANG_S:
        return None, _SLOW.format(HANG_S, key_dim)
    return got, hint


@checker("07.2")
def roll_back(answer, *, seed=None):
    """``answer(state, k, v, g, beta, rejected) -> [K, V]``: the state after the first
    ``n - rejected`` of ``n`` draft tokens, from the state after all ``n`` (one head) and the
    draft's unit keys ``k [n, K]``, values ``v [n, V]``, log decays ``g [n, K]`` and write
    strengths ``beta [n]``; without a linear-algebra routine (inverse, solve), a d_k x d_k
    array or kda_lib; the draft drawn at each call."""
    seed, rng = seeded(seed)
    for key_dim, value_dim, tokens, rejected in _DRAFTS:
        s0, k, v, g, beta = _draft(rng, tokens, key_dim, value_dim)
        states = draft_states(s0, k, v, g, beta)
        got, hint = _roll_back_call(answer, states[-1], k, v, g, beta, rejected)
        where = f"for n = {tokens}, rejected = {rejected}"
        hint = hint or refuse_degenerate(got, shape=s0.shape, inputs=(states[-1],),
                                         what=f"the state {where}")
        if hint:
            return hint + again(seed)
        got, want = np.asarray(got, np.float64), states[tokens - rejected]
        if np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want):
            continue
        for off in (-1, 1):
            n = tokens - rejected + off
            if 0 <= n <= tokens and np.linalg.norm(got - states[n]) <= 1e-4 * np.linalg.norm(
                    states[n]):
                return (f"off by one token {where}: undo exactly the last `rejected` tokens"
                        + again(seed))
        return (f"wrong {where} (some beta > 1 here: a series in beta k k^T diverges): write "
                "S_(t-1) from S_t = M_t S_(t-1) + E_t; what undoes I - beta k k^T exactly, for "
                "a unit k?" + again(seed))
    return None


def _t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes):
    kda = 2 * state_bytes * heads * (key_dim * value_dim
                                     + max(conv_size - 1, 0) * (2 * key_dim + value_dim))
    return max(1, math.ceil(kda / (kv_numbers * cache_bytes)) - 2)


def _cases(rng):
    """Six (heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes), conv_size
    4, 4, 4, 0, 2, 3, drawn from ``rng`` (the crossing well above T = 1)."""
    return [(int(rng.choice([8, 16, 32])), int(rng.choice([64, 128])), int(rng.choice([64, 128])),
             conv_size, int(rng.integers(96, 4097)), int(rng.choice([2, 4])),
             int(rng.choice([2, 4]))) for conv_size in (4, 4, 4, 0, 2, 3)]


@checker("07.3")
def decode_crossover(answer, *, seed=None):
    """``answer(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes)``:
    the smallest whole context T >= 1 at which an attention decode step (write the new entry,
    read all T + 1) moves at least the bytes of a KDA step (state and conv histories, in the
    state's dtype, read and written), on shapes drawn at each call."""
    seed, rng = seeded(seed)
    for case in _cases(rng):
        got, hint = call_own_work(answer, *case, name="t_star(...)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what=f"T for {case}")
        if hint:
            return hint + again(seed)
        want = _t_star(*case)
        if int(got) == want:
            continue
        h, k, v, w, n, bs, bc = case
        if int(got) == math.ceil(2 * h * k * v * bs / (n * bc)):
            return (f"wrong for {case}: that is section 5's T*_step; put back the conv "
                    "histories and the new entry" + again(seed))
        if np.isclose(float(got), want / 2, atol=2):
            return (f"off by a factor of 2 for {case}: the KDA cache is read and written back"
                    + again(seed))
        return (f"wrong for arguments {case}; count both steps' bytes; is it the smallest whole "
                "T?" + again(seed))
    return None
