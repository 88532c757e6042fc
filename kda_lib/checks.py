"""Argument checks every folder of kda_lib uses: each raises ``ValueError`` naming the argument
and what was expected, before any work."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

MAX_SEED = 2**63 - 1  # jax.random.key takes a signed 64-bit int
MAX_LAYERS = 1_024  # 8x the deepest published LM (126): past it refused, not built (a layer takes
# 0.05-0.08 s to build, so 1,024 take about a minute; 100,000 took hours)


def shared_fields(source, config_class) -> dict:
    """The fields of the dataclass instance ``source`` that ``config_class`` also has."""
    names = {field.name for field in dataclasses.fields(config_class)}
    return {f.name: getattr(source, f.name) for f in dataclasses.fields(source) if f.name in names}


def is_concrete(x) -> bool:
    """Are ``x``'s values readable here (not None, a tracer or an array over processes)?"""
    if x is None or isinstance(x, jax.core.Tracer):
        return False
    return getattr(x, "is_fully_addressable", True)


def is_int(value, minimum: int | None = 1) -> bool:
    """Is ``value`` an int (numpy ints count, bools do not) ``>= minimum`` (None: any)?"""
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    return integer and (minimum is None or value >= minimum)


def check_int(name: str, value, minimum: int = 1, *, optional: bool = False,
              expected: str | None = None) -> int | None:  # fmt: skip
    """``value`` as an int if :func:`is_int` (None when ``optional``), else a ValueError."""
    if optional and value is None:
        return None
    if not is_int(value, minimum):
        if expected is None:
            expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            expected = f"None or {expected}" if optional else expected
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """:func:`check_int` saying "must be an int >= <minimum>"."""
    return check_int(name, value, minimum, expected=f"an int >= {minimum}")


def check_seed(name: str, value) -> int:
    """A seed for ``jax.random.key``: an int in [0, 2^63 - 1]."""
    if check_positive_int(name, value, minimum=0) > MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, 2**63 - 1], got {value!r}")
    return int(value)


def check_flag(name: str, value) -> bool:
    """``value`` as a Python bool (numpy bools count; ints and arrays, maybe traced, do not)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def is_number(value) -> bool:
    """Is ``value`` a real number (Python or numpy int or float; bools do not count)?"""
    return is_int(value, None) or isinstance(value, (float, np.floating))


def check_number(name: str, value, *, minimum: float | None = None, positive=False) -> float:
    """``value`` as a float, if a finite :func:`is_number` ``>= minimum`` (``positive``: > 0)."""
    requirement = "a finite number" + (" > 0" if positive else "")
    requirement += "" if minimum is None else f" >= {minimum:g}"
    ok = is_number(value) and np.isfinite(value) and (value > 0 or not positive)
    if not (ok and (minimum is None or value >= minimum)):
        raise ValueError(f"{name} must be {requirement}, got {value!r}")
    return float(value)


def check_float_dtype(name: str, value) -> np.dtype:
    """``value`` as a floating-point dtype (``jnp.float32``, ``"bfloat16"``, ...)."""
    try:
        dtype = None if value is None else jnp.dtype(value)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point dtype, got {value!r}")
    return dtype


def host_values(x, dtype=None) -> np.ndarray:
    """``x``'s values on the host: every input check's read (tests count them here)."""
    return np.asarray(x, dtype)


def check_token_ids(name: str, ids, vocab_size: int) -> None:
    """Integer token ids in ``[0, vocab_size)`` (values checked when concrete)."""
    dtype = getattr(ids, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {dtype}")
    if is_concrete(ids) and np.size(ids):
        values = host_values(ids)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} token ids must lie in [0, {vocab_size}) (vocab_size), "
                             f"got ids in [{low}, {high}]")  # fmt: skip


def check_array(name: str, x, *, floating: bool = False) -> None:
    """``x`` must be a jax or numpy array (not a list or scalar), floating with ``floating``."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        hint = " (wrap it in jnp.asarray)" if isinstance(x, (list, tuple)) else ""
        raise ValueError(f"{name} must be a jax or numpy array, got {type(x).__name__}{hint}")
    if floating and not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")


# ------------------------------------------------------------------ sizes against memory
def memory_limit() -> int | None:
    """The first local device's memory in bytes, else this machine's, or None (unknown)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # e.g. Windows has no sysconf
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in binary units: ``"4.0 TiB"``, ``"512 B"``."""
    value, unit = float(nbytes), 0
    while value >= 1024 and unit < 8:
        value, unit = value / 1024, unit + 1
    name = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")[unit]
    return f"{int(value)} B" if not unit else f"{value:.{1 if value < 100 else 0}f} {name}"


def allocation_problem(what: str, nbytes: int, *, limit: int | None = None) -> str | None:
    """Why ``nbytes`` for ``what`` exceed ``limit`` (default :func:`memory_limit`), or None."""
    limit = memory_limit() if limit is None else limit
    if limit is None or nbytes <= limit:
        return None
    return (f"{what} would take ~{format_bytes(nbytes)} (more than this machine's memory, "
            f"{format_bytes(limit)})")  # fmt: skip


def dominant_size(sizes: dict, nbytes) -> str:
    """The key of ``sizes`` (ints) behind most of ``nbytes(sizes)``: the one whose value set to 1
    leaves the fewest bytes (a size that cannot be 1, ``nbytes`` raising, is passed over). What
    a memory refusal names, not the largest number."""

    def without(name):
        try:
            return nbytes({**sizes, name: 1})
        except (ValueError, TypeError):
            return float("inf")

    return min(sizes, key=without)


def check_allocation(name: str, value, what: str, nbytes: int, *, limit=None) -> None:
    """``ValueError("<name>=<value>: <allocation_problem>")`` before anything is allocated."""
    if problem := allocation_problem(what, nbytes, limit=limit):
        raise ValueError(f"{name}={value if isinstance(value, str) else repr(value)}: {problem}")


def check_activation(name: str, x, hidden_size: int) -> None:
    """``x`` a floating ``[B, T, hidden_size]`` array with B, T >= 1 (a mixer's input)."""
    check_array(name, x, floating=True)
    if x.ndim != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"{name} must have shape [B, T, hidden_size={hidden_size}], got {x.shape}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        empty = " and ".join(n for n, d in (("B", x.shape[0]), ("T", x.shape[1])) if d < 1)
        raise ValueError(f"{name} [B, T, hidden] is empty: {empty} = 0 (shape {x.shape}); the "
                         "layer needs at least one row and one token")  # fmt: skip
