"""JSON records: written by the command lines, read back by the notebooks.

Writing (``python -m kda_lib.lab.bench``, ``python -m kda_lib.lab.train_cli``, notebook 08): the
output path
is checked before any work (:func:`output_path_problem`), records are strict JSON (a NaN or
infinite number becomes null: :func:`strict_json`), and they are written atomically
(:func:`write_json`), so an interrupted run never leaves a truncated file nor destroys an older
one. Several processes may add to one record: :func:`update_json` reads, merges and writes it
under an exclusive lock on a sidecar file (``.<name>.lock``), so no writer loses another's
work.

Reading the recorded runs: the files live in ``data/benchmarks/*.json`` and
``data/results/*.json`` of a checkout. The wheel ships the same files as
``kda_lib/recorded_data/`` (see ``[tool.setuptools]`` in pyproject.toml), so an installed
kda_lib (Colab, a TPU VM) reads the same recordings as a checkout. A file that is not there
raises :class:`FileNotFoundError` saying where it was looked for and what is there instead: a
notebook never draws an empty plot in silence.

* :func:`recorded_dir` -- the folder of one kind (``"benchmarks"`` or ``"results"``).
* :func:`recorded_files` -- its JSON files, sorted by name.
* :func:`recorded_path` / :func:`load_recorded` -- one file by name, as a path or parsed JSON.
* :func:`load_benchmark_runs` -- every recorded benchmark table, read defensively.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
import stat
import sys
import tempfile
from typing import Any

from kda_lib.checks import is_int, is_number

# A tool run (kda-bench, kda-train) writes here unless told otherwise; the recorded evidence that
# the README and the notebooks cite (data/benchmarks/, data/results/) is replaced only when the
# command is asked to (--record), never by default.
RUNS_DIR = pathlib.Path("build") / "runs"
RECORDED_DIR = pathlib.Path("data")

# ----------------------------------------------------------------------------- writing


def output_path_problem(path: str | pathlib.Path) -> str | None:
    """Why a JSON record cannot be written to ``path`` (None: it can): the path is empty or a
    folder, a parent is a file, or the folder cannot be created or written to. A symlink is
    followed, as :func:`write_json` writes through it. Creates the folder (as writing the
    record would) to find out."""
    if str(path) == "":
        return "the path is empty; give a file path such as 'run.json'"
    given, real = str(path), os.path.realpath(path)
    path = pathlib.Path(real if real != os.path.abspath(path) else path)  # a link: its target
    if os.path.isdir(path):  # os.path's: False, not an OSError, for a name too long
        example = os.path.join(given, "run.json")
        return f"{given!r} is a directory; give a file path such as {example!r}"
    for ancestor in (path.parent, *path.parent.parents):
        if os.path.exists(ancestor) and not os.path.isdir(ancestor):
            return f"{str(ancestor)!r} is a file, so {given!r} cannot be created"
    try:  # the temporary file write_json makes: the longest name it writes there
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = _temporary_file(path)
        os.close(handle)
        os.unlink(temporary)
    except OSError as error:
        return f"cannot write {given!r}: {error.strerror or error}"
    return None


def replace_problem(path: str | pathlib.Path, kind: str, keys) -> str | None:
    """Why a ``kind`` record (a JSON object with every key of ``keys``) must not replace the
    file at ``path`` (None: there is none, or it holds a ``kind`` record): it is not a regular
    file, is damaged, or holds another kind of record (another command's runs), kept as it is."""
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the read
        return f"{str(path)!r} is not a regular file: give a file path"
    try:
        document = read_json_document(path)
    except ValueError as error:
        return f"{error}; it is kept: move it away or give another path"
    if document is None or set(keys) <= document.keys():
        return None
    missing = sorted(set(keys) - document.keys())
    return (f"{str(path)!r} holds another kind of record, not a {kind} (no {missing}); it is "
            "kept: move it away or give another path")  # fmt: skip


def _temporary_file(path: pathlib.Path) -> tuple[int, str]:
    """``tempfile.mkstemp`` beside ``path``, named after it: where :func:`write_json` writes."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")


def strict_json(value):
    """``value`` with every non-finite float replaced by None: JSON has no NaN or infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def dumps(document) -> str:
    """Indented strict JSON text of ``document``, with a final newline."""
    return json.dumps(strict_json(document), indent=1, allow_nan=False) + "\n"


def write_json(document, path: str | pathlib.Path) -> pathlib.Path:
    """Write ``document`` as strict JSON, atomically: a temporary file in the same folder, then
    ``os.replace``. Creates folders; returns the path.

    An existing file keeps its permission bits (a 0600 record stays 0600; a new one gets
    0666 minus the umask). A symlink is written *through*: its target is replaced, the link
    stays a link (a dangling link's target is created)."""
    path = pathlib.Path(path)
    target = pathlib.Path(os.path.realpath(path))  # through a symlink (also of a folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        mode = stat.S_IMODE(target.stat().st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    handle, temporary = _temporary_file(target)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(dumps(document))
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)  # mkstemp makes it 0600
        os.replace(temporary, target)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise
    return path


def read_json_document(path: str | pathlib.Path) -> dict | None:
    """The JSON object in ``path``, or None when there is no file; ValueError naming the file
    when it is not UTF-8 JSON holding an object (a damaged record is never overwritten)."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{str(path)!r} is not a readable JSON record: {error}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{str(path)!r} holds JSON {type(document).__name__}, not an object")
    return document


def exit_on_broken_pipe(command):
    """``command`` wrapped for the command line: a reader of stdout that went away (``| head``,
    ``| true``) ends it with exit status 1 and no BrokenPipeError traceback."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            result = command(*args, **kwargs)
            sys.stdout.flush()  # what is still buffered fails here, not at the exit
            return result
        except BrokenPipeError:
            with contextlib.suppress(OSError, ValueError, AttributeError):  # no real descriptor
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # exit's flush
            raise SystemExit(1) from None

    return run


@contextlib.contextmanager
def locked(path: str | pathlib.Path):
    """Hold an exclusive ``fcntl.flock`` on the sidecar ``.<name>.lock`` next to ``path`` (made
    if absent, never removed: removing it would let two processes lock different files)."""
    import fcntl  # POSIX only; imported here so that reading records works everywhere

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_json(path: str | pathlib.Path, merge) -> dict:
    """Under :func:`locked`, read the record at ``path`` (None if absent), write
    ``merge(current)`` atomically (:func:`write_json`) and return it: writers that each merge
    their own additions into what is on disk lose nothing to one another, also when one
    reaches the file through a symlink (the lock and the write are on its real path)."""
    path = os.path.realpath(path)
    with locked(path):
        document = merge(read_json_document(path))
        write_json(document, path)
    return document


# ----------------------------------------------------------------------------- reading
KINDS = ("benchmarks", "results")
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1]  # kda_lib/
# where the wheel puts the files (package-dir mapping of kda_lib.recorded_data onto data/)
INSTALLED_DATA_DIR = _PACKAGE_DIR / "recorded_data"
# where they are in a checkout (an editable install, or kda_lib on sys.path from the source tree)
CHECKOUT_DATA_DIR = _PACKAGE_DIR.parent / "data"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def recorded_dir(kind: str) -> pathlib.Path:
    """The folder holding the recorded files of ``kind``.

    Args:
      kind: ``"benchmarks"`` (timing tables of ``kda_lib.lab.bench``) or ``"results"`` (training
        records of ``kda_lib.lab.train``).

    Returns:
      ``kda_lib/recorded_data/<kind>`` of an installed wheel, else ``data/<kind>`` of the
      checkout kda_lib was imported from.

    Raises:
      ValueError: ``kind`` is not one of :data:`KINDS`.
      FileNotFoundError: neither folder exists (a broken install), naming both.
    """
    _check_kind(kind)
    for base in (INSTALLED_DATA_DIR, CHECKOUT_DATA_DIR):
        if (base / kind).is_dir():
            return base / kind
    raise FileNotFoundError(
        f"no recorded {kind}: neither {INSTALLED_DATA_DIR / kind} (an installed kda_lib) nor "
        f"{CHECKOUT_DATA_DIR / kind} (a checkout) exists; reinstall kda_lib from its repository"
    )


def recorded_files(kind: str) -> list[pathlib.Path]:
    """The ``*.json`` files of ``kind`` (see :func:`recorded_dir`), sorted by name; may be []."""
    return sorted(recorded_dir(kind).glob("*.json"))


def recorded_path(kind: str, name: str) -> pathlib.Path:
    """The path of the recorded file ``name`` (e.g. ``"synthetic_recall_full.json"``) of ``kind``.

    Raises:
      ValueError: ``kind`` is unknown, or ``name`` is not a bare file name.
      FileNotFoundError: the file is not there; the message lists the files that are.
    """
    if not name or pathlib.PurePath(name).name != name:
        raise ValueError(f"name must be a file name such as 'run.json', got {name!r}")
    path = recorded_dir(kind) / name
    if not path.is_file():
        available = [p.name for p in recorded_files(kind)] or "none"
        raise FileNotFoundError(
            f"recorded {kind} file {name!r} not found in {path.parent}; available: {available}"
        )
    return path


def load_recorded(kind: str, name: str) -> Any:
    """The parsed JSON of the recorded file ``name`` of ``kind`` (see :func:`recorded_path`).

    Raises:
      FileNotFoundError: as :func:`recorded_path`.
      ValueError: the file is not UTF-8, not valid JSON or nested too deeply to parse (the
        message names the file).
    """
    path = recorded_path(kind, name)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"recorded {kind} file {path} is not UTF-8 text: {e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"recorded {kind} file {path} is not valid JSON: {e}") from e
    except RecursionError as e:  # json's parser recurses once per level of nesting
        raise ValueError(f"recorded {kind} file {path} is nested too deeply to parse") from e


def load_benchmark_runs(directory=None) -> tuple[list[dict], list[str]]:
    """Recorded benchmark runs from ``directory/*.json``, as written by ``python -m
    kda_lib.lab.bench``.

    ``directory`` None, or a folder that does not exist, reads the benchmarks recorded with
    kda_lib (:func:`recorded_dir`: the wheel's copy, or ``data/benchmarks/`` of
    the checkout), and a note says so.

    Reads the layout the benchmark writes (``platform``, ``device_kind``, ``config``,
    ``records``); records need ``impl``, ``T``, ``mode`` and a numeric ``median_ms`` (failed rows
    are left out). Other files are skipped with a note, not raised.

    Returns:
      ``(runs, notes)``: runs are ``{"label", "file", "config", "records"}`` dicts (label like
      ``"recorded: gpu NVIDIA H200"``, config like ``"B=1, H=16, K=128, V=128, bfloat16"`` when
      the file says, records keep only usable entries); notes say what was skipped and why.
    """
    runs, notes = [], []
    if directory is None or not pathlib.Path(directory).is_dir():
        if directory is not None:
            notes.append(f"{directory}/ not found; reading the benchmarks recorded with kda_lib")
        directory = recorded_dir("benchmarks")
    directory = pathlib.Path(directory)
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        notes.append(f"no recorded benchmarks in {directory}/")
    for path in files:
        run = _read_benchmark_file(path, notes)
        if run is not None:
            runs.append(run)
    return runs, notes


def _usable_record(record) -> bool:
    """A benchmark row with an implementation, a mode, an int T >= 1 and a finite, positive
    median time (failed or skipped rows have none)."""
    return (
        isinstance(record, dict)
        and {"impl", "T", "mode", "median_ms"} <= record.keys()
        and is_number(record["median_ms"])
        and math.isfinite(record["median_ms"])
        and record["median_ms"] > 0
        and is_int(record["T"])
    )


def _read_benchmark_file(path: pathlib.Path, notes: list[str]) -> dict | None:
    """One file of :func:`load_benchmark_runs`: its run, or None with a note saying why."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        notes.append(f"{path.name}: unreadable ({e})")
        return None
    except RecursionError:  # json's parser recurses once per level of nesting
        notes.append(f"{path.name}: unreadable (nested too deeply to parse); skipped")
        return None
    # the layout python -m kda_lib.lab.bench writes (platform, device_kind, config, records)
    meta = payload if isinstance(payload, dict) else {}
    records = meta.get("records")
    if not isinstance(records, list):
        notes.append(f"{path.name}: not a kda_lib.lab.bench file (no 'records' list); skipped")
        return None
    usable = [r for r in records if _usable_record(r)]
    if not usable:
        notes.append(f"{path.name}: no record with impl, T, mode and median_ms; skipped")
        return None
    platform = str(meta.get("platform", "unknown platform"))
    device = meta.get("device_kind")
    label = f"recorded: {platform}" + (f" {device}" if device and device != platform else "")
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    shape = ", ".join(
        f"{short}={config[key]}"
        for key, short in (("batch", "B"), ("heads", "H"), ("key_dim", "K"), ("value_dim", "V"))
        if key in config
    )
    if config.get("dtype"):
        shape += f", {config['dtype']}"
    if len(usable) < len(records):
        notes.append(
            f"{path.name}: {len(records) - len(usable)} records without impl, an int T, mode "
            "and a finite positive median_ms (failed or skipped runs) left out"
        )
    return {"label": label, "file": path.name, "config": shape, "records": usable}
