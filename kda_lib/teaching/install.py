"""The notebooks' installer: kda_lib's dependencies for this runtime, with the standard library
only.

The install cell of every notebook runs this file *by path* (``runpy.run_path``) where kda_lib or
a module that notebook imports is missing (a fresh Colab runtime, a new TPU VM, a local Jupyter
with only jax, an install cut short): in a checkout it uses the checkout's kda_lib as it is
(not installed); elsewhere it installs kda_lib alone first if it is missing (``pip install
--no-deps``); then :func:`install_dependencies`. ``import kda_lib`` would import jax, flax and
tokamax, which may not be there yet, so this module imports nothing from kda_lib and no
third-party package (tests/teaching/test_install.py runs it with those blocked).

:func:`install_dependencies` installs kda_lib's core requirements and, of the extras' packages,
only those the notebook found missing (tokamax only where the notebook uses it), for the
machine's accelerator. It keeps the JAX the runtime already has when it is new enough, so a GPU
or TPU runtime never gets its accelerator build of JAX replaced by a CPU one. A requirement whose
Python marker this interpreter fails (tokamax, whose releases need Python >= 3.12) is skipped
with a one-line note. It reads kda_lib's requirements from its installed metadata or, for a
checkout's kda_lib that is not installed, from the checkout's ``pyproject.toml``. It says what
it is installing before pip starts (about 1 to 3 minutes) and one line with what it did after;
where pip fails, it raises :class:`InstallFailed`, which Jupyter shows as one line (pip's reason
and the command to run by hand), not a traceback.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence

DISTRIBUTION = "kda-lib"
# distributions that make up a runtime's JAX: kept at their versions when it is new enough
_JAX_FAMILY = re.compile(r"^(jax|jaxlib|libtpu(-nightly)?|jax-(cuda\d+|rocm\d*)-(plugin|pjrt))$")
# the clauses of a requirement's marker this reads (joined by "and"): its extra and a Python
# version (tokamax's `python_version >= "3.12"`)
_EXTRA_MARKER = re.compile(r"""^extra\s*==\s*["']([\w.-]+)["']$""")
_PYTHON_MARKER = re.compile(
    r"""^python_(?:full_)?version\s*(>=|<=|==|!=|>|<)\s*["'](\d+(?:\.\d+)*)["']$"""
)
_COMPARE = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


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
      extras: kda_lib extras whose requirements are drawn on (e.g. ``("notebook", "tpu")``).
      requirements: pip requirement strings (the core's and those of the extras' packages that
        the notebook needs).
      constraints: ``name==version`` pins that keep the runtime's JAX as it is (may be empty).
      summary: the one line printed after installing.
      skipped: one line per requirement left out because this Python fails its marker (may be
        empty).
      skipped_names: the canonical names of those requirements.
    """

    extras: tuple[str, ...]
    requirements: tuple[str, ...]
    constraints: tuple[str, ...]
    summary: str
    skipped: tuple[str, ...] = ()
    skipped_names: tuple[str, ...] = ()


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


def _requirement_name(requirement: str) -> str:
    """The canonical distribution name of a requirement string (``"jax[tpu]>=0.10.2"`` -> jax)."""
    return _canonical(re.match(r"[A-Za-z0-9._-]*", requirement).group(0))


def _label(requirement: str) -> str:
    """A requirement's name and extras, without its version (``"jax[tpu]>=0.10.2"`` -> jax[tpu])."""
    return re.match(r"[A-Za-z0-9._-]*(\[[^\]]*\])?", requirement).group(0)


def _split_requirements(requires: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """kda_lib's metadata requirements grouped by extra ("" for the core): each one as
    ``(requirement, python)``, ``python`` its marker's Python clause (``'python_version >=
    "3.12"'``) or ``""``; the extra clause dropped.

    Raises:
      ValueError: a marker with another clause, or clauses joined otherwise than by "and".
    """
    groups: dict[str, list[tuple[str, str]]] = {}
    for line in requires:
        requirement, _, marker = (part.strip() for part in line.partition(";"))
        extra, python = "", []
        for clause in filter(None, (c.strip().strip("()").strip() for c in marker.split(" and "))):
            match = _EXTRA_MARKER.match(clause)
            if match and not extra:
                extra = match.group(1)
            elif _PYTHON_MARKER.match(clause):
                python.append(clause)
            else:
                raise ValueError(f"unexpected marker in kda-lib's requirement {line!r}")
        groups.setdefault(extra, []).append((requirement, " and ".join(python)))
    return groups


def _python_holds(python: str, version: Sequence[int]) -> bool:
    """Whether Python ``version`` (``(3, 11)``) meets ``python`` (clauses from
    :func:`_split_requirements`; ``""`` always holds)."""
    for clause in filter(None, python.split(" and ")):
        op, wanted = _PYTHON_MARKER.match(clause).groups()
        wanted_parts = tuple(int(part) for part in wanted.split("."))
        if not _COMPARE[op](tuple(version)[: len(wanted_parts)], wanted_parts):
            return False
    return True


_SELF = re.compile(r"^kda[-_.]lib\s*\[([^\]]*)\]\s*$", re.IGNORECASE)


def _extra_requirements(
    groups: Mapping[str, list[tuple[str, str]]], extra: str, seen: set[str]
) -> list[tuple[str, str]]:
    """The requirements of ``extra``, an extra that names others (``kda-lib[tokamax]``) expanded
    into theirs: kda_lib itself may be installed ``--no-deps`` from a URL pip cannot see again."""
    if extra not in groups:
        raise ValueError(f"kda-lib declares no extra {extra!r}; it has {sorted(groups)}")
    seen.add(extra)
    found = []
    for requirement, python in groups[extra]:
        match = _SELF.match(requirement)
        if not match:
            found.append((requirement, python))
            continue
        for name in (n.strip() for n in match.group(1).split(",")):
            if name and name not in seen:
                found += _extra_requirements(groups, name, seen)
    return found


def _minimum_version(requirements: Sequence[tuple[str, str]], name: str) -> tuple[int, ...]:
    for requirement, _ in requirements:
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
    modules: Collection[str] | None = None,
    python: Sequence[int] | None = None,
    checkout: bool = False,
) -> InstallPlan:
    """Decide what to install for kda_lib on this runtime (pure: runs nothing).

    Args:
      requires: kda_lib's metadata requirements (``importlib.metadata.requires("kda-lib")``, or
        :func:`checkout_requirements`).
      accelerator: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (:func:`detect_accelerator`).
      installed: the runtime's JAX distributions (:func:`installed_jax_family`).
      colab: whether this is Colab (only changes the wording of the summary).
      version: kda_lib's version, for the summary.
      modules: the modules the notebook found missing: of the extras' packages, only these are
        installed (and the accelerator's JAX); None: all of the ``notebook`` extra's.
      python: the Python version the requirements' markers are read for (default: this one's).
      checkout: kda_lib is a checkout's, not installed (only changes the wording).

    Returns:
      The core requirements and those of the ``notebook`` extra's packages ``modules`` names
      (the extras it names, e.g. ``tokamax``, expanded), plus the accelerator's extra when the
      runtime's JAX cannot already drive it. A runtime JAX at least as new as kda_lib's lower
      bound is kept exactly (its versions become constraints); an older or missing one is
      replaced through the accelerator's extra (``gpu``/``cuda12``/``tpu``), so it stays an
      accelerator build. A requirement whose Python marker ``python`` fails is left out and
      named in ``skipped``.

    Raises:
      ValueError: an unknown ``accelerator``, or a requirement of a kind this cannot read.
    """
    if accelerator not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"accelerator must be 'cpu', 'gpu' or 'tpu', got {accelerator!r}")
    python = tuple(sys.version_info[:2] if python is None else python[:2])
    groups = _split_requirements(requires)
    core = groups.get("", [])
    keep_jax = _keeps_runtime_jax(core, installed)
    extras = _extras_for(accelerator, installed, keep_jax)
    chosen = _chosen_requirements(groups, extras, modules)
    requirements, skipped, skipped_names = _for_this_python(chosen, python)
    constraints = [f"{name}=={v}" for name, v in sorted(installed.items())] if keep_jax else []
    where = "Colab" if colab else "this machine"
    label = f"kda_lib {version}" if version else "kda_lib"
    label += " (from the checkout, not installed)" if checkout else " installed"
    beyond = [_label(r) for r in requirements if r not in {r for r, _ in core}]
    what = "its core requirements" + (f" and {', '.join(beyond)}" if beyond else "")
    jax_note = _jax_note(core, installed.get("jax"), keep_jax)
    summary = f"{label} with {what} for the {accelerator.upper()} of {where}; {jax_note}"
    return InstallPlan(
        tuple(extras),
        tuple(requirements),
        tuple(constraints),
        summary,
        tuple(skipped),
        tuple(skipped_names),
    )


def _keeps_runtime_jax(core: Sequence[tuple[str, str]], installed: Mapping[str, str]) -> bool:
    """Whether the runtime's JAX is kept: jax and jaxlib both installed and at least kda_lib's
    lower bounds (pinned, an old jaxlib would not resolve)."""
    return all(
        name in installed and _version_tuple(installed[name]) >= _minimum_version(core, name)
        for name in ("jax", "jaxlib")
    )


def _extras_for(accelerator: str, installed: Mapping[str, str], keep_jax: bool) -> list[str]:
    """The extras drawn on: ``notebook``, plus the accelerator's (``gpu``, ``cuda12``, ``tpu``)
    where the runtime's JAX is replaced or cannot drive the accelerator."""
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
    return extras


def _chosen_requirements(
    groups: Mapping[str, list[tuple[str, str]]],
    extras: Sequence[str],
    modules: Collection[str] | None,
) -> list[tuple[str, str]]:
    """``(requirement, python marker)`` pairs: the core's, then those of ``extras`` (expanded)
    whose package ``modules`` names (all where ``modules`` is None) or that are JAX's."""
    wanted = None if modules is None else {_canonical(m) for m in modules}
    chosen = list(groups.get("", []))
    seen: set[str] = set()
    for extra in extras:
        chosen += [
            (requirement, marker)
            for requirement, marker in _extra_requirements(groups, extra, seen)
            if wanted is None
            or _requirement_name(requirement) in wanted
            or _JAX_FAMILY.match(_requirement_name(requirement))
        ]
    return chosen


def _for_this_python(
    chosen: Sequence[tuple[str, str]], python: tuple[int, ...]
) -> tuple[list[str], list[str], list[str]]:
    """``(requirements, skipped, skipped_names)``: the requirements of ``chosen`` whose marker
    Python ``python`` meets (each once), and a note and the name of each one it fails."""
    requirements, skipped, skipped_names = [], [], []
    this = ".".join(map(str, python))
    for requirement, marker in chosen:
        name = _requirement_name(requirement)
        if _python_holds(marker, python):
            requirements += [requirement] if requirement not in requirements else []
        elif name not in skipped_names:
            needs = " and ".join(
                f"Python {op} {v}" for op, v in (_PYTHON_MARKER.match(c).groups()
                                                 for c in marker.split(" and "))
            )  # fmt: skip
            skipped_names.append(name)
            skipped.append(
                f"Skipping {name}: its releases need {needs} and this is Python {this} (what "
                f"needs {name} raises an error saying so)"
            )
    return requirements, skipped, skipped_names


def _jax_note(core: Sequence[tuple[str, str]], runtime_jax: str | None, keep_jax: bool) -> str:
    """The summary's words on the runtime's JAX: kept, replaced (and why) or installed."""
    if keep_jax:
        return f"kept the runtime's jax {runtime_jax}"
    if runtime_jax:
        needed = ".".join(map(str, _minimum_version(core, "jax")))
        return f"replaced the runtime's jax {runtime_jax} (kda_lib needs >= {needed})"
    return "installed jax"


def checkout_requirements(pyproject: str) -> tuple[list[str], str]:
    """A checkout's kda_lib requirements, written as the installed metadata writes them
    (``'tokamax>=0.0.17; python_version >= "3.12" and extra == "tokamax"'``), and its version,
    read from its ``pyproject.toml``: for a kda_lib importable from a checkout, not installed."""
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    requires = list(project.get("dependencies", []))
    for extra, lines in project.get("optional-dependencies", {}).items():
        for line in lines:
            requirement, _, marker = (part.strip() for part in line.partition(";"))
            both = f"{marker} and " if marker else ""
            requires.append(f'{requirement}; {both}extra == "{extra}"')
    return requires, project["version"]


def _kda_lib_requirements() -> tuple[list[str], str, bool]:
    """``(requirements, version, checkout)``: kda_lib's installed metadata; where kda_lib is
    not installed, the ``pyproject.toml`` of the checkout this file sits in (``checkout``
    True)."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
        return requires, importlib.metadata.version(DISTRIBUTION), False
    except importlib.metadata.PackageNotFoundError:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        pyproject = os.path.join(root, "pyproject.toml")
        if not os.path.isfile(pyproject):
            raise importlib.metadata.PackageNotFoundError(
                f"{DISTRIBUTION} is not installed and {root} is no checkout (no pyproject.toml)"
            ) from None
        return (*checkout_requirements(pyproject), True)


def install_dependencies(
    *,
    dry_run: bool = False,
    missing: Sequence[str] = (),
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> InstallPlan:
    """Install kda_lib's requirements for this runtime and this notebook.

    kda_lib must be installed or importable from a checkout (its requirements are then read from
    the checkout's ``pyproject.toml``). Detects the accelerator, plans with
    :func:`plan_install` for the modules ``missing`` names, prints a line per requirement this
    Python cannot install (tokamax below Python 3.12); where that leaves nothing missing,
    returns without pip. Otherwise says what it is about to install and how long that takes
    (pip prints nothing meanwhile), runs one ``pip install`` in this interpreter (pip's own
    settings such as ``PIP_NO_INDEX`` apply) and prints the plan's summary with the time it
    took, plus the packages whose installed version changed (restart the runtime if it had
    imported one of them).

    Args:
      dry_run: print the plan and the pip command, install nothing.
      missing: the modules the install cell found missing (named in the first line); of the
        extras' packages only these are installed. Empty: all of the ``notebook`` extra's.
      run: the function that runs pip (:func:`subprocess.run`; replaced in tests).

    Raises:
      importlib.metadata.PackageNotFoundError: kda_lib is neither installed nor a checkout's.
      InstallFailed: pip failed; the message is one line: pip's reason (:func:`pip_reason`) and
        the pip command to run by hand, which prints pip's whole output.
    """
    requires, version, checkout = _kda_lib_requirements()
    plan = plan_install(
        requires,
        detect_accelerator(),
        installed_jax_family(),
        colab=in_colab(),
        version=version,
        modules=[name for name in missing if name != "kda_lib"] if missing else None,
        checkout=checkout,
    )
    for line in plan.skipped:
        print(line, flush=True)
    if missing and not set(map(_canonical, missing)) - set(plan.skipped_names):
        return plan  # only what this Python cannot install was missing
    with tempfile.TemporaryDirectory() as tmp:
        command = _pip_command(plan, os.path.join(tmp, "constraints.txt"))
        if dry_run:
            print(f"{plan.summary} | would run: {shlex.join(command)}")
            return plan
        before = _installed_versions()
        _announce(plan, missing)
        start = time.monotonic()
        result = run(command, capture_output=True, text=True)
    if result.returncode != 0:
        by_hand = [sys.executable, "-m", "pip", "install", *plan.requirements, *plan.constraints]
        raise InstallFailed(
            f"pip could not install kda_lib's dependencies ({pip_reason(result.stderr)}); "
            f"run `{shlex.join(by_hand)}` in a terminal (or in a cell, after `!`) to see "
            "pip's whole output, then this cell again"
        )
    importlib.invalidate_caches()  # what pip installed, found by the next import at once
    _report(plan, before, start)
    return plan


def _pip_command(plan: InstallPlan, constraints: str) -> list[str]:
    """The ``pip install`` command for ``plan``, its constraints written to the file
    ``constraints``."""
    with open(constraints, "w") as f:
        f.write("".join(f"{line}\n" for line in plan.constraints))
    # no colour: the reason line is read from pip's output (a kernel may force colours)
    command = [sys.executable, "-m", "pip", "install", "-qq", "--no-color", "-c", constraints]
    return command + list(plan.requirements)


def _announce(plan: InstallPlan, missing: Sequence[str]) -> None:
    """Print what pip is about to install (and which missing modules asked for it) and how
    long that takes: pip prints nothing meanwhile."""
    dependencies = [name for name in missing if name != "kda_lib"]
    why = f" ({', '.join(dependencies)} missing)" if dependencies else ""
    names = [_requirement_name(r) for r in plan.requirements]
    listed = ", ".join(
        f"{n} (which brings about 90 packages: google-cloud-storage, duckdb, grpcio, ...)"
        if n == "tokamax"
        else n
        for n in dict.fromkeys(names)
    )
    print(
        f"Installing kda_lib's dependencies{why}: {listed}. pip prints nothing meanwhile; "
        "this takes about 1 to 3 minutes on Colab ...",
        flush=True,
    )


def _report(plan: InstallPlan, before: Mapping[str, str], start: float) -> None:
    """Print the plan's summary with the time since ``start`` and the packages whose installed
    version changed from ``before`` (restart the runtime if it had imported them)."""
    after = _installed_versions()
    changed = [
        f"{n} {before[n]}->{after[n]}"
        for n in sorted(before)
        if n in after and after[n] != before[n]
    ]
    restart = f"; changed {', '.join(changed)}: restart the runtime if it had imported them"
    took = f" ({time.monotonic() - start:.0f} s)"
    print(plan.summary + took + (restart if changed else ""))


def _installed_versions() -> dict[str, str]:
    return {
        _canonical(d.metadata["Name"] or ""): d.version for d in importlib.metadata.distributions()
    }


if __name__ == "__main__":
    # `python path/to/kda_lib/teaching/install.py [--dry-run]`: the setup cell's second step by hand
    install_dependencies(dry_run="--dry-run" in sys.argv[1:])
