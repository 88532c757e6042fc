"""The notebooks' installer: kda_lib's dependencies for this runtime, with the standard library
only.

The install cell of every notebook runs this file *by path* (``runpy.run_path``) where kda_lib or
a module the notebooks import is missing (a fresh Colab runtime, a new TPU VM, a local Jupyter
with only jax, an install cut short): it installs kda_lib alone first if it is missing
(``pip install --no-deps``), then :func:`install_dependencies`. ``import kda_lib`` would import
jax, flax and tokamax, which may not be there yet, so this module imports nothing from kda_lib
and no third-party package (tests/teaching/test_install.py runs it with those blocked).

:func:`install_dependencies` picks the extras for the machine's accelerator and keeps the JAX the
runtime already has when it is new enough, so a GPU or TPU runtime never gets its accelerator
build of JAX replaced by a CPU one. It says what it is installing before pip starts (about 1 to
3 minutes) and one line with what it did after; where pip fails, it raises :class:`InstallFailed`,
which Jupyter shows as one line (pip's reason and the command to run by hand), not a traceback.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

DISTRIBUTION = "kda-lib"
# distributions that make up a runtime's JAX: kept at their versions when it is new enough
_JAX_FAMILY = re.compile(r"^(jax|jaxlib|libtpu(-nightly)?|jax-(cuda\d+|rocm\d*)-(plugin|pjrt))$")
_EXTRA_MARKER = re.compile(r"""^extra\s*==\s*["']([\w.-]+)["']$""")


class InstallFailed(RuntimeError):
    """pip failed. Jupyter (IPython) shows it as its one line, without a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def pip_reason(output: str) -> str:
    """The line of pip's output that says why it failed: the first ``ERROR:`` or git
    ``fatal:`` line (e.g. "fatal: unable to access ...: Could not resolve host"), else the
    last line."""
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # colours, should pip print them anyway
    lines = [line.strip() for line in output.splitlines() if line.strip()] or ["no output"]
    return next((line for line in lines if line.startswith(("ERROR:", "fatal:"))), lines[-1])


@dataclasses.dataclass(frozen=True)
class InstallPlan:
    """What :func:`install_dependencies` installs.

    Attributes:
      extras: kda_lib extras whose requirements are installed (e.g. ``("notebook", "tpu")``).
      requirements: pip requirement strings (the core's and those extras').
      constraints: ``name==version`` pins that keep the runtime's JAX as it is (may be empty).
      summary: the one line printed after installing.
    """

    extras: tuple[str, ...]
    requirements: tuple[str, ...]
    constraints: tuple[str, ...]
    summary: str


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; local (``+cuda``) and pre-release tails ignored."""
    release = re.match(r"\d+(\.\d+)*", version.split("+")[0])
    return tuple(int(part) for part in release.group(0).split(".")) if release else ()


def detect_accelerator(environ: Mapping[str, str] | None = None) -> str:
    """``"tpu"``, ``"gpu"`` (NVIDIA) or ``"cpu"``, from device files and the runtime's variables.

    Looks at no Python package, so it works before JAX is installed.
    """
    environ = os.environ if environ is None else environ
    if any(name in environ for name in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "COLAB_TPU_ADDR")):
        return "tpu"
    if glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"):
        return "tpu"
    if os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi"):
        return "gpu"
    return "cpu"


def in_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def installed_jax_family() -> dict[str, str]:
    """Canonical name -> version of the JAX distributions installed (jax, jaxlib, plugins)."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = _canonical(dist.metadata["Name"] or "")
        if _JAX_FAMILY.match(name):
            found.setdefault(name, dist.version)
    return found


def _split_requirements(requires: Sequence[str]) -> dict[str, list[str]]:
    """kda_lib's metadata requirements grouped by extra ("" for the core), markers dropped."""
    groups: dict[str, list[str]] = {}
    for line in requires:
        requirement, _, marker = (part.strip() for part in line.partition(";"))
        match = _EXTRA_MARKER.match(marker) if marker else None
        if marker and not match:
            raise ValueError(f"unexpected marker in kda-lib's requirement {line!r}")
        groups.setdefault(match.group(1) if match else "", []).append(requirement)
    return groups


_SELF = re.compile(r"^kda[-_.]lib\s*\[([^\]]*)\]\s*$", re.IGNORECASE)


def _extra_requirements(groups: Mapping[str, list[str]], extra: str, seen: set[str]) -> list[str]:
    """The requirements of ``extra``, an extra that names others (``kda-lib[tokamax]``) expanded
    into theirs: kda_lib itself may be installed ``--no-deps`` from a URL pip cannot see again."""
    if extra not in groups:
        raise ValueError(f"kda-lib declares no extra {extra!r}; it has {sorted(groups)}")
    seen.add(extra)
    found = []
    for requirement in groups[extra]:
        match = _SELF.match(requirement)
        if not match:
            found.append(requirement)
            continue
        for name in (n.strip() for n in match.group(1).split(",")):
            if name and name not in seen:
                found += _extra_requirements(groups, name, seen)
    return found


def _minimum_version(requirements: Sequence[str], name: str) -> tuple[int, ...]:
    for requirement in requirements:
        match = re.match(rf"^{re.escape(name)}\s*>=\s*([\w.]+)", requirement)
        if match:
            return _version_tuple(match.group(1))
    return ()


def plan_install(
    requires: Sequence[str],
    accelerator: str,
    installed: Mapping[str, str],
    *,
    colab: bool = False,
    version: str = "",
) -> InstallPlan:
    """Decide what to install for kda_lib on this runtime (pure: runs nothing).

    Args:
      requires: kda_lib's metadata requirements (``importlib.metadata.requires("kda-lib")``).
      accelerator: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (:func:`detect_accelerator`).
      installed: the runtime's JAX distributions (:func:`installed_jax_family`).
      colab: whether this is Colab (only changes the wording of the summary).
      version: kda_lib's version, for the summary.

    Returns:
      The core and ``notebook`` requirements (the extras it names, e.g. ``tokamax``,
      expanded), plus the accelerator's extra when the runtime's
      JAX cannot already drive it. A runtime JAX at least as new as kda_lib's lower bound is kept
      exactly (its versions become constraints); an older or missing one is replaced through the
      accelerator's extra (``gpu``/``cuda12``/``tpu``), so it stays an accelerator build.

    Raises:
      ValueError: an unknown ``accelerator``, or a requirement of a kind this cannot read.
    """
    if accelerator not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"accelerator must be 'cpu', 'gpu' or 'tpu', got {accelerator!r}")
    groups = _split_requirements(requires)
    minimum = _minimum_version(groups.get("", []), "jax")
    runtime_jax = installed.get("jax")
    # kept only if jax and jaxlib are both new enough: pinned, an old jaxlib would not resolve
    keep_jax = all(
        name in installed
        and _version_tuple(installed[name]) >= _minimum_version(groups.get("", []), name)
        for name in ("jax", "jaxlib")
    )
    has_cuda = [n for n in installed if n.startswith("jax-cuda") and n.endswith("-plugin")]
    drives = {
        "cpu": True,
        "gpu": bool(has_cuda) or any(n.startswith("jax-rocm") for n in installed),
        "tpu": any(n.startswith("libtpu") for n in installed),
    }[accelerator]
    extras = ["notebook"]
    if not (keep_jax and drives) and accelerator != "cpu":
        # a runtime on CUDA 12 keeps CUDA 12: mixing the two plugins breaks JAX's GPU backend
        extras.append("cuda12" if "jax-cuda12-plugin" in installed else accelerator)
    requirements = list(groups.get("", []))
    seen: set[str] = set()
    for extra in extras:
        requirements += _extra_requirements(groups, extra, seen)
    constraints = [f"{name}=={v}" for name, v in sorted(installed.items())] if keep_jax else []
    where = "Colab" if colab else "this machine"
    installed_as = f"kda_lib {version} installed" if version else "kda_lib installed"
    if keep_jax:
        jax_note = f"kept the runtime's jax {runtime_jax}"
    elif runtime_jax:
        needed = ".".join(map(str, minimum))
        jax_note = f"replaced the runtime's jax {runtime_jax} (kda_lib needs >= {needed})"
    else:
        jax_note = "installed jax"
    summary = (
        f"{installed_as} with [{','.join(extras)}] for the {accelerator.upper()} of {where}; "
        f"{jax_note}"
    )
    return InstallPlan(tuple(extras), tuple(requirements), tuple(constraints), summary)


def install_dependencies(
    *,
    dry_run: bool = False,
    missing: Sequence[str] = (),
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> InstallPlan:
    """Install kda_lib's requirements for this runtime (kda_lib itself must be installed).

    Detects the accelerator, plans with :func:`plan_install`, says what it is about to install
    and how long that takes (pip prints nothing meanwhile), runs one ``pip install`` in this
    interpreter (pip's own settings such as ``PIP_NO_INDEX`` apply) and prints the plan's
    summary with the time it took, plus the packages whose installed version changed (restart
    the runtime if it had imported one of them).

    Args:
      dry_run: print the plan and the pip command, install nothing.
      missing: the modules the install cell found missing (named in the first line).
      run: the function that runs pip (:func:`subprocess.run`; replaced in tests).

    Raises:
      importlib.metadata.PackageNotFoundError: kda_lib is not installed.
      InstallFailed: pip failed; the message is one line: pip's reason (:func:`pip_reason`) and
        the pip command to run by hand, which prints pip's whole output.
    """
    requires = importlib.metadata.requires(DISTRIBUTION) or []
    plan = plan_install(
        requires,
        detect_accelerator(),
        installed_jax_family(),
        colab=in_colab(),
        version=importlib.metadata.version(DISTRIBUTION),
    )
    before = _installed_versions()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = os.path.join(tmp, "constraints.txt")
        with open(constraints, "w") as f:
            f.write("".join(f"{line}\n" for line in plan.constraints))
        # no colour: the reason line is read from pip's output (a kernel may force colours)
        command = [sys.executable, "-m", "pip", "install", "-qq", "--no-color", "-c", constraints]
        command += plan.requirements
        if dry_run:
            print(f"{plan.summary} | would run: {shlex.join(command)}")
            return plan
        dependencies = [name for name in missing if name != "kda_lib"]
        why = f" ({', '.join(dependencies)} missing)" if dependencies else ""
        print(
            f"Installing kda_lib's dependencies{why} with [{','.join(plan.extras)}]: jax, "
            "tokamax (which brings about 90 packages: google-cloud-storage, duckdb, grpcio, ...), "
            "flax, optax, matplotlib, ipywidgets. pip prints nothing meanwhile; this takes about "
            "1 to 3 minutes on Colab ...",
            flush=True,
        )
        start = time.monotonic()
        result = run(command, capture_output=True, text=True)
    if result.returncode != 0:
        by_hand = [sys.executable, "-m", "pip", "install", *plan.requirements, *plan.constraints]
        raise InstallFailed(
            f"pip could not install kda_lib's dependencies ({pip_reason(result.stderr)}); "
            f"run `{shlex.join(by_hand)}` in a terminal (or in a cell, after `!`) to see "
            "pip's whole output, then this cell again"
        )
    after = _installed_versions()
    changed = [
        f"{n} {before[n]}->{after[n]}"
        for n in sorted(before)
        if n in after and after[n] != before[n]
    ]
    restart = f"; changed {', '.join(changed)}: restart the runtime if it had imported them"
    took = f" ({time.monotonic() - start:.0f} s)"
    print(plan.summary + took + (restart if changed else ""))
    return plan


def _installed_versions() -> dict[str, str]:
    return {
        _canonical(d.metadata["Name"] or ""): d.version for d in importlib.metadata.distributions()
    }


if __name__ == "__main__":
    # `python path/to/kda_lib/teaching/install.py [--dry-run]`: the setup cell's second step by hand
    install_dependencies(dry_run="--dry-run" in sys.argv[1:])
