"""Shared fixtures. Eight simulated CPU devices are configured before jax is imported so the
context-parallel tests can build meshes; every other test runs on device 0 as usual.

The tests compile many small programs and run each once or twice, so XLA:CPU's compile time
dominates the suite; its fast-compile flags (no LLVM optimisation) roughly halve it. Notebooks
are executed with the environment's own XLA_FLAGS (``USER_XLA_FLAGS``) plus the fast-compile
flags where their time is compilation (``tests/teaching/test_notebooks.py`` says which,
measured)."""

import atexit
import contextlib
import gc
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

USER_XLA_FLAGS = os.environ.get("XLA_FLAGS")
# the suite's defaults; a flag the user already set keeps the user's value. The last two are
# kda_lib.lab.emulation.FAST_COMPILE_OPTIONS as flags (importing kda_lib here would import jax).
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
SUITE_XLA_FLAGS = ("--xla_force_host_platform_device_count=8", *FAST_COMPILE_FLAGS)


def with_flags(user_flags: str | None, flags) -> str:
    """``user_flags`` with each of ``flags`` the user did not set already appended."""
    user = user_flags or ""
    return " ".join([*user.split(), *(f for f in flags if f.split("=")[0] not in user)])


os.environ["XLA_FLAGS"] = with_flags(USER_XLA_FLAGS, SUITE_XLA_FLAGS)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402
from extended import EXTENDED  # noqa: E402  # tests/extended.py: what make test leaves out
from flax import nnx  # noqa: E402
from jax._src import lru_cache  # noqa: E402  # the file cache's writer (see _put_whole)

# Many tests build the same program from new Python objects (a fresh model, a new closure), which
# jax's in-memory caches cannot match, so XLA compiles it again. jax's persistent cache keys on
# the program itself: with it on, each distinct program compiles once per run (-17% on
# tests/layers/test_kda_layer.py, measured). One empty directory per `pytest` run, made by the
# first process (the xdist controller, whose workers inherit the variable) and removed by it at
# exit, so a run tests no state left by an earlier one and the two workers share their
# compilations (a third of the programs a worker compiles, the other compiles too). jax writes
# an entry in place without a lock, so a reader could see half a file: entries are written under
# a temporary name and renamed (atomic on one filesystem). Only pytest's processes use it (set
# through jax.config, not jax's environment variable): notebook kernels and the multi-process
# tests compile for themselves.
if "KDA_TESTS_JAX_CACHE" not in os.environ:
    os.environ["KDA_TESTS_JAX_CACHE"] = tempfile.mkdtemp(prefix="kda-tests-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["KDA_TESTS_JAX_CACHE"], ignore_errors=True)
COMPILE_CACHE_DIR = os.environ["KDA_TESTS_JAX_CACHE"]
if not hasattr(jax, "enable_x64"):  # JAX < 0.11 (a TPU image's 0.10.2): the same context

    @contextlib.contextmanager
    def _enable_x64(on: bool = True):
        before = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", on)
        try:
            yield
        finally:
            jax.config.update("jax_enable_x64", before)

    jax.enable_x64 = _enable_x64

# `make test-tpu` (JAX_PLATFORMS=tpu): the chip's default float32 matmul is one bfloat16 pass
# (about three digits), so the tests that hold float32 forms to the CPU's tolerances (1e-5)
# run at full precision there, as a user checking values would; the Pallas kernels choose
# their own passes (the same on both)
if jax.default_backend() == "tpu":
    jax.config.update("jax_default_matmul_precision", "highest")
    # float64 (the oracles) on the host's CPU: the chip has none (a float64 oracle test on the
    # v5e ran for over 6 minutes without finishing, 2026-12-06); make test-tpu keeps the CPU
    # platform beside the TPU (JAX_PLATFORMS=tpu,cpu)
    _enable_x64_here = jax.enable_x64

    @contextlib.contextmanager
    def _enable_x64_on_cpu(on: bool = True):
        with _enable_x64_here(on), jax.default_device(jax.devices("cpu")[0] if on else None):
            yield

    jax.enable_x64 = _enable_x64_on_cpu
jax.config.update("jax_compilation_cache_dir", COMPILE_CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _put_whole(cache, key: str, value: bytes) -> None:
    """jax's file-cache ``put`` (no eviction: the default size limit) written to a temporary
    name and renamed, so that another process reads a whole entry or none."""
    path = cache.path / f"{key}{lru_cache._CACHE_SUFFIX}"
    if not path.exists():
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_bytes(value)
        os.replace(partial, path)


assert jax.config.jax_compilation_cache_max_size == -1  # the only case _put_whole covers
lru_cache.LRUCache.put = _put_whole

# Python's cyclic garbage collector, tuned for a long test process: a worker's heap grows to
# millions of objects (traced programs, compiled executables, collected test items), and at the
# default thresholds (2000, 10, 10) the full collections, which walk all of them, ran 37-46 times
# a worker and took 18-19 s of its time, all collections about 23 s; at (50000, 20, 10) a worker
# ran 5 full collections (0.1 s) and about 4 s of collections in all (gc.callbacks, one whole
# `make test` each, Python 3.12.1, 2026-12-05). Young objects are still collected, every 50,000
# net allocations. The thresholds mean this on Python 3.12 and 3.13; 3.14's incremental
# collector reads them differently, so it keeps its defaults.
if sys.version_info < (3, 14):
    gc.set_threshold(50_000, 20, 10)


@pytest.fixture(scope="session", autouse=True)
def _record_platform(request, record_testsuite_property):
    """Under ``--junitxml`` (``make test-tpu``'s record in data/): the device and versions."""
    if request.config.option.xmlpath:
        import flax
        import jaxlib

        device = jax.devices()[0]
        for name, value in (
            ("device_kind", device.device_kind),
            ("platform", device.platform),
            ("python", sys.version.split()[0]),
            ("jax", jax.__version__),
            ("jaxlib", jaxlib.__version__),
            ("flax", flax.__version__),
        ):
            record_testsuite_property(name, value)


# ``jitted_call(module, x, **kwargs)`` is ``module(x, **kwargs)`` for a layer or model, compiled
# as one program: called eagerly, each of its small ops compiles on its own at every new shape
# (about 16 ms each, up to 250 a test). Tests of errors raised before any work call the module.
jitted_call = nnx.jit(lambda module, x, **kwargs: module(x, **kwargs))



# Python's own refusal of a call's arguments ("got an unexpected keyword argument 'chunk_size'")
# names the argument too, but no check of the library's made it: such a misuse row fails
PYTHONS_OWN_REFUSAL = re.compile(r"got an unexpected keyword argument|missing \d+ required "
                                 r"(positional|keyword-only) argument|takes \d+ positional "
                                 r"argument|got multiple values for argument")  # fmt: skip


@pytest.fixture
def x64():
    """Run the test body with float64 enabled (the oracle's precision)."""
    with jax.enable_x64(True):
        yield


# jax settings a test may change only inside a `with` block or with its own restore: a leaked
# change alters every later test on the worker (other random draws, other precision)
GUARDED_SETTINGS = (
    "jax_threefry_partitionable",
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_default_prng_impl",
    "jax_default_device",
)


@pytest.fixture(autouse=True)
def _jax_settings_unchanged(request):
    before = {name: getattr(jax.config, name) for name in GUARDED_SETTINGS}
    yield
    after = {name: getattr(jax.config, name) for name in GUARDED_SETTINGS}
    changed = {name: (before[name], after[name]) for name in before if before[name] != after[name]}
    if changed:
        for name, (value, _) in changed.items():  # restore, so that one leak fails one test
            jax.config.update(name, value)
        pytest.fail(f"{request.node.nodeid} left jax settings changed (before, after): {changed}")


# the three training notebooks: the longest tests (45-60 s each), handed out first
LONGEST_NOTEBOOKS = ("synthetic_recall", "hybrid_language_model", "training_delayed_copy")

# the other tests of 10 s or more collected in the last quarter (tests/parallel, teaching), or
# of a minute or more anywhere (profile of the suite under `pytest -n 2`): started early as well
LONG_TESTS = (
    "test_colab_path_installs_what_is_missing_says_why_pip_failed_and_runs_notebook_00",
    "test_papermill_injects_parameters",
    "test_answers_that_break_the_stated_rule_are_refused",  # 13-32 s
    "test_context_parallel_layer_across_two_processes",  # 20-23 s
    "test_rule_breakers_are_refused",  # 13 s
    "test_correct_answers_written_differently_pass",  # 28-70 s (tests/teaching/test_redteam_0610)
    "test_index_lists_the_notebooks_in_order_with_a_line_and_a_thumbnail",  # builds the site
)


COLLECTED = pytest.StashKey[set]()  # every node id collected (tests/contracts/test_extended.py)


def pytest_collection_modifyitems(config, items):
    """Start the notebook executions and the other long tests first, the training notebooks
    (the longest tests) at the very front: `pytest -n 2` hands tests out in collection order,
    so a long test collected last would run alone at the end while the other worker idles."""

    def rank(item):
        if item.originalname == "test_notebook_executes":
            return 0 if any(n in item.name for n in LONGEST_NOTEBOOKS) else 1
        return 1 if item.originalname in LONG_TESTS else 2

    items.sort(key=rank)  # stable: the original order within each rank
    for item in items:
        node = item.nodeid.split("@")[0]  # xdist appends "@group" to a grouped test's id
        if node in EXTENDED:
            item.add_marker(pytest.mark.extended(EXTENDED[node]))
    config.stash[COLLECTED] = {item.nodeid.split("@")[0] for item in items}  # before -m


def pytest_unconfigure(config):
    """An xdist worker has sent its last report: let it end without a garbage collection.

    execnet (xdist's transport) sends a worker SIGINT when it is still running 5 s after the
    controller asked it to end; on a loaded machine a full collection over the session's heap
    (thousands of compiled programs and arrays) takes longer, and the SIGINT surfaced as a
    KeyboardInterrupt traceback in a gc callback just above the final "passed" line. The
    process is about to exit, so its cyclic garbage need not be collected."""
    if hasattr(config, "workerinput"):
        gc.freeze()
        gc.disable()


def load_fla_layer_fixture(case: str):
    """fla's recorded layer ``case`` (``data/fixtures/fla_layer_{case}.npz``): the KDAConfig of
    its config, its state_dict, input ``x: [B, T, d]`` and fla's output ``y: [B, T, d]``."""
    import numpy as np

    from kda_lib import KDAConfig

    data = np.load(f"data/fixtures/fla_layer_{case}.npz", allow_pickle=False)
    cfg = json.loads(str(data["config_json"]))
    config = KDAConfig(
        hidden_size=cfg["hidden_size"],
        num_heads=cfg["num_heads"],
        head_dim=cfg["head_dim"],
        conv_size=cfg["conv_size"],
        lower_bound=cfg["lower_bound"],
        forget_gate_rank=cfg["head_dim"],
        output_gate_rank=cfg["head_dim"],
        norm_eps=cfg["norm_eps"],
    )
    state_dict = {k.removeprefix("sd/"): data[k] for k in data.files if k.startswith("sd/")}
    return config, state_dict, data["x"], data["y"]


# --- shared by the tests of the scripts/ command lines. (Here, not in tests/lab/conftest.py: a
# second conftest module would shadow this one for `from conftest import ...`.)
def load_script(file_name: str):
    """``scripts/<file_name>`` imported as a module (registered in ``sys.modules``: dataclasses
    look their module up there)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / file_name
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# in a subprocess: loads the script by path (argv[1]) as ``script``, runs the patch source
# (argv[2]: e.g. replaces its training with a fast fake), then exits with the script's main on
# the remaining arguments
SCRIPT_RUNNER = textwrap.dedent(
    """
    import importlib.util, sys

    spec = importlib.util.spec_from_file_location("script_under_test", sys.argv[1])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    exec(sys.argv[2])
    sys.exit(script.main(sys.argv[3:]))
    """
)


# patch source for a SCRIPT_RUNNER subprocess: this run's persistent compilation cache (the
# directory above, entries written whole as in this process), so that processes running the
# same programs (a driver, then the same driver resumed) compile each of them once
SHARED_COMPILE_CACHE = textwrap.dedent(
    f"""
    import os as _os

    import jax as _jax
    from jax._src import lru_cache as _lru_cache

    def _put_whole(cache, key, value):
        path = cache.path / f"{{key}}{{_lru_cache._CACHE_SUFFIX}}"
        if not path.exists():
            partial = path.with_name(f".{{path.name}}.{{_os.getpid()}}")
            partial.write_bytes(value)
            _os.replace(partial, path)

    assert _jax.config.jax_compilation_cache_max_size == -1
    _lru_cache.LRUCache.put = _put_whole
    _jax.config.update("jax_compilation_cache_dir", {COMPILE_CACHE_DIR!r})
    _jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    _jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    """
)


@contextlib.contextmanager
def closed_stdout():
    """Within: ``sys.stdout`` a pipe whose reader has gone, as ``command | true`` leaves it."""
    read, write = os.pipe()
    os.close(read)
    stdout, saved = os.fdopen(write, "w"), sys.stdout
    sys.stdout = stdout
    try:
        yield
    finally:
        sys.stdout = saved
        with contextlib.suppress(OSError):  # what is still buffered has nowhere to go
            stdout.close()


@pytest.fixture
def concurrent_writers():
    """``run(script_path, patch, argvs)``: one process per argument list of ``argvs``, all
    started at once, each running ``script_path``'s ``main`` after ``patch`` (Python source
    that sees the loaded module as ``script``, e.g. ``script.run_one = fake``); fails the test
    with a process's stderr unless every one exits 0."""

    def run(script_path, patch: str, argvs: list[list[str]], timeout: float = 300) -> None:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT_RUNNER, str(script_path), textwrap.dedent(patch)]
                + list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for argv in argvs
        ]
        for process in processes:
            _, stderr = process.communicate(timeout=timeout)
            assert process.returncode == 0, stderr[-3000:]

    return run
