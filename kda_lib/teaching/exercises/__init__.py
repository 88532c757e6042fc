"""Exercise checkers: say whether a student's answer is right without printing the answer.

Each notebook's exercises leave an answer cell for the student (``answer = None`` to start) and
call ``check("03.2", answer, ...)``. A checker lives in ``kda_lib/teaching/exercises/chNN.py`` (one
module per notebook), registered with ``@checker("NN.M")``; it recomputes what it needs from
the arguments the notebook passes and returns ``None`` when the answer is right or a short hint
(never the expected value) when it is not. Worked solutions are in ``notebooks/solutions/``
(plain Python, one module per notebook), where a student goes after trying; the test suite
(``tests/teaching/test_exercises.py``) feeds every solution to its checker and asserts it passes,
and wrong answers (NaN, inf, zeros, an input handed back, a wrong shape or dtype, the shortcut
an exercise forbids) and asserts each fails.

Every checker sends what it is about to compare through :func:`refuse_degenerate` (the same
refusals, with a hint, in every exercise); a checker that asks for a function calls it through
:func:`call_answer` on inputs of its own, so a hard-coded array cannot pass; with ``own_code``
(every exercise of notebooks 00-05) the call is stopped at its first ``kda_lib`` frame
(:func:`library_calls`), so no route through the library passes. ``tests/teaching/test_redteam.py``
attacks those checkers mechanically.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import importlib
import inspect
import itertools
import multiprocessing.process
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

_CHECKERS: dict[str, Callable[..., str | None]] = {}


def checker(exercise_id: str) -> Callable[[Callable[..., str | None]], Callable[..., str | None]]:
    """Register ``fn(answer, **context) -> None | hint`` as the checker of ``exercise_id``
    ("NN.M": notebook NN, exercise M)."""

    def register(fn: Callable[..., str | None]) -> Callable[..., str | None]:
        if exercise_id in _CHECKERS:
            raise ValueError(f"exercise {exercise_id!r} has two checkers")
        _CHECKERS[exercise_id] = fn
        return fn

    return register


def refuse_degenerate(
    answer: Any,
    *,
    shape: Sequence[int] | None = None,
    inputs: Sequence[Any] = (),
    what: str = "the answer",
    integer: bool = False,
    allow_zeros: bool = False,
) -> str | None:
    """The refusals every checker shares: ``None`` if ``answer`` is real numbers (ints or floats,
    not bools, complex numbers, strings or objects; whole numbers where ``integer``), of
    ``shape`` (when given), all finite, not all zeros (unless ``allow_zeros``) and not one of
    ``inputs`` handed back unchanged (arrays of more than one entry: a scalar answer may equal
    an input by chance); else a hint saying which. It never compares with the expected answer:
    the checker does that after."""
    if callable(answer) or isinstance(answer, (str, bytes, dict, set)):
        return f"{what} should be numbers (an array or a number), got {type(answer).__name__}"
    try:
        values = np.asarray(answer)
    except Exception:  # noqa: BLE001 - ragged lists and the like
        return f"{what} should be numbers (an array or a number)"
    if values.dtype.kind == "O":
        try:
            values = values.astype(np.float64)
        except (TypeError, ValueError):
            return f"{what} should be numbers (an array or a number)"
        except OverflowError:  # a Python int past float64's range
            return f"{what} is too large for a float64 (over 1.8e308)"
    if values.dtype.kind not in "iuf":
        return f"{what} should be real numbers (ints or floats), got dtype {values.dtype}"
    if shape is not None and values.shape != tuple(shape):
        return f"{what} should have shape {tuple(shape)}, got {values.shape}"
    if not np.isfinite(values).all():
        return f"{what} has NaN or inf entries"
    if integer and not (values.dtype.kind in "iu" or (values == np.round(values)).all()):
        return f"{what} should be whole numbers"
    if not allow_zeros and values.size and not values.any():
        return f"{what} is all zeros"
    for given in inputs:
        if values.size > 1 and np.shape(given) == values.shape:
            if np.array_equal(np.asarray(given), values):
                return f"{what} is one of the inputs handed back unchanged"
    return None


# the machinery that calls an answer; the checkers (chNN) count as library: an answer that
# calls a checker's reference function is refused, except the helpers marked @machinery
_OWN = (__name__, f"{__name__}._routes")
MACHINERY_CODE: set = set()


def seeded(seed) -> tuple[int, np.random.Generator]:
    """``(seed, rng)``: a fresh seed from ``os.urandom`` unless one is given (a checker's trials
    drawn afresh at every call, so no table of answers keyed on its inputs passes)."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
    return seed, np.random.default_rng(seed)


def again(seed) -> str:
    """The hint's suffix that repeats a call's drawn inputs."""
    return f" (these inputs again: check(..., seed={seed}))"


def machinery(fn):
    """Marks a checker helper that runs while an answer runs (an interpreter, a patched
    ``np.exp``): its code, nested functions and lambdas included, is not an answer route."""
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        MACHINERY_CODE.add(code)
        stack += [c for c in code.co_consts if isinstance(c, type(code))]
    return fn


LIBRARY_HINT = (
    "your answer runs kda_lib code (or tokamax's or fla's); this exercise asks you to write it "
    "yourself (NumPy or jnp)"
)


_CONTEXTS = itertools.count(1_000_001)
# The context the hooks that watch an answer (library_calls, _routes.call_own_work) run it in:
# the same value from call to call, so an answer's own operations compile once, not at every
# call (the red team of tests/teaching: -40%, measured). No other code enters it, and a hook that
# stopped a library call retires it (the next call gets a new value): an answer that swallows the
# stop runs on unwatched, so a trace cached in a retired context may hold library code, and no
# later call enters one; in the live context, every trace cached ran watched, library-free.
_WATCHED = [next(_CONTEXTS)]


def _retire_watched() -> None:
    _WATCHED[0] = next(_CONTEXTS)


@contextlib.contextmanager
def fresh_jax_context(version: int | None = None) -> Iterator[None]:
    """A JAX context no call outside it used: inside it a function jitted and compiled before
    (``jax.jit(kda_lib.kda)`` called earlier) traces again, so it runs its Python frames where
    the profile hook sees them. It is a value of ``jax_xla_profile_version`` (``version``, by
    default a new one), an integer in every jit and trace cache key that XLA:CPU ignores;
    unlike ``jax.clear_caches()`` it keeps every program compiled outside it (the checkers'
    references, the notebook's own)."""
    jax = sys.modules.get("jax")
    if jax is None:  # nothing jitted yet
        yield
        return
    before = jax.config.jax_xla_profile_version
    jax.config.update("jax_xla_profile_version", next(_CONTEXTS) if version is None else version)
    try:
        yield
    finally:
        jax.config.update("jax_xla_profile_version", before)


class _LibraryEntered(BaseException):
    """Raised into an answer at its first ``kda_lib`` frame (a BaseException, so that the
    answer's own ``except Exception`` does not swallow it); :func:`library_calls` stops it."""


STARTED = "a thread or process"
THREAD_HINT = (
    "your answer starts a thread or a process, or turns the checker's profile hook off; the "
    "checker watches only the code an answer runs itself: compute it in the calling thread"
)
COMPILED = "a compiled program"
COMPILED_HINT = (
    "your answer calls a program compiled before it ran (jax.jit(f).lower(...).compile()): "
    "the checker cannot see what such a program computes; write the computation in the answer"
)
JAXPR = "a jaxpr traced before"
JAXPR_HINT = (
    "your answer evaluates a jaxpr it did not trace (jax.make_jaxpr(f) made before, replayed "
    "with eval_jaxpr or jaxpr_as_fun): the checker cannot see what it computes; write the "
    "computation in the answer"
)
HINTS = {STARTED: THREAD_HINT, COMPILED: COMPILED_HINT, JAXPR: JAXPR_HINT}


FRAMES = "the call stack"
HINTS[FRAMES] = (
    "your answer reads the call stack (sys._getframe, inspect.stack, a traceback's or a "
    "generator's frame, gc's referrers): the checker's frames are not inputs; compute the "
    "answer from the arguments"
)
# audit events that hand code a frame (or every object: gc), and the frame attributes audited
_FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys._current_exceptions",
                           "gc.get_objects", "gc.get_referrers"})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_FRAME_GUARD: list = [None]  # (thread id, the list a refusal is recorded in) while an answer runs
_IN_HOOK: set[int] = set()


_CHECKER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


@functools.cache
def _stdlib_paths() -> tuple[str, ...]:
    import sysconfig

    return tuple({os.path.join(sysconfig.get_paths()[p], "") for p in ("stdlib", "platstdlib")})


def _frame_audit(event: str, args: tuple) -> None:
    """The audit hook (installed once, idle unless :func:`frames_refused` is active): in the
    answer's thread, a frame read that neither the checkers nor an installed package (JAX,
    NumPy: their path holds "-packages") asked for, the standard library's ``inspect``,
    ``traceback``... passed through, records :data:`FRAMES` and raises
    :class:`_LibraryEntered`."""
    guard = _FRAME_GUARD[0]
    if guard is None or not (event in _FRAME_EVENTS or (
            event == "object.__getattr__" and args[1] in _FRAME_ATTRIBUTES)):
        return
    me = threading.get_ident()
    if me != guard[0] or me in _IN_HOOK:
        return
    _IN_HOOK.add(me)
    try:
        frame = sys._getframe(1)
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_CHECKER_DIR):
            return
        while path.startswith(_stdlib_paths()) and "-packages" not in path and frame.f_back:
            frame = frame.f_back
            path = os.path.abspath(frame.f_code.co_filename)
        if "-packages" + os.sep in path:
            return
    finally:
        _IN_HOOK.discard(me)
    if not guard[1]:
        guard[1].append(FRAMES)
    raise _LibraryEntered(FRAMES)


_AUDITING: list[bool] = []


@contextlib.contextmanager
def frames_refused(entered: list[str]) -> Iterator[None]:
    """While the block runs (the answer's call), a frame read the answer makes (``sys._getframe``,
    ``inspect.currentframe``/``stack``, ``traceback.extract_stack``, an exception's
    ``__traceback__.tb_frame``, a generator's ``gi_frame``, ``sys._current_frames``,
    ``gc.get_referrers``/``get_objects``) records :data:`FRAMES` in ``entered`` and stops the
    answer: the checker's frames above it hold its trials. Its refusal ends here, quietly."""
    if not _AUDITING:
        sys.addaudithook(_frame_audit)
        _AUDITING.append(True)
    previous = _FRAME_GUARD[0]
    _FRAME_GUARD[0] = (threading.get_ident(), entered)
    try:
        yield
    except _LibraryEntered:
        if entered[:1] != [FRAMES]:
            raise
    finally:
        _FRAME_GUARD[0] = previous


def _refusing(entered: list[str], original, what: str = STARTED,
              exempt: tuple[str, ...] = ("jax", "jaxlib", "threading")):  # fmt: skip
    """``original``, refusing (recording ``what``) unless called from a module of ``exempt``
    (a package or a dotted module: JAX's threads, a timer, watched) or from the checkers."""

    def refuse(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__") or ""
        if caller.startswith(__name__) or any(
                caller == e or caller.startswith(e + ".") for e in exempt):
            return original(*args, **kwargs)
        if not entered:
            entered.append(what)
        raise _LibraryEntered(what)

    return refuse


@functools.cache
def _jit_dispatch_module(jax) -> str | None:
    """The module of jit's Python dispatch path (found once: building a jitted function runs
    jax code, which a traced answer's call must not see)."""
    return getattr(getattr(jax.jit(abs), "_cache_miss", None), "__module__", None)


def _compiled_entry_points() -> list[tuple[Any, str, Any, tuple[str, ...]]]:
    """``(owner, name, attribute, exempt)`` of the ways to run a compiled program: a
    ``jax.stages.Compiled``, its executables (``call``; ``ExecuteReplicated``, its
    ``unsafe_call``) and the XLA executable under them (``execute*``), the last two exempt when
    JAX's own dispatch calls them (jit's Python path; never jax.tree.map and the like); none
    before JAX is imported (no program compiled). Found from public objects (their modules)."""
    jax = sys.modules.get("jax")
    stages = getattr(jax, "stages", None)
    if stages is None:
        return []
    owner = stages.Compiled
    out = [(owner, n, owner.__dict__[n], ()) for n in ("__call__", "call") if n in owner.__dict__]
    base = getattr(sys.modules.get(owner.__module__), "Executable", None)
    executables = base.__subclasses__() if base is not None else []  # pxla's MeshExecutable
    out += [(c, "call", c.__dict__["call"], ()) for c in executables if "call" in c.__dict__]
    module = sys.modules.get(executables[0].__module__) if executables else None
    jit_module = _jit_dispatch_module(jax)
    dispatch = tuple(m for m in (getattr(module, "__name__", None), jit_module) if m)
    replicated = getattr(module, "ExecuteReplicated", None)
    if replicated is not None and dispatch:  # (an empty exempt would refuse jit's own calls)
        out.append((replicated, "__call__", replicated.__dict__["__call__"], dispatch))
    loaded = getattr(getattr(module, "xc", None), "LoadedExecutable", None)
    out += [(loaded, n, loaded.__dict__[n], dispatch) for n in
            ("execute", "execute_sharded", "execute_with_token")
            if loaded is not None and dispatch and n in loaded.__dict__]
    return out


def _jaxpr_types() -> tuple[type, ...]:
    """``(Jaxpr, ClosedJaxpr)`` (jax.extend.core's), or ``()`` before JAX is imported."""
    if "jax" not in sys.modules:
        return ()
    import jax.extend.core

    return jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr


def _jaxpr_entry_points() -> list[tuple[Any, str, Any, tuple[str, ...]]]:
    """``(owner, name, function, exempt)`` of the ways to evaluate a jaxpr (``eval_jaxpr``,
    ``jaxpr_as_fun``) in every module that exports them (jax.core, jax.extend.core, the one
    they are defined in, found from ``ClosedJaxpr``), JAX's own callers exempt."""
    types = _jaxpr_types()
    if not types:
        return []
    public = [sys.modules.get(m) for m in ("jax.core", "jax.extend.core")]
    modules = [m for m in (*public, sys.modules.get(types[1].__module__)) if m is not None]
    return [(m, n, m.__dict__[n], ("jax", "jaxlib")) for m in modules
            for n in ("eval_jaxpr", "jaxpr_as_fun") if n in m.__dict__]


def held(answer, found: Callable[[Any], Any], depth: int = 3) -> Any:
    """The first ``found(x)`` that is truthy, ``x`` an object ``answer`` holds: itself, in a
    closure, a default, a partial, a global its code names or a container of those, ``depth``
    levels deep; else ``None``."""
    todo, seen = [(answer, depth)], set()
    while todo:
        fn, level = todo.pop()
        hit = found(fn)
        if hit:
            return hit
        if level < 0 or id(fn) in seen or isinstance(fn, (str, bytes, np.ndarray)):
            continue
        seen.add(id(fn))
        if isinstance(fn, (dict, list, tuple, set, frozenset)):
            todo += [(x, level - 1) for x in list(fn.values() if isinstance(fn, dict) else fn)[:64]]
        if isinstance(fn, functools.partial):
            todo += [(x, level) for x in (fn.func, *fn.args, *fn.keywords.values())]
        code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", None) or {}
        stack = [code] if code is not None else []
        while stack:
            c = stack.pop()
            stack += [x for x in c.co_consts if isinstance(x, type(c))]
            todo += [(names[n], level - 1) for n in c.co_names if n in names]
        todo += [(x, level - 1) for x in (getattr(fn, "__defaults__", None) or ())]
        todo += [(x, level - 1) for x in (getattr(fn, "__kwdefaults__", None) or {}).values()]
        for cell in getattr(fn, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                todo.append((cell.cell_contents, level - 1))
    return None


def _fingerprint(code) -> tuple:
    """What two copies of one function's source share: bytecode, constants (the docstring
    included; nested code by its own fingerprint), names and variable names (not the file, the
    first line or the function's name, which ``exec(inspect.getsource(f))`` changes)."""
    consts = tuple(_fingerprint(c) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames


_REFERENCE_PRINTS: dict[str, frozenset] = {}  # checker module -> its functions' prints
_ALL_PRINTS: list = [0, frozenset()]  # (modules counted, the union of their prints)


def _source_prints(fn) -> set:
    """The fingerprints of ``fn``'s code and of its source compiled afresh (the module's own
    bytecode can differ from a recompiled copy's in call opcodes)."""
    prints = {_fingerprint(fn.__code__)}
    with contextlib.suppress(OSError, TypeError, SyntaxError):
        source = textwrap.dedent(inspect.getsource(fn))
        prints |= {_fingerprint(c) for c in compile(source, "<source>", "exec").co_consts
                   if isinstance(c, type(fn.__code__))}
    return prints


def _reference_prints() -> frozenset:
    """The fingerprints of the functions with a docstring (so that a student's own code, the same
    by chance, is not taken for a copy) that the checker modules (``chNN``) imported define."""
    for name, module in list(sys.modules.items()):
        if name.startswith(__name__ + ".ch") and name not in _REFERENCE_PRINTS:
            _REFERENCE_PRINTS[name] = frozenset().union(*(
                _source_prints(f) for f in vars(module).values()
                if getattr(f, "__module__", None) == name and getattr(f, "__doc__", None)
                and hasattr(f, "__code__")))
    if _ALL_PRINTS[0] != len(_REFERENCE_PRINTS):
        _ALL_PRINTS[:] = [len(_REFERENCE_PRINTS), frozenset().union(*_REFERENCE_PRINTS.values())]
    return _ALL_PRINTS[1]


COPY_HINT = (
    "your answer runs a copy of the checker's own reference (its source re-created from "
    "kda_lib): write the computation yourself"
)


def copies_reference(answer) -> bool:
    """Whether ``answer`` holds (:func:`held`) a function whose code, or code nested in it, is a
    re-created copy of a checker's reference function (same :func:`_fingerprint`)."""
    prints = _reference_prints()

    def copied(fn) -> bool:
        code = getattr(fn, "__code__", None)
        stack = [code] if isinstance(code, type(_fingerprint.__code__)) else []
        while stack:
            c = stack.pop()
            if _fingerprint(c) in prints:
                return True
            stack += [x for x in c.co_consts if isinstance(x, type(c))]
        return False

    return held(answer, copied) is not None


def holds_jaxpr(answer) -> bool:
    """Whether ``answer`` holds (:func:`held`) a jaxpr (``Jaxpr``, ``ClosedJaxpr``) traced
    before it ran (evaluated inside the answer, it would run code no hook sees)."""
    types = _jaxpr_types()
    return bool(types) and held(answer, lambda x: isinstance(x, types)) is not None


@contextlib.contextmanager
def watch_every_thread(hook, entered: list[str]) -> Iterator[None]:
    """While the block runs, ``hook`` is the profile function of every thread (the calling
    one, those already running: a thread pool made before the call; and those started), and
    starting a thread or process (``threading``, ``concurrent.futures``, ``multiprocessing``,
    ``subprocess``, ``os.fork``) records :data:`STARTED` in ``entered`` and raises
    :class:`_LibraryEntered` (JAX's own threads, started from ``jax`` code, excepted and
    watched); calling a ``jax.stages.Compiled`` or its executables (a program compiled before
    the answer ran, whose Python frames never run) records :data:`COMPILED`, and evaluating a
    jaxpr from outside JAX (``eval_jaxpr``, ``jaxpr_as_fun``) :data:`JAXPR`, and raises the
    same: an answer may not run code where the hooks cannot see it."""
    starts = [(threading.Thread, "start"), (multiprocessing.process.BaseProcess, "start"),
              (subprocess.Popen, "_execute_child")]
    starts += [(os, n) for n in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp")
               if hasattr(os, n)]
    starts += [(_thread, n) for n in ("start_new_thread", "start_joinable_thread", "start_new")
               if hasattr(_thread, n)]
    # the hooks themselves: an answer may not change them (checked again when it returns)
    starts += [(sys, "setprofile"), (sys, "settrace"), (threading, "setprofile"),
               (threading, "settrace")]
    starts += [(threading, n) for n in ("setprofile_all_threads", "settrace_all_threads")
               if hasattr(threading, n)]
    originals = [(owner, name, owner.__dict__[name]) for owner, name in starts]
    compiled = _compiled_entry_points()
    jaxprs = _jaxpr_entry_points()
    set_all = getattr(threading, "setprofile_all_threads", None)  # Python >= 3.12
    previous, previous_new = sys.getprofile(), threading.getprofile()
    for owner, name, fn in originals:
        setattr(owner, name, _refusing(entered, fn))
    for owner, name, fn, exempt in compiled:
        setattr(owner, name, _refusing(entered, fn, COMPILED, exempt))
    for owner, name, fn, exempt in jaxprs:
        setattr(owner, name, _refusing(entered, fn, JAXPR, exempt))
    if set_all is not None:
        set_all(hook)
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield
        if sys.getprofile() is not hook and not entered:  # turned off by a route not patched
            entered.append(STARTED)
    finally:
        for owner, name, fn, *_ in originals + compiled + jaxprs:
            setattr(owner, name, fn)
        if set_all is not None:
            set_all(None)
        threading.setprofile(previous_new)
        sys.setprofile(previous)


OTHER_KDA = ("tokamax", "fla")  # the other KDA libraries installed beside kda_lib (fla: if so)


_KNOWN_MODULES: dict[str, tuple[bool, bool]] = {}  # exact str -> (other_kda, library module)
_KNOWN_FOR = [OTHER_KDA]  # the OTHER_KDA they were found for (a test may set another)


def _module_kinds(module: str) -> tuple[bool, bool]:
    """``(other_kda(module), module is kda_lib's and not the machinery's)``, remembered for
    exact ``str`` names only (a ``str`` subclass could match a library name in a dict and answer
    differently elsewhere): the profile hooks ask it at every call an answer makes."""
    if _KNOWN_FOR[0] is not OTHER_KDA:
        _KNOWN_MODULES.clear()
        _KNOWN_FOR[0] = OTHER_KDA
    known = _KNOWN_MODULES.get(module) if type(module) is str else None
    if known is None:
        other = module in OTHER_KDA or module.startswith(tuple(p + "." for p in OTHER_KDA))
        ours = (module == "kda_lib" or module.startswith("kda_lib.")) and module not in _OWN
        known = other, ours or other
        if type(module) is str:
            _KNOWN_MODULES[module] = known
    return known


def other_kda(module: str) -> bool:
    """Whether ``module`` (a dotted name) is in one of :data:`OTHER_KDA`'s packages, whose KDA
    code (tokamax's reference, fla's kernels) an answer may not run either."""
    return _module_kinds(module)[0]


@contextlib.contextmanager
def library_calls() -> Iterator[list[str]]:
    """While the block runs, stop it at the first Python frame of ``kda_lib`` (or of tokamax or
    fla, :func:`other_kda`) that is entered
    (the machinery calling the answer excepted; the checkers' reference functions count),
    whatever the route: the function itself,
    ``functools.partial``, a lambda, a notebook function that calls it, ``jax.jit`` of it
    (in a :func:`fresh_jax_context` only this hook's blocks enter, so a function jitted
    outside it is traced again). The
    list yielded holds the module entered (empty if none); the block ends there, quietly."""
    entered: list[str] = []

    def profile(frame, event, _arg):
        if event == "call" and not entered:
            module = frame.f_globals.get("__name__") or ""
            if _module_kinds(module)[1] and frame.f_code not in MACHINERY_CODE:
                entered.append(module)
                raise _LibraryEntered(module)

    try:
        with watch_every_thread(profile, entered), fresh_jax_context(_WATCHED[0]):
            yield entered
    except _LibraryEntered:
        pass
    finally:
        if entered:
            _retire_watched()


ANSWER_RUNNING: list = []  # the answer call_answer is running (a time limit stops only it)


def call_answer(
    answer: Any,
    *args: Any,
    name: str = "your function",
    wanted: str | None = None,
    own_code: bool = False,
) -> tuple[Any, str | None]:
    """``(answer(*args), None)``, or ``(None, hint)`` when ``answer`` is not callable (the hint
    asks for ``wanted``, by default "a function ``name``") or raises (a student's function may
    fail any way). With ``own_code``, also a hint when the call enters any ``kda_lib`` code
    (:func:`library_calls`): the exercise asks the student to write it."""
    if not callable(answer):
        wanted = wanted or f"a function {name}"
        return None, f"answer with {wanted}, not a {type(answer).__name__}"
    if copies_reference(answer):
        return None, COPY_HINT
    if own_code and holds_jaxpr(answer):
        return None, JAXPR_HINT
    guard = library_calls() if own_code else contextlib.nullcontext([])
    result = None
    try:
        with guard as entered, frames_refused(entered):
            ANSWER_RUNNING.append(answer)
            try:
                result = answer(*args)
            finally:
                ANSWER_RUNNING.pop()
    except Exception as error:  # noqa: BLE001 - a student's function may fail any way
        if own_code and entered:
            return None, HINTS.get(entered[0], LIBRARY_HINT)
        message = str(error).splitlines()[0][:120] if str(error) else ""
        return None, f"{name} raised {type(error).__name__}" + (f": {message}" if message else "")
    if entered:
        return None, HINTS.get(entered[0], LIBRARY_HINT)
    return result, None


def _checker_for(exercise_id: str) -> Callable[..., str | None]:
    if not isinstance(exercise_id, str):
        raise ValueError(
            f"exercise_id must be a string like '03.2', got {exercise_id!r} "
            f"({type(exercise_id).__name__})"
        )
    chapter = exercise_id.split(".")[0]
    if not (chapter.isdigit() and len(chapter) == 2):
        raise ValueError(f"exercise_id must look like 'NN.M', got {exercise_id!r}")
    try:
        importlib.import_module(f"{__name__}.ch{chapter}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.ch{chapter}":  # a missing import inside the chapter
            raise
        raise ValueError(
            f"no exercises for notebook {chapter} (exercise_id {exercise_id!r})"
        ) from err
    if exercise_id not in _CHECKERS:
        raise ValueError(f"no exercise {exercise_id!r}; known: {sorted(_CHECKERS)}")
    return _CHECKERS[exercise_id]


def verdict(exercise_id: str, answer: Any, **context: Any) -> str | None:
    """``None`` if ``answer`` solves ``exercise_id``, else a hint; raises if it was not tried
    (``answer is None``). The tests call this; notebooks call :func:`check`."""
    fn = _checker_for(exercise_id)
    if answer is None:
        raise ValueError(f"exercise {exercise_id}: no answer given")
    return fn(answer, **context)


def check(exercise_id: str, answer: Any, **context: Any) -> bool | None:
    """Print whether ``answer`` solves ``exercise_id``: ``True`` right, ``False`` wrong (with a
    hint), ``None`` not tried yet (``answer is None``). Never prints the expected answer."""
    fn = _checker_for(exercise_id)
    if answer is None:
        print(f"exercise {exercise_id}: not tried yet (replace None with your answer)")
        return None
    hint = fn(answer, **context)
    print(f"exercise {exercise_id}: " + ("right" if hint is None else f"not yet: {hint}"))
    return hint is None
