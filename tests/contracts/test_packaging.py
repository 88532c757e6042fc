"""Packaging: the wheel, the Colab path, tokamax as an extra and the recorded data.

A plain install (the wheel, no extras) brings no tokamax: its metadata names tokamax only under
the ``tokamax``, ``tpu``, ``notebook`` and ``dev`` extras, and only on Python >= 3.12 (its
releases need it; the package itself admits Python 3.11, a TPU image's), pip installs it offline
where only the core's dependencies are there, and the README's first snippet runs; a tokamax
implementation asked for without tokamax raises an error naming the extra (and, below Python
3.12, why it cannot install), before any work.

The end-to-end test builds kda_lib's wheel and runs notebook 00's first cells (parameters, setup,
imports; the whole notebook runs in tests/teaching/test_notebooks.py) the way Colab does: in a fresh
virtual environment without kda_lib, flax, optax, tokamax, matplotlib or ipywidgets, from a
temporary folder with no checkout on ``sys.path``, the notebook's own setup cell installs the
wheel (in place of the ``git+`` URL, ``--no-deps``), then the dependencies through
``kda_lib/teaching/install.py``: first with no wheel to install them from, where the cell must
end with one line saying why pip failed, then with them, where the cells must complete having
installed only what notebook 00 imports (no tokamax, no ipywidgets) and a call of kda_lib must
run; then the recorded data that notebooks 03 and 08 read is loaded there.

To stay offline and fast, pip runs with ``PIP_NO_INDEX=1`` and finds kda_lib's missing direct
requirements in a folder of wheels repacked from the project venv's installed files
(:func:`_repack`); the fresh environment sees the rest of the project venv's installed
dependencies (jax, numpy, papermill, ipykernel and what the missing ones need in turn, so pip
installs 6 wheels rather than 75) through a ``.pth`` line to a folder of links
(:func:`_dependency_view`) that leaves out the editable kda_lib and the missing ones.
"""

from __future__ import annotations

import ast
import base64
import email.parser
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tokenize
import zipfile

import pytest
from conftest import FAST_COMPILE_FLAGS, USER_XLA_FLAGS, with_flags
from packaging.requirements import Requirement

from kda_lib.lab import records
from kda_lib.teaching import install as installer
from kda_lib.teaching import notebook as nb_setup

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "00_quickstart.ipynb"
# what a notebook server needs that Colab has and kda_lib does not declare
RUNNER_REQUIREMENTS = ["papermill", "ipykernel"]
RECORDED_CHECK = """\
import kda_lib
from kda_lib.lab import records

runs, notes = records.load_benchmark_runs()
results = records.load_recorded("results", "synthetic_recall_full.json")
print("recorded:", kda_lib.__file__, records.recorded_dir("benchmarks"), len(runs), len(results))
import importlib.util
print("not installed:", [m for m in ("tokamax", "ipywidgets") if not importlib.util.find_spec(m)])
"""
# one call of the installed kda_lib in the notebook's kernel (the chunked form: T 20 over
# chunks of 16, one partial chunk)
ONE_CALL = """\
x = [jax.random.normal(key, (1, 20, 2, 8)) for key in jax.random.split(jax.random.key(0), 3)]
o, _ = kda_lib.kda(*x, -jnp.ones((1, 20, 2, 8)) / 4, jnp.full((1, 20, 2), 0.5),
                   implementation="chunked", chunk_size=16)
print("one call:", o.shape, o.dtype, "finite", bool(jnp.isfinite(o).all()))
"""
NOTEBOOK_ONLY = {"matplotlib", "ipywidgets", "jupyterlab", "papermill", "nbval", "tqdm"}


def test_setup_is_reachable_from_import_kda_lib_and_prints_no_path(capsys):
    import jax

    import kda_lib

    # `import kda_lib; kda_lib.teaching.notebook.setup()` works
    assert kda_lib.teaching.notebook is nb_setup
    names = ("jax_threefry_partitionable", "jax_default_matmul_precision")
    before = {n: getattr(jax.config, n) for n in names}
    try:
        nb_setup.setup(style=False)
    finally:  # setup() switches the random numbers and the precision: give the others theirs back
        for name, value in before.items():
            jax.config.update(name, value)
    line = capsys.readouterr().out
    assert "kda_lib 0.1.0" in line and str(ROOT) not in line and os.sep + "kda_lib" not in line
    assert nb_setup._origin("/x/lib/python3.12/site-packages/kda_lib/__init__.py") == "installed"
    assert nb_setup._origin(str(ROOT / "kda_lib" / "__init__.py")) == "source tree"


def test_the_library_imports_no_plotting_notebook_or_training_package():
    """`import kda_lib` and every module of the library folders (ops, parallel, layers, models)
    bring no matplotlib and no notebook package: those are for lab/ and teaching/ (optax is not
    checked: flax.nnx itself imports it)."""
    package = ROOT / "kda_lib"
    library = [package / "checks.py", package / "testing.py", package / "__init__.py"]
    for folder in ("ops", "parallel", "layers", "models"):
        library += sorted((package / folder).rglob("*.py"))
    modules = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in library
    ]
    assert "kda_lib.ops.tokamax.adapter" in modules and "kda_lib.models.presets" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in {sorted(NOTEBOOK_ONLY)!r} if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]", f"imported by the core: {run.stdout}"


# ----------------------------------------------------------------------------- tokamax, an extra
EXTRA = re.escape("pip install 'kda-lib[tokamax]'")


@pytest.fixture
def without_tokamax(monkeypatch):
    """tokamax as if not installed: ``import tokamax`` fails and ``find_spec`` finds nothing."""
    for name in [m for m in sys.modules if m == "tokamax" or m.startswith("tokamax.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tokamax", None)
    assert importlib.util.find_spec("tokamax") is None
    with pytest.raises(ImportError):
        import tokamax  # noqa: F401


def test_a_tokamax_implementation_without_tokamax_names_the_extra_before_any_work(
    without_tokamax, monkeypatch
):
    import jax

    import kda_lib
    from kda_lib.ops import api as registry
    from kda_lib.parallel.context_parallel import kda_context_parallel
    from kda_lib.testing import random_kda_inputs

    def no_work(*args, **kwargs):
        raise AssertionError("the tokamax adapter ran")

    monkeypatch.setattr(registry, "tokamax_kda", no_work)
    x = random_kda_inputs(jax.random.key(0), 1, 8, 2, 8, 8)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    for name in ("tokamax_xla", "tokamax_xla_chunked", "tokamax_mosaic"):
        with pytest.raises(ModuleNotFoundError, match=rf"implementation='{name}'.*{EXTRA}"):
            kda_lib.kda(*args, implementation=name)
        with pytest.raises(ModuleNotFoundError, match=EXTRA):
            kda_context_parallel(*args, implementation=name)
        # the benchmark skips it with this note; "auto" never picks it, even on a TPU
        problems = registry.refusals(
            name, key_dim=8, dtype="float32", lower_bound=-5.0, fused_gate=True
        )
        assert any("kda-lib[tokamax]" in p for p in problems), problems
    with pytest.raises(ModuleNotFoundError, match=EXTRA):
        with kda_lib.emulate_tpu("v6e"):
            pass
    kda_lib.kda(*args)  # kda_lib's own forms need no tokamax
    monkeypatch.setattr(registry, "tpu_generation", lambda: 6)
    chosen = registry.select_implementation(
        seq_len=4096, key_dim=128, dtype="bfloat16", lower_bound=-5.0, fused_gate=True
    )
    assert chosen == "pallas_tpu"  # kda_lib's own kernels: not tokamax's


@pytest.mark.parametrize(
    "python, why",
    [
        ((3, 11, 7), "on Python >= 3.12 (tokamax's releases need Python >= 3.12; this is Python "
         "3.11, where the extra installs without it)"),
        ((3, 12, 1), None),
        ((3, 13, 0), None),
    ],
)
def test_the_missing_tokamax_error_says_why_on_a_python_older_than_3_12(
    without_tokamax, monkeypatch, python, why
):
    """A TPU image's Python 3.11 cannot install tokamax: the error names the extra and says why
    it would not help there; on 3.12 and newer it names the extra alone."""
    import jax

    import kda_lib
    from kda_lib.ops.tokamax import adapter
    from kda_lib.testing import random_kda_inputs

    problem = adapter.missing_tokamax_problem("implementation='tokamax_xla'", python)
    assert re.search(EXTRA, problem), problem
    assert (why in problem) if why else ("3.1" not in problem), problem
    x = random_kda_inputs(jax.random.key(0), 1, 8, 2, 8, 8)
    monkeypatch.setattr(sys, "version_info", python)  # what the raised error reads
    with pytest.raises(ModuleNotFoundError) as raised:
        kda_lib.kda(*(x[n] for n in ("q", "k", "v", "g", "beta")), implementation="tokamax_xla")
    assert str(raised.value) == problem


# ----------------------------------------------------------------------------- recorded data
def test_recorded_data_is_found_and_parsed():
    assert records.recorded_files("benchmarks"), "no recorded benchmarks"
    runs = records.load_recorded("results", "synthetic_recall_full.json")
    assert isinstance(runs, list) and runs and "eval" in runs[0]


def test_a_missing_recording_is_an_explicit_error():
    listed = r"not found in .*available: .*'synthetic_recall_full.json'"
    with pytest.raises(FileNotFoundError, match=listed):
        records.recorded_path("results", "no_such_run.json")
    with pytest.raises(ValueError, match="kind"):
        records.recorded_dir("fixtures")
    with pytest.raises(ValueError, match="name"):
        records.recorded_path("results", "../benchmarks/x.json")


def test_benchmark_loader_falls_back_to_the_recorded_benchmarks(tmp_path):
    runs, notes = records.load_benchmark_runs(tmp_path / "absent")
    assert runs and any("not found" in note for note in notes)
    assert runs == records.load_benchmark_runs()[0]


# ----------------------------------------------------------------------------- the wheel
def _copy_sources(target: pathlib.Path) -> pathlib.Path:
    """The files a wheel is built from, so the build writes nothing into the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "kda_lib", target / "kda_lib", ignore=ignore)
    for kind in records.KINDS:
        shutil.copytree(ROOT / "data" / kind, target / "data" / kind, ignore=ignore)
    return target


# one worker builds the wheel once for the tests that read it
WHEEL = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> pathlib.Path:
    source = _copy_sources(tmp_path_factory.mktemp("source"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(source),
        ],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    (path,) = dist.glob("kda_lib-*.whl")
    return path


def _wheel_requires(wheel: pathlib.Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(zf.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


@WHEEL
def test_wheel_holds_the_package_and_the_recorded_data(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    modules = {  # subpackages too: the notebooks import kda_lib.teaching.exercises on Colab
        p.relative_to(ROOT).as_posix() for p in (ROOT / "kda_lib").rglob("*.py")
    }
    assert modules <= names, f"modules missing from the wheel: {sorted(modules - names)}"
    for kind in records.KINDS:
        files = {f"kda_lib/recorded_data/{kind}/{p.name}" for p in records.recorded_files(kind)}
        assert files and files <= names, f"recorded {kind} missing: {sorted(files - names)}"
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "data/"))]
    assert not [n for n in names if "fixtures" in n], "parity fixtures do not belong in the wheel"


@WHEEL
def test_plain_install_pulls_no_plotting_notebook_or_tokamax_package(wheel):
    requires = [Requirement(r) for r in _wheel_requires(wheel)]
    core = {r.name.lower() for r in requires if r.marker is None}
    assert core and not (core & NOTEBOOK_ONLY), f"core requires {sorted(core & NOTEBOOK_ONLY)}"
    assert "tokamax" not in core, "tokamax is an extra: pip install 'kda-lib[tokamax]'"

    def extra_brings(extra: str, seen=()) -> set[str]:
        names = set()
        for r in requires:
            if r.marker is not None and r.marker.evaluate({"extra": extra}):
                if r.name == "kda-lib":
                    for inner in set(r.extras) - {extra, *seen}:
                        names |= extra_brings(inner, (*seen, extra))
                else:
                    names.add(r.name.lower())
        return names

    # the TPU users, the notebooks and the suite keep it
    for extra in ("tokamax", "tpu", "notebook", "dev"):
        assert "tokamax" in extra_brings(extra), extra
    # where its releases install: Python >= 3.12; the package itself admits a TPU image's 3.11
    (tokamax,) = [r for r in requires if r.name == "tokamax"]
    for python, holds in (("3.11", False), ("3.12", True), ("3.13", True)):
        assert tokamax.marker.evaluate({"extra": "tokamax", "python_version": python}) is holds
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        assert "\nRequires-Python: >=3.11\n" in zf.read(name).decode()


@WHEEL
def test_the_checkout_reads_its_requirements_as_the_wheel_declares_them(wheel):
    """A checkout's kda_lib, not installed: the notebooks' installer reads pyproject.toml into
    what the installed metadata would say (markers included)."""
    requires, version = installer.checkout_requirements(str(ROOT / "pyproject.toml"))
    assert version == "0.1.0"
    assert sorted(map(str, map(Requirement, requires))) == sorted(
        map(str, map(Requirement, _wheel_requires(wheel)))
    )


def _dependency_closure(requirements: list[str]) -> set[str]:
    """Canonical names of the installed distributions ``requirements`` pull in (extras too)."""
    seen: set[str] = set()
    todo = [(Requirement(r), ()) for r in requirements]
    while todo:
        requirement, extras = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        wanted = tuple(sorted(requirement.extras))
        if (name, wanted) in seen or (
            requirement.marker
            and not any(requirement.marker.evaluate({"extra": e}) for e in (extras or ("",)))
        ):
            continue
        seen.add((name, wanted))
        dist = importlib.metadata.distribution(name)
        for line in dist.requires or []:
            todo.append((Requirement(line), wanted))
    return {name for name, _ in seen}


def _dependency_view(
    requirements: list[str], view: pathlib.Path, leave_out: set[str] = frozenset()
) -> pathlib.Path:
    """A folder of links to the installed files of the closure of ``requirements``, less the
    distributions ``leave_out`` (canonical names) and kda_lib."""
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    view.mkdir()
    left_out = {
        file.parts[0]
        for name in leave_out
        for file in importlib.metadata.distribution(name).files or []
    }
    for name in _dependency_closure(requirements) - {"kda-lib", *leave_out}:
        for file in importlib.metadata.distribution(name).files or []:
            top = file.parts[0]
            if top in left_out:
                continue
            if top != ".." and (site / top).exists() and not (view / top).exists():
                (view / top).symlink_to(site / top)
    return view


def _repack(name: str, folder: pathlib.Path) -> pathlib.Path:
    """A wheel of the installed distribution ``name``, from its installed files (RECORD)."""
    dist = importlib.metadata.distribution(name)
    site = pathlib.Path(dist.locate_file(""))
    files = [f for f in dist.files or [] if f.parts[0] != ".." and "__pycache__" not in f.parts]
    (info,) = {f.parts[0] for f in files if f.parts[0].endswith(".dist-info")}
    tags = [
        t.split(":", 1)[1].strip()
        for t in dist.read_text("WHEEL").splitlines()
        if t.startswith("Tag:")
    ]
    python, abi, platform = (".".join(sorted({t.split("-")[i] for t in tags})) for i in range(3))
    wheel = folder / f"{info.removesuffix('.dist-info')}-{python}-{abi}-{platform}.whl"
    record = []
    with zipfile.ZipFile(wheel, "w") as zf:
        for file in files:
            if file.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            data = (site / file).read_bytes()
            zf.writestr(file.as_posix(), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{file.as_posix()},sha256={digest.decode()},{len(data)}")
        zf.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return wheel


def _fresh_venv(path: pathlib.Path, view: pathlib.Path) -> tuple[pathlib.Path, str]:
    """A venv without pip that sees the installed files linked in ``view`` (a ``.pth`` line);
    returns its python and its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (pathlib.Path(purelib) / "project_dependencies.pth").write_text(f"{view}\n")
    return python, purelib


def _offline_env(venv: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", JAX_PLATFORMS="cpu")
    # pip --no-compile: no .pyc of every installed module (Python compiles what is imported)
    env.update(PIP_COMPILE="0")
    # the user's flags plus the fast-compile ones, as test_notebooks runs notebook 00 (its
    # time is compilation), not the simulated devices of the unit tests
    env["XLA_FLAGS"] = with_flags(USER_XLA_FLAGS, FAST_COMPILE_FLAGS)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


@WHEEL
@pytest.mark.slow
def test_a_plain_install_brings_no_tokamax_and_runs_the_readme_first_snippet(wheel, tmp_path):
    """`pip install kda-lib` (the wheel, no extras, offline) where the core's dependencies are
    installed and tokamax is not: pip finds nothing missing, and the README's first snippet
    runs without tokamax."""
    core = [r for r in _wheel_requires(wheel) if Requirement(r).marker is None]
    view = _dependency_view([*core, "pip"], tmp_path / "deps")
    assert not (view / "tokamax").exists()
    python, purelib = _fresh_venv(tmp_path / "venv", view)
    env = _offline_env(tmp_path / "venv")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-build-isolation", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]  # no index: nothing else to fetch
    readme = (ROOT / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    check = (
        f"{snippet}\nimport importlib.util\n"
        "print('tokamax', importlib.util.find_spec('tokamax'), 'kda_lib', kda_lib.__file__)\n"
    )
    run = subprocess.run(
        [python, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("tokamax ")]
    _, found, _, module = line.split()
    assert found == "None" and module.startswith(purelib), line


def _run_notebook(python, workdir, env, find_links) -> subprocess.CompletedProcess:
    command = [python, "-m", "papermill", "--no-progress-bar", "-k", "python3"]
    return subprocess.run(
        [*command, "--cwd", str(workdir), "00.ipynb", "00-executed.ipynb"],
        cwd=workdir,
        env={**env, "PIP_FIND_LINKS": str(find_links)},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _outputs(executed: pathlib.Path, kind: str) -> list[dict]:
    cells = json.loads(executed.read_text())["cells"]
    return [
        o
        for c in cells
        if c["cell_type"] == "code"
        for o in c["outputs"]
        if o["output_type"] == kind
    ]


@pytest.mark.slow
def test_colab_path_installs_what_is_missing_says_why_pip_failed_and_runs_notebook_00(
    wheel, tmp_path
):
    # the core and the notebook extra's requirements, the extras it names (tokamax) expanded,
    # as the install cell plans them
    kda_requires = list(installer.plan_install(_wheel_requires(wheel), "cpu", {}).requirements)
    # a runtime with jax, Jupyter and matplotlib: kda_lib's other requirements are missing
    # (matplotlib stays: compiling its 8 MB of Python on install would add 10-20 s)
    names = {Requirement(r).name.lower().replace("_", "-") for r in kda_requires}
    missing = names - {"jax", "jaxlib", "numpy", "matplotlib"}
    assert {"flax", "optax", "tokamax", "ipywidgets"} <= missing
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in sorted(missing):
        _repack(name, wheels)
    view = _dependency_view(
        [*kda_requires, *RUNNER_REQUIREMENTS, "pip"], tmp_path / "deps", leave_out=missing
    )
    python, purelib = _fresh_venv(tmp_path / "venv", view)

    notebook = json.loads(NOTEBOOK.read_text())
    setup_cells = [c for c in notebook["cells"] if "KDA_LIB_SOURCE = " in "".join(c["source"])]
    assert len(setup_cells) == 1, "notebook 00 has no setup cell with an install line"
    source = "".join(setup_cells[0]["source"])
    start = source.index('KDA_LIB_SOURCE = "') + len('KDA_LIB_SOURCE = "')
    setup_cells[0]["source"] = source[:start] + str(wheel) + source[source.index('"', start) :]
    # the notebook up to its imports cell (parameters, install, imports, setup()): the rest is
    # kda_lib's code, which tests/teaching/test_notebooks.py runs in full; here one call of it
    # shows the installed package computes, then what notebooks 03 and 08 load: the recorded
    # benchmarks and training results
    (imports,) = [
        i
        for i, c in enumerate(notebook["cells"])
        if "kda_lib.teaching.notebook.setup()" in "".join(c["source"])
    ]
    assert notebook["cells"].index(setup_cells[0]) < imports
    notebook["cells"] = notebook["cells"][: imports + 1]
    notebook["cells"] += [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
        for s in (ONE_CALL, RECORDED_CHECK)
    ]
    workdir = tmp_path / "colab"  # no checkout here or above it
    workdir.mkdir()
    (workdir / "00.ipynb").write_text(json.dumps(notebook))
    executed = workdir / "00-executed.ipynb"

    env = _offline_env(tmp_path / "venv")

    # 1. nothing to install the dependencies from: the cell installs kda_lib (--no-deps), then
    # stops with one line naming pip's reason and the command to run, and no traceback
    (tmp_path / "no-wheels").mkdir()
    run = _run_notebook(python, workdir, env, tmp_path / "no-wheels")
    assert run.returncode != 0, "the notebook ran without its dependencies"
    (error,) = _outputs(executed, "error")
    assert error["ename"] == "InstallFailed", error
    (line,) = error["traceback"]
    assert line.startswith(
        "InstallFailed: pip could not install kda_lib's dependencies (ERROR: "
    ), line
    reason = line.split(";")[0]  # what pip could not find: one of the missing requirements
    assert any(f"requirement {name}" in reason for name in missing), line
    assert f"run `{python} -m pip install " in line and "\n" not in line.rstrip(), line
    printed = "".join("".join(o["text"]) for o in _outputs(executed, "stream"))
    assert "Installing kda_lib from" in printed and "ERROR" not in printed, printed[:2000]
    assert "Traceback" not in printed, printed[:2000]

    # 2. with the wheels: kda_lib is there (from the wheel, --no-deps), flax and the rest are
    # not; the cell installs them and the cells complete
    run = _run_notebook(python, workdir, env, wheels)
    assert run.returncode == 0, f"notebook 00 failed in the fresh venv:\n{run.stderr[-6000:]}"
    printed = "".join("".join(o["text"]) for o in _outputs(executed, "stream"))
    summary = "kda_lib 0.1.0 installed with its core requirements for the CPU of this machine"
    assert summary in printed, printed[:2000]
    # the install says what it does before pip's silent minutes; setup() names no folder
    (before,) = [line for line in printed.splitlines() if "Installing kda_lib's" in line]
    assert before.startswith("Installing kda_lib's dependencies (flax, optax missing): jax"), before
    # only what notebook 00 imports: neither tokamax (03) nor ipywidgets (02)
    assert "tokamax" not in before and "ipywidgets" not in before, before
    assert "not installed: ['tokamax', 'ipywidgets']" in printed, printed[-2000:]
    (setup_line,) = [line for line in printed.splitlines() if "| kda_lib" in line]
    assert setup_line.endswith("| kda_lib 0.1.0 (installed)"), setup_line
    assert "one call: (1, 20, 2, 8) float32 finite True" in printed, printed[-2000:]
    (line,) = [line for line in printed.splitlines() if line.startswith("recorded:")]
    _, module, benchmarks, n_runs, n_results = line.split()
    assert module.startswith(purelib) and benchmarks.startswith(purelib), line
    assert int(n_runs) >= 1 and int(n_results) >= 1, line


def _code(source: pathlib.Path) -> str:
    """A notebook's code without its comments (markdown cells are comments in the .py)."""
    tokens = tokenize.generate_tokens(io.StringIO(source.read_text()).readline)
    return " ".join(t.string for t in tokens if t.type != tokenize.COMMENT)


def test_each_install_cell_checks_the_modules_its_notebook_imports_and_no_more():
    """The install cell skips the install only if these are all there: each third-party module
    a notebook imports must be among its NEEDED (IPython comes with every Jupyter kernel), and
    what kda_lib imports only for some notebooks is asked for only there: tokamax where the
    notebook's code runs tokamax's kernels (an implementation="tokamax_*", emulate_tpu, or 03's
    kda_forms, which times tokamax's chunked form), ipywidgets where it asks for sliders."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import notebook_setup

    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    for source in sources:
        imported = set()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        third_party = imported - set(sys.stdlib_module_names) - {"IPython"}
        assert "numpy" in third_party, f"{source.name}: no numpy import found: the parser broke"
        needed = notebook_setup.needed_modules(source.name)
        assert third_party <= set(needed), (source.name, sorted(third_party - set(needed)))
        code = _code(source)
        uses_tokamax = bool(re.search(r"""["']tokamax_|emulate_tpu|kda_forms \(""", code))
        assert ("tokamax" in needed) is uses_tokamax, source.name
        assert ("ipywidgets" in needed) is ("interactive (" in code), source.name
        line = "NEEDED = (" + ", ".join(f'"{m}"' for m in needed) + ")\n"
        assert line in source.read_text(), source.name
    assert set(notebook_setup.NEEDED_MODULES) == {
        m for s in sources for m in notebook_setup.needed_modules(s.name)
    }
