"""Training for the tiny models of :mod:`kda_lib.models.tiny_lm` (Flax NNX + optax).

:func:`train` runs AdamW (no weight decay on norms, biases, embeddings, ``A_log``,
``dt_bias``: :func:`kda_lib.layers.params.weight_decay_mask`) on batches drawn from a task of
:mod:`kda_lib.lab.tasks`, one jitted step per batch, and returns a history of the masked loss and
accuracy; :func:`evaluate` scores held-out batches; :func:`run_experiment` and
:func:`run_sweep` train, score and describe runs as JSON records. The command line is
:mod:`kda_lib.lab.train_cli` (``python -m kda_lib.lab.train_cli``). Randomness: the model's init
comes
from the ``nnx.Rngs`` you build it with; batches come from ``seed`` through three disjoint
streams of it (``fold_in(key(seed), stream)``): training (:data:`TRAIN_STREAM`), validation
(:data:`VALIDATION_STREAM`: what early stopping and rate choice may read) and test
(:data:`TEST_STREAM`: the reported number, scored once at the end of a run).
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import inspect
import math
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kda_lib.checks import check_positive_int, check_seed
from kda_lib.lab.records import RUNS_DIR, write_json
from kda_lib.lab.tasks import (
    ANSWER_POSITIONS,
    TASKS,
    TaskBatch,
    TaskFn,
    beyond_reach_mask,
    chance_accuracy,
)
from kda_lib.layers.params import parameter_count, weight_decay_mask
from kda_lib.models.tiny_lm import (
    ModelConfig,
    TinyLM,
)
from kda_lib.ops.api import register_compiled_cache

TRAIN_STREAM = 0  # jax.random.fold_in(key(seed), stream): training batches
VALIDATION_STREAM = 1  # held-out batches for decisions: early stopping, rate choice
TEST_STREAM = 2  # held-out batches for the reported score only, evaluated once at the end
EVAL_STREAM = VALIDATION_STREAM  # the name before the test stream existed (same batches)
SPLITS = {"validation": VALIDATION_STREAM, "test": TEST_STREAM}


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
    """AdamW with linear warmup then cosine decay to 10%, global-norm clipping and the mask
    :func:`kda_lib.layers.params.weight_decay_mask`. ``warmup_steps`` defaults to 10% of
    ``steps``."""
    warmup = max(1, steps // 10) if warmup_steps is None else warmup_steps
    leaves, treedef = jax.tree.flatten(weight_decay_mask(model))
    transform = _adamw(steps, learning_rate, weight_decay, min(warmup, steps), clip_norm,
                       (tuple(leaves), treedef))  # fmt: skip
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
    mask = jax.tree.unflatten(mask_items[1], mask_items[0])  # weight_decay_mask's pytree

    chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    chain.append(optax.adamw(schedule, weight_decay=weight_decay, mask=mask))
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
def _eval_step(model, batch: TaskBatch, beyond: jax.Array | None = None):
    """Loss and accuracy over ``batch.mask``; with ``beyond`` (a ``[B, T]`` bool sub-mask) also
    the number of correct and of scored positions there."""
    logits = model(batch.inputs)
    loss, accuracy = masked_metrics(logits, batch)
    if beyond is None:
        return loss, accuracy, jnp.float32(0), jnp.float32(0)
    correct = (jnp.argmax(logits, -1) == batch.targets) & beyond
    return loss, accuracy, correct.sum(dtype=jnp.float32), beyond.sum(dtype=jnp.float32)


@register_compiled_cache
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
      task_fn: ``(key, batch, seq_len) -> TaskBatch``, jittable (see :mod:`kda_lib.lab.tasks`).
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


def print_record(record: dict, file=None) -> None:
    """One plain line per training record, on ``file`` (default: stdout)."""
    print(
        f"step {record['step']:6d}  loss {record['loss']:.4f}  "
        f"accuracy {record['accuracy']:.3f}  {record['seconds']:.1f} s",
        file=file,
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
    split: str = "validation",
    reach: int | None = None,
) -> dict[str, float]:
    """Masked loss (nats) and accuracy on ``num_batches`` held-out batches of ``split``.

    ``split="validation"`` draws from ``fold_in(key(seed), VALIDATION_STREAM)`` (the batches
    decisions such as early stopping and the rate choice may read), ``split="test"`` from
    ``fold_in(key(seed), TEST_STREAM)`` (for the reported score only): neither is a stream
    :func:`train` draws from, and they differ from each other. Returns ``{"loss", "accuracy"}``
    averaged over the batches (all have the same mask size for a fixed task).

    ``reach``: for a task whose answers have a source position
    (:func:`kda_lib.lab.tasks.beyond_reach_mask`: stack), also ``beyond_reach_accuracy`` and
    ``beyond_reach_scored``: the accuracy over, and the number of, the scored positions whose
    answer lies more than ``reach`` tokens back (e.g. ``ModelConfig.conv_reach``; the
    accuracy is NaN when there is none). Other tasks ignore it.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    num_batches = check_positive_int("num_batches", num_batches)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_seed("seed", seed)
    if reach is not None:
        check_positive_int("reach", reach, minimum=0)
    draw = _batch_drawer(task_fn, batch_size, seq_len)
    name = task_name(task_fn)
    by_reach = reach is not None and name in ANSWER_POSITIONS
    key = _stream(seed, SPLITS[split])
    results = []
    for i in range(num_batches):
        batch = draw(jax.random.fold_in(key, i))
        beyond = beyond_reach_mask(name, batch, reach) if by_reach else None
        results.append(_eval_step(model, batch, beyond))
    losses, accuracies, correct, scored = np.asarray(jax.device_get(results), np.float64).T
    scores = dict(loss=float(losses.mean()), accuracy=float(accuracies.mean()))
    if by_reach:
        total = float(scored.sum())
        scores["beyond_reach_accuracy"] = float(correct.sum() / total) if total else math.nan
        scores["beyond_reach_scored"] = int(total)
    return scores


def task_name(task_fn: TaskFn) -> str | None:
    """The :data:`TASKS` name of the generator ``task_fn`` binds (a ``functools.partial`` as
    :func:`make_task` builds, or the generator itself); None for any other function."""
    generator = getattr(task_fn, "func", task_fn)
    return next((name for name, fn in TASKS.items() if fn is generator), None)


def record_scores(record: dict) -> dict:
    """``{"validation": {...} | None, "test": {...} | None}`` of a run record, old or new.

    New records (:func:`run_experiment`, ``scripts/synthetic_sweep.py``) hold ``validation``
    and ``test``; records written before the test stream existed hold only ``eval``, which
    was scored on the validation stream's batches (and read for decisions too), so it is
    returned as ``validation`` with ``test`` None."""
    validation = record.get("validation", record.get("eval"))
    return dict(validation=validation, test=record.get("test"))


# ----------------------------------------------------------------------------- experiments
# Task options used when neither the caller nor the command line gives one. Small enough for
# CI; the notebooks' "full" parameters and the command line scale them up.
DEFAULT_TASK_OPTIONS: dict[str, dict] = {
    "delayed_copy": dict(vocab_size=16, delay=8),
    "mqar": dict(vocab_size=64, num_pairs=8),
    "palindrome": dict(vocab_size=16),
    "stack": dict(vocab_size=16),
}


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
    try:
        return _bound_task(name, tuple(sorted(bound.items())))
    except TypeError:  # an unhashable option value: a new, equally valid, uncached binding
        return functools.partial(generator, **bound)


@functools.lru_cache(maxsize=256)
def _bound_task(name: str, options: tuple) -> TaskFn:
    """One partial per (task, options): equal settings give the *same* object, so
    :func:`_batch_drawer`'s cache (keyed on it) compiles a task's batches once per shape, not
    once per run (a sweep's seeds and mixers share them)."""
    return functools.partial(TASKS[name], **dict(options))


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
      task: a name in :data:`kda_lib.lab.tasks.TASKS`.
      mixer: a name in :data:`MIXERS`.
      seq_len, batch_size: T and B of every batch (training and evaluation).
      steps, learning_rate, log_every, progress: see :func:`train`.
      seed: seeds the model's init (``nnx.Rngs(seed)``) and the batches (see :func:`train`).
      eval_batches: held-out batches per split (validation and test) for :func:`evaluate`.
      task_options: the task generator's keyword options (defaults from
        :data:`DEFAULT_TASK_OPTIONS`); ``vocab_size`` is also the model's.
      model_options: other :class:`ModelConfig` fields and the mixer's
        :class:`kda_lib.KDAConfig` fields, by their flat names (hidden_size, num_layers,
        num_heads, ...; see :meth:`ModelConfig.from_flat`).

    Returns:
      A JSON-ready record: ``task``, ``task_options``, ``mixer``, ``model`` (the
      ModelConfig), ``params``, ``training`` (steps, batch_size, seq_len, learning_rate, seed),
      ``history`` (from :func:`train`), ``validation`` and ``test`` (each ``loss``,
      ``accuracy``, ``batches`` and, for stack, the accuracy beyond the model's
      ``conv_reach``: see :func:`evaluate`), both scored once after training; ``eval`` (the
      validation scores, under the name records had before the test split existed),
      ``chance_accuracy`` (:func:`kda_lib.lab.tasks.chance_accuracy`), ``train_seconds``
      (compilation included), ``diverged`` (True when a training or the held-out loss is not
      finite; training then stops early), ``platform``, ``versions`` and ``date`` (UTC).

    Raises:
      ValueError: an unknown task or option, a shape the task cannot fill, or a task that
        scores no position (e.g. delayed_copy with ``delay >= seq_len``), before training.
    """
    task_fn = _checked_task(task, task_options, batch_size, seq_len, seed)
    config = ModelConfig.from_flat(
        vocab_size=task_fn.keywords["vocab_size"], mixer=mixer, **(model_options or {})
    )
    model = TinyLM(config, rngs=nnx.Rngs(seed))
    shape = dict(batch_size=batch_size, seq_len=seq_len)
    start = time.perf_counter()
    history = train(
        model, task_fn, steps=steps, **shape, learning_rate=learning_rate, seed=seed,
        log_every=log_every, progress=progress,
    )  # fmt: skip
    train_seconds = time.perf_counter() - start
    held_out = dict(**shape, num_batches=eval_batches, seed=seed, reach=config.conv_reach)
    scores = {
        split: dict(evaluate(model, task_fn, **held_out, split=split), batches=eval_batches)
        for split in ("validation", "test")
    }
    training = dict(steps=steps, **shape, learning_rate=learning_rate, seed=seed)
    return _experiment_record(task, task_fn, model, training, history, scores, train_seconds)


def _checked_task(task: str, task_options, batch_size: int, seq_len: int, seed: int) -> TaskFn:
    """The task generator with its options bound, after checking, before any training, that
    it fills ``[batch_size, seq_len]`` batches (its own error message otherwise) and that the
    first training batch scores at least one position."""
    task_fn = make_task(task, **(task_options or {}))
    # fail here, with the generator's own message, rather than inside the jitted step
    jax.eval_shape(lambda key: task_fn(key, batch_size, seq_len), jax.random.key(0))
    first = _batch_drawer(task_fn, batch_size, seq_len)(
        jax.random.fold_in(_stream(seed, TRAIN_STREAM), 0)
    )
    if not bool(jnp.any(first.mask)):
        raise ValueError(
            f"task {task!r} with seq_len={seq_len} and options {dict(task_fn.keywords)} scores "
            "no position (the first batch's mask is all False): nothing to train or evaluate"
        )
    return task_fn


def _experiment_record(task, task_fn, model, training, history, scores, seconds) -> dict:
    """The JSON-ready record of one finished run (see :func:`run_experiment`)."""
    config, options = model.config, task_fn.keywords
    return dict(
        task=task,
        task_options=dict(options),
        mixer=config.label,
        model=config.record(),
        params=parameter_count(model),
        training=training,
        history=history,
        validation=scores["validation"],
        test=scores["test"],
        eval=scores["validation"],  # the name older readers use (the same batches as before)
        chance_accuracy=chance_accuracy(task, **options),
        train_seconds=seconds,
        diverged=not all(
            math.isfinite(v)
            for v in [*history["loss"], scores["validation"]["loss"], scores["test"]["loss"]]
        ),
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
    """``mqar  T=64  kda  accuracy 0.941 (chance 0.062)  12.3 s`` for one record: the test
    accuracy, or for an old record (no test split) its ``eval`` accuracy."""
    scores = record_scores(record)
    accuracy = (scores["test"] or scores["validation"])["accuracy"]
    return (
        f"{record['task']:<12s} T={record['training']['seq_len']:<5d} {record['mixer']:<10s} "
        f"accuracy {accuracy:.3f} (chance {record['chance_accuracy']:.3f})  "
        f"{record['train_seconds']:.1f} s"
    )


def default_result_path(record: dict, results_dir=None) -> pathlib.Path:
    """``<results_dir>/<task>-<mixer>-T<seq_len>-seed<seed>.json``; ``results_dir`` defaults to
    ``build/runs/results`` (a run never replaces the recorded ``data/results/`` by default)."""
    results_dir = RUNS_DIR / "results" if results_dir is None else results_dir
    training = record["training"]
    name = f"{record['task']}-{record['mixer']}-T{training['seq_len']}-seed{training['seed']}"
    return pathlib.Path(results_dir) / f"{name}.json"


def save_record(record: dict | list[dict], path: str | pathlib.Path) -> pathlib.Path:
    """Write a record (or a list of them) as indented, strict JSON (a NaN or infinite number
    becomes null), creating folders; returns the path.

    Atomic: the text goes to a temporary file in the same folder, which then replaces ``path``,
    so an interrupted write never leaves a truncated record (nor destroys an older one)."""
    return write_json(record, path)


if __name__ == "__main__":
    # a library module: `python -m kda_lib.lab.train ...` would otherwise exit 0 having done nothing
    raise SystemExit(
        "kda_lib.lab.train is a library module; train from the shell with `kda-train` "
        "(or `python -m kda_lib.lab.train_cli`)"
    )
