"""Notebook 08's synthetic sweep, resumable: tune a rate per task and mixer, then fresh seeds.

    python scripts/synthetic_sweep.py --preset cpu --phase all --output data/results/FILE.json

(``--phase tune`` or ``--phase seeds`` runs one phase; ``all`` runs, task by task, the
tuning and then the seeds.) ``--preset cpu`` (the default) is the size this 2-core machine
runs; ``--preset paper`` the paper's lengths and step budget, for an accelerator (see
:data:`PRESETS`); any option given on the command line overrides its preset's value.

One run per (task, mixer, seq_len, learning rate, seed). After every run the document is
merged into the file under a lock and rewritten atomically (:mod:`kda_lib.lab.record_runs`),
and a run already in the file is skipped, so a cut loses at most the run in progress, the same
command resumes, and two processes writing the same ``--output`` (say, one per task with
``--only``) lose nothing of each other's. Bad arguments (a
count below its minimum, an unknown task, mixer or ``--only`` cell, a model option or task
length that the config or the task refuses, a seed both tuning and reported, a damaged or
unwritable ``--output``) are refused before any work.

Protocol (stated once, recorded in the JSON under ``protocol``):

- **Three streams** per seed (:mod:`kda_lib.lab.train`): training batches, **validation**
  batches (the early stop and the rate choice read only these) and **test** batches (the
  reported score, evaluated once, after training ends).
- **Tuning** (per task and mixer): on the task's first length with the tuning seed
  (``--tune-seed``, never one of ``--seeds``), each rate of the grid; the best rate by
  validation (:func:`best_rate`) must lie strictly inside the rates tried, else the grid is
  extended by one point (a factor ``--grid-factor`` beyond the edge) and tried, up to
  ``--max-extensions`` times per side.
- **Seeds**: every length of the task, every seed of ``--seeds`` (fresh: no tuning run is
  reused), at the tuned rate.
- **Training and stopping**: AdamW with warmup and cosine decay over ``--max-steps``
  (:func:`kda_lib.lab.train.make_optimizer`); validation accuracy every ``--eval-every``
  steps. A run stops early once validation accuracy reaches ``--solved`` ("solved"), or when
  the loss is not finite ("diverged"). At the step budget its verdict is "flat" when
  validation accuracy changed by less than ``--flat-tol`` over the last 20% of the steps,
  "rising" when it ended at least ``--flat-tol`` above where that stretch began (still
  learning: not converged), else "moving" (records before 2026-12-05 call both "rising";
  ``recall_sweep.stop_label`` separates them). Then the test batches are scored.
- **Controls**: the conv-only mixer (``conv``, blind beyond ``ModelConfig.conv_reach`` tokens)
  runs on every task; for stack every score also gives the accuracy on the scored pops whose
  answer lies beyond that reach (``beyond_reach_accuracy``).
- **Sizes**: with ``--match-params M`` (recorded in ``setting`` as ``match_params``; without
  it, records before 2026-12-06, each mixer keeps the MLP width ``2 * hidden_size``) every model
  gets the MLP width whose parameter count is nearest that of mixer M's model at that width
  (:func:`kda_lib.models.tiny_lm.match_parameter_count`, notebook 09's rule: within half an
  MLP unit, ``num_layers * (2 * hidden_size + 1)`` parameters); every run records its
  ``params``, its ``model`` (``mlp_width``) and the ``params_target``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import time

import jax
import numpy as np
from flax import nnx

import kda_lib.teaching.notebook
from kda_lib.lab import record_runs
from kda_lib.lab.rate_grid import add_grid_arguments, parse_grid, tune_rate
from kda_lib.lab.record_runs import check_option_minimums
from kda_lib.lab.tasks import TASKS, chance_accuracy
from kda_lib.lab.train import TRAIN_STREAM, evaluate, make_optimizer, make_task, train_step
from kda_lib.layers.kda_layer import KDAConfig
from kda_lib.layers.params import parameter_count
from kda_lib.models.tiny_lm import MIXERS as MODEL_MIXERS
from kda_lib.models.tiny_lm import ModelConfig, TinyLM, config_param_count, match_parameter_count

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


MIXERS = "kda,gdn,mamba2,attention,attention_conv,conv"

# The presets' values; the command line overrides any of them.
PRESETS: dict[str, dict] = {
    # this 2-core CPU: MQAR with 8 pairs and a 64-token vocabulary at T = 64 and 128,
    # palindrome and stack at 64 and 128; 5 fresh seeds per cell, one tuning seed
    "cpu": dict(
        seq_lens="mqar=64,128;palindrome=64,128;stack=64,128",
        vocab_size=64,
        num_pairs=8,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        head_dim=32,
        chunk_size=32,
        batch_size=16,
        max_steps=2000,
        eval_every=100,
        eval_batches=8,
        test_batches=16,
        seeds="0,1,2,3,4",
    ),
    # the paper's Figure 4 (section 5.1): T = 256 to 2048 and up to 20K steps, all it gives
    # here; the layers, heads, width, vocabulary, pairs and batch are this repository's choice
    "paper": dict(
        seq_lens="mqar=256,512,1024,2048;palindrome=256,512,1024,2048;stack=256,512,1024,2048",
        vocab_size=256,
        num_pairs=32,
        hidden_size=256,
        num_layers=2,
        num_heads=4,
        head_dim=64,
        chunk_size=64,
        batch_size=32,
        max_steps=20000,
        eval_every=500,
        eval_batches=16,
        test_batches=32,
        seeds="0,1,2,3,4",
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--phase", choices=["tune", "seeds", "all"], required=True)
    p.add_argument("--output", required=True, help="the JSON document (created or resumed)")
    p.add_argument("--tasks", default="mqar,palindrome,stack")
    p.add_argument("--mixers", default=MIXERS)
    p.add_argument(
        "--seq-lens",
        type=_lengths,
        help="per task, 'task=T1,T2;...'; the first length is the tuning length",
    )
    for name in ("vocab-size", "num-pairs", "hidden-size", "num-layers", "num-heads"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--implementation", default="chunked")
    for name in ("chunk-size", "batch-size", "max-steps", "eval-every"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--eval-batches", type=int, help="validation batches per check")
    p.add_argument("--test-batches", type=int, help="test batches, scored once per run")
    p.add_argument("--solved", type=float, default=0.99)
    p.add_argument("--flat-tol", type=float, default=0.01)
    add_grid_arguments(p, "task and mixer")
    record_runs.add_seed_arguments(p)
    p.add_argument("--only", default="", help="restrict to 'task/mixer,...' (for a quick check)")
    p.add_argument(
        "--match-params",
        metavar="MIXER",
        help="every model's MLP width chosen so its parameter count is nearest MIXER's model's "
        "(default: no matching, the MLP 2 * hidden_size wide)",
    )
    return p


def parse(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The arguments with the chosen preset's values where none was given."""
    return record_runs.parse_with_preset(parser(), PRESETS, argv)


SETTING_KEYS = (
    "protocol_version",
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
    "test_batches",
    "solved",
    "flat_tol",
    "tune_seed",
)
PROTOCOL_VERSION = 2  # 2: validation and test streams, tuning seed apart (issue 39)
# settings recorded only when given, so that a document made before they existed resumes:
# name -> the value that leaves it out
OPTIONAL_SETTINGS = {"match_params": None}


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
    if window[-1] - base >= flat_tol:
        return "rising"
    return "flat" if max(abs(a - base) for a in window) < flat_tol else "moving"


_DRAWERS: dict = {}


def _model_config(mixer: str, args) -> ModelConfig:
    """The model of ``mixer`` at the options ``args``; with ``--match-params M`` its MLP width
    is the one whose parameter count is nearest M's model's (:func:`params_target`)."""
    config = _unmatched_config(mixer, args)
    target = params_target(args)
    return config if target is None else match_parameter_count(config, target)


def params_target(args) -> int | None:
    """The parameter count every model is matched to (``--match-params``), else None."""
    match = getattr(args, "match_params", None)
    return None if match is None else config_param_count(_unmatched_config(match, args))


def _unmatched_config(mixer: str, args) -> ModelConfig:
    mixer_config = KDAConfig(
        hidden_size=args.hidden_size,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        implementation=args.implementation,
        chunk_size=args.chunk_size,
    )
    return ModelConfig(
        vocab_size=args.vocab_size,
        mixer=mixer,
        num_layers=args.num_layers,
        mixer_config=mixer_config,
    )


def _train_until_stop(model, task_fn, draw, lr, seed, seq_len, args) -> tuple[dict, str | None]:
    """The training loop with its validation checks: ``(curve, stop or None)``."""
    optimizer = make_optimizer(model, steps=args.max_steps, learning_rate=lr)
    step_fn = nnx.cached_partial(train_step, model, optimizer)
    data_key = jax.random.fold_in(jax.random.key(seed), TRAIN_STREAM)
    held_out = dict(batch_size=args.batch_size, seq_len=seq_len, seed=seed, split="validation")
    curve = {"step": [], "loss": [], "accuracy": [], "train_loss": [], "seconds": []}
    window, start, stop = [], time.perf_counter(), None
    for i in range(args.max_steps):
        window.append(step_fn(draw(jax.random.fold_in(data_key, i)))[0])
        if (i + 1) % args.eval_every and i + 1 < args.max_steps:
            continue
        train_loss = float(np.mean(jax.device_get(window)))
        window = []
        scores = evaluate(model, task_fn, **held_out, num_batches=args.eval_batches)
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
    return curve, stop


def run_one(task: str, mixer: str, seq_len: int, lr: float, seed: int, args) -> dict:
    """Train one model until solved (on validation) or the step budget, then score the
    validation and, once, the test batches; the record, JSON-ready. ``curve`` holds the
    validation checks (``loss``, ``accuracy``) beside the training loss."""
    options = task_options(task, args)
    task_fn = make_task(task, **options)
    shape = (task, tuple(sorted(options.items())), args.batch_size, seq_len)
    if shape not in _DRAWERS:
        _DRAWERS[shape] = jax.jit(lambda key: task_fn(key, args.batch_size, seq_len))
    config = _model_config(mixer, args)
    model = TinyLM(config, rngs=nnx.Rngs(seed))
    curve, stop = _train_until_stop(model, task_fn, _DRAWERS[shape], lr, seed, seq_len, args)
    steps_run = curve["step"][-1]
    held_out = dict(batch_size=args.batch_size, seq_len=seq_len, seed=seed)
    reach = dict(reach=config.conv_reach)
    validation = evaluate(
        model, task_fn, **held_out, **reach, num_batches=args.eval_batches, split="validation"
    )
    test = evaluate(
        model, task_fn, **held_out, **reach, num_batches=args.test_batches, split="test"
    )
    target = params_target(args)
    matched = {} if target is None else dict(params_target=target)
    device = jax.devices()[0]
    return dict(
        task=task,
        task_options=options,
        mixer=mixer,
        model=config.record(),
        params=parameter_count(model),
        **matched,
        training=dict(
            steps=steps_run,
            max_steps=args.max_steps,
            batch_size=args.batch_size,
            seq_len=seq_len,
            learning_rate=lr,
            seed=seed,
        ),
        curve=curve,
        validation=dict(validation, batches=args.eval_batches),
        test=dict(test, batches=args.test_batches),
        eval=dict(validation, batches=args.eval_batches),  # the name older readers use
        conv_reach=config.conv_reach,
        stop=stop or verdict(curve, args.max_steps, args.solved, args.flat_tol),
        chance_accuracy=chance_accuracy(task, **options),
        train_seconds=curve["seconds"][-1],
        seconds_per_step=curve["seconds"][-1] / steps_run,
        platform=device.platform,
        device_kind=device.device_kind,
        versions={name: importlib.metadata.version(name) for name in ("jax", "flax", "optax")},
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def run_key(r: dict) -> tuple:
    t = r["training"]
    return (r["task"], r["mixer"], t["seq_len"], float(t["learning_rate"]), int(t["seed"]))


def score(r: dict) -> tuple:
    """Tuning order, on validation only, lower is better: a solved run beats an unsolved one,
    and among solved runs the fewest steps wins (their final accuracies differ only by where in
    [solved, 1] the check fired); then higher final validation accuracy, then lower validation
    loss. (A record without ``validation`` is an old one, whose ``eval`` was scored on the same
    stream.)"""
    solved = r["stop"] == "solved"
    validation = r.get("validation", r.get("eval"))
    return (
        not solved,
        r["training"]["steps"] if solved else 0,
        -round(validation["accuracy"], 3),
        validation["loss"],
    )


def best_rate(rows: list[dict]) -> float:
    """The rate of the best run (:func:`score`; ties: the first, the smaller rate)."""
    return float(min(rows, key=score)["training"]["learning_rate"])


def setting_of(args) -> dict:
    """The options that make a run what it is (:data:`SETTING_KEYS`), and those of
    :data:`OPTIONAL_SETTINGS` given a value other than the one that leaves them out."""
    setting = record_runs.setting_of(args, SETTING_KEYS, PROTOCOL_VERSION)
    for name, absent in OPTIONAL_SETTINGS.items():
        if getattr(args, name, absent) != absent:
            setting[name] = getattr(args, name)
    return setting


class Sweep(record_runs.RunDocument):
    """The JSON document and the runs in it; :meth:`ensure` trains a run only when absent.

    ``before_train(key)`` (optional), called with a run's ``(task, mixer, seq_len, lr, seed)``
    just before it is trained (never for a run the document or the file holds), may raise to
    stop the sweep there (a driver's time limit: ``scripts/synthetic_protocol.py``)."""

    def __init__(self, args, before_train=None):
        self.args, self.before_train = args, before_train
        document = dict(
            protocol=__doc__.split("Protocol (stated once")[1].strip(),
            setting=setting_of(args),
            grids={},
            runs=[],
        )
        super().__init__(args.output, document, run_key)

    def ensure(self, task, mixer, seq_len, lr, seed, phase) -> dict:
        def train() -> dict:
            if self.before_train is not None:
                self.before_train((task, mixer, seq_len, float(lr), int(seed)))
            return dict(run_one(task, mixer, seq_len, lr, seed, self.args), phase=phase)

        def announce(record: dict) -> None:
            print(
                f"{phase:5s} {task:10s} {mixer:15s} T={seq_len:<4d} lr {lr:<8g} seed {seed}: "
                f"val {record['validation']['accuracy']:.3f} test "
                f"{record['test']['accuracy']:.3f} after {record['training']['steps']} "
                f"steps ({record['stop']}), {record['train_seconds']:.0f} s",
                flush=True,
            )

        key = (task, mixer, seq_len, float(lr), int(seed))
        return super().ensure(key, train, announce)

    def tune(self, task, mixer, seed: int | None = None):
        """The rate of the cell, chosen on validation at the task's first length with the
        tuning seed (:func:`kda_lib.lab.rate_grid.tune_rate`), recorded in ``grids`` under
        ``"task/mixer"``. ``seed``: another tuning seed (never a reported one), for the rate's
        robustness to it: recorded under ``"task/mixer@seed<seed>"``, the seeds' rate unchanged."""
        a = self.args
        seq_len = a.seq_lens[task][0]
        seed = a.tune_seed if seed is None else seed
        if seed in a.seeds:
            raise ValueError(f"tuning seed {seed} is one of the reported seeds {a.seeds}")
        grid = tune_rate(
            lambda lr: score(self.ensure(task, mixer, seq_len, lr, seed, "tune")),
            initial_grid(a),
            factor=a.grid_factor,
            max_extensions=a.max_extensions,
        )
        self.set_grid(
            grid_name(task, mixer, seed, a.tune_seed),
            dict(seq_len=seq_len, seed=seed, **{k: grid[k] for k in ("rates", "best", "inside")}),
        )

    def seeds(self, task, mixer):
        tuned = self.doc["grids"].get(f"{task}/{mixer}")
        if tuned is None:
            raise SystemExit(f"{task}/{mixer} is not tuned yet: run --phase tune first")
        for key in seed_plan(self.args, {f"{task}/{mixer}": tuned["best"]}):
            self.ensure(*key, "seeds")


def grid_name(task: str, mixer: str, seed: int, tune_seed: int) -> str:
    """``"task/mixer"`` for the tuning seed's grid, ``"task/mixer@seed<seed>"`` for another's."""
    return f"{task}/{mixer}" + ("" if seed == tune_seed else f"@seed{seed}")


def initial_grid(args) -> list[float]:
    return parse_grid(args.grid)


def cells(args) -> list[tuple[str, str]]:
    """(task, mixer) pairs, task by task, restricted by ``--only``."""
    only = set(filter(None, args.only.split(",")))
    tasks, mixers = args.tasks.split(","), args.mixers.split(",")
    return [(t, m) for t in tasks for m in mixers if not only or f"{t}/{m}" in only]


def tuning_plan(args) -> list[tuple]:
    """The tuning runs of the first grid, ``(task, mixer, seq_len, rate, seed)``: the task's
    first length, the tuning seed (an edge best adds one rate at a time beyond these)."""
    return [
        (task, mixer, args.seq_lens[task][0], rate, args.tune_seed)
        for task, mixer in cells(args)
        for rate in initial_grid(args)
    ]


def seed_plan(args, rates: dict[str, float]) -> list[tuple]:
    """The reported runs ``(task, mixer, seq_len, rate, seed)``: per tuned cell (``rates``:
    ``"task/mixer"`` -> its chosen rate) every seed of ``--seeds`` at every length."""
    return [
        (task, mixer, seq_len, rates[f"{task}/{mixer}"], seed)
        for task, mixer in cells(args)
        if f"{task}/{mixer}" in rates
        for seed in args.seeds
        for seq_len in args.seq_lens[task]
    ]


# the smallest values of this script's int options beyond those of record_runs.MINIMUMS
MINIMUMS = dict(
    record_runs.MINIMUMS,
    vocab_size=2,
    num_pairs=1,
    chunk_size=1,
    max_steps=1,
    eval_batches=1,
    test_batches=1,
)


def check_arguments(p: argparse.ArgumentParser, args) -> None:
    """Refuse, before any work, what would fail or mislead later (argparse's error, exit 2);
    turns ``--seeds`` and ``--grid`` into lists."""
    check_option_minimums(p, args, MINIMUMS)
    if not 0 < args.solved <= 1:
        p.error(f"--solved must be in (0, 1], got {args.solved}")
    if not args.flat_tol >= 0:
        p.error(f"--flat-tol must be >= 0, got {args.flat_tol}")
    record_runs.check_seeds_and_grid(p, args)
    if args.match_params is not None and args.match_params not in MODEL_MIXERS:
        p.error(f"--match-params: unknown mixer {args.match_params!r}; known: "
                f"{', '.join(sorted(MODEL_MIXERS))}")  # fmt: skip
    check_cells(p, args)
    record_runs.check_output(p, args, setting_of(args))


def check_cells(p: argparse.ArgumentParser, args) -> None:
    """Refuse (argparse's error naming the option) an unknown task, mixer or ``--only`` cell,
    a model option its config refuses, and a task length or option its generator refuses
    (traced with :func:`jax.eval_shape`: nothing is compiled or run)."""
    tasks, mixers = args.tasks.split(","), args.mixers.split(",")
    for option, names, known in (("--tasks", tasks, TASKS), ("--mixers", mixers, MODEL_MIXERS)):
        unknown = [name for name in names if name not in known]
        if unknown:
            p.error(f"{option}: unknown {unknown}; known: {', '.join(sorted(known))}")
    missing = [t for t in tasks if t not in args.seq_lens]
    if missing:
        p.error(f"--seq-lens gives no length for the task(s) {missing}")
    only = set(filter(None, args.only.split(",")))
    unknown = sorted(only - {f"{t}/{m}" for t in tasks for m in mixers})
    if unknown:
        p.error(f"--only: {unknown} are not task/mixer cells of --tasks and --mixers")
    for mixer in mixers:  # (with --match-params: a target below a 1-unit MLP is refused here)
        record_runs.check_model(p, lambda m=mixer: _model_config(m, args))
    batch = args.batch_size
    for task in tasks:
        draw = make_task(task, **task_options(task, args))
        for seq_len in args.seq_lens[task]:
            try:
                jax.eval_shape(lambda d=draw, t=seq_len: d(jax.random.key(0), batch, t))
            except ValueError as error:
                p.error(f"--seq-lens {task}={seq_len} (--vocab-size, --num-pairs): {error}")


def main(argv=None):
    p, args = parse(argv)
    check_arguments(p, args)
    kda_lib.teaching.notebook.setup(style=False)
    sweep = Sweep(args)
    todo = cells(args)
    start = time.perf_counter()
    for task in args.tasks.split(","):  # per task: tuning, then seeds: finished cells come early
        for t, m in todo:
            if t == task and args.phase in ("tune", "all"):
                sweep.tune(t, m)
        for t, m in todo:
            if t == task and args.phase in ("seeds", "all"):
                sweep.seeds(t, m)
    print(
        f"done: {len(sweep.doc['runs'])} runs in {sweep.path} "
        f"({time.perf_counter() - start:.0f} s this call)"
    )


if __name__ == "__main__":
    main()
