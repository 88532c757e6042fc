"""Run tokamax's TPU (Pallas Mosaic) KDA kernel without a TPU, in Pallas interpret mode.

``with kda_lib.emulate_tpu("v6e"): ...`` makes ``implementation="tokamax_mosaic"`` work on CPU
(``kda``, the layer, and tokamax's own context parallelism), to check the TPU code path, not for
speed (``jax.jit(f, compiler_options=FAST_COMPILE_OPTIONS)`` compiles the interpreted kernels
about twice as fast). ``implementation="auto"`` never picks the emulated kernel. On a real TPU
it does nothing; ``KDA_EMULATE_TPU=v6e`` (``1`` means v6e) turns it on for the whole process.

Four switches, all undone when the context exits (process-wide, not per thread):
``PALLAS_INTERPRET=1``, which tokamax's kernels read when traced (so trace, and take gradients,
inside the context); jax's TPU info registry answering for the host's device kind with the
emulated chip's limits; tokamax's Mosaic op built with ``bypass_device_check=True``
(:func:`emulated_mosaic_op`); and memory a kernel never writes read
as zeros instead of interpret mode's NaN (``uninitialized_memory="zero"``: tokamax's Mosaic
backward sums its gate-parameter gradients over chunk padding it never writes, times an exact
zero). The hooks are private jax/tokamax internals, listed in :data:`HOOKS` and tested with
:data:`TESTED_JAX` and :data:`TESTED_TOKAMAX`; a missing one raises
:class:`EmulationUnavailableError`. Why not jax's abstract-mesh route: docs/DESIGN.md.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from collections.abc import Iterator

TESTED_JAX = "0.12.0.1"
TESTED_TOKAMAX = "0.0.17"
ENV_VAR = "KDA_EMULATE_TPU"
INTERPRET_ENV_VAR = "PALLAS_INTERPRET"
DEFAULT_GENERATION = "v6e"
# ChipVersion values of jax 0.12 (jax._src.tpu_info.ChipVersion)
CHIP_VERSIONS = ("v2", "v3", "v4i", "v4", "v5e", "v5p", "v6e", "7", "7x", "8i", "8t")
# XLA:CPU options that compile the (large) interpreted kernels ~2x faster; the kernels are tiny
# at emulation sizes, so the slower code costs nothing. Pass to jax.jit(compiler_options=...).
FAST_COMPILE_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}

_stack: list[str] = []  # chip versions of the active emulate_tpu contexts, innermost last
_env_checked = False
_env_context = None


class EmulationUnavailableError(RuntimeError):
    """A private jax/tokamax hook that TPU emulation needs is missing (version mismatch)."""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def unavailable_error(what: str) -> EmulationUnavailableError:
    """The error for a hook emulation needs that this installation lacks (``what``), naming
    the tested and installed versions of jax and tokamax."""
    return EmulationUnavailableError(
        f"kda_lib.emulate_tpu needs {what}, which this installation lacks. It was tested with "
        f"jax {TESTED_JAX} and tokamax {TESTED_TOKAMAX}; installed: jax {_version('jax')}, "
        f"tokamax {_version('tokamax')}. Install the tested versions "
        f"(pip install jax=={TESTED_JAX} tokamax=={TESTED_TOKAMAX}) or run on a TPU."
    )


@functools.cache
def _warn_if_untested() -> None:
    found = (_version("jax"), _version("tokamax"))
    if found != (TESTED_JAX, TESTED_TOKAMAX):
        warnings.warn(
            f"kda_lib.emulate_tpu was tested with jax {TESTED_JAX} and tokamax "
            f"{TESTED_TOKAMAX}, found jax {found[0]} and tokamax {found[1]}; it relies on "
            "private hooks, check its results against implementation='chunked'",
            stacklevel=3,
        )


_TPU_INFO = lambda: importlib.import_module("jax._src.tpu_info")  # noqa: E731
_PRIMITIVES = lambda: importlib.import_module("jax._src.pallas.primitives")  # noqa: E731
_INTERPRETER = lambda: importlib.import_module("jax._src.pallas.hlo_interpreter")  # noqa: E731
_TK_UTILS = lambda: importlib.import_module("tokamax._src.ops.kda.utils")  # noqa: E731
_TK_MOSAIC = lambda: importlib.import_module("tokamax._src.ops.kda.pallas_mosaic_tpu")  # noqa: E731

# every private jax/tokamax name emulation uses: key -> (module loader, attribute, what for)
HOOKS = {
    "registry": (_TPU_INFO, "registry", "the TPU info registry"),
    "chip_version": (_TPU_INFO, "ChipVersion", "the TPU info registry"),
    "info_for_chip": (_TPU_INFO, "get_tpu_info_for_chip", "the TPU info registry"),
    "fill": (_PRIMITIVES, "uninitialized_value", "interpret mode's fill value"),
    "interpreter": (_INTERPRETER, "primitives", "interpret mode's fill value"),
    "interpret_switch": (_TK_UTILS, "get_interpret", "tokamax's PALLAS_INTERPRET switch"),
    "mosaic_op": (
        _TK_MOSAIC,
        "PallasMosaicTpuKimiDeltaAttention",
        "tokamax's Mosaic op with bypass_device_check=True",
    ),
}


def hook(key: str):
    """The module holding ``HOOKS[key]``'s attribute, after checking the attribute is there
    (:class:`EmulationUnavailableError` if not; tokamax missing: ModuleNotFoundError)."""
    load, attribute, what = HOOKS[key]
    if load in (_TK_UTILS, _TK_MOSAIC) and importlib.util.find_spec("tokamax") is None:
        raise ModuleNotFoundError(
            "kda_lib.emulate_tpu (tokamax's TPU kernel in interpret mode) needs tokamax, which "
            "is not installed: pip install 'kda-lib[tokamax]'",
            name="tokamax",
        )
    try:
        module = load()
    except ImportError as e:
        raise unavailable_error(f"{e.name} ({what})") from e
    if not hasattr(module, attribute):
        raise unavailable_error(f"{module.__name__}.{attribute} ({what})")
    return module


def _check_hooks():
    """Every hook present and of the expected kind, before anything is switched on."""
    for key in HOOKS:
        hook(key)
    tpu_info, primitives = hook("registry"), hook("fill")
    op = hook("mosaic_op").PallasMosaicTpuKimiDeltaAttention
    if not isinstance(tpu_info.registry, dict):
        raise unavailable_error("jax._src.tpu_info.registry as a dict (the TPU info registry)")
    if hook("interpreter").primitives is not primitives:
        raise unavailable_error("jax._src.pallas.hlo_interpreter reading primitives' fill value")
    if "bypass_device_check" not in getattr(op, "__dataclass_fields__", {}):
        raise unavailable_error("PallasMosaicTpuKimiDeltaAttention(bypass_device_check=True)")
    return tpu_info, primitives


def _zero_fill(original):
    import jax.numpy as jnp

    def uninitialized_value(shape, dtype):
        if jnp.issubdtype(dtype, jnp.floating):
            return jnp.zeros(shape, dtype)
        return original(shape, dtype)

    uninitialized_value.kda_lib_zero_fill = True
    uninitialized_value.__wrapped_original__ = original
    return uninitialized_value


def _chip(generation: str) -> str:
    name = str(generation).strip().lower()
    name = name.removeprefix("tpu").strip()
    if name not in CHIP_VERSIONS:
        raise ValueError(
            f"emulate_tpu: unknown TPU generation {generation!r}; use one of {CHIP_VERSIONS} "
            f"(tokamax's Mosaic KDA needs v6e or newer)"
        )
    return name


def _host_device():
    import jax

    return jax.devices()[0]


def _clear_tpu_info_cache(get_tpu_info) -> None:
    getattr(get_tpu_info, "cache_clear", lambda: None)()


@functools.cache
def emulated_mosaic_op():
    """tokamax's Mosaic KDA op with its TPU device check bypassed, called with the keyword
    arguments of tokamax's ``kimi_delta_attention`` minus ``implementation``."""
    _check_hooks()
    return hook("mosaic_op").PallasMosaicTpuKimiDeltaAttention(bypass_device_check=True)


@contextlib.contextmanager
def _emulating(chip: str, uninitialized_memory: str) -> Iterator[None]:
    tpu_info, primitives = _check_hooks()
    registry, get_tpu_info = tpu_info.registry, getattr(tpu_info, "get_tpu_info", None)
    _warn_if_untested()
    kind = _host_device().device_kind
    version, info_for_chip = tpu_info.ChipVersion(chip), tpu_info.get_tpu_info_for_chip
    saved_env = os.environ.get(INTERPRET_ENV_VAR)
    saved_entry = registry.get(kind)
    saved_fill = primitives.uninitialized_value
    os.environ[INTERPRET_ENV_VAR] = "1"
    registry[kind] = lambda: info_for_chip(version, 1)
    if uninitialized_memory == "zero" and not hasattr(saved_fill, "kda_lib_zero_fill"):
        primitives.uninitialized_value = _zero_fill(saved_fill)
    elif uninitialized_memory == "nan" and hasattr(saved_fill, "kda_lib_zero_fill"):
        primitives.uninitialized_value = saved_fill.__wrapped_original__
    _clear_tpu_info_cache(get_tpu_info)
    _stack.append(chip)
    try:
        yield
    finally:
        _stack.pop()
        primitives.uninitialized_value = saved_fill
        if saved_env is None:
            os.environ.pop(INTERPRET_ENV_VAR, None)
        else:
            os.environ[INTERPRET_ENV_VAR] = saved_env
        if saved_entry is None:
            registry.pop(kind, None)
        else:
            registry[kind] = saved_entry
        _clear_tpu_info_cache(get_tpu_info)


@contextlib.contextmanager
def emulate_tpu(
    generation: str = DEFAULT_GENERATION, *, uninitialized_memory: str = "zero"
) -> Iterator[str | None]:
    """Within the block, ``implementation="tokamax_mosaic"`` runs on CPU in interpret mode.

    Args:
      generation: the TPU chip to emulate, one of :data:`CHIP_VERSIONS` (default ``"v6e"``;
        tokamax's Mosaic KDA needs v6e or newer). Its hardware limits (VMEM, lanes) shape the
        kernel's blocking exactly as on that chip.
      uninitialized_memory: what a kernel reads from memory it never wrote, ``"zero"``
        (default) or ``"nan"`` (jax's interpret-mode default; see the module docstring for
        why tokamax's gate-parameter gradients need ``"zero"``).

    Yields:
      The emulated chip version, or None on a real TPU (where the block runs unchanged).

    Raises:
      EmulationUnavailableError: a private jax/tokamax hook is missing (the message names the
        tested versions, :data:`TESTED_JAX` and :data:`TESTED_TOKAMAX`).
    """
    chip = _chip(generation)
    if uninitialized_memory not in ("zero", "nan"):
        raise ValueError(
            f"emulate_tpu: uninitialized_memory must be 'zero' or 'nan', "
            f"got {uninitialized_memory!r}"
        )
    if _host_device().platform == "tpu":
        yield None
        return
    with _emulating(chip, uninitialized_memory):
        yield chip


def _activate_from_environment() -> None:
    """Turn emulation on for the rest of the process if ``KDA_EMULATE_TPU`` asks for it."""
    global _env_checked
    if _env_checked:
        return
    _env_checked = True
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    chip = DEFAULT_GENERATION if value in ("1", "true", "yes", "on") else value
    try:
        chip = _chip(chip)
    except ValueError as e:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: {e}") from None
    if _host_device().platform == "tpu":
        return
    global _env_context
    _env_context = _emulating(chip, "zero")
    _env_context.__enter__()  # exited by reset_environment_activation
    # and at exit, while the interpreter is whole: left suspended, the generator would be
    # closed during shutdown, after module globals are gone (an ignored AttributeError
    # traceback on stderr in every process)
    atexit.register(reset_environment_activation)


def reset_environment_activation() -> None:
    """Undo a ``KDA_EMULATE_TPU`` activation, and read the variable again at the next
    emulation query: for a process that changes the variable after the first query (the tests
    do; otherwise it is read once per process)."""
    global _env_checked, _env_context
    if _env_context is not None:
        _env_context.__exit__(None, None, None)
    _env_context = None
    _env_checked = False


def emulated_chip() -> str | None:
    """The TPU chip being emulated (e.g. ``"v6e"``), or None (no emulation, or a real TPU)."""
    _activate_from_environment()
    return _stack[-1] if _stack else None


def emulated_tpu_generation() -> int | None:
    """The emulated TPU generation (e.g. 6 for v6e), or None when not emulating."""
    chip = emulated_chip()
    return None if chip is None else int("".join(c for c in chip if c.isdigit()))


def is_emulating() -> bool:
    """True inside :func:`emulate_tpu` (or with ``KDA_EMULATE_TPU`` set) off TPU."""
    return emulated_chip() is not None
