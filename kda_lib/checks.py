"""Argument checks every folder of kda_lib uses: ints, seeds, numbers, token ids, arrays, and
sizes against the machine's memory; and :func:`shared_fields`, how one config is built from
another by field name.

Each check raises ``ValueError`` naming the argument and what was expected, before any work is
done.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np


def shared_fields(source, config_class) -> dict:
    """The fields of the dataclass instance ``source`` that ``config_class`` also has, by name:
    how a config is built from another without copying its fields one by one (the layer
    configs name a width alike, e.g. ``head_dim`` and ``value_head_dim`` in every mixer's)."""
    names = {field.name for field in dataclasses.fields(config_class)}
    return {
        field.name: getattr(source, field.name)
        for field in dataclasses.fields(source)
        if field.name in names
    }


def is_concrete(x) -> bool:
    """Are ``x``'s values readable here? Not under ``jit`` (a tracer), and not for an array
    spread over several processes (multi-host): value checks then skip, as under jit."""
    if x is None or isinstance(x, jax.core.Tracer):
        return False
    return getattr(x, "is_fully_addressable", True)


MAX_SEED = 2**63 - 1  # jax.random.key takes a signed 64-bit int


def is_int(value, minimum: int | None = 1) -> bool:
    """Is ``value`` an int (numpy ints count; bools, numpy bools and floats such as 2.0 do not)
    that is ``>= minimum`` (any int with ``minimum=None``)? The one test behind every integer
    check of the package (:func:`check_int`, :func:`check_positive_int`)."""
    return (
        not isinstance(value, (bool, np.bool_))
        and isinstance(value, (int, np.integer))
        and (minimum is None or value >= minimum)
    )


def check_int(
    name: str, value, minimum: int = 1, *, optional: bool = False, expected: str | None = None
) -> int | None:
    """``value`` as a Python int if :func:`is_int` (``value >= minimum``), None for None when
    ``optional``; otherwise ``ValueError("<name> must be <expected>, got <value>")``, where
    ``expected`` defaults to "a positive int" (minimum 1) or "an int >= <minimum>", after
    "None or " when ``optional``."""
    if optional and value is None:
        return None
    if not is_int(value, minimum):
        if expected is None:
            expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            expected = f"None or {expected}" if optional else expected
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int, if it is an int (numpy ints count) >= ``minimum``; a bool, a float
    (even 2.0) or anything else is a ValueError naming ``name`` ("must be an int >= 1")."""
    return check_int(name, value, minimum, expected=f"an int >= {minimum}")


def check_option_minimums(parser, args, minimums: dict[str, int]) -> None:
    """The command lines' integer options against their smallest values: argparse's error
    (exit status 2) naming the first option below its minimum. An option that is None (not
    given) or not in ``args`` (not this parser's) passes."""
    for name, minimum in minimums.items():
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def check_seed(name: str, value) -> int:
    """A seed for ``jax.random.key``: an int in [0, 2^63 - 1]."""
    value = check_positive_int(name, value, minimum=0)
    if value > MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, 2**63 - 1], got {value!r}")
    return value


def is_number(value) -> bool:
    """Is ``value`` a real number (Python or numpy int or float; bools do not count)?"""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def check_number(name: str, value, *, minimum: float | None = None, positive=False) -> float:
    """``value`` as a float, if it is a finite real number (numpy scalars count, bools do not)
    that is ``>= minimum`` (or ``> 0`` with ``positive``)."""
    requirement = "a finite number" + (" > 0" if positive else "")
    requirement += "" if minimum is None else f" >= {minimum:g}"
    if (
        not is_number(value)
        or not np.isfinite(value)
        or (positive and not value > 0)
        or (minimum is not None and not value >= minimum)
    ):
        raise ValueError(f"{name} must be {requirement}, got {value!r}")
    return float(value)


def check_token_ids(name: str, ids, vocab_size: int) -> None:
    """Integer token ids in ``[0, vocab_size)`` (values checked when concrete, i.e. not under
    ``jit``): an id outside gives NaN or silently another token's embedding."""
    dtype = getattr(ids, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {dtype}")
    if is_concrete(ids) and np.size(ids):
        low, high = int(np.min(ids)), int(np.max(ids))
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} token ids must lie in [0, {vocab_size}) (vocab_size), "
                f"got ids in [{low}, {high}]"
            )


def check_array(name: str, x) -> None:
    """``x`` must be an array (jax or numpy), not a Python list, tuple or scalar."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(
            f"{name} must be a jax or numpy array, got {type(x).__name__}"
            + (" (wrap it in jnp.asarray)" if isinstance(x, (list, tuple)) else "")
        )


# ------------------------------------------------------------------ sizes against memory


def memory_limit() -> int | None:
    """This process's first device's memory in bytes where JAX reports it (``memory_stats()``'s
    ``bytes_limit``: GPU, TPU), else this machine's physical memory (``os.sysconf``), or None
    where neither is known (the size checks then pass). Read at the call: an allocation above
    it cannot succeed here, whatever else is running."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # e.g. Windows has no sysconf
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in binary units with two significant places: ``"4.0 TiB"``, ``"512 B"``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    value, unit = float(nbytes), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{value:.1f} {units[unit]}" if value < 100 else f"{value:.0f} {units[unit]}"


def allocation_problem(what: str, nbytes: int, *, limit: int | None = None) -> str | None:
    """``"<what> would take ~X (more than this machine's memory, Y)"`` when ``nbytes`` (an
    estimate made before allocating) exceeds ``limit`` (default :func:`memory_limit`), else
    None."""
    limit = memory_limit() if limit is None else limit
    if limit is None or nbytes <= limit:
        return None
    return (
        f"{what} would take ~{format_bytes(nbytes)} (more than this machine's memory, "
        f"{format_bytes(limit)})"
    )


def check_allocation(name: str, value, what: str, nbytes: int, *, limit=None) -> None:
    """Refuse a size before anything is allocated: ``ValueError("<name>=<value>: <what> would
    take ~X (more than this machine's memory, Y)")`` when the estimate ``nbytes`` exceeds
    ``limit`` (default :func:`memory_limit`); otherwise nothing. ``name``: the argument to
    blame, ``value`` its value (shown with ``!r``, or as it is when a str)."""
    problem = allocation_problem(what, nbytes, limit=limit)
    if problem:
        shown = value if isinstance(value, str) else repr(value)
        raise ValueError(f"{name}={shown}: {problem}")
