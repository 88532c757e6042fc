"""Red team of a notebook's exercises with the notebook's own namespace, run inside its kernel.

tests/teaching/run_nbval.py (attacks on: ``KDA_NAMESPACE_ATTACK_REPORT`` set, as
tests/teaching/test_notebooks.py does) runs this file in the notebook's kernel just before the
first exercise cell, with :func:`runpy.run_path` and these globals:

* ``NOTEBOOK``: the kernel's ``globals()``, exactly what the notebook built so far;
* ``CHECKS``: ``{exercise id: {keyword: expression}}``, the context arguments the notebook's
  ``check`` calls pass (evaluated here in the namespace);
* ``PRELUDE``: the exercise cells' top-level assignments other than ``answer`` (a context
  expression may use them, e.g. 06's ``p_late``);
* ``TIME_LIMIT_S``: the most seconds one checker call may take.

Every value the notebook defines, every function it defines or imports from kda_lib's
computing modules, and ``functools.partial`` of each such function, is fed to each exercise;
one the checker accepts (no hint) is a hole. A call past the time limit counts as refused.
It prints one line, ``NAMESPACE_ATTACK {"accepted": [[id, name], ...], "tried": n}``. The
namespace, jax's settings, the NumPy and ``random`` generators and matplotlib's open figures are
restored afterwards, so the notebook runs on as if nothing had happened.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import re
import signal
import time
import types
import warnings

MARKER = "NAMESPACE_ATTACK "
# conftest's GUARDED_SETTINGS: notebook.setup() sets them, an attack may change them
SETTINGS = ("jax_threefry_partitionable", "jax_enable_x64", "jax_default_matmul_precision",
            "jax_default_prng_impl")
_KERNEL_NAMES = re.compile(r"^(_+|_i+|_i?\d+|_[a-z]h|In|Out|exit|quit|get_ipython)$")


def attackable(value) -> bool:
    """Values, and the functions the notebook defines or imports from kda_lib's computing
    modules; third-party callables (plt, time, print, ...) and kda_lib.teaching's
    notebook-setup helpers are not answers."""
    if isinstance(value, types.ModuleType) or value is None:
        return False
    if not callable(value):
        return True
    module = getattr(value, "__module__", "") or ""
    return module == "__main__" or (
        module.startswith("kda_lib") and not module.startswith("kda_lib.teaching")
    )


@contextlib.contextmanager
def time_limit(seconds: int):
    """Stop a call after ``seconds`` (SIGALRM: the kernel runs this on its main thread)."""

    def stop(*_):
        raise TimeoutError("attack ran past its time limit")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)  # again each second: Python drops a
    try:  # stop raised in a finaliser or weakref callback
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(verdict, exercise_id, answer, context, seconds) -> bool:
    try:
        with time_limit(seconds):
            hint = verdict(exercise_id, answer, **context)
    except TimeoutError:
        return True
    except Exception:  # noqa: BLE001 - a checker that raises was not fooled
        return True
    return isinstance(hint, str) and bool(hint)


def attack(namespace: dict, checks: dict, prelude: str, seconds: int) -> dict:
    """``{"accepted": [[exercise id, name], ...], "tried": n, "slowest": [[seconds, exercise
    id, name], ...]}`` (the three slowest calls) for ``namespace``."""
    from kda_lib.teaching.exercises import verdict

    scratch = dict(namespace)
    exec(prelude, scratch)  # noqa: S102 - the notebook's own exercise-cell assignments
    contexts = {
        eid: {key: eval(expr, scratch) for key, expr in kwargs.items()}  # noqa: S307
        for eid, kwargs in checks.items()
    }
    attacks = []
    for name, value in list(namespace.items()):
        if name.startswith("__") or _KERNEL_NAMES.match(name) or not attackable(value):
            continue
        attacks.append((name, value))
        if callable(value):
            attacks.append((f"{name} (partial)", functools.partial(value)))
    accepted, tried, slowest = [], 0, []
    for eid, context in contexts.items():
        for label, answer in attacks:
            tried += 1
            start = time.perf_counter()
            if not refused(verdict, eid, answer, context, seconds):
                accepted.append([eid, label])
            slowest = sorted([*slowest, [round(time.perf_counter() - start, 2), eid, label]])[-3:]
    return {"accepted": accepted, "tried": tried, "slowest": slowest}


def main(namespace: dict, checks: dict, prelude: str, seconds: int) -> None:
    import jax
    import matplotlib.pyplot as plt
    import numpy as np

    saved = dict(namespace)
    settings = {name: getattr(jax.config, name) for name in SETTINGS}
    np_state, py_state = np.random.get_state(), random.getstate()
    figures = set(plt.get_fignums())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = attack(namespace, checks, prelude, seconds)
    finally:
        for name in set(namespace) - set(saved):
            del namespace[name]
        namespace.update(saved)
        for name, value in settings.items():
            jax.config.update(name, value)
        np.random.set_state(np_state)
        random.setstate(py_state)
        for number in set(plt.get_fignums()) - figures:
            plt.close(number)
    print(MARKER + json.dumps(report), flush=True)


if __name__ == "<run_path>":
    main(NOTEBOOK, CHECKS, PRELUDE, TIME_LIMIT_S)  # noqa: F821 - run_path's init_globals
