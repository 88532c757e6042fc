"""Notebook 09's record under issue 39's protocol: a rate per model on validation, then seeds.

    nice -n 19 python scripts/stdlib_lm_seeds.py --preset cpu \
        --output data/results/stdlib_lm_protocol.json

Trains notebook 09's five byte-level models, parameter-matched to the KDA model by their MLP
width exactly as the notebook builds them (:func:`model_config`): ``hybrid`` (the yaml's
``hybrid_layers``, Kimi Linear's 3 KDA : 1 MLA), ``hybrid_mha`` (the same pattern with NoPE
multi-head attention in place of MLA), ``kda``, ``gdn`` and ``attention`` (RoPE), on the Python
standard library's source (:mod:`kda_lib.lab.corpus`). ``--preset cpu`` (the default) takes
the sizes of ``notebooks/params/full/09_hybrid_language_model.yaml`` (4 layers, width 64, 2
heads of 32, MLA latent 32, batch 16 of 128-byte windows); ``--preset tiny`` is a model and a
corpus small enough for a test (see :data:`PRESETS`). An option given on the command line
overrides its preset's value.

(This script's earlier version, before issue 39, trained every model at one rate, 3e-3, and
recorded validation bits per byte only: ``data/results/stdlib_lm_seeds.json``, seeds 1 and 2,
made with the corpus before it had a test split; git history has it.)

Protocol (stated once, recorded in the JSON under ``protocol``):

- **Three disjoint streams**, the corpus split by file (:func:`kda_lib.lab.corpus.split_of`;
  ``--validation-fraction``, ``--test-fraction``): **training** windows at random offsets of
  the training files; **validation** windows (``--val-windows`` evenly spaced windows of the
  validation files: the curve every ``--eval-every`` steps and the rate choice read only these)
  and **test** windows (``--test-windows`` of the test files: the reported score, scored once
  per run, after its last step). Windows of one split share no bytes (checked before any
  work), so a standard error over them is one over independent windows.
- **Tuning**, per model, with the tuning seed (``--tune-seed``, never one of ``--seeds``):
  every rate of ``--grid``, the best by final validation bits per byte; when the best is an
  edge of the rates tried, one rate ``--grid-factor`` beyond that edge is added, up to
  ``--max-extensions`` times per side (:func:`kda_lib.lab.rate_grid.tune_rate`). ``grids``
  records the rates, their scores, the best and whether it lies strictly inside.
- **Seeds**: every model at its chosen rate with every seed of ``--seeds`` (fresh: no tuning run
  is reused); all models at the first seed, then all at the next, so a cut leaves whole paired
  seeds. Seed ``s`` draws the model's init and the training batches from ``jax.random.key(s)``
  as notebook 09's ``seed`` does: the models of one seed see the same batches (paired).
- **Budget**: every run, tuning or seed, ``--steps`` AdamW steps (warmup, cosine decay to 10%:
  :func:`kda_lib.lab.train.make_optimizer`), batch ``--batch-size`` of ``--seq-len`` bytes: an
  equal budget for every model and rate, no early stop (a run whose training loss is not finite
  stops there, ``diverged``).
- **Recorded per run**: ``curve`` (training and validation bits per byte every
  ``--eval-every`` steps and at the last, wall time); ``validation`` and ``test``: bits per byte
  with its standard error over the windows, and bits per byte at each of the ``--seq-len``
  positions of a window (mean and standard error over the windows:
  :func:`kda_lib.lab.generate.score_text`), from which whether the bits keep falling beyond
  position 32 can be tested; ``probe``, the long-range probe on the test split
  (:func:`kda_lib.lab.corpus.copy_probe_windows`): windows whose second half repeats the first
  (``--seq-len // 2`` bytes back) against windows whose first half is other text, scored where
  the last ``--probe-reach`` + 1 bytes are the same in both, so that a model reading no
  further back than ``--probe-reach`` bytes gains nothing (:func:`kda_lib.lab.generate.
  copy_probe_scores`: the gain in bits per byte with its standard error over the windows);
  training tokens/s (validation excluded).

Time, ``--preset cpu``: 5 models x (3 tuning rates + 5 seeds) = 40 runs of 600 steps. Per step
on this 2-core machine under load (notebook 09's full setting, 800 steps, recorded in
``stdlib_lm_seeds.json``: 170-452 s a run): attention 0.21 s, hybrid 0.37, hybrid_mha 0.39,
kda 0.48, gdn 0.52; so 8 x 600 x 1.97 s = 2.6 hours of training. Scoring adds minutes
(measured 2026-12-02 for KDA: 0.6 s per validation of 256 windows, 1.4 s per test of 512; 7
validations and one test per run). Each rate an edge best adds is one more 600-step run of
that model (2-5 minutes). About 3 hours in all, less on a quieter machine (measured the same
day at load 7: attention 0.12 s and KDA 0.30 s per step). ``--steps 800`` (notebook 09's
budget) would take about 3.5 hours at the recorded rates.

Resuming and concurrency: a run is keyed by (model, rate, seed); after every run the document
is merged into ``--output`` under a lock and rewritten atomically
(:mod:`kda_lib.lab.record_runs`), and a run already there is skipped, so a cut loses
at most the run in progress, the same command resumes, and two processes writing the same
``--output`` (say, one per model with ``--models``) lose nothing of each other's. Bad
arguments (a count below its minimum, the tuning seed among the seeds, an unknown model, a bad
grid, a damaged or unwritable ``--output``, an ``--output`` made with another setting or
corpus) are refused before any training.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import pathlib
import time
from typing import NamedTuple

import jax
import yaml
from flax import nnx

import kda_lib.teaching.notebook
from kda_lib.lab import record_runs
from kda_lib.lab.corpus import (
    ByteCorpus,
    CopyProbe,
    TextBatch,
    copy_probe_windows,
    load_stdlib_corpus,
    text_task,
    validation_windows,
    windows_overlap,
)
from kda_lib.lab.generate import copy_probe_scores, score_text
from kda_lib.lab.rate_grid import add_grid_arguments, round_rate, tune_rate
from kda_lib.lab.record_runs import check_option_minimums
from kda_lib.lab.records import read_json_document
from kda_lib.lab.train import train
from kda_lib.layers.kda_layer import KDAConfig
from kda_lib.models.tiny_lm import (
    MIXERS,
    ModelConfig,
    TinyLM,
    config_param_count,
    match_parameter_count,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAMS = ROOT / "notebooks" / "params" / "full" / "09_hybrid_language_model.yaml"
MODELS = ("hybrid", "hybrid_mha", "kda", "gdn", "attention")
PROTOCOL_VERSION = 2  # 2: validation and test splits, a rate per model, tuning seed apart
EVAL_BATCH = 64  # windows per forward pass when scoring


def model_config(p: dict, model_name: str) -> ModelConfig:
    """The notebook's config of ``model_name`` for the parameters ``p``, parameter-matched to
    the KDA model by its MLP width; NoPE in both hybrids, RoPE in the attention model."""
    mixer_config = KDAConfig(
        hidden_size=p["hidden_size"],
        num_heads=p["num_heads"],
        head_dim=p["head_dim"],
        implementation=p["implementation"],
    )
    base = ModelConfig(
        vocab_size=256,
        num_layers=p["num_layers"],
        mixer_config=mixer_config,
        kv_lora_rank=p["kv_lora_rank"],
    )
    hybrid = tuple(p["hybrid_layers"])
    patterns = {
        "attention": ("attention",),
        "kda": ("kda",),
        "gdn": ("gdn",),
        "hybrid": hybrid,
        "hybrid_mha": tuple("attention" if m == "mla" else m for m in hybrid),
    }
    target = config_param_count(dataclasses.replace(base, layers=patterns["kda"]))
    rope = not model_name.startswith("hybrid")
    return match_parameter_count(
        dataclasses.replace(base, layers=patterns[model_name], rope=rope), target
    )


_FULL = yaml.safe_load(PARAMS.read_text())
_SIZES = ("hidden_size", "num_layers", "num_heads", "head_dim", "kv_lora_rank", "batch_size")

# The presets' values; the command line overrides any of them.
PRESETS: dict[str, dict] = {
    # this 2-core CPU: notebook 09's full sizes; 600 steps so that the 40 runs fit in ~3 hours
    "cpu": dict(
        **{name: _FULL[name] for name in _SIZES},
        hybrid_layers=",".join(_FULL["hybrid_layers"]),
        seq_len=_FULL["seq_len"],
        steps=600,
        eval_every=100,
        val_windows=256,
        test_windows=512,
        probe_reach=32,
        max_bytes=None,
    ),
    # a test's size: 2 layers of width 16, 16-byte windows, a few steps, 20 kB per split
    "tiny": dict(
        hidden_size=16,
        num_layers=2,
        num_heads=1,
        head_dim=8,
        kv_lora_rank=8,
        batch_size=2,
        hybrid_layers="kda,mla",
        seq_len=16,
        steps=3,
        eval_every=2,
        val_windows=8,
        test_windows=8,
        probe_reach=4,
        max_bytes=20000,
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--output", required=True, help="the JSON document (created or resumed)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + str(MODELS))
    record_runs.add_seed_arguments(p, seeds="0,1,2,3,4")
    add_grid_arguments(p, "model")
    for name in (
        *_SIZES,
        "seq-len",
        "steps",
        "eval-every",
        "val-windows",
        "test-windows",
        "probe-reach",
    ):
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    p.add_argument("--hybrid-layers", help="the hybrid's layer pattern, e.g. kda,kda,kda,mla")
    p.add_argument("--implementation", default=_FULL["implementation"])
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument("--test-fraction", type=float, default=0.1)
    p.add_argument("--max-bytes", type=int, help="bytes kept per split (default: all)")
    return p


def parse(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The arguments with the chosen preset's values where none was given."""
    return record_runs.parse_with_preset(parser(), PRESETS, argv)


SETTING_KEYS = (
    "protocol_version",
    *_SIZES,
    "hybrid_layers",
    "implementation",
    "seq_len",
    "steps",
    "eval_every",
    "val_windows",
    "test_windows",
    "probe_reach",
    "validation_fraction",
    "test_fraction",
    "max_bytes",
    "tune_seed",
)


def setting_of(args) -> dict:
    return record_runs.setting_of(args, SETTING_KEYS, PROTOCOL_VERSION)


# the smallest values of this script's int options beyond those of record_runs.MINIMUMS
MINIMUMS = dict(
    record_runs.MINIMUMS,
    kv_lora_rank=1,
    seq_len=1,
    steps=1,
    val_windows=2,
    test_windows=2,
    probe_reach=1,
    max_bytes=2,
)


def check_arguments(p: argparse.ArgumentParser, args) -> None:
    """Refuse, before any work, what would fail or mislead later (argparse's error, exit 2);
    turns ``--models``, ``--seeds``, ``--grid`` and ``--hybrid-layers`` into lists."""
    check_option_minimums(p, args, MINIMUMS)
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or len(set(args.models)) < len(args.models):
        p.error(f"--models must be distinct names of {MODELS}, got {args.models}")
    record_runs.check_seeds_and_grid(p, args)
    if args.probe_reach >= args.seq_len // 2:
        p.error(
            f"--probe-reach must be below --seq-len // 2 = {args.seq_len // 2} (the probe repeats "
            f"the text that far back), got {args.probe_reach}"
        )
    args.hybrid_layers = args.hybrid_layers.split(",")
    if not set(args.hybrid_layers) <= set(MIXERS) or args.num_layers % len(args.hybrid_layers):
        p.error(
            f"--hybrid-layers must be mixers of {sorted(MIXERS)} whose count divides "
            f"--num-layers {args.num_layers}, got {args.hybrid_layers}"
        )
    record_runs.check_output(p, args, setting_of(args))
    for name in args.models:  # last: matching the parameter counts takes seconds
        record_runs.check_model(p, lambda n=name: model_config(sizes(args), n))


class Data(NamedTuple):
    """The corpus and its three streams: the training task, the validation and test windows,
    and the long-range probe's windows (from the test split)."""

    corpus: ByteCorpus
    train_task: object
    validation: TextBatch
    test: TextBatch
    probe: CopyProbe


def load_data(p: argparse.ArgumentParser, args) -> Data:
    """The corpus split three ways, refused (argparse's error) when a held-out split is too
    small for its windows to share no bytes, or ``--output`` holds another corpus."""
    try:
        corpus = load_stdlib_corpus(
            validation_fraction=args.validation_fraction,
            test_fraction=args.test_fraction,
            max_bytes=args.max_bytes,
        )
    except ValueError as error:
        p.error(f"the corpus: {error}")
    half = args.seq_len // 2
    for split, count, length in (
        ("validation", args.val_windows, args.seq_len),
        ("test", args.test_windows, args.seq_len),
        ("test", args.test_windows, half),  # the probe's spans
    ):
        data = getattr(corpus, split)
        if data.size < length + 1 or windows_overlap(data, length, count):
            p.error(
                f"the {split} split ({data.size} bytes) is too small for {count} windows of "
                f"{length} + 1 bytes that share no bytes: fewer windows or more bytes"
            )
    recorded = (read_json_document(args.output) or {}).get("corpus")
    if recorded and recorded["fingerprint"] != corpus.fingerprint:
        p.error(f"--output {args.output} was made with another corpus: {recorded}")
    return Data(
        corpus,
        text_task(corpus.train),
        validation_windows(corpus.validation, args.seq_len, args.val_windows),
        validation_windows(corpus.test, args.seq_len, args.test_windows),
        copy_probe_windows(corpus.test, args.seq_len, args.test_windows, args.probe_reach),
    )


def sizes(args) -> dict:
    """The parameters :func:`model_config` reads (as notebook 09's yaml names them)."""
    names = ("hidden_size", "num_layers", "num_heads", "head_dim", "kv_lora_rank")
    return dict(
        {name: getattr(args, name) for name in names},
        implementation=args.implementation,
        hybrid_layers=list(args.hybrid_layers),
    )


def held_out_scores(model: TinyLM, windows: TextBatch) -> dict:
    """:func:`score_text` of ``windows`` as recorded: bits per byte (``bpb``) and its standard
    error over the windows, and the bits at each position (mean and standard error)."""
    scores = score_text(model, windows, batch_size=min(EVAL_BATCH, windows.inputs.shape[0]))
    return dict(
        bpb=scores["bits_per_token"],
        bpb_se=scores["bits_per_token_se"],
        windows=int(windows.inputs.shape[0]),
        bits_by_position=scores["bits_by_position"],
        bits_by_position_se=scores["bits_by_position_se"],
    )


def train_with_curve(model: TinyLM, data: Data, lr: float, data_seed: int, args) -> tuple:
    """Train ``model`` for ``--steps`` steps, scoring the validation windows every
    ``--eval-every`` steps and after the last: ``(curve, last validation scores, training
    tokens/s or None when a single check leaves no steps to time)``."""
    curve = {"step": [], "train_bpb": [], "validation_bpb": [], "seconds": []}
    spent, last = [], {}

    def validate(record):
        start = time.perf_counter()
        last.update(held_out_scores(model, data.validation))
        spent.append(time.perf_counter() - start)
        curve["step"].append(record["step"])
        curve["train_bpb"].append(record["loss"] / math.log(2))
        curve["validation_bpb"].append(last["bpb"])
        curve["seconds"].append(record["seconds"] + sum(spent[:-1]))

    history = train(
        model,
        data.train_task,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        learning_rate=lr,
        seed=data_seed,
        log_every=args.eval_every,
        progress=validate,
    )
    timed = history["step"][-1] - history["step"][0]
    seconds = history["seconds"][-1] - history["seconds"][0] - sum(spent[:-1])
    speed = timed * args.batch_size * args.seq_len / seconds if timed else None
    return curve, last, speed


def run_one(model_name: str, lr: float, seed: int, args, data: Data) -> dict:
    """Train one model at rate ``lr`` with ``seed`` and score validation and, once, test."""
    model_seed, data_seed = (
        int(s) for s in jax.random.randint(jax.random.key(seed), (2,), 0, 2**31 - 1)
    )
    config = model_config(sizes(args), model_name)
    model = TinyLM(config, rngs=nnx.Rngs(model_seed))
    start = time.perf_counter()
    curve, validation, speed = train_with_curve(model, data, lr, data_seed, args)
    test = held_out_scores(model, data.test)
    probe = copy_probe_scores(model, data.probe, batch_size=min(EVAL_BATCH, args.test_windows))
    return dict(
        model=model_name,
        learning_rate=lr,
        seed=seed,
        layers=list(config.layer_mixers),
        params=config_param_count(config),
        config=config.record(),
        training=dict(
            steps=curve["step"][-1],
            max_steps=args.steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            model_seed=model_seed,
            data_seed=data_seed,
        ),
        diverged=not math.isfinite(curve["train_bpb"][-1]),
        curve=curve,
        validation=validation,
        test=test,
        probe=dict(probe, reach=args.probe_reach, distance=args.seq_len // 2),
        train_tokens_per_second=speed,
        seconds=time.perf_counter() - start,
        platform=jax.devices()[0].platform,
        jax_version=jax.__version__,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def run_key(r: dict) -> tuple:
    return (r["model"], round_rate(r["learning_rate"]), int(r["seed"]))


def made_with(document: dict) -> dict:
    """What a document was made with: the setting and the corpus (by its fingerprint)."""
    return dict(
        setting=document.get("setting"), corpus=document.get("corpus", {}).get("fingerprint")
    )


def run_order(r: dict) -> tuple:
    """The document's order of runs: by model, phase, rate and seed."""
    return (r["model"], r["phase"], *run_key(r)[1:])


class Record(record_runs.RunDocument):
    """The JSON document and the runs in it; :meth:`ensure` trains a run only when absent."""

    def __init__(self, args, data: Data):
        self.args, self.data = args, data
        document = dict(
            protocol=__doc__.split("under ``protocol``):")[1].split("\nTime, ")[0].strip(),
            setting=setting_of(args),
            corpus=data.corpus.describe(),
            grids={},
            runs=[],
        )
        super().__init__(args.output, document, run_key, made_with, run_order)

    def ensure(self, model_name: str, lr: float, seed: int, phase: str) -> dict:
        key = (model_name, round_rate(lr), int(seed))

        def train() -> dict:
            return dict(run_one(model_name, key[1], seed, self.args, self.data), phase=phase)

        def announce(record: dict) -> None:
            v, t = record["validation"], record["test"]
            print(
                f"{phase:5s} {model_name:10s} lr {key[1]:<8g} seed {seed:<4d}: validation "
                f"{v['bpb']:.4f} +- {v['bpb_se']:.4f}, test {t['bpb']:.4f} +- {t['bpb_se']:.4f} "
                f"bits/byte after {record['training']['steps']} steps, {record['seconds']:.0f} s",
                flush=True,
            )

        return super().ensure(key, train, announce)

    def tune(self, model_name: str) -> float:
        """The model's rate, chosen on validation with the tuning seed (recorded in ``grids``)."""
        a = self.args

        def validation_bpb(lr: float) -> float:
            bpb = self.ensure(model_name, lr, a.tune_seed, "tune")["validation"]["bpb"]
            return math.nan if bpb is None else bpb  # a NaN is written as null

        grid = tune_rate(
            validation_bpb, a.grid, factor=a.grid_factor, max_extensions=a.max_extensions
        )
        self.set_grid(model_name, dict(grid, seed=a.tune_seed))
        return grid["best"]


def main(argv=None) -> None:
    p, args = parse(argv)
    check_arguments(p, args)
    data = load_data(p, args)
    kda_lib.teaching.notebook.setup(style=False)  # the notebooks' random-number settings
    record = Record(args, data)
    start = time.perf_counter()
    rates = {name: record.tune(name) for name in args.models}
    for seed in args.seeds:  # every model at one seed, then the next: whole paired seeds
        for name in args.models:
            record.ensure(name, rates[name], seed, "seeds")
    print(
        f"done: {len(record.doc['runs'])} runs in {record.path} "
        f"({time.perf_counter() - start:.0f} s this call); rates {rates}",
        flush=True,
    )


if __name__ == "__main__":
    main()
