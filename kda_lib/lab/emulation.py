"""tokamax's TPU (Pallas Mosaic) KDA kernel without a TPU, in Pallas interpret mode: within
``emulate_tpu("v6e")``, or with ``KDA_EMULATE_TPU=v6e`` (``1``: v6e) for the process. Switched
on, and undone on exit: ``PALLAS_INTERPRET=1``, jax's TPU info for the host's device kind, and
memory a kernel never writes read as zeros, through the private names in :data:`HOOKS`; the
tokamax adapter sees the emulated TPU through its seam ``adapter.emulated_tpu``."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import os
import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from kda_lib.ops.tokamax import adapter

TESTED_JAX, TESTED_TOKAMAX = "0.12.0.1", "0.0.17"
ENV_VAR, DEFAULT_GENERATION = "KDA_EMULATE_TPU", "v6e"
CHIP_VERSIONS = ("v2", "v3", "v4i", "v4", "v5e", "v5p", "v6e", "7", "7x", "8i", "8t")  # jax 0.12
# jax.jit(compiler_options=...) for XLA:CPU that compile the interpreted kernels ~2x faster
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0,
                        "xla_llvm_disable_expensive_passes": True}  # fmt: skip
_TPU_INFO = "jax._src.tpu_info"
HOOKS = {  # key -> (module, attribute, what for): every private name emulation uses
    "registry": (_TPU_INFO, "registry", "the TPU info registry"),
    "chip_version": (_TPU_INFO, "ChipVersion", "the TPU info registry"),
    "info_for_chip": (_TPU_INFO, "get_tpu_info_for_chip", "the TPU info registry"),
    "fill": ("jax._src.pallas.primitives", "uninitialized_value", "interpret mode's fill value"),
    "interpret_switch": ("tokamax._src.ops.kda.utils", "get_interpret",
                         "tokamax's PALLAS_INTERPRET switch"),
    "mosaic_op": ("tokamax._src.ops.kda.pallas_mosaic_tpu", "PallasMosaicTpuKimiDeltaAttention",
                  "tokamax's Mosaic op with bypass_device_check=True"),
}  # fmt: skip

_stack: list[str] = []  # chip versions of the active emulate_tpu contexts, innermost last
_env = {"checked": False, "context": None}  # the KDA_EMULATE_TPU activation


class EmulationUnavailableError(RuntimeError):
    """A private jax/tokamax hook that TPU emulation needs is missing (version mismatch)."""


def _versions() -> tuple[str, str]:
    return tuple(importlib.metadata.version(dist) for dist in ("jax", "tokamax"))


def _hooks() -> dict:
    """``{key: module}`` for :data:`HOOKS`, each checked (else EmulationUnavailableError)."""
    adapter.require_tokamax("kda_lib.emulate_tpu (tokamax's TPU kernel in interpret mode)")
    found = {}
    for key, (name, attribute, what) in HOOKS.items():
        try:
            found[key] = importlib.import_module(name)
            getattr(found[key], attribute)
        except (ImportError, AttributeError) as e:
            installed = "jax {}, tokamax {}".format(*_versions())
            raise EmulationUnavailableError(
                f"kda_lib.emulate_tpu needs {name}.{attribute} ({what}), which this installation "
                f"lacks. It was tested with jax {TESTED_JAX} and tokamax {TESTED_TOKAMAX}; "
                f"installed: {installed}. Install the tested versions (pip install "
                f"jax=={TESTED_JAX} tokamax=={TESTED_TOKAMAX}) or run on a TPU."
            ) from e
    return found


@functools.cache
def emulated_mosaic_op():
    """tokamax's Mosaic KDA op with its TPU device check bypassed."""
    return _hooks()["mosaic_op"].PallasMosaicTpuKimiDeltaAttention(bypass_device_check=True)


def _chip(generation: str) -> str:
    name = str(generation).strip().lower().removeprefix("tpu").strip()
    if name not in CHIP_VERSIONS:
        raise ValueError(f"emulate_tpu: unknown TPU generation {generation!r}; use one of "
                         f"{CHIP_VERSIONS} (tokamax's Mosaic KDA needs v6e or newer)")
    return name


@contextlib.contextmanager
def _emulating(chip: str, uninitialized_memory: str) -> Iterator[None]:
    hooks = _hooks()
    tpu_info, primitives = hooks["registry"], hooks["fill"]
    if _versions() != (TESTED_JAX, TESTED_TOKAMAX):
        warnings.warn(f"kda_lib.emulate_tpu was tested with jax {TESTED_JAX} and tokamax "
                      f"{TESTED_TOKAMAX}; it relies on private hooks, check its results against "
                      "implementation='chunked'", stacklevel=4)  # fmt: skip
    registry, kind = tpu_info.registry, jax.devices()[0].device_kind
    clear = getattr(getattr(tpu_info, "get_tpu_info", None), "cache_clear", lambda: None)
    saved = [(os.environ, "PALLAS_INTERPRET", os.environ.get("PALLAS_INTERPRET")),
             (registry, kind, registry.get(kind))]  # fmt: skip
    fill = primitives.uninitialized_value
    original = getattr(fill, "kda_lib_original", fill)
    version = tpu_info.ChipVersion(chip)
    os.environ["PALLAS_INTERPRET"] = "1"
    registry[kind] = lambda: tpu_info.get_tpu_info_for_chip(version, 1)

    def zero_fill(shape, dtype):  # tokamax's Mosaic backward sums gate gradients over chunk
        if jnp.issubdtype(dtype, jnp.floating):  # padding it never writes, times zero
            return jnp.zeros(shape, dtype)
        return original(shape, dtype)

    zero_fill.kda_lib_original = original
    primitives.uninitialized_value = zero_fill if uninitialized_memory == "zero" else original
    clear()
    _stack.append(chip)
    try:
        yield
    finally:
        _stack.pop()
        primitives.uninitialized_value = fill
        for mapping, key, value in saved:
            if value is None:
                mapping.pop(key, None)
            else:
                mapping[key] = value
        clear()


@contextlib.contextmanager
def emulate_tpu(
    generation: str = DEFAULT_GENERATION, *, uninitialized_memory: str = "zero"
) -> Iterator[str | None]:
    """Within the block, ``implementation="tokamax_mosaic"`` runs on CPU in interpret mode as
    on ``generation`` (one of :data:`CHIP_VERSIONS`; its VMEM and lanes shape the blocking);
    memory a kernel never wrote reads as ``uninitialized_memory``: ``"zero"`` or ``"nan"``
    (jax's default). Yields the chip, or None on a real TPU (the block runs unchanged); raises
    EmulationUnavailableError where a private jax/tokamax hook is missing."""
    chip = _chip(generation)
    if uninitialized_memory not in ("zero", "nan"):
        raise ValueError(f"emulate_tpu: uninitialized_memory must be 'zero' or 'nan', "
                         f"got {uninitialized_memory!r}")  # fmt: skip
    if jax.devices()[0].platform == "tpu":
        yield None
        return
    with _emulating(chip, uninitialized_memory):
        yield chip


def reset_environment_activation() -> None:
    """Undo a ``KDA_EMULATE_TPU`` activation (the variable is read again)."""
    if _env["context"] is not None:
        _env["context"].__exit__(None, None, None)
    _env.update(checked=False, context=None)


def emulated_chip() -> str | None:
    """The TPU chip being emulated (``"v6e"``, ...) or None; the first query applies
    ``KDA_EMULATE_TPU``."""
    if not _env["checked"]:
        _env["checked"] = True
        value = os.environ.get(ENV_VAR, "").strip().lower()
        if value not in ("", "0", "false", "no", "off"):
            try:
                chip = _chip(DEFAULT_GENERATION if value in ("1", "true", "yes", "on") else value)
            except ValueError as e:
                raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: {e}") from None
            if jax.devices()[0].platform != "tpu":
                _env["context"] = _emulating(chip, "zero")
                _env["context"].__enter__()  # and exited before shutdown closes generators
                atexit.register(reset_environment_activation)
    return _stack[-1] if _stack else None


def emulated_tpu_generation() -> int | None:
    """The emulated TPU generation (e.g. 6 for v6e), or None when not emulating."""
    chip = emulated_chip()
    return None if chip is None else int("".join(c for c in chip if c.isdigit()))


def is_emulating() -> bool:
    """True inside :func:`emulate_tpu` (or with ``KDA_EMULATE_TPU`` set) off TPU."""
    return emulated_chip() is not None


def _emulated_tpu() -> tuple[int, object] | None:
    generation = emulated_tpu_generation()
    return None if generation is None else (generation, emulated_mosaic_op())


adapter.emulated_tpu = _emulated_tpu  # the core's seam: kda() sees the emulated TPU
