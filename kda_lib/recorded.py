"""Recorded data that the notebooks read: benchmark timings and training results.

The files live in ``data/benchmarks/*.json`` (written by ``python -m kda_lib.bench``) and
``data/results/*.json`` (written by ``python -m kda_lib.train`` and notebook 08) of a checkout.
The wheel ships the same files as ``kda_lib/recorded_data/`` (see ``[tool.setuptools]`` in
pyproject.toml), so an installed kda_lib (Colab, a TPU VM) reads the same recordings as a
checkout. A file that is not there raises :class:`FileNotFoundError` saying where it was looked
for and what is there instead: a notebook never draws an empty plot in silence.

* :func:`recorded_dir` -- the folder of one kind (``"benchmarks"`` or ``"results"``).
* :func:`recorded_files` -- its JSON files, sorted by name.
* :func:`recorded_path` / :func:`load_recorded` -- one file by name, as a path or parsed JSON.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

KINDS = ("benchmarks", "results")
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
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
      kind: ``"benchmarks"`` (timing tables of ``kda_lib.bench``) or ``"results"`` (training
        records of ``kda_lib.train``).

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
