"""Training for the tiny models of :mod:`kda_lib.models` (Flax NNX + optax).

:func:`train` runs AdamW (no weight decay on norms, biases, embeddings, ``A_log``,
``dt_bias``: :func:`kda_lib.models.decay_mask`) on batches drawn from a task of
:mod:`kda_lib.tasks`, one jitted step per batch, and returns a history of the masked loss and
accuracy; :func:`evaluate` scores held-out batches; :func:`run_experiment` and
:func:`run_sweep` train, score and describe runs as JSON records; ``python -m kda_lib.train``
is the command line. Randomness: the model's init comes from the ``nnx.Rngs`` you build it
with; batches come from ``seed`` (training and evaluation draw from different streams of it,
so they never share a batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import inspect
import math
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kda_lib._checks import MAX_SEED, check_positive_int, check_seed
from kda_lib.models import (
    MIXERS,
    ModelConfig,
    TinyLM,
    count_params,
    decay_mask,
    parameter_path_names,
)
from kda_lib.records import dumps, output_path_problem, write_json
from kda_lib.tasks import TASKS, TaskBatch, TaskFn, chance_accuracy

TRAIN_STREAM = 0  # jax.random.fold_in(key(seed), stream): training batches
EVAL_STREAM = 1  # held-out batches for evaluate()


# ----------------------------------------------------------------------------- optimiser


def make_optimizer(
    model: nnx.Module,
    *,
    steps: int,
    learning_rate: float,
    weight_decay: float = 0.1,
    warmup_steps: int | None = None,
    clip_norm: float | None = 1.0,
) -> nnx.Optimizer:
    """AdamW with linear warmup then cosine decay to 10%, global-norm clipping and the
    :func:`decay_mask`. ``warmup_steps`` defaults to 10% of ``steps``."""
    warmup = max(1, steps // 10) if warmup_steps is None else warmup_steps
    mask = tuple(sorted(decay_mask(model).items()))
    transform = _adamw(steps, learning_rate, weight_decay, min(warmup, steps), clip_norm, mask)
    return nnx.Optimizer(model, transform, wrt=nnx.Param)


@functools.lru_cache(maxsize=64)
def _adamw(steps, learning_rate, weight_decay, warmup, clip_norm, mask_items):
    """One optax transform per setting: equal settings give the *same* object, so optimisers
    built for equal models have equal graphdefs and share compiled training steps."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),  # optax needs a decay phase after the warmup
        end_value=0.1 * learning_rate,
    )
    mask = dict(mask_items)

    def mask_fn(params):
        return jax.tree_util.tree_map_with_path(lambda p, _: mask[parameter_path_names(p)], params)

    chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    chain.append(optax.adamw(schedule, weight_decay=weight_decay, mask=mask_fn))
    return optax.chain(*chain)


# ----------------------------------------------------------------------------- training
def masked_metrics(logits: jax.Array, batch: TaskBatch) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy (nats) and accuracy over ``batch.mask``; logits ``[B, T, vocab]``."""
    mask = batch.mask.astype(jnp.float32)
    count = jnp.maximum(mask.sum(), 1.0)
    losses = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch.targets
    )
    correct = (jnp.argmax(logits, -1) == batch.targets).astype(jnp.float32)
    return (losses * mask).sum() / count, (correct * mask).sum() / count


def _stream(seed: int, stream: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), stream)


def _loss(model: nnx.Module, batch: TaskBatch):
    return masked_metrics(model(batch.inputs), batch)


# Module-level jitted steps, cached on the model's and optimiser's graphdefs (structure and
# static config): models of equal config share one compilation across tasks and runs, as long
# as their batches have the same shape (a sweep over tasks of one vocabulary and length
# compiles each mixer once).
@nnx.jit
def train_step(model, optimizer, batch: TaskBatch):
    (loss, accuracy), grads = nnx.value_and_grad(_loss, has_aux=True)(model, batch)
    optimizer.update(model, grads)
    return loss, accuracy


@nnx.jit
def _eval_step(model, batch: TaskBatch):
    return _loss(model, batch)


@functools.lru_cache(maxsize=64)
def _batch_drawer(task_fn: TaskFn, batch_size: int, seq_len: int):
    """``key -> task_fn(key, batch_size, seq_len)``, jitted (batches are drawn outside the
    model's step so that the step does not depend on the task). Cached: the checks of
    :func:`run_experiment`, :func:`train` and :func:`evaluate` share one compilation."""
    return jax.jit(lambda key: task_fn(key, batch_size, seq_len))


def train(
    model: TinyLM,
    task_fn: TaskFn,
    *,
    steps: int,
    batch_size: int,
    seq_len: int,
    learning_rate: float = 3e-3,
    seed: int = 0,
    log_every: int = 10,
    progress: bool | Callable[[dict], None] = False,
    weight_decay: float = 0.1,
    warmup_steps: int | None = None,
    clip_norm: float | None = 1.0,
) -> dict[str, list]:
    """Train ``model`` in place on ``task_fn(key, batch_size, seq_len)`` batches.

    Batch ``i`` (0-based) is ``task_fn(fold_in(fold_in(key(seed), TRAIN_STREAM), i), ...)``.
    The jitted step is shared by every model of the same config and batch shape, so a sweep
    over tasks compiles it once per mixer.

    Args:
      model: e.g. :class:`TinyLM`; any module mapping ``[B, T]`` tokens to logits.
      task_fn: ``(key, batch, seq_len) -> TaskBatch``, jittable (see :mod:`kda_lib.tasks`).
      steps, batch_size, seq_len: optimiser steps and the batch shape.
      learning_rate: AdamW peak (see :func:`make_optimizer` for the schedule).
      seed: the batches' seed.
      log_every: record the mean loss/accuracy of every ``log_every`` steps (and of the last,
        possibly shorter, window).
      progress: False: silent. True: print one line per record. A callable: called with each
        record (``{"step", "loss", "accuracy", "seconds"}``).
      weight_decay, warmup_steps, clip_norm: see :func:`make_optimizer`.

    Returns:
      ``{"step": [...], "loss": [...], "accuracy": [...], "seconds": [...]}``: the last step of
      each window (1-based), the window's mean masked loss (nats) and accuracy, and the wall
      time since the start (the first record includes compilation). Training stops after the
      first window whose mean loss is not finite (the run diverged; that record is the last).
    """
    steps = check_positive_int("steps", steps)
    log_every = check_positive_int("log_every", log_every)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_seed("seed", seed)
    # NaN passes (as in the command line): such a run diverges and is recorded as diverged
    number = isinstance(learning_rate, (int, float, np.integer, np.floating))
    if isinstance(learning_rate, bool) or not number or learning_rate < 0:
        raise ValueError(f"learning_rate must be a number >= 0, got {learning_rate!r}")
    optimizer = make_optimizer(
        model,
        steps=steps,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        clip_norm=clip_norm,
    )

    draw = _batch_drawer(task_fn, batch_size, seq_len)
    step_fn = nnx.cached_partial(train_step, model, optimizer)
    data_key = _stream(seed, TRAIN_STREAM)
    history: dict[str, list] = {"step": [], "loss": [], "accuracy": [], "seconds": []}
    window: list[tuple[jax.Array, jax.Array]] = []
    report = print_record if progress is True else (progress or None)
    start = time.perf_counter()
    for i in range(steps):
        window.append(step_fn(draw(jax.random.fold_in(data_key, i))))
        if len(window) == log_every or i == steps - 1:
            losses, accuracies = zip(*jax.device_get(window), strict=True)
            record = dict(
                step=i + 1,
                loss=float(sum(losses) / len(losses)),
                accuracy=float(sum(accuracies) / len(accuracies)),
                seconds=time.perf_counter() - start,
            )
            for name, value in record.items():
                history[name].append(value)
            if report:
                report(record)
            window = []
            if not math.isfinite(record["loss"]):
                break  # diverged: the remaining steps cannot recover from a non-finite loss
    return history


def print_record(record: dict) -> None:
    """One plain line per training record."""
    print(
        f"step {record['step']:6d}  loss {record['loss']:.4f}  "
        f"accuracy {record['accuracy']:.3f}  {record['seconds']:.1f} s",
        flush=True,
    )


def evaluate(
    model: TinyLM,
    task_fn: TaskFn,
    *,
    batch_size: int,
    seq_len: int,
    num_batches: int = 4,
    seed: int = 0,
) -> dict[str, float]:
    """Masked loss (nats) and accuracy on ``num_batches`` held-out batches.

    The batches come from ``fold_in(key(seed), EVAL_STREAM)``, a stream :func:`train` never
    draws from, so with the same seed they are unseen. Returns ``{"loss", "accuracy"}``
    averaged over the batches (all have the same mask size for a fixed task).
    """

    num_batches = check_positive_int("num_batches", num_batches)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_seed("seed", seed)
    draw = _batch_drawer(task_fn, batch_size, seq_len)
    key = _stream(seed, EVAL_STREAM)
    results = [_eval_step(model, draw(jax.random.fold_in(key, i))) for i in range(num_batches)]
    results = jax.device_get(results)
    return dict(
        loss=sum(float(loss) for loss, _ in results) / num_batches,
        accuracy=sum(float(acc) for _, acc in results) / num_batches,
    )


# ----------------------------------------------------------------------------- experiments
# Task options used when neither the caller nor the command line gives one. Small enough for
# CI; the notebooks' "full" parameters and the command line scale them up.
DEFAULT_TASK_OPTIONS: dict[str, dict] = {
    "delayed_copy": dict(vocab_size=16, delay=8),
    "mqar": dict(vocab_size=64, num_pairs=8),
    "palindrome": dict(vocab_size=16),
    "stack": dict(vocab_size=16),
}
RESULTS_DIR = "data/results"


def make_task(name: str, **options) -> TaskFn:
    """``TASKS[name]`` with its options bound (missing ones from :data:`DEFAULT_TASK_OPTIONS`).

    Raises ValueError naming the task for an unknown task or an option it does not take.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    generator = TASKS[name]
    accepted = [
        p.name
        for p in inspect.signature(generator).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"task {name!r} takes the options {accepted}; got unknown {unknown}")
    bound = {**DEFAULT_TASK_OPTIONS.get(name, {}), **options}
    return functools.partial(generator, **bound)


def run_experiment(
    task: str,
    *,
    mixer: str,
    seq_len: int,
    steps: int,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    eval_batches: int = 4,
    task_options: dict | None = None,
    model_options: dict | None = None,
    log_every: int = 50,
    progress: bool | Callable[[dict], None] = False,
) -> dict:
    """Train a :class:`TinyLM` with ``mixer`` on ``task`` and score it on held-out batches.

    Args:
      task: a name in :data:`kda_lib.tasks.TASKS`.
      mixer: a name in :data:`MIXERS`.
      seq_len, batch_size: T and B of every batch (training and evaluation).
      steps, learning_rate, log_every, progress: see :func:`train`.
      seed: seeds the model's init (``nnx.Rngs(seed)``) and the batches (see :func:`train`).
      eval_batches: held-out batches for :func:`evaluate`.
      task_options: the task generator's keyword options (defaults from
        :data:`DEFAULT_TASK_OPTIONS`); ``vocab_size`` is also the model's.
      model_options: other :class:`ModelConfig` fields (hidden_size, num_layers, ...).

    Returns:
      A JSON-ready record: ``task``, ``task_options``, ``mixer``, ``model`` (the
      ModelConfig), ``params``, ``training`` (steps, batch_size, seq_len, learning_rate, seed),
      ``history`` (from :func:`train`), ``eval`` (``loss``, ``accuracy``, ``batches``),
      ``chance_accuracy`` (:func:`kda_lib.tasks.chance_accuracy`), ``train_seconds``
      (compilation included), ``diverged`` (True when a training or the held-out loss is not
      finite; training then stops early), ``platform``, ``versions`` and ``date`` (UTC).

    Raises:
      ValueError: an unknown task or option, a shape the task cannot fill, or a task that
        scores no position (e.g. delayed_copy with ``delay >= seq_len``), before training.
    """
    task_fn = make_task(task, **(task_options or {}))
    # fail here, with the generator's own message, rather than inside the jitted step
    jax.eval_shape(lambda key: task_fn(key, batch_size, seq_len), jax.random.key(0))
    options = task_fn.keywords
    first = _batch_drawer(task_fn, batch_size, seq_len)(
        jax.random.fold_in(_stream(seed, TRAIN_STREAM), 0)
    )
    if not bool(jnp.any(first.mask)):
        raise ValueError(
            f"task {task!r} with seq_len={seq_len} and options {dict(options)} scores no "
            "position (the first batch's mask is all False): nothing to train or evaluate"
        )
    config = ModelConfig(vocab_size=options["vocab_size"], mixer=mixer, **(model_options or {}))
    model = TinyLM(config, rngs=nnx.Rngs(seed))
    start = time.perf_counter()
    history = train(
        model,
        task_fn,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        learning_rate=learning_rate,
        seed=seed,
        log_every=log_every,
        progress=progress,
    )
    train_seconds = time.perf_counter() - start
    scores = evaluate(
        model, task_fn, batch_size=batch_size, seq_len=seq_len, num_batches=eval_batches, seed=seed
    )
    return dict(
        task=task,
        task_options=dict(options),
        mixer=config.label,
        model=dataclasses.asdict(config),
        params=count_params(model),
        training=dict(
            steps=steps,
            batch_size=batch_size,
            seq_len=seq_len,
            learning_rate=learning_rate,
            seed=seed,
        ),
        history=history,
        eval=dict(scores, batches=eval_batches),
        chance_accuracy=chance_accuracy(task, **options),
        train_seconds=train_seconds,
        diverged=not all(math.isfinite(v) for v in [*history["loss"], scores["loss"]]),
        platform=jax.devices()[0].platform,
        versions={dist: importlib.metadata.version(dist) for dist in ("jax", "flax", "optax")},
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def run_sweep(
    tasks: dict[str, dict],
    mixers: list[str],
    seq_lens: list[int],
    *,
    report: Callable[[dict], None] | None = None,
    **experiment,
) -> list[dict]:
    """:func:`run_experiment` for every task x sequence length x mixer, in that order.

    Args:
      tasks: task name -> its options (e.g. ``{"mqar": {"vocab_size": 32, "num_pairs": 4}}``).
        Give every task the same ``vocab_size`` and the runs of one mixer and length share one
        compiled training step.
      mixers: names in :data:`MIXERS`.
      seq_lens: T values.
      report: called with each record as it finishes (e.g. to print a line).
      **experiment: the other :func:`run_experiment` arguments (steps, batch_size,
        learning_rate, seed, eval_batches, model_options, log_every).

    Returns:
      The records, one per run.
    """
    records = []
    for task, options in tasks.items():
        for seq_len in seq_lens:
            for mixer in mixers:
                record = run_experiment(
                    task, mixer=mixer, seq_len=seq_len, task_options=options, **experiment
                )
                records.append(record)
                if report:
                    report(record)
    return records


def summary_line(record: dict) -> str:
    """``mqar  T=64  kda  accuracy 0.941 (chance 0.062)  12.3 s`` for one record."""
    return (
        f"{record['task']:<12s} T={record['training']['seq_len']:<5d} {record['mixer']:<10s} "
        f"accuracy {record['eval']['accuracy']:.3f} (chance {record['chance_accuracy']:.3f})  "
        f"{record['train_seconds']:.1f} s"
    )


def default_result_path(record: dict, results_dir: str = RESULTS_DIR) -> pathlib.Path:
    """``<results_dir>/<task>-<mixer>-T<seq_len>-seed<seed>.json``."""
    training = record["training"]
    name = f"{record['task']}-{record['mixer']}-T{training['seq_len']}-seed{training['seed']}"
    return pathlib.Path(results_dir) / f"{name}.json"


def save_record(record: dict | list[dict], path: str | pathlib.Path) -> pathlib.Path:
    """Write a record (or a list of them) as indented, strict JSON (a NaN or infinite number
    becomes null), creating folders; returns the path.

    Atomic: the text goes to a temporary file in the same folder, which then replaces ``path``,
    so an interrupted write never leaves a truncated record (nor destroys an older one)."""
    return write_json(record, path)


class _ProgressBar:
    """A tqdm bar fed by :func:`train`'s records (for terminals)."""

    def __init__(self, steps: int, description: str):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=steps, desc=description, unit="step")
        self.done = 0

    def __call__(self, record: dict) -> None:
        self.bar.update(record["step"] - self.done)
        self.done = record["step"]
        self.bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}")

    def close(self) -> None:
        self.bar.close()


def _layer_pattern(text: str) -> tuple[str, ...]:
    """``"kda,kda,kda,attention"`` -> ``("kda", "kda", "kda", "attention")``, names checked."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in MIXERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown mixers {unknown} in {text!r}; known: {', '.join(sorted(MIXERS))}"
        )
    return names


def _model_label(args: argparse.Namespace) -> str:
    """The record's mixer name: ``--mixer``, or the ``--layers`` pattern's label."""
    if not args.layers:
        return args.mixer
    return ModelConfig(vocab_size=1, num_layers=len(args.layers), layers=args.layers).label


MIXER_HELP = {
    "kda": "Kimi Delta Attention",
    "gdn": "Gated DeltaNet: one decay per head",
    "attention": "causal softmax attention, RoPE",
    "attention_conv": "that attention with KDA's short convs on q, k, v: an ablation",
    "conv": "the short conv alone, no recurrence",
}


def _task_defaults(option: str) -> str:
    """`` [delayed_copy 16, mqar 64, ...]``: each task's default of ``option`` (or "")."""
    found = [f"{task} {o[option]}" for task, o in DEFAULT_TASK_OPTIONS.items() if option in o]
    return f" [{', '.join(found)}]" if found else ""


def _stack_default() -> str:
    default = inspect.signature(TASKS["stack"]).parameters.get("pop_probability")
    return f" [stack {default.default}]" if default and default.default is not default.empty else ""


def _model_default(field: str):
    return ModelConfig.__dataclass_fields__[field].default


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kda_lib.train",
        description="Train a tiny language model on a synthetic task, score it on held-out "
        "batches and write a JSON record.",
    )
    parser.add_argument("task", choices=sorted(TASKS), help="synthetic task")
    parser.add_argument(
        "--mixer",
        choices=sorted(MIXERS),
        default="kda",
        metavar="MIXER",
        help="token mixer: "
        + "; ".join(f"{name} ({MIXER_HELP.get(name, 'see kda_lib.models')})" for name in MIXERS)
        + " (default: kda)",
    )
    parser.add_argument(
        "--steps", type=int, default=1000, help="optimiser steps (default: %(default)s)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=128, help="tokens per sequence T (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="sequences per batch B (default: %(default)s)"
    )
    parser.add_argument(
        "--learning-rate", type=float, default=3e-3, help="AdamW peak rate (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="model init and batches (default: %(default)s)"
    )
    parser.add_argument(
        "--eval-batches", type=int, default=8, help="held-out batches (default: %(default)s)"
    )
    parser.add_argument(
        "--log-every", type=int, default=50, help="steps per progress record (default: %(default)s)"
    )
    task = parser.add_argument_group("task options (each task's defaults in brackets)")
    task.add_argument(
        "--vocab-size",
        type=int,
        help="tokens in the task and the model" + _task_defaults("vocab_size"),
    )
    task.add_argument(
        "--num-pairs",
        type=int,
        help="mqar: key/value pairs per sequence" + _task_defaults("num_pairs"),
    )
    task.add_argument(
        "--delay", type=int, help="delayed_copy: how far back to copy" + _task_defaults("delay")
    )
    task.add_argument(
        "--pop-probability",
        type=float,
        help="stack: chance of a pop" + (_task_defaults("pop_probability") or _stack_default()),
    )
    model = parser.add_argument_group("model options")
    model_help = dict(
        hidden_size="model width",
        num_layers="blocks of (norm, mixer, norm, MLP)",
        num_heads="heads H of the mixer",
        head_dim="K (and V) per head",
        conv_size="short-conv width W (kda, gdn, conv)",
    )
    for field, meaning in model_help.items():
        model.add_argument(
            f"--{field.replace('_', '-')}",
            type=int,
            help=f"{meaning} (default: {_model_default(field)})",
        )
    model.add_argument(
        "--implementation",
        help=f"KDA kernel (see kda_lib.kda; default: {_model_default('implementation')})",
    )
    model.add_argument(
        "--layers",
        type=_layer_pattern,
        help="per-layer mixers, comma-separated (e.g. kda,kda,kda,attention: Kimi Linear's 3:1 "
        "hybrid), tiled over --num-layers (default: one copy); replaces --mixer",
    )
    model.add_argument(
        "--rope",
        action=argparse.BooleanOptionalAction,
        help="rotary positions in attention layers (default: on; --no-rope is NoPE)",
    )
    parser.add_argument(
        "--output",
        help="JSON record path (default: data/results/<task>-<mixer>-T<seq_len>-seed<seed>.json)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "bar", "lines", "none"),
        default="auto",
        help="auto (the default): a tqdm bar on a terminal, plain lines otherwise",
    )
    return parser


# the smallest value of each integer option (absent options: not given, or not this parser's)
OPTION_MINIMUMS = dict(
    steps=1,
    seq_len=1,
    batch_size=1,
    eval_batches=1,
    log_every=1,
    vocab_size=1,
    num_pairs=1,
    delay=0,
    hidden_size=1,
    num_layers=1,
    num_heads=1,
    head_dim=1,
    conv_size=0,
)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> pathlib.Path:
    """Reject bad option values before any work (argparse's error: exit status 2, naming the
    option) and return the record's path, checked to be writable."""
    for name, minimum in OPTION_MINIMUMS.items():
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")
    if args.pop_probability is not None and not 0.0 <= args.pop_probability <= 1.0:
        parser.error(f"--pop-probability must lie in [0, 1], got {args.pop_probability}")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must lie in [0, 2**63 - 1], got {args.seed}")
    if args.learning_rate < 0:  # NaN passes: such a run diverges and is recorded as diverged
        parser.error(f"--learning-rate must be >= 0, got {args.learning_rate}")
    where = dict(
        task=args.task,
        mixer=_model_label(args),
        training=dict(seq_len=args.seq_len, seed=args.seed),
    )
    path = pathlib.Path(args.output) if args.output else default_result_path(where)
    problem = output_path_problem(path)
    if problem:
        parser.error(f"--output: {problem}")
    return path


def _rescue_record(record: dict, path: pathlib.Path, error: OSError) -> None:
    """The record could not be written to ``path`` (checked writable before training, so the
    disk filled up or went away meanwhile): write it to the system's temporary folder instead,
    or if that fails too print it on stdout; say where on stderr and exit with status 1."""
    fallback = pathlib.Path(tempfile.gettempdir()) / path.name
    where = None
    if fallback.resolve() != path.resolve():
        try:
            where = f"written to {fallback} instead"
            save_record(record, fallback)
        except OSError:
            where = None
    if where is None:
        print(dumps(record), end="", flush=True)
        where = "printed above on stdout"
    print(
        f"error: could not write the finished run's record to {path} ({error}); "
        f"the record was {where}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> dict:
    """The command line; returns the record it wrote.

    Every option and the output path are checked before training (exit status 2). A run whose
    loss is not finite is recorded with ``"diverged": true`` (nulls for the non-finite numbers)
    and the process exits with status 1."""
    started = time.perf_counter()
    parser = _parser()
    args = parser.parse_args(argv)
    path = _check_args(parser, args)
    task_options = {
        name: getattr(args, name)
        for name in ("vocab_size", "num_pairs", "delay", "pop_probability")
        if getattr(args, name) is not None
    }
    model_options = {
        name: getattr(args, name)
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "head_dim",
            "conv_size",
            "implementation",
            "layers",
            "rope",
        )
        if getattr(args, name) is not None
    }
    if args.layers:  # the pattern names every layer's mixer; one copy unless --num-layers
        model_options.setdefault("num_layers", len(args.layers))
        args.mixer = args.layers[0]
    style = args.progress
    if style == "auto":
        style = "bar" if sys.stdout.isatty() else "lines"
    if style != "none":  # the first record comes only after the first step has compiled
        print(
            f"{args.task} / {_model_label(args)}: building the model and compiling the first "
            "training step (10 s to a minute on a CPU; the progress starts after it) ...",
            file=sys.stderr,
            flush=True,
        )
    bar = _ProgressBar(args.steps, f"{args.task}/{args.mixer}") if style == "bar" else None
    progress = bar if bar else (style == "lines")
    try:
        record = run_experiment(
            args.task,
            mixer=args.mixer,
            seq_len=args.seq_len,
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            seed=args.seed,
            eval_batches=args.eval_batches,
            task_options=task_options,
            model_options=model_options,
            log_every=args.log_every,
            progress=progress,
        )
    except ValueError as error:
        parser.error(str(error))
    finally:
        if bar:
            bar.close()
    try:
        save_record(record, path)
    except OSError as error:  # e.g. the disk filled up during training: keep the finished run
        _rescue_record(record, path, error)
    if record["diverged"]:
        history = record["history"]
        step = next(
            (
                s
                for s, v in zip(history["step"], history["loss"], strict=True)
                if not math.isfinite(v)
            ),
            None,
        )
        where = f"the training loss at step {step}" if step else "the held-out loss"
        print(
            f"{args.task} / {record['mixer']}, T={args.seq_len}: diverged ({where} is not finite); "
            f'recorded with "diverged": true in {path}',
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)
    print(
        f"{args.task} / {record['mixer']}, T={args.seq_len}: held-out accuracy "
        f"{record['eval']['accuracy']:.3f} (chance {record['chance_accuracy']:.3f}), "
        f"loss {record['eval']['loss']:.3f}; {record['train_seconds']:.0f} s training "
        f"(compilation included), {time.perf_counter() - started:.0f} s in all; wrote {path}",
        flush=True,
    )
    return record


if __name__ == "__main__":
    main()
