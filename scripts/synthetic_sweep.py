"""Notebook 08's recorded synthetic sweep, resumable: tune a rate per task and mixer, then seeds.

    python scripts/synthetic_sweep.py --phase all --output data/results/synthetic_recall_sweep.json

(``--phase tune`` or ``--phase seeds`` runs one phase; ``all`` runs, task by task, the
tuning and then the seeds.)

One run per (task, mixer, seq_len, learning rate, seed). After every run the document is
merged into the file under a lock and rewritten atomically
(:func:`kda_lib.lab.records.update_json`), and a run already in the file is skipped, so a cut
loses at most the run in progress, the same command resumes, and two processes writing the same
``--output`` (say, one per task with ``--only``) lose nothing of each other's. Bad arguments (a
count below its minimum, a damaged or unwritable ``--output``) are refused before any work.

Protocol (stated once, recorded in the JSON under ``protocol``):

- **Tuning** (per task and mixer): on the task's first length and the first seed, each rate of
  the grid; the best rate (:func:`best_rate`) must lie strictly inside the rates tried, else the
  grid is extended by one point (a factor ``--grid-factor`` beyond the edge) and tried, up to
  ``--max-extensions`` times per side.
- **Seeds**: every length of the task, every seed, at the tuned rate (the tuning run is reused
  as the first seed at the first length).
- **Training and stopping**: AdamW with warmup and cosine decay over ``--max-steps``
  (:func:`kda_lib.lab.train.make_optimizer`); held-out accuracy (:func:`kda_lib.lab.train.evaluate`,
  batches training never draws) every ``--eval-every`` steps. A run stops early once held-out
  accuracy reaches ``--solved`` ("solved"), or when the loss is not finite ("diverged"). At the
  step budget its verdict is "flat" when held-out accuracy changed by less than ``--flat-tol``
  over the last 20% of the steps, and "rising" otherwise (still learning: not converged).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import pathlib
import time

import jax
import numpy as np
from flax import nnx

import kda_lib.teaching.notebook
from kda_lib.checks import check_option_minimums
from kda_lib.lab.records import output_path_problem, read_json_document, update_json
from kda_lib.lab.tasks import chance_accuracy
from kda_lib.lab.train import TRAIN_STREAM, evaluate, make_optimizer, make_task, train_step
from kda_lib.layers.params import parameter_count
from kda_lib.models.tiny_lm import ModelConfig, TinyLM

FLAT_WINDOW = 0.2  # the last fifth of the steps, for the "flat" verdict


def _lengths(text: str) -> dict[str, list[int]]:
    """``"mqar=32,64;stack=32"`` -> ``{"mqar": [32, 64], "stack": [32]}``."""
    out = {}
    for part in text.split(";"):
        name, _, values = part.partition("=")
        if not values:
            raise argparse.ArgumentTypeError(f"--seq-lens: {part!r} is not task=T1,T2")
        out[name.strip()] = [int(v) for v in values.split(",")]
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--phase", choices=["tune", "seeds", "all"], required=True)
    p.add_argument("--output", required=True, help="the JSON document (created or resumed)")
    p.add_argument("--tasks", default="mqar,palindrome,stack")
    p.add_argument("--mixers", default="kda,gdn,attention,attention_conv")
    p.add_argument(
        "--seq-lens",
        type=_lengths,
        default=_lengths("mqar=32,64;palindrome=16,32;stack=32,64,16"),
        help="per task, 'task=T1,T2;...'; the first length is the tuning length",
    )
    p.add_argument("--vocab-size", type=int, default=32)
    p.add_argument("--num-pairs", type=int, default=4, help="MQAR key/value pairs")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--implementation", default="chunked")
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=1500)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--solved", type=float, default=0.99)
    p.add_argument("--flat-tol", type=float, default=0.01)
    p.add_argument("--grid", default="0.001,0.003,0.01", help="initial rates (each task, mixer)")
    p.add_argument("--grid-factor", type=float, default=3.0)
    p.add_argument("--max-extensions", type=int, default=2)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--only", default="", help="restrict to 'task/mixer,...' (for a quick check)")
    return p


SETTING_KEYS = (
    "vocab_size",
    "num_pairs",
    "hidden_size",
    "num_layers",
    "num_heads",
    "head_dim",
    "implementation",
    "chunk_size",
    "batch_size",
    "max_steps",
    "eval_every",
    "eval_batches",
    "solved",
    "flat_tol",
)


def task_options(task: str, args) -> dict:
    options = dict(vocab_size=args.vocab_size)
    if task == "mqar":
        options["num_pairs"] = args.num_pairs
    return options


def verdict(curve: dict, steps: int, solved: float, flat_tol: float) -> str:
    """The stopping rule's verdict for a finished run (see the module docstring)."""
    if not all(math.isfinite(v) for v in curve["loss"]):
        return "diverged"
    if curve["accuracy"][-1] >= solved:
        return "solved"
    start = steps * (1 - FLAT_WINDOW)
    window = [a for s, a in zip(curve["step"], curve["accuracy"], strict=True) if s >= start]
    earlier = [a for s, a in zip(curve["step"], curve["accuracy"], strict=True) if s <= start]
    base = earlier[-1] if earlier else curve["accuracy"][0]
    return "flat" if max(abs(a - base) for a in window) < flat_tol else "rising"


_DRAWERS: dict = {}


def run_one(task: str, mixer: str, seq_len: int, lr: float, seed: int, args) -> dict:
    """Train one model until solved or the step budget; the record, JSON-ready."""
    options = task_options(task, args)
    task_fn = make_task(task, **options)
    shape = (task, tuple(sorted(options.items())), args.batch_size, seq_len)
    if shape not in _DRAWERS:
        _DRAWERS[shape] = jax.jit(lambda key: task_fn(key, args.batch_size, seq_len))
    draw = _DRAWERS[shape]
    config = ModelConfig(
        vocab_size=args.vocab_size,
        mixer=mixer,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        implementation=args.implementation,
        chunk_size=args.chunk_size,
    )
    model = TinyLM(config, rngs=nnx.Rngs(seed))
    optimizer = make_optimizer(model, steps=args.max_steps, learning_rate=lr)
    step_fn = nnx.cached_partial(train_step, model, optimizer)
    data_key = jax.random.fold_in(jax.random.key(seed), TRAIN_STREAM)
    curve = {"step": [], "loss": [], "accuracy": [], "train_loss": [], "seconds": []}
    window, start, stop = [], time.perf_counter(), None
    for i in range(args.max_steps):
        window.append(step_fn(draw(jax.random.fold_in(data_key, i)))[0])
        if (i + 1) % args.eval_every and i + 1 < args.max_steps:
            continue
        train_loss = float(np.mean(jax.device_get(window)))
        window = []
        scores = evaluate(
            model,
            task_fn,
            batch_size=args.batch_size,
            seq_len=seq_len,
            num_batches=args.eval_batches,
            seed=seed,
        )
        for name, value in [
            ("step", i + 1),
            ("loss", scores["loss"]),
            ("accuracy", scores["accuracy"]),
            ("train_loss", train_loss),
            ("seconds", time.perf_counter() - start),
        ]:
            curve[name].append(value)
        if not (math.isfinite(train_loss) and math.isfinite(scores["loss"])):
            stop = "diverged"
        elif scores["accuracy"] >= args.solved:
            stop = "solved"
        if stop:
            break
    steps_run = curve["step"][-1]
    return dict(
        task=task,
        task_options=options,
        mixer=mixer,
        model=dataclasses.asdict(config),
        params=parameter_count(model),
        training=dict(
            steps=steps_run,
            max_steps=args.max_steps,
            batch_size=args.batch_size,
            seq_len=seq_len,
            learning_rate=lr,
            seed=seed,
        ),
        curve=curve,
        eval=dict(
            loss=curve["loss"][-1], accuracy=curve["accuracy"][-1], batches=args.eval_batches
        ),
        stop=stop or verdict(curve, args.max_steps, args.solved, args.flat_tol),
        chance_accuracy=chance_accuracy(task, **options),
        train_seconds=curve["seconds"][-1],
        seconds_per_step=curve["seconds"][-1] / steps_run,
        platform=jax.devices()[0].platform,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def run_key(r: dict) -> tuple:
    t = r["training"]
    return (r["task"], r["mixer"], t["seq_len"], float(t["learning_rate"]), int(t["seed"]))


def score(r: dict) -> tuple:
    """Tuning order: a solved run beats an unsolved one, and among solved runs the fewest steps
    wins (their final accuracies differ only by where in [solved, 1] the check fired); then
    higher final held-out accuracy, then lower held-out loss."""
    solved = r["stop"] == "solved"
    return (
        solved,
        -r["training"]["steps"] if solved else 0,
        round(r["eval"]["accuracy"], 3),
        -r["eval"]["loss"],
    )


def best_rate(rows: list[dict]) -> float:
    return float(max(rows, key=score)["training"]["learning_rate"])


def _rate(x: float) -> float:
    return float(f"{x:.3g}")


def setting_of(args) -> dict:
    return {key: getattr(args, key) for key in SETTING_KEYS}


def merge(ours: dict, disk: dict | None) -> dict:
    """The document on disk with this process's runs and grids added (a run already on disk is
    kept as it is there); SystemExit when the file was made with another setting."""
    if not disk:
        return ours
    if disk.get("setting") != ours["setting"]:
        raise SystemExit(
            f"the output was made with the setting {disk.get('setting')}, not "
            f"{ours['setting']}: give another --output"
        )
    runs = {run_key(r): r for r in disk.get("runs", [])}
    for r in ours["runs"]:
        runs.setdefault(run_key(r), r)
    return {
        **ours,
        **disk,
        "grids": {**disk.get("grids", {}), **ours["grids"]},
        "runs": list(runs.values()),
    }


class Sweep:
    """The JSON document and the runs in it; :meth:`ensure` trains a run only when absent."""

    def __init__(self, args):
        self.args, self.path = args, pathlib.Path(args.output)
        self.doc = dict(
            protocol=__doc__.split("Protocol (stated once")[1].strip(),
            setting=setting_of(args),
            grids={},
            runs=[],
        )
        self.refresh()

    def refresh(self):
        """Take in what other processes have written to the file since (read without the lock:
        the file is only ever replaced whole)."""
        self.doc = merge(self.doc, read_json_document(self.path))
        self.index = {run_key(r): r for r in self.doc["runs"]}

    def ensure(self, task, mixer, seq_len, lr, seed, phase) -> dict:
        key = (task, mixer, seq_len, float(lr), int(seed))
        if key not in self.index:
            self.refresh()
        if key not in self.index:
            record = run_one(task, mixer, seq_len, lr, seed, self.args)
            record["phase"] = phase
            self.doc["runs"].append(record)
            self.index[key] = record
            self.save()
            print(
                f"{phase:5s} {task:10s} {mixer:15s} T={seq_len:<4d} lr {lr:<8g} seed {seed}: "
                f"acc {record['eval']['accuracy']:.3f} after {record['training']['steps']} "
                f"steps ({record['stop']}), {record['train_seconds']:.0f} s",
                flush=True,
            )
        return self.index[key]

    def save(self):
        self.doc = update_json(self.path, lambda disk: merge(self.doc, disk))
        self.index = {run_key(r): r for r in self.doc["runs"]}

    def tune(self, task, mixer):
        a = self.args
        seq_len, seed = a.seq_lens[task][0], a.seeds[0]
        grid = sorted(_rate(float(x)) for x in a.grid.split(","))
        low = high = 0
        while True:
            rows = [self.ensure(task, mixer, seq_len, lr, seed, "tune") for lr in grid]
            best = best_rate(rows)
            if best == grid[0] and low < a.max_extensions:
                grid.insert(0, _rate(best / a.grid_factor))
                low += 1
            elif best == grid[-1] and high < a.max_extensions:
                grid.append(_rate(best * a.grid_factor))
                high += 1
            else:
                break
        self.doc["grids"][f"{task}/{mixer}"] = dict(
            seq_len=seq_len, seed=seed, rates=grid, best=best, inside=grid[0] < best < grid[-1]
        )
        self.save()

    def seeds(self, task, mixer):
        tuned = self.doc["grids"].get(f"{task}/{mixer}")
        if tuned is None:
            raise SystemExit(f"{task}/{mixer} is not tuned yet: run --phase tune first")
        for seed in self.args.seeds:
            for seq_len in self.args.seq_lens[task]:
                self.ensure(task, mixer, seq_len, tuned["best"], seed, "seeds")


MINIMUMS = dict(
    vocab_size=2,
    num_pairs=1,
    hidden_size=1,
    num_layers=1,
    num_heads=1,
    head_dim=1,
    chunk_size=1,
    batch_size=1,
    max_steps=1,
    eval_every=1,
    eval_batches=1,
    max_extensions=0,
)


def check_arguments(p: argparse.ArgumentParser, args) -> None:
    """Refuse, before any work, what would fail or mislead later (argparse's error, exit 2)."""
    check_option_minimums(p, args, MINIMUMS)
    if not 0 < args.solved <= 1:
        p.error(f"--solved must be in (0, 1], got {args.solved}")
    if not (args.flat_tol >= 0 and args.grid_factor > 1):
        p.error("--flat-tol must be >= 0 and --grid-factor > 1")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
        rates = [float(x) for x in args.grid.split(",")]
    except ValueError as error:
        p.error(f"--seeds must be ints and --grid numbers, comma-separated: {error}")
    if any(s < 0 for s in args.seeds) or not all(r > 0 for r in rates):
        p.error(f"--seeds must be >= 0 and --grid rates > 0; got {args.seeds}, {rates}")
    problem = output_path_problem(args.output)
    if problem:
        p.error(f"--output: {problem}")
    try:
        document = read_json_document(args.output)
    except ValueError as error:
        p.error(f"--output: {error}; move it away or give another path")
    if document is not None and document.get("setting", setting_of(args)) != setting_of(args):
        p.error(f"--output {args.output} was made with another setting: give another --output")


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    check_arguments(p, args)
    tasks, mixers = args.tasks.split(","), args.mixers.split(",")
    missing = [t for t in tasks if t not in args.seq_lens]
    if missing:
        raise SystemExit(f"--seq-lens gives no length for the task(s) {missing}")
    only = set(filter(None, args.only.split(",")))
    kda_lib.teaching.notebook.setup(style=False)
    sweep = Sweep(args)
    cells = [(t, m) for t in tasks for m in mixers if not only or f"{t}/{m}" in only]
    start = time.perf_counter()
    for task in tasks:  # per task: its tuning, then its seeds, so finished cells come early
        for t, m in cells:
            if t == task and args.phase in ("tune", "all"):
                sweep.tune(t, m)
        for t, m in cells:
            if t == task and args.phase in ("seeds", "all"):
                sweep.seeds(t, m)
    print(
        f"done: {len(sweep.doc['runs'])} runs in {sweep.path} "
        f"({time.perf_counter() - start:.0f} s this call)"
    )


if __name__ == "__main__":
    main()
