"""The misuse suite of the command lines (issue 55): every console script of pyproject.toml and
every script in scripts/ that takes arguments, each with a table of hostile arguments (empty,
unwritable and symlinked paths, damaged files, negative and zero numbers, a bool or a word for
an int, unknown names) and the refusal it must give: argparse's exit status 2 with a message
naming the option, before any work (each command's work functions are replaced by ones that
fail the test). A new command line is not done until it has its rows here."""

import importlib
import importlib.util
import pathlib
import tomllib

import pytest
from conftest import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNWRITABLE = "/proc/kda-misuse/run.json"  # no one, root included, makes a folder in /proc


_script = load_script


SWEEP = ["--phase", "all", "--tasks", "mqar", "--mixers", "kda", "--seq-lens", "mqar=8",
         "--num-pairs", "2", "--output", "{tmp}/sweep.json"]  # fmt: skip

# command -> (how to load it, the function called with argv, the work it must not reach,
# the arguments every row starts from; "{tmp}" is the test's folder)
COMMANDS = {
    "kda-train": (
        lambda: importlib.import_module("kda_lib.lab.train_cli"),
        "main",
        ["run_experiment"],
        ["stack", "--output", "{tmp}/run.json"],
    ),
    "kda-bench": (
        lambda: importlib.import_module("kda_lib.lab.bench"),
        "main",
        ["_plan_jobs", "policy_grid.run_grid"],
        ["--out", "{tmp}/bench.json"],
    ),
    "synthetic_sweep.py": (
        lambda: _script("synthetic_sweep.py"),
        "main",
        ["run_one", "Sweep"],
        SWEEP,
    ),
    "stdlib_lm_seeds.py": (
        lambda: _script("stdlib_lm_seeds.py"),
        "main",
        ["run_one", "Record"],
        ["--preset", "tiny", "--output", "{tmp}/seeds.json"],
    ),
    "auto_grad_vs_chunked.py": (
        lambda: _script("auto_grad_vs_chunked.py"),
        "main",
        ["kernel_inputs", "TimedProgram"],
        ["--out", "{tmp}/ratio.json"],
    ),
    "build_site.py": (
        lambda: _script("build_site.py"),
        "main",
        ["build_site"],
        ["--output", "{tmp}/html", "{tmp}/01_a.ipynb"],
    ),
    "check_browser.py": (
        lambda: _script("check_browser.py"),
        "main",
        ["check_site", "check_lab"],
        ["--site", "{tmp}/site", "--screenshots", "{tmp}/shots"],
    ),
    "train_step_table.py": (
        lambda: _script("train_step_table.py"),
        "main",
        ["seconds_per_step"],
        ["--output", "{tmp}/steps.json"],
    ),
    "run_notebooks_sandboxed.py": (
        lambda: _script("run_notebooks_sandboxed.py"),
        "main",
        ["run"],
        ["--output", "{tmp}/notebooks.json"],
    ),
    "notebook_setup.py": (
        lambda: _script("notebook_setup.py"),
        "main",
        ["set_repository_url", "problems"],
        [],
    ),
    "synthetic_protocol.py": (
        lambda: _script("synthetic_protocol.py"),
        "main",
        ["main_run", "build_protocol"],
        ["run", "--time-limit", "60"],
    ),
    "recall_capacity.py": (
        lambda: _script("recall_capacity.py"),
        "main",
        ["documents", "run", "sweep.Sweep", "sweep.run_one"],
        ["--output", "{tmp}/capacity.json", "--parts", "{tmp}/parts", "--pairs", "2,4"],
    ),
}

# a path option of each command that writes, and whether a file there is read first (resumed,
# or replaced only when it holds the command's own kind of record)
PATH_OPTIONS = {
    "kda-train": ("--output", True),
    "kda-bench": ("--out", True),
    "synthetic_sweep.py": ("--output", True),
    "stdlib_lm_seeds.py": ("--output", True),
    "auto_grad_vs_chunked.py": ("--out", False),
    "train_step_table.py": ("--output", False),
    "run_notebooks_sandboxed.py": ("--output", False),
    "recall_capacity.py": ("--output", True),
}


def _path_rows():
    """Each writing command against the odd paths: empty, unwritable, a symlink whose target
    cannot be made, and (for a resumed file) a damaged one."""
    for command, (option, resumed) in PATH_OPTIONS.items():
        yield command, [option, ""], f"{option}: the path is empty"
        yield command, [option, UNWRITABLE], f"{option}: cannot write '{UNWRITABLE}'"
        yield command, [option, "{tmp}/link.json"], f"{option}: '{{tmp}}/afile' is a file, so"
        if resumed:
            yield command, [option, "{tmp}/damaged.json"], f"{option}: '{{tmp}}/damaged.json'"
        # issue 75.4: a name past the folder's limit (255 bytes), or one whose temporary file
        # (".<name>.XXXXXXXX.tmp") would be: refused, not a raw OSError after the work
        for length in (300, 250):
            yield (command, [option, "{tmp}/" + "a" * length + ".json"],
                   f"{option}: cannot write '{{tmp}}/{'a' * length}.json': File name too long")
    # issue 75.4: another command's record (here a sweep's runs) is kept, not replaced
    for command in ("kda-train", "kda-bench"):
        option = PATH_OPTIONS[command][0]
        yield command, [option, "{tmp}/sweep.json"], f"{option}: '{{tmp}}/sweep.json' holds another"
    damaged_grid = "--out: '{tmp}/damaged.json' is not a readable JSON record"
    yield "kda-bench", ["--preset", "auto-grid", "--out", "{tmp}/damaged.json"], damaged_grid
    yield "kda-bench", ["--preset", "auto-grid", "--out", "-"], "--out -: --preset auto-grid"
    for command, option in (("build_site.py", "--output"), ("build_site.py", "--source"),
                            ("check_browser.py", "--screenshots")):  # fmt: skip
        yield command, [option, ""], f"{option}: the path is empty"
        yield command, [option, UNWRITABLE], f"{option}: cannot write into '{UNWRITABLE}'"
        yield command, [option, "{tmp}/afile"], f"{option}: cannot write into '{{tmp}}/afile'"
        yield command, [option, "{tmp}/" + "a" * 300], f"{option}: cannot write into"


NUMBER_AND_NAME_ROWS = [
    # kda-train
    ("kda-train", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ("kda-train", ["--seq-len", "-4"], "--seq-len must be >= 1, got -4"),
    ("kda-train", ["--steps", "True"], "argument --steps: invalid int value: 'True'"),
    ("kda-train", ["--batch-size", "2.5"], "argument --batch-size: invalid int value: '2.5'"),
    ("kda-train", ["--learning-rate", "-1"], "--learning-rate must be >= 0, got -1.0"),
    ("kda-train", ["--seed", "-1"], "--seed must lie in [0, 2**63 - 1], got -1"),
    ("kda-train", ["--pop-probability", "2"], "--pop-probability must lie in [0, 1]"),
    ("kda-train", ["--mixer", "bogus"], "argument --mixer: invalid choice: 'bogus'"),
    ("kda-train", ["--layers", "kda,bogus"], "argument --layers: unknown mixers ['bogus']"),
    ("kda-train", ["--record", "--output", "x.json"], "give --output or --record"),
    # issue 75.1: a million narrow layers fit memory but take hours to build
    ("kda-train", ["--num-layers", "1000000", "--hidden-size", "1", "--num-heads", "1",
                   "--head-dim", "1"], "--num-layers must be <= 1,024, got 1000000"),
    # kda-bench
    ("kda-bench", ["--heads", "0"], "--heads must be >= 1, got 0"),
    ("kda-bench", ["--seq-lens", "8", "-8"], "--seq-lens must all be >= 1, got [8, -8]"),
    ("kda-bench", ["--reps", "yes"], "argument --reps: invalid int value: 'yes'"),
    ("kda-bench", ["--calls", "0"], "--calls must be >= 1, got 0"),
    ("kda-bench", ["--impls", "bogus"], "argument --impls: invalid choice: 'bogus'"),
    ("kda-bench", ["--skip-rows", "chunkd:fwd"], "--skip-rows: unknown rows ['chunkd:fwd']"),
    ("kda-bench", ["--preset", "auto-grid", "--grid-max-s", "0"], "--grid-max-s must be > 0"),
    ("kda-bench", ["--preset", "auto-grid", "--grid-max-s", "-1"], "--grid-max-s must be > 0"),
    ("kda-bench", ["--grid-max-s", "5"], "--grid-max-s applies to --preset auto-grid only"),
    # issue 75.4: the seed's range before any row compiles, as kda-train checks it
    ("kda-bench", ["--seed", "-5"], "--seed must lie in [0, 2**63 - 1], got -5"),
    ("kda-bench", ["--seed", str(2**64)], f"--seed must lie in [0, 2**63 - 1], got {2**64}"),
    # train_step_table.py
    ("train_step_table.py", ["--seq-lens", "256,x"], "--seq-lens must be comma-separated ints"),
    ("train_step_table.py", ["--seq-lens", "64"], "--seq-lens must all be >= 3 * num_pairs = 96"),
    ("train_step_table.py", ["--mixers", "kda,bogus"], "--mixers: unknown ['bogus']"),
    ("train_step_table.py", ["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    # run_notebooks_sandboxed.py
    ("run_notebooks_sandboxed.py", ["--cell-timeout", "0"], "--cell-timeout must be positive"),
    ("run_notebooks_sandboxed.py", ["{tmp}/none.ipynb"], "no such notebook: {tmp}/none.ipynb"),
    ("run_notebooks_sandboxed.py", ["--executed", "{tmp}", "{tmp}/01_a.ipynb"],
     "--executed: '{tmp}' holds the notebooks run"),
    # synthetic_sweep.py
    ("synthetic_sweep.py", ["--max-steps", "0"], "--max-steps must be >= 1, got 0"),
    ("synthetic_sweep.py", ["--batch-size", "false"], "argument --batch-size: invalid int"),
    ("synthetic_sweep.py", ["--solved", "0"], "--solved must be in (0, 1], got 0.0"),
    ("synthetic_sweep.py", ["--grid-factor", "1"], "--grid-factor must be > 1, got 1.0"),
    ("synthetic_sweep.py", ["--seeds", "0,0"], "--seeds must be distinct ints >= 0"),
    ("synthetic_sweep.py", ["--mixers", "kda,bogus"], "--mixers: unknown ['bogus']"),
    ("synthetic_sweep.py", ["--tasks", "mqar,bogus"], "--tasks: unknown ['bogus']"),
    ("synthetic_sweep.py", ["--only", "mqar/kdaa"], "--only: ['mqar/kdaa'] are not task/mixer"),
    ("synthetic_sweep.py", ["--implementation", "bogus"], "--implementation: KDAConfig"),
    ("synthetic_sweep.py", ["--chunk-size", "3"], "--chunk-size: KDAConfig.chunk_size"),
    ("synthetic_sweep.py", ["--seq-lens", "mqar=4"], "--seq-lens mqar=4 (--vocab-size, --num"),
    ("synthetic_sweep.py", ["--num-pairs", "40"], "--seq-lens mqar=8 (--vocab-size, --num-pa"),
    ("synthetic_sweep.py", ["--seq-lens", "mqar=x"], "argument --seq-lens: invalid _lengths"),
    # stdlib_lm_seeds.py
    ("stdlib_lm_seeds.py", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ("stdlib_lm_seeds.py", ["--seq-len", "none"], "argument --seq-len: invalid int value"),
    ("stdlib_lm_seeds.py", ["--models", "kda,bogus"], "--models must be distinct names of"),
    ("stdlib_lm_seeds.py", ["--hybrid-layers", "kda,bogus"], "--hybrid-layers must be mixers"),
    ("stdlib_lm_seeds.py", ["--implementation", "bogus"], "--implementation: KDAConfig"),
    ("stdlib_lm_seeds.py", ["--tune-seed", "0"], "--tune-seed 0 is one of --seeds"),
    ("stdlib_lm_seeds.py", ["--probe-reach", "999"], "--probe-reach must be below --seq-len"),
    # auto_grad_vs_chunked.py
    ("auto_grad_vs_chunked.py", ["--reps", "0"], "--reps must be >= 1, got 0"),
    ("auto_grad_vs_chunked.py", ["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    ("auto_grad_vs_chunked.py", ["--seq-lens", "0"], "--seq-lens must all be >= 1, got [0]"),
    ("auto_grad_vs_chunked.py", ["--reps", "True"], "argument --reps: invalid int value"),
    # build_site.py, check_browser.py, notebook_setup.py
    ("build_site.py", ["{tmp}/missing.ipynb"], "notebooks: no such file ['{tmp}/missing.ipynb']"),
    ("check_browser.py", ["--site", "{tmp}"], "--site: no site in '{tmp}'"),
    ("check_browser.py", ["--lab-timeout", "0"], "--lab-timeout must be > 0 seconds, got 0.0"),
    ("check_browser.py", ["--lab-timeout", "nan"], "--lab-timeout must be > 0 seconds, got nan"),
    ("notebook_setup.py", ["--set-repository-url", ""], "--set-repository-url: url must look"),
    ("notebook_setup.py", ["--set-repository-url", "gitlab.com/a/b"], "--set-repository-url:"),
    ("notebook_setup.py", ["--check", "--write"], "argument --write: not allowed with"),
    # synthetic_protocol.py (its subcommand run; the recorded protocol where none is given)
    ("synthetic_protocol.py", ["--time-limit", "0"], "--time-limit must be > 0, got 0.0"),
    # recall_capacity.py (its own checks, then each count's synthetic_sweep.py arguments)
    ("recall_capacity.py", ["--pairs", "2,x"], "--pairs must be comma-separated ints"),
    ("recall_capacity.py", ["--pairs", "2,2"], "--pairs must be distinct ints in [1, 32]"),
    ("recall_capacity.py", ["--pairs", "0,40"], "--pairs must be distinct ints in [1, 32]"),
    ("recall_capacity.py", ["--time-limit", "nan"], "--time-limit must be > 0 seconds, got nan"),
    ("recall_capacity.py", ["--rate", "-0.1"], "--rate must be a number > 0, got '-0.1'"),
    ("recall_capacity.py", ["--rate", "fast"], "--rate must be a number > 0, got 'fast'"),
    ("recall_capacity.py", ["--max-steps", "0"], "--max-steps must be >= 1, got 0"),
    ("recall_capacity.py", ["--seeds", "0,0"], "--seeds must be distinct ints >= 0"),
    ("recall_capacity.py", ["--mixers", "kda,bogus"], "--mixers: unknown ['bogus']"),
    ("recall_capacity.py", ["--parts", "{tmp}/afile"], "--parts: '{tmp}/afile' is a file, so"),
    ("recall_capacity.py", ["--output", "{tmp}/sweep.json"], "--output: '{tmp}/sweep.json' holds"),
    ("synthetic_protocol.py", ["--time-limit", "nan"], "--time-limit must be > 0, got nan"),
    ("synthetic_protocol.py", ["--max-runs", "0"], "--max-runs must be >= 1, got 0"),
    ("synthetic_protocol.py", ["--protocol", "{tmp}/none.json"], "--protocol: no file at"),
    ("synthetic_protocol.py", ["--protocol", "{tmp}/damaged.json"], "--protocol: '{tmp}/damaged"),
    ("synthetic_protocol.py", ["--protocol", "{tmp}/sweep.json"], "is not a synthetic_recall_pr"),
    ("synthetic_protocol.py", ["--copy-to", "{tmp}/afile"], "--copy-to: '{tmp}/afile' is a file"),
]

ROWS = [*_path_rows(), *NUMBER_AND_NAME_ROWS]


def test_every_command_line_has_rows():
    """Every console script and every script in scripts/ that takes arguments is covered."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    consoles = set(pyproject["project"]["scripts"])
    scripts = {p.name for p in (ROOT / "scripts").glob("*.py") if "argparse" in p.read_text()}
    assert consoles | scripts == set(COMMANDS)
    assert {command for command, *_ in ROWS} == set(COMMANDS)


@pytest.fixture(scope="module")
def loaded():
    """Each command's module, loaded once."""
    return {name: load() for name, (load, *_) in COMMANDS.items()}


def _forbid(monkeypatch, module, names: list[str]) -> None:
    for dotted in names:
        owner_path, _, name = dotted.rpartition(".")
        owner = module
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part)

        def forbidden(*args, _name=dotted, **kwargs):
            pytest.fail(f"{_name} ran before the arguments were refused")

        monkeypatch.setattr(owner, name, forbidden)


@pytest.mark.parametrize(
    ("command", "argv", "message"), ROWS, ids=[f"{c} {' '.join(a)}" for c, a, _ in ROWS]
)
def test_hostile_arguments_are_refused_before_any_work(
    command, argv, message, loaded, tmp_path, monkeypatch, capsys
):
    module = loaded[command]
    _, entry, work, base = COMMANDS[command]
    _forbid(monkeypatch, module, work)
    (tmp_path / "afile").write_text("a file where a folder should be")
    (tmp_path / "link.json").symlink_to(tmp_path / "afile" / "runs" / "run.json")
    (tmp_path / "damaged.json").write_text('{"runs": [')
    (tmp_path / "sweep.json").write_text('{"protocol": "", "setting": {}, "grids": {}, "runs": []}')
    (tmp_path / "01_a.ipynb").write_text("{}")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html></html>")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        getattr(module, entry)([a.format(tmp=tmp_path) for a in [*base, *argv]])
    assert exit_info.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
