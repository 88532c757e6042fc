"""Run tokamax's TPU (Pallas Mosaic) KDA kernel without a TPU, in Pallas interpret mode.

``with kda_lib.emulate_tpu("v6e"): ...`` makes ``implementation="tokamax_mosaic"`` work on CPU
(``kda``, the layer, tokamax's own context parallelism) to check the TPU code path, not for
speed; ``"auto"`` never picks the emulated kernel. On a real TPU it does nothing.
``KDA_EMULATE_TPU=v6e`` (``1``: v6e) turns it on for the whole process.

Four process-wide switches, undone when the context exits: ``PALLAS_INTERPRET=1`` (read when
tokamax's kernels are traced: trace and differentiate inside the context); jax's TPU info
registry answering for the host's device kind with the emulated chip; tokamax's Mosaic op built
with ``bypass_device_check=True``; memory a kernel never writes read as zeros, not NaN
(tokamax's Mosaic backward sums gate gradients over chunk padding it never writes, times zero).
The private jax/tokamax names it uses are :data:`HOOKS`, all checked before anything is switched
on (:class:`EmulationUnavailableError` names the tested versions). docs/DESIGN.md section 4.
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
DEFAULT_GENERATION = "v6e"
CHIP_VERSIONS = ("v2", "v3", "v4i", "v4", "v5e", "v5p", "v6e", "7", "7x", "8i", "8t")  # jax 0.12
# XLA:CPU options that compile the (large) interpreted kernels ~2x faster: jax.jit(f,
# compiler_options=FAST_COMPILE_OPTIONS)
FAST_COMPILE_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}
_TPU_INFO = "jax._src.tpu_info"
HOOKS = {  # key -> (module, attribute, what for): every private name emulation uses
    "registry": (_TPU_INFO, "registry", "the TPU info registry"),
    "chip_version": (_TPU_INFO, "ChipVersion", "the TPU info registry"),
    "info_for_chip": (_TPU_INFO, "get_tpu_info_for_chip", "the TPU info registry"),
    "fill": ("jax._src.pallas.primitives", "uninitialized_value", "interpret mode's fill value"),
    "interpreter": ("jax._src.pallas.hlo_interpreter", "primitives", "interpret mode's fill value"),
    "interpret_switch": (
        "tokamax._src.ops.kda.utils", "get_interpret", "tokamax's PALLAS_INTERPRET switch"
    ),
    "mosaic_op": (
        "tokamax._src.ops.kda.pallas_mosaic_tpu", "PallasMosaicTpuKimiDeltaAttention",
        "tokamax's Mosaic op with bypass_device_check=True",
    ),
}  # fmt: skip

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


def _unavailable(what: str) -> EmulationUnavailableError:
    return EmulationUnavailableError(
        f"kda_lib.emulate_tpu needs {what}, which this installation lacks. It was tested with "
        f"jax {TESTED_JAX} and tokamax {TESTED_TOKAMAX}; installed: jax {_version('jax')}, "
        f"tokamax {_version('tokamax')}. Install the tested versions "
        f"(pip install jax=={TESTED_JAX} tokamax=={TESTED_TOKAMAX}) or run on a TPU."
    )


def _hooks() -> dict:
    """``{key: module}`` for every :data:`HOOKS` entry, each checked to be there and of the
    expected kind (EmulationUnavailableError; tokamax missing: ModuleNotFoundError)."""
    if importlib.util.find_spec("tokamax") is None:
        raise ModuleNotFoundError(
            "kda_lib.emulate_tpu (tokamax's TPU kernel in interpret mode) needs tokamax, which "
            "is not installed: pip install 'kda-lib[tokamax]'", name="tokamax",
        )  # fmt: skip
    found = {}
    for key, (name, attribute, what) in HOOKS.items():
        try:
            found[key] = importlib.import_module(name)
        except ImportError as e:
            raise _unavailable(f"{e.name} ({what})") from e
        if not hasattr(found[key], attribute):
            raise _unavailable(f"{name}.{attribute} ({what})")
    if not isinstance(found["registry"].registry, dict):
        raise _unavailable(f"{_TPU_INFO}.registry as a dict (the TPU info registry)")
    if found["interpreter"].primitives is not found["fill"]:
        raise _unavailable("jax._src.pallas.hlo_interpreter reading primitives' fill value")
    op = found["mosaic_op"].PallasMosaicTpuKimiDeltaAttention
    if "bypass_device_check" not in getattr(op, "__dataclass_fields__", {}):
        raise _unavailable("PallasMosaicTpuKimiDeltaAttention(bypass_device_check=True)")
    return found


@functools.cache
def emulated_mosaic_op():
    """tokamax's Mosaic KDA op with its TPU device check bypassed (called with
    ``kimi_delta_attention``'s keywords minus ``implementation``)."""
    op = _hooks()["mosaic_op"].PallasMosaicTpuKimiDeltaAttention
    return op(bypass_device_check=True)


def _zero_fill(original):
    import jax.numpy as jnp

    def uninitialized_value(shape, dtype):
        if jnp.issubdtype(dtype, jnp.floating):
            return jnp.zeros(shape, dtype)
        return original(shape, dtype)

    uninitialized_value.kda_lib_original = original
    return uninitialized_value


def _chip(generation: str) -> str:
    name = str(generation).strip().lower().removeprefix("tpu").strip()
    if name not in CHIP_VERSIONS:
        raise ValueError(
            f"emulate_tpu: unknown TPU generation {generation!r}; use one of {CHIP_VERSIONS} "
            f"(tokamax's Mosaic KDA needs v6e or newer)"
        )
    return name


def _on_tpu() -> bool:
    import jax

    return jax.devices()[0].platform == "tpu"


@contextlib.contextmanager
def _emulating(chip: str, uninitialized_memory: str) -> Iterator[None]:
    import jax

    hooks = _hooks()
    tpu_info, primitives = hooks["registry"], hooks["fill"]
    if (_version("jax"), _version("tokamax")) != (TESTED_JAX, TESTED_TOKAMAX):
        warnings.warn(f"kda_lib.emulate_tpu was tested with jax {TESTED_JAX} and tokamax "
                      f"{TESTED_TOKAMAX}; it relies on private hooks, check its results against "
                      "implementation='chunked'", stacklevel=4)  # fmt: skip
    registry, kind = tpu_info.registry, jax.devices()[0].device_kind
    clear = getattr(getattr(tpu_info, "get_tpu_info", None), "cache_clear", lambda: None)
    saved = (os.environ.get("PALLAS_INTERPRET"), registry.get(kind), primitives.uninitialized_value)
    original = getattr(saved[2], "kda_lib_original", saved[2])
    version = tpu_info.ChipVersion(chip)
    os.environ["PALLAS_INTERPRET"] = "1"
    registry[kind] = lambda: tpu_info.get_tpu_info_for_chip(version, 1)
    primitives.uninitialized_value = (
        _zero_fill(original) if uninitialized_memory == "zero" else original
    )
    clear()
    _stack.append(chip)
    try:
        yield
    finally:
        _stack.pop()
        primitives.uninitialized_value = saved[2]
        for mapping, key, value in ((os.environ, "PALLAS_INTERPRET", saved[0]),
                                    (registry, kind, saved[1])):  # fmt: skip
            if value is None:
                mapping.pop(key, None)
            else:
                mapping[key] = value
        clear()


@contextlib.contextmanager
def emulate_tpu(
    generation: str = DEFAULT_GENERATION, *, uninitialized_memory: str = "zero"
) -> Iterator[str | None]:
    """Within the block, ``implementation="tokamax_mosaic"`` runs on CPU in interpret mode.

    Args:
      generation: the TPU chip to emulate, one of :data:`CHIP_VERSIONS` (default ``"v6e"``);
        its limits (VMEM, lanes) shape the kernel's blocking as on that chip.
      uninitialized_memory: what a kernel reads from memory it never wrote, ``"zero"``
        (default) or ``"nan"`` (jax's interpret-mode default).

    Yields the emulated chip, or None on a real TPU (where the block runs unchanged). Raises
    EmulationUnavailableError where a private jax/tokamax hook is missing.
    """
    chip = _chip(generation)
    if uninitialized_memory not in ("zero", "nan"):
        raise ValueError(f"emulate_tpu: uninitialized_memory must be 'zero' or 'nan', "
                         f"got {uninitialized_memory!r}")  # fmt: skip
    if _on_tpu():
        yield None
        return
    with _emulating(chip, uninitialized_memory):
        yield chip


def _activate_from_environment() -> None:
    """Turn emulation on for the rest of the process if ``KDA_EMULATE_TPU`` asks for it."""
    global _env_checked, _env_context
    if _env_checked:
        return
    _env_checked = True
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    try:
        chip = _chip(DEFAULT_GENERATION if value in ("1", "true", "yes", "on") else value)
    except ValueError as e:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: {e}") from None
    if _on_tpu():
        return
    _env_context = _emulating(chip, "zero")
    _env_context.__enter__()
    # exited at exit while the interpreter is whole (a generator closed during shutdown
    # prints an ignored AttributeError traceback)
    atexit.register(reset_environment_activation)


def reset_environment_activation() -> None:
    """Undo a ``KDA_EMULATE_TPU`` activation; the variable is read again at the next query."""
    global _env_checked, _env_context
    if _env_context is not None:
        _env_context.__exit__(None, None, None)
    _env_context, _env_checked = None, False


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
