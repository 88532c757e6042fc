"""The notebooks' shared setup: :func:`setup` (one line about JAX and kda_lib, the shared
settings), :func:`check_parameters` (a notebook's papermill parameters, by name) and
:func:`interactive` (whether a widget may start).

The install step before it is :mod:`kda_lib.teaching.install` (standard library only).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping

from kda_lib.checks import check_flag, is_int
from kda_lib.teaching.install import DISTRIBUTION


def setup(*, style: bool = True, on_host: bool = False) -> None:
    """The settings every notebook shares; prints one line about JAX and kda_lib.

    * the plot style of :func:`kda_lib.teaching.viz.setup_style` (``style=False`` leaves
      matplotlib as it is);
    * random numbers from the non-partitionable threefry: on CPU it compiles multi-dimensional
      draws many times faster (seconds per shape otherwise); it only changes which numbers are
      drawn;
    * float32 matmuls at float32's precision (``jax_default_matmul_precision`` "highest") on every
      backend, so the course's float32 comparisons mean on a TPU (whose default is one bfloat16
      pass: 3e-3 from the float64 oracle in notebook 07's decode on the v5e) or a GPU (TF32)
      what they mean on a CPU; the line says so off a CPU. The Pallas kernels name their own
      passes;
    * ``on_host``: new arrays and computations on the host's CPU (``jax_default_device``), for a
      page that checks formulas against float64 NumPy to float32's rounding (a TPU's float32
      softplus is 1.6e-4 off at the largest element measured, notebook 02 on the v5e). Only for
      such pages: ``jax.default_backend()`` still names the accelerator, so ``auto``'s choice,
      the Pallas kernels' interpret switch and :func:`kda_lib.testing.float32_tolerance` would
      answer for it; needs the CPU platform (not ``JAX_PLATFORMS=tpu``).
    """
    import jax

    import kda_lib

    style, on_host = check_flag("style", style), check_flag("on_host", on_host)
    if style:
        from kda_lib.teaching import viz

        viz.setup_style()
    jax.config.update("jax_threefry_partitionable", False)
    jax.config.update("jax_default_matmul_precision", "highest")
    if on_host:
        jax.config.update("jax_default_device", jax.devices("cpu")[0])
    devices = jax.devices()
    count = f"{len(devices)} device" + ("s" if len(devices) > 1 else "")
    print(
        f"jax {jax.__version__} on {jax.default_backend()} ({count}, {devices[0].device_kind})"
        + ("" if jax.default_backend() == "cpu" else " | float32 matmuls: highest")
        + (" | this page on the host's CPU" if on_host else "")
        + " | "
        f"kda_lib {_installed_version()} ({_origin(kda_lib.__file__)})"
    )


def _installed_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _origin(module_file: str) -> str:
    """Where kda_lib was imported from, in words that name no folder of this machine (the line
    ends up on the published pages)."""
    parts = os.path.normpath(module_file).split(os.sep)
    return "installed" if "site-packages" in parts or "dist-packages" in parts else "source tree"


# set to 1 by `make notebooks` (papermill) and tests/teaching/run_nbval.py for their kernels
NONINTERACTIVE_ENV = "KDA_NONINTERACTIVE"


def interactive(requested: bool = True) -> bool:
    """Whether a notebook cell may start a widget: ``requested`` (the notebook's ``interactive``
    parameter), ``KDA_NONINTERACTIVE`` unset (or ``0``), and a kernel whose frontend can answer
    ``input()`` (JupyterLab, Colab and VS Code can; papermill, nbconvert and every other
    nbclient run cannot). A run without a frontend draws the static figure instead: a widget
    there has nothing to move it, and its messages can stall the cell until the cell timeout
    (jupyter/nbclient#312)."""
    if not requested or os.environ.get(NONINTERACTIVE_ENV, "0") != "0":
        return False
    ipython = sys.modules.get("IPython")
    kernel = getattr(ipython.get_ipython(), "kernel", None) if ipython else None
    return kernel is not None and bool(getattr(kernel, "_allow_stdin", True))


# int parameters that may be 0 (every other int parameter must be >= 1)
ZERO_OK_PARAMETERS = frozenset({"seed", "conv_size", "delay"})


def check_parameters(namespace: Mapping, *, zero_ok: frozenset = ZERO_OK_PARAMETERS) -> None:
    """Check a notebook's parameters against the types annotated in its ``parameters`` cell,
    first thing after it (papermill injects its values in a cell right after that one), so a
    bad value fails at once with an error naming the parameter instead of deep inside JAX.

    ``int``: an int (not a bool) >= 1, or >= 0 for the names in ``zero_ok``; ``float``: a finite
    number; ``bool``; ``str``; ``list`` / ``list[X]``: a list (or tuple) of such values.

    Raises:
      ValueError: the first parameter that does not fit, with its name, value and the rule.
    """
    import math
    import typing

    annotations = dict(namespace.get("__annotations__", {}))

    def problem(name, value, kind) -> str | None:
        origin = typing.get_origin(kind) or kind
        if origin is list:
            if not isinstance(value, (list, tuple)):
                return "a list"
            (item,) = typing.get_args(kind) or (None,)
            for entry in value if item else ():
                why = problem(name, entry, item)
                if why:
                    return f"a list whose entries are each {why}"
            return None
        if kind is bool:
            return None if isinstance(value, bool) else "True or False"
        if kind is int:
            low = 0 if name in zero_ok else 1
            return None if is_int(value, low) else f"an int >= {low}"
        if kind is float:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            return None if number and math.isfinite(value) else "a finite number"
        if kind is str:
            return None if isinstance(value, str) else "a str"
        return None

    for name, kind in annotations.items():
        if name not in namespace:
            continue
        why = problem(name, namespace[name], kind)
        if why:
            raise ValueError(
                f"notebook parameter {name} must be {why}, got {namespace[name]!r} "
                "(set in the parameters cell, or injected by papermill -p)"
            )
