"""The notebooks' installer (kda_lib/teaching/install.py): its plans (only what the notebook
lacks; tokamax skipped below Python 3.12), its pip call, the install cell that runs it by path
(from an installed kda_lib or a checkout's), and the file itself run where jax, numpy, flax,
tokamax and kda_lib cannot be imported (a fresh runtime)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from kda_lib.teaching import install as installer

ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "kda_lib" / "teaching" / "install.py"
REQUIRES = [
    "jax>=0.12.0.1",
    "jaxlib>=0.12.0.1",
    "numpy>=2.5.5",
    'tokamax>=0.0.17; python_version >= "3.12" and extra == "tokamax"',
    'kda-lib[tokamax]; extra == "notebook"',
    'matplotlib>=3.11.2; extra == "notebook"',
    'jax[cuda13]>=0.12.0.1; extra == "gpu"',
    'jax[cuda12]>=0.12.0.1; extra == "cuda12"',
    'jax[tpu]>=0.12.0.1; extra == "tpu"',
    'kda-lib[tokamax]; extra == "tpu"',
    'pytest>=9; extra == "dev"',
]
PY312 = (3, 12)  # where tokamax installs


# ----------------------------------------------------------------------------- install plans
def test_plan_keeps_a_new_enough_runtime_jax_and_adds_no_accelerator_build():
    installed = {"jax": "0.13.0", "jaxlib": "0.13.0", "jax-cuda12-plugin": "0.13.0"}
    plan = installer.plan_install(
        REQUIRES, "gpu", installed, colab=True, version="0.1.0", python=PY312
    )
    assert plan.extras == ("notebook",) and plan.skipped == ()
    assert plan.requirements == (  # the extra the notebook extra names, expanded
        "jax>=0.12.0.1",
        "jaxlib>=0.12.0.1",
        "numpy>=2.5.5",
        "tokamax>=0.0.17",
        "matplotlib>=3.11.2",
    )
    assert set(plan.constraints) == {"jax==0.13.0", "jaxlib==0.13.0", "jax-cuda12-plugin==0.13.0"}
    assert "kept the runtime's jax 0.13.0" in plan.summary and "Colab" in plan.summary
    assert plan.summary.startswith(
        "kda_lib 0.1.0 installed with its core requirements and tokamax, matplotlib for the GPU"
    )


def test_plan_replaces_an_old_runtime_jax_with_the_same_accelerator_build():
    installed = {"jax": "0.4.30", "jaxlib": "0.4.30", "jax-cuda12-plugin": "0.4.30"}
    plan = installer.plan_install(REQUIRES, "gpu", installed)
    assert plan.extras == ("notebook", "cuda12")  # stays on the runtime's CUDA 12
    assert plan.constraints == ()
    assert "jax[cuda12]>=0.12.0.1" in plan.requirements
    assert "replaced the runtime's jax 0.4.30 (kda_lib needs >= 0.12.0.1)" in plan.summary


def test_plan_adds_the_tpu_build_where_jax_cannot_drive_the_tpu():
    no_libtpu = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1"}
    plan = installer.plan_install(REQUIRES, "tpu", no_libtpu, python=PY312)
    assert plan.extras == ("notebook", "tpu")
    assert "jax[tpu]>=0.12.0.1" in plan.requirements
    assert plan.requirements.count("tokamax>=0.0.17") == 1  # named by both extras, once
    assert not [r for r in plan.requirements if r.startswith("kda-lib")]
    assert "jax==0.12.0.1" in plan.constraints  # the extra adds libtpu, jax stays
    with_libtpu = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "libtpu": "0.0.50"}
    plan = installer.plan_install(REQUIRES, "tpu", with_libtpu)
    assert plan.extras == ("notebook",)
    plan = installer.plan_install(REQUIRES, "gpu", {})
    assert plan.extras == ("notebook", "gpu") and "installed jax" in plan.summary
    old_jaxlib = {"jax": "0.12.0.1", "jaxlib": "0.11.2", "libtpu": "0.0.40"}
    plan = installer.plan_install(REQUIRES, "tpu", old_jaxlib)
    assert plan.extras == ("notebook", "tpu") and plan.constraints == ()


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="accelerator"):
        installer.plan_install(REQUIRES, "npu", {})
    for marker in ("sys_platform == 'linux'", "python_version < '3.13' or extra == 'x'"):
        with pytest.raises(ValueError, match="marker"):
            installer.plan_install([f"jax>=0.12; {marker}"], "cpu", {})


def test_plan_asks_only_for_the_missing_modules_of_the_extras():
    """A notebook without sliders or tokamax lacking matplotlib: the core and matplotlib, not
    tokamax (not even through the tpu extra), but the TPU build of JAX where JAX cannot drive
    the TPU."""
    plan = installer.plan_install(REQUIRES, "cpu", {}, modules=["matplotlib"], python=PY312)
    assert plan.requirements == ("jax>=0.12.0.1", "jaxlib>=0.12.0.1", "numpy>=2.5.5",
                                 "matplotlib>=3.11.2")  # fmt: skip
    assert "with its core requirements and matplotlib for the CPU" in plan.summary
    plan = installer.plan_install(REQUIRES, "tpu", {}, modules=["flax"], python=PY312)
    assert plan.extras == ("notebook", "tpu")
    assert plan.requirements == ("jax>=0.12.0.1", "jaxlib>=0.12.0.1", "numpy>=2.5.5",
                                 "jax[tpu]>=0.12.0.1")  # fmt: skip
    plan = installer.plan_install(REQUIRES, "cpu", {}, modules=["tokamax"], python=PY312)
    assert plan.requirements[-1] == "tokamax>=0.0.17"


def test_plan_skips_tokamax_below_python_3_12_with_one_line_saying_why():
    """A TPU image's Python 3.11: tokamax's marker fails, so the plan leaves it out and says
    why, for the notebook extra and the tpu extra alike; on 3.12 and 3.13 it is asked for."""
    for accelerator in ("cpu", "tpu"):
        plan = installer.plan_install(REQUIRES, accelerator, {}, python=(3, 11, 7))
        assert not [r for r in plan.requirements if r.startswith("tokamax")], plan.requirements
        assert plan.skipped == (
            "Skipping tokamax: its releases need Python >= 3.12 and this is Python 3.11 (what "
            "needs tokamax raises an error saying so)",
        )
        assert plan.skipped_names == ("tokamax",) and "matplotlib>=3.11.2" in plan.requirements
    for python in ((3, 12), (3, 13)):
        plan = installer.plan_install(REQUIRES, "cpu", {}, python=python)
        assert "tokamax>=0.0.17" in plan.requirements and plan.skipped == ()


def test_checkout_requirements_read_pyproject_as_the_metadata_writes_them(tmp_path):
    """A checkout's kda_lib (importable, not installed): its requirements come from its
    pyproject.toml, markers joined to the extra as in the installed metadata."""
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "kda-lib"\nversion = "9.9"\ndependencies = ["jax>=0.10.2"]\n'
        "[project.optional-dependencies]\n"
        """tokamax = ['tokamax>=0.0.17; python_version >= "3.12"']\n"""
        'notebook = ["kda-lib[tokamax]", "matplotlib>=3"]\n'
    )
    requires, version = installer.checkout_requirements(str(pyproject))
    assert version == "9.9"
    assert requires == [
        "jax>=0.10.2",
        'tokamax>=0.0.17; python_version >= "3.12" and extra == "tokamax"',
        'kda-lib[tokamax]; extra == "notebook"',
        'matplotlib>=3; extra == "notebook"',
    ]
    plan = installer.plan_install(requires, "cpu", {}, python=(3, 11), checkout=True)
    assert plan.requirements == ("jax>=0.10.2", "matplotlib>=3") and plan.skipped_names == (
        "tokamax",
    )
    assert plan.summary.startswith("kda_lib (from the checkout, not installed) with its core")


def test_detect_accelerator_from_the_runtime_variables():
    assert installer.detect_accelerator({"TPU_ACCELERATOR_TYPE": "v5litepod-1"}) == "tpu"
    assert installer.detect_accelerator({"COLAB_TPU_ADDR": "10.0.0.2:8470"}) == "tpu"


def test_install_dependencies_runs_one_pip_command_and_reports_failure(capsys, monkeypatch):
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(sys, "version_info", (3, 12, 1, "final", 0))
    plan = installer.install_dependencies(run=fake_pip, missing=["jax", "tokamax"])
    ((command,),) = [calls]
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert command[-len(plan.requirements) :] == list(plan.requirements)
    assert any(r.startswith("tokamax") for r in plan.requirements)
    assert not [r for r in plan.requirements if r.startswith(("matplotlib", "ipywidgets"))]
    before, after = capsys.readouterr().out.strip().splitlines()
    # what is about to happen, before pip's silent minutes; then what happened, and how long
    assert before.startswith("Installing kda_lib's dependencies (jax, tokamax missing): jax, ")
    assert "about 90 packages" in before and "minutes" in before
    assert re.fullmatch(re.escape(plan.summary) + r" \(\d+ s\)", after)
    calls.clear()
    installer.install_dependencies(run=fake_pip, missing=["flax"])  # no tokamax: no 90 packages
    assert calls and "about 90 packages" not in capsys.readouterr().out


def test_install_dependencies_below_python_3_12_skips_tokamax_with_one_line(
    capsys, monkeypatch
):
    """On a Python 3.11 TPU image, notebook 03 lacks only tokamax: one line says why it is
    skipped, and pip does not run; lacking matplotlib too, pip installs the rest."""
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    requires, version = installer.checkout_requirements(str(ROOT / "pyproject.toml"))
    # this checkout's requirements, whichever kda-lib's metadata this environment holds
    monkeypatch.setattr(installer, "_kda_lib_requirements", lambda: (requires, version, False))
    monkeypatch.setattr(sys, "version_info", (3, 11, 7, "final", 0))
    plan = installer.install_dependencies(run=fake_pip, missing=["tokamax"])
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("Skipping tokamax: its releases need Python >= 3.12 and this is "
                           "Python 3.11")  # fmt: skip
    assert calls == [] and plan.skipped_names == ("tokamax",)
    installer.install_dependencies(run=fake_pip, missing=["tokamax", "matplotlib"])
    ((command,),) = [calls]
    assert not [c for c in command if c.startswith("tokamax")]
    assert [c for c in command if c.startswith("matplotlib")]


# what pip prints where it cannot reach the network (offline, or an index it cannot see)
PIP_OFFLINE = """\
ERROR: Could not find a version that satisfies the requirement tokamax>=0.0.17 (from versions: none)
ERROR: No matching distribution found for tokamax>=0.0.17
"""
# and where git cannot clone kda_lib (pip 26, git 2.4x)
PIP_GIT_FAILED = """\
  error: subprocess-exited-with-error

  × git clone --quiet https://github.com/o/n /tmp/pip-req-build-x did not run successfully.
  │ exit code: 128
  ╰─> [1 lines of output]
      fatal: unable to access 'https://github.com/o/n/': Could not resolve host: github.com
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
ERROR: Failed to build 'git+https://github.com/o/n' when git clone --filter=blob:none --quiet
"""


def test_pip_reason_is_the_line_that_says_why():
    first = PIP_OFFLINE.splitlines()[0]
    assert installer.pip_reason(PIP_OFFLINE) == first
    assert installer.pip_reason(PIP_GIT_FAILED).startswith("fatal: unable to access")
    assert installer.pip_reason("  something odd\n  last words \n") == "last words"
    assert installer.pip_reason("") == "no output"
    coloured = "\x1b[31mERROR: No matching distribution found for flax\x1b[0m\n"
    assert installer.pip_reason(coloured) == "ERROR: No matching distribution found for flax"


def test_a_failing_pip_ends_the_install_with_one_line_saying_why_and_what_to_run(capsys):
    """No pip output and no traceback: Jupyter shows InstallFailed as its one line."""

    def failing_pip(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", PIP_OFFLINE)

    with pytest.raises(installer.InstallFailed) as failed:
        installer.install_dependencies(run=failing_pip, missing=["flax", "matplotlib"])
    (line,) = failed.value._render_traceback_()
    assert "\n" not in line and line == f"InstallFailed: {failed.value}"
    assert "could not install kda_lib's dependencies (ERROR: Could not find a version" in line
    # the command to run by hand: this interpreter's pip and the plan's requirements
    by_hand = re.search(r"run `([^`]*)`", line).group(1)
    assert by_hand.startswith(f"{sys.executable} -m pip install ") and "matplotlib" in by_hand
    assert isinstance(failed.value, RuntimeError)
    assert "No matching distribution" not in capsys.readouterr().out  # pip's lines not echoed


def test_install_cell_installs_what_is_missing_even_when_kda_lib_is_there(monkeypatch):
    """An install cut short leaves kda_lib without jax: the cell must not skip the install."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import notebook_setup

    block = notebook_setup.install_block(notebook_setup.repository_url(), "03_chunkwise_algorithm")
    real_find_spec = importlib.util.find_spec
    calls = []
    monkeypatch.setattr(sys, "path", list(sys.path))  # the block may append a checkout

    def find_spec(name, *args):
        return None if name == "jax" else real_find_spec(name, *args)

    def no_pip(command, **kwargs):
        raise AssertionError(f"kda_lib is installed: no pip install of it, got {command}")

    def run_path(path, *args, **kwargs):
        assert pathlib.PurePath(path).parts[-2:] == ("teaching", "install.py")
        return {"install_dependencies": lambda **kw: calls.append(kw)}

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "run", no_pip)
    monkeypatch.setattr("runpy.run_path", run_path)
    exec(block, {})
    assert calls == [{"missing": ["jax"]}]
    calls.clear()
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    exec(block, {})  # everything there: nothing runs
    assert calls == []


def test_install_cell_ends_with_one_line_where_pip_cannot_install_kda_lib(monkeypatch):
    """No network or a private fork: the cell stops with git's reason and the command to run,
    shown by Jupyter as one line, and runs no installer."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import notebook_setup

    url = notebook_setup.repository_url()
    block = notebook_setup.install_block(url, "00_quickstart")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "kda_lib" else real_find_spec(name, *args),
    )
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda command, **kw: subprocess.CompletedProcess(command, 1, "", PIP_GIT_FAILED),
    )
    monkeypatch.setattr("runpy.run_path", lambda *a, **k: pytest.fail("the installer ran"))
    with pytest.raises(RuntimeError) as failed:
        exec(block, {})
    (line,) = failed.value._render_traceback_()
    assert line.startswith("InstallFailed: pip could not install kda_lib (fatal: unable to access")
    assert f"run `pip install git+{url}`" in line and "\n" not in line


def test_install_cell_takes_kda_lib_from_the_checkout_it_sits_in(tmp_path):
    """A checkout without kda_lib installed (a TPU image where the package does not build
    offline): the cell, run from the checkout's notebooks/ folder or its root, imports the
    checkout's kda_lib (no pip install of it, no failing metadata lookup of kda-lib), and the
    installer reads the checkout's pyproject.toml. Run with ``-S`` (no site-packages: no kda-lib
    installed), the installer as a dry run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import notebook_setup

    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    (checkout / "kda_lib").symlink_to(ROOT / "kda_lib")
    (checkout / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    block = notebook_setup.install_block(notebook_setup.repository_url(), "00_quickstart")
    script = textwrap.dedent(
        """
        import importlib.metadata, runpy, subprocess, sys
        def no_pip(*args, **kwargs):
            raise SystemExit(f"pip ran: {args}")
        subprocess.run = no_pip
        real_run_path = runpy.run_path
        def dry_run_path(path, *args, **kwargs):
            namespace = real_run_path(path, *args, **kwargs)
            install = namespace["install_dependencies"]
            namespace["install_dependencies"] = lambda **kw: install(dry_run=True, **kw)
            return namespace
        runpy.run_path = dry_run_path
        try:
            importlib.metadata.version("kda-lib")
        except importlib.metadata.PackageNotFoundError:
            print("kda-lib not installed")
        """
    ) + block + "print('kda_lib from', importlib.util.find_spec('kda_lib').origin)\n"
    for cwd in (checkout / "notebooks", checkout):
        run = subprocess.run(
            [sys.executable, "-S", "-c", script], cwd=cwd, capture_output=True, text=True,
            env={"PATH": "/usr/bin:/bin"}, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
        lines = run.stdout.splitlines()
        assert lines[0] == "kda-lib not installed", run.stdout
        (plan,) = [line for line in lines if "would run:" in line]
        assert plan.startswith("kda_lib 0.1.0 (from the checkout, not installed) with its core")
        assert "Installing kda_lib from" not in run.stdout
        assert lines[-1] == f"kda_lib from {checkout / 'kda_lib' / '__init__.py'}", run.stdout


# modules a fresh runtime lacks: the installer must run without any of them
BLOCKED = ("jax", "jaxlib", "numpy", "flax", "optax", "tokamax", "kda_lib")
BLOCKER = """
import importlib.abc
import sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
"""


def _run_blocked(body: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    script = f"BLOCKED = {BLOCKED!r}\n" + BLOCKER + textwrap.dedent(body)
    # -S: no site-packages .pth hooks (the editable kda_lib); -I would drop PYTHONPATH too
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )


def test_the_installer_runs_with_jax_numpy_flax_tokamax_and_kda_lib_blocked(tmp_path):
    """Run by path as the install cell does, with every third-party module it must not need
    blocked: it plans, prints the plan and the pip command (dry run), and imports none of them."""
    run = _run_blocked(
        f"""
        import runpy
        for name in BLOCKED:  # the blocker works
            try:
                __import__(name)
            except ModuleNotFoundError:
                pass
            else:
                raise SystemExit(f"{{name}} imported despite the blocker")
        namespace = runpy.run_path({str(INSTALLER)!r})
        plan = namespace["install_dependencies"](dry_run=True, missing=["jax", "flax"])
        print("extras", ",".join(plan.extras))
        print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "would run:" in run.stdout and "pip install" in run.stdout
    assert "extras notebook" in run.stdout
    assert "loaded []" in run.stdout


def test_the_installer_as_a_script_with_blocked_imports(tmp_path):
    """`python kda_lib/teaching/install.py --dry-run` (the cell's second step by hand)."""
    run = _run_blocked(
        f"""
        import runpy
        sys.argv = [{str(INSTALLER)!r}, "--dry-run"]
        runpy.run_path({str(INSTALLER)!r}, run_name="__main__")
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "would run:" in run.stdout


def test_the_blocker_would_catch_an_installer_that_imports_kda_lib(tmp_path):
    """The blocked run fails for an installer that imports kda_lib at its top (the bug the
    layout fixed: notebook.py imported kda_lib._checks, which imports jax)."""
    broken = tmp_path / "install.py"
    future = "from __future__ import annotations\n"
    broken.write_text(
        INSTALLER.read_text().replace(future, future + "from kda_lib.checks import is_int\n", 1)
    )
    run = _run_blocked(f"import runpy\nrunpy.run_path({str(broken)!r})\n", tmp_path)
    assert run.returncode != 0 and "blocked" in run.stderr
