"""A JSON document of runs, resumable and safe under concurrent writers.

What the record scripts (``scripts/synthetic_sweep.py``, notebook 08's; ``scripts/
stdlib_lm_seeds.py``, notebook 09's) share; each keeps its own runs, run function and protocol.
Their document is ``{"protocol": text, "setting": {...}, "grids": {...}, "runs": [...]}`` (and
whatever else a script records beside, e.g. its corpus):

* :func:`parse_with_preset` -- the command line, with the chosen ``--preset``'s values where it
  gave none.
* :func:`add_seed_arguments`, :func:`check_seeds_and_grid` -- ``--seeds`` (the reported seeds)
  and ``--tune-seed`` (the tuning runs' seed, never a reported one), checked with the rate
  grid's options (:mod:`kda_lib.lab.rate_grid`) before any work; :data:`MINIMUMS`, the
  smallest values of the int options both scripts have.
* :func:`check_model` -- a model option its config refuses, as argparse's error naming it.
* :func:`setting_of` -- the options that make a run what it is: a document is resumed only by
  a command with the same setting.
* :func:`check_output` -- ``--output`` refused before any work when it cannot be written, is
  damaged or was made with another setting.
* :func:`merge` -- the document on disk with a process's runs and grids added.
* :class:`RunDocument` -- the document in memory: :meth:`~RunDocument.ensure` trains a run only
  when neither it nor the file holds it, and after every run the document is merged into the
  file under a lock and rewritten atomically (:func:`kda_lib.lab.records.update_json`), so a
  cut loses at most the run in progress, the same command resumes, and two processes writing
  one file lose nothing of each other's.
"""

from __future__ import annotations

import argparse
import pathlib
import re
from collections.abc import Callable, Sequence

from kda_lib.checks import MAX_SEED
from kda_lib.lab.rate_grid import parse_grid
from kda_lib.lab.records import output_path_problem, read_json_document, update_json

# The smallest values of the int options both record scripts have, for
# check_option_minimums: the model's sizes, the batch, the validation interval,
# the grid's extensions per side and the tuning seed.
MINIMUMS = dict(
    hidden_size=1,
    num_layers=1,
    num_heads=1,
    head_dim=1,
    batch_size=1,
    eval_every=1,
    max_extensions=0,
    tune_seed=0,
)


def check_option_minimums(parser, args, minimums: dict[str, int]) -> None:
    """argparse's error naming the first option of ``args`` below its minimum in ``minimums``
    (None or absent options pass)."""
    for name, minimum in minimums.items():
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def check_seed_option(parser, args, name: str = "seed") -> None:
    """argparse's error unless ``args.<name>`` is a seed of ``jax.random.key``, in [0, 2^63 - 1]."""
    value = getattr(args, name)
    if not 0 <= value <= MAX_SEED:
        parser.error(f"--{name.replace('_', '-')} must lie in [0, 2**63 - 1], got {value}")


def parse_with_preset(
    p: argparse.ArgumentParser, presets: dict[str, dict], argv=None
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """``(p, its arguments)``: ``p`` has ``--preset``, one of ``presets``, whose values stand
    where the command line gave none; a string value goes through its option's ``type`` as a
    default does (e.g. ``"mqar=64,128"`` -> ``{"mqar": [64, 128]}``). Each option a preset sets
    defaults to None."""
    args = p.parse_args(argv)
    p.set_defaults(**presets[args.preset])
    return p, p.parse_args(argv)


def add_seed_arguments(p: argparse.ArgumentParser, seeds: str | None = None) -> None:
    """``--seeds`` (the reported seeds, comma-separated; default ``seeds``) and ``--tune-seed``
    (the tuning runs' seed, 1000) on ``p``."""
    p.add_argument("--seeds", default=seeds, help="the reported seeds, comma-separated")
    p.add_argument("--tune-seed", type=int, default=1000, help="the tuning runs' seed")


def check_seeds_and_grid(p: argparse.ArgumentParser, args) -> None:
    """Refuse (argparse's error, exit 2) seeds that are not distinct ints >= 0, a tuning seed
    among them, a bad ``--grid`` or ``--grid-factor``; turns ``args.seeds`` and ``args.grid``
    into lists (the grid rounded and sorted: :func:`kda_lib.lab.rate_grid.parse_grid`)."""
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.grid = parse_grid(args.grid)
    except ValueError as error:
        p.error(f"--seeds must be ints >= 0 and --grid rates > 0, comma-separated: {error}")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) < len(args.seeds):
        p.error(f"--seeds must be distinct ints >= 0, got {args.seeds}")
    if args.tune_seed in args.seeds:
        p.error(
            f"--tune-seed {args.tune_seed} is one of --seeds {args.seeds}: a tuning run is "
            "never a reported seed"
        )
    if not args.grid_factor > 1:
        p.error(f"--grid-factor must be > 1, got {args.grid_factor}")


def check_model(p: argparse.ArgumentParser, build: Callable[[], object]) -> None:
    """Refuse (argparse's error) the options of a model config that ``build()`` refuses,
    naming the option of the field the config names (``KDAConfig.chunk_size``:
    ``--chunk-size``)."""
    try:
        build()
    except ValueError as error:
        field = re.search(r"Config\.(\w+)", str(error))
        p.error(f"--{field[1].replace('_', '-') if field else 'model options'}: {error}")


def setting_of(args, keys: Sequence[str], protocol_version: int) -> dict:
    """``{key: args.key}`` for ``keys`` in their order, ``protocol_version`` under that name."""
    values = dict(vars(args), protocol_version=protocol_version)
    return {key: values[key] for key in keys}


def _differs(recorded, ours) -> bool:
    """A document recorded without the entry (None) was made with anything."""
    return recorded is not None and recorded != ours


def check_output(p: argparse.ArgumentParser, args, setting: dict) -> None:
    """Refuse (argparse's error naming ``--output``) an ``args.output`` that cannot be written,
    holds a damaged document (left as it is), or one made with a setting other than ``setting``."""
    problem = output_path_problem(args.output)
    if problem:
        p.error(f"--output: {problem}")
    try:
        document = read_json_document(args.output)
    except ValueError as error:
        p.error(f"--output: {error}; move it away or give another path")
    if document is not None and _differs(document.get("setting"), setting):
        p.error(f"--output {args.output} was made with another setting: give another --output")


def _made_with_setting(document: dict) -> dict:
    return {"setting": document.get("setting")}


def merge(
    ours: dict,
    disk: dict | None,
    run_key: Callable[[dict], tuple],
    made_with: Callable[[dict], dict] = _made_with_setting,
    order: Callable[[dict], tuple] | None = None,
) -> dict:
    """The document on disk with ``ours``' runs and grids added (a run already on disk, by
    ``run_key``, is kept as it is there; runs in the order found, or sorted by ``order``).

    ``made_with(document)`` names what a document was made with (default: its ``setting``); an
    entry that ``disk`` holds (not None) and that differs from ours is a SystemExit: the file
    was made by another command, give another ``--output``."""
    if not disk:
        return ours
    recorded, mine = made_with(disk), made_with(ours)
    other = [name for name in mine if _differs(recorded[name], mine[name])]
    if other:
        raise SystemExit(
            f"the output was made with another {' and '.join(other)} ({recorded}, not "
            f"{mine}): give another --output"
        )
    runs = {run_key(r): r for r in disk.get("runs", [])}
    for r in ours["runs"]:
        runs.setdefault(run_key(r), r)
    merged = list(runs.values()) if order is None else sorted(runs.values(), key=order)
    return {**ours, **disk, "grids": {**disk.get("grids", {}), **ours["grids"]}, "runs": merged}


class RunDocument:
    """The JSON document at ``path`` (``document``: this process's, taken into the file's) and
    its runs by ``run_key``; :meth:`ensure` trains a run only when absent. ``made_with`` and
    ``order`` as :func:`merge` takes them."""

    def __init__(self, path, document: dict, run_key, made_with=_made_with_setting, order=None):
        self.path, self.doc = pathlib.Path(path), document
        self.run_key, self.made_with, self.order = run_key, made_with, order
        self.refresh()

    def merged(self, disk: dict | None) -> dict:
        return merge(self.doc, disk, self.run_key, self.made_with, self.order)

    def _reindex(self) -> None:
        self.index = {self.run_key(r): r for r in self.doc["runs"]}

    def refresh(self) -> None:
        """Take in what other processes have written to the file since (read without the lock:
        the file is only ever replaced whole)."""
        self.doc = self.merged(read_json_document(self.path))
        self._reindex()

    def save(self) -> None:
        """Merge the document into the file under its lock (:func:`update_json`)."""
        self.doc = update_json(self.path, self.merged)
        self._reindex()

    def ensure(self, key: tuple, train: Callable[[], dict], announce=None) -> dict:
        """The run ``key`` (as ``run_key`` names it): from the document, else from the file,
        else ``train()``'s record, added and saved at once, then ``announce(record)``."""
        if key not in self.index:
            self.refresh()
        if key not in self.index:
            record = train()
            self.doc["runs"].append(record)
            self.index[key] = record
            self.save()
            if announce is not None:
                announce(record)
        return self.index[key]

    def set_grid(self, name: str, grid: dict) -> None:
        """Record a tuned grid under ``grids[name]`` and save."""
        self.doc["grids"][name] = grid
        self.save()
