"""``kda-train`` (or ``python -m kda_lib.lab.train_cli``): train a tiny model on a synthetic
task from the shell.

The command line of :mod:`kda_lib.lab.train`: every option and the output path are checked
before any training (argparse's exit status 2, naming the option), then
:func:`kda_lib.lab.train.run_experiment` runs and its record is written as JSON, by default
under ``build/runs/results/`` (``--record``: the recorded ``data/results/``, which the notebooks
read; ``--output -``: on stdout alone, no file, progress on stderr). ``--help`` lists the task
and model options with their defaults.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import pathlib
import sys
import tempfile
import time

from kda_lib.checks import MAX_LAYERS, allocation_problem, dominant_size, format_bytes
from kda_lib.lab.record_runs import check_option_minimums, check_seed_option
from kda_lib.lab.records import (
    RECORDED_DIR,
    dumps,
    exit_on_broken_pipe,
    output_path_problem,
    replace_problem,
)
from kda_lib.lab.tasks import TASKS
from kda_lib.lab.train import (
    DEFAULT_TASK_OPTIONS,
    default_result_path,
    print_record,
    run_experiment,
    save_record,
)
from kda_lib.models.tiny_lm import MIXERS, ModelConfig


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
    "mamba2": "Mamba2-style stand-in: one decay per head, writes not scaled by the step size",
    "mamba2_dt": "Mamba2's discretisation: one decay per head, writes scaled by the step size",
}


def _task_defaults(option: str) -> str:
    """`` [delayed_copy 16, mqar 64, ...]``: each task's default of ``option`` (or "")."""
    found = [f"{task} {o[option]}" for task, o in DEFAULT_TASK_OPTIONS.items() if option in o]
    return f" [{', '.join(found)}]" if found else ""


def _stack_default() -> str:
    default = inspect.signature(TASKS["stack"]).parameters.get("pop_probability")
    return f" [stack {default.default}]" if default and default.default is not default.empty else ""


def _model_default(field: str):
    """The default of a model option: a :class:`ModelConfig` field or its mixer's."""
    return ModelConfig(vocab_size=1).record()[field]


def _parser() -> argparse.ArgumentParser:
    """The command line's options; their values are checked by :func:`_check_args`."""
    parser = argparse.ArgumentParser(
        prog="kda-train",
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
        + "; ".join(
            f"{name} ({MIXER_HELP.get(name, 'see kda_lib.models.tiny_lm')})" for name in MIXERS
        )
        + " (default: kda)",
    )
    _add_run_options(parser)
    _add_task_options(parser.add_argument_group("task options (each task's defaults in brackets)"))
    _add_model_options(parser.add_argument_group("model options"))
    parser.add_argument(
        "--output",
        help="JSON record path; '-': the record alone on stdout (progress on stderr), no file "
        "(default: build/runs/"
        "results/<task>-<mixer>-T<seq_len>-seed<seed>.json); a file holding anything but a "
        "training record is kept, refused",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write data/results/<task>-<mixer>-T<seq_len>-seed<seed>.json instead: the recorded "
        "results the notebooks read (replaces a file of that name)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "bar", "lines", "none"),
        default="auto",
        help="auto (the default): a tqdm bar on a terminal, plain lines otherwise",
    )
    return parser


def _add_run_options(parser) -> None:
    """``--steps``, ``--seq-len``, ``--batch-size``, ``--learning-rate``, ``--seed``,
    ``--eval-batches``, ``--log-every``."""
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


def _add_task_options(task) -> None:
    """``--vocab-size``, ``--num-pairs``, ``--delay``, ``--pop-probability``."""
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


def _add_model_options(model) -> None:
    """The :class:`ModelConfig` fields the command line sets (absent: the config's default)."""
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


# the largest value of the counting options: a billion steps (or held-out batches, or steps
# between records) is days of even the smallest model, and larger counts overflow the int32
# step counter of the learning-rate schedule inside jit; layers: ModelConfig's bound
OPTION_MAXIMUMS = dict(steps=10**9, eval_batches=10**9, log_every=10**9, num_layers=MAX_LAYERS)

# the options the memory estimate of a run reads (see _memory_problem)
SIZE_OPTIONS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim", "batch_size",
                "seq_len")  # fmt: skip


# the keys of a training record (run_experiment's): --output replaces only such a file
RECORD_KEYS = ("task", "mixer", "training", "history")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> pathlib.Path | None:
    """Reject bad option values before any work (argparse's error: exit status 2, naming the
    option) and return the record's path, checked to be writable and to hold no other kind of
    record (None: ``--output -``, stdout)."""
    check_option_minimums(parser, args, OPTION_MINIMUMS)
    for name, maximum in OPTION_MAXIMUMS.items():
        value = getattr(args, name)
        if value is not None and value > maximum:
            parser.error(f"--{name.replace('_', '-')} must be <= {maximum:,}, got {value}")
    problem = _memory_problem(args)
    if problem:
        parser.error(problem)
    if args.pop_probability is not None and not 0.0 <= args.pop_probability <= 1.0:
        parser.error(f"--pop-probability must lie in [0, 1], got {args.pop_probability}")
    check_seed_option(parser, args)
    if args.learning_rate < 0:  # NaN passes: such a run diverges and is recorded as diverged
        parser.error(f"--learning-rate must be >= 0, got {args.learning_rate}")
    where = dict(
        task=args.task,
        mixer=_model_label(args),
        training=dict(seq_len=args.seq_len, seed=args.seed),
    )
    if args.record and args.output is not None:
        parser.error("--record writes the recorded data/results/ file: give --output or --record")
    if args.output == "-":
        return None
    folder = RECORDED_DIR / "results" if args.record else None
    path = default_result_path(where, folder) if args.output is None else args.output
    problem = output_path_problem(path) or replace_problem(path, "training record", RECORD_KEYS)
    if problem:
        parser.error(f"--output: {problem}")
    return pathlib.Path(path)


def _memory_problem(args: argparse.Namespace) -> str | None:
    """Why the run cannot fit this machine's memory, naming the size option behind most of the
    bytes (:func:`kda_lib.checks.dominant_size`), or None.

    A lower bound, from the sizes alone (nothing is built): AdamW training keeps 16 bytes a
    parameter (float32 parameters, gradients and two moments), and every model has at least
    the embedding and the output head (``vocab hidden`` each) and per layer the MLP (``2 hidden
    2 hidden``) and the mixer's value and output projections (``2 hidden H K``); a step holds
    at least the batch's logits (``B T vocab``) and one residual stream per layer (``B T
    hidden``), 4 bytes each."""
    task = DEFAULT_TASK_OPTIONS.get(args.task, {})
    sizes = {
        "vocab_size": args.vocab_size or task.get("vocab_size", 1),
        **{name: getattr(args, name) or _model_default(name) for name in SIZE_OPTIONS[1:5]},
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
    }
    def nbytes(sizes: dict) -> tuple[int, int]:  # parameters (x 16 bytes), activations
        vocab, hidden, layers, heads, head_dim, batch, seq_len = sizes.values()
        params = 2 * vocab * hidden + layers * (4 * hidden * hidden + 2 * hidden * heads * head_dim)
        return 16 * params, 4 * batch * seq_len * (vocab + layers * hidden)

    params, activations = nbytes(sizes)
    what = (
        f"training (at least: parameters, gradients and AdamW's moments "
        f"~{format_bytes(params)}, one batch's logits and residual streams "
        f"~{format_bytes(activations)})"
    )
    problem = allocation_problem(what, params + activations)
    if problem is None:
        return None
    name = dominant_size(sizes, lambda s: sum(nbytes(s)))
    others = ", ".join(f"--{n.replace('_', '-')} {v}" for n, v in sizes.items() if n != name)
    return f"--{name.replace('_', '-')} {sizes[name]} (with {others}): {problem}"


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


TASK_OPTIONS = ("vocab_size", "num_pairs", "delay", "pop_probability")
MODEL_OPTIONS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "head_dim",
    "conv_size",
    "implementation",
    "layers",
    "rope",
)


def _experiment_options(args: argparse.Namespace) -> tuple[dict, dict]:
    """The task and model options given on the command line (absent ones are left to the
    defaults). With ``--layers`` the pattern names every layer's mixer, one copy of it unless
    ``--num-layers`` says otherwise, and ``args.mixer`` becomes its first layer's."""
    task_options = {n: getattr(args, n) for n in TASK_OPTIONS if getattr(args, n) is not None}
    model_options = {n: getattr(args, n) for n in MODEL_OPTIONS if getattr(args, n) is not None}
    if args.layers:
        model_options.setdefault("num_layers", len(args.layers))
        args.mixer = args.layers[0]
    return task_options, model_options


def _progress(args: argparse.Namespace):
    """``(bar, progress)``: a tqdm bar (to close after training) or None, and what
    :func:`kda_lib.lab.train.train` gets as ``progress`` (``--output -``: lines on stderr, the
    record alone on stdout). Says on stderr that compiling comes first, unless ``--progress
    none``."""
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
    if bar:
        return bar, bar
    if style != "lines":
        return None, False
    return None, functools.partial(print_record, file=sys.stderr) if args.output == "-" else True


def _report(record: dict, args: argparse.Namespace, path: pathlib.Path | None,
            started: float) -> None:  # fmt: skip
    """One line on the finished run (on stderr when the record is on stdout: ``path`` None);
    a diverged run is said on stderr and exits with 1."""
    run = f"{args.task} / {record['mixer']}, T={args.seq_len}"
    where = "stdout" if path is None else path
    if record["diverged"]:
        history = record["history"]
        losses = zip(history["step"], history["loss"], strict=True)
        step = next((s for s, v in losses if not math.isfinite(v)), None)
        step_at = f"the training loss at step {step}" if step else "the held-out loss"
        print(
            f'{run}: diverged ({step_at} is not finite); recorded with "diverged": true in '
            f"{where}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)
    print(
        f"{run}: held-out accuracy {record['test']['accuracy']:.3f} on the test batches "
        f"(validation {record['validation']['accuracy']:.3f}, chance "
        f"{record['chance_accuracy']:.3f}), loss {record['test']['loss']:.3f}; "
        f"{record['train_seconds']:.0f} s training "
        f"(compilation included), {time.perf_counter() - started:.0f} s in all; "
        + ("the record is on stdout" if path is None else f"wrote {path}"),
        file=sys.stdout if path else sys.stderr,
        flush=True,
    )


@exit_on_broken_pipe
def main(argv: list[str] | None = None) -> dict:
    """The command line; returns the record it wrote (or printed: ``--output -``).

    Every option and the output path are checked before training (exit status 2). A run whose
    loss is not finite is recorded with ``"diverged": true`` (nulls for the non-finite numbers)
    and the process exits with status 1."""
    started = time.perf_counter()
    parser = _parser()
    args = parser.parse_args(argv)
    path = _check_args(parser, args)
    task_options, model_options = _experiment_options(args)
    bar, progress = _progress(args)
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
    if path is None:
        print(dumps(record), end="", flush=True)
    else:
        try:
            save_record(record, path)
        except OSError as error:  # e.g. the disk filled up during training: keep the run
            _rescue_record(record, path, error)
    _report(record, args, path, started)
    return record


def command() -> None:
    """The ``kda-train`` console script: :func:`main` on ``sys.argv``, exit status 0 when done."""
    main()


if __name__ == "__main__":
    command()
