"""Seed spread of notebook 09's full setting: models x seeds, each row merged into a JSON.

    python scripts/stdlib_lm_seeds.py --models hybrid hybrid_mha kda gdn attention \
        --seeds 1 2 --output data/results/stdlib_lm_seeds.json

Builds and trains each model exactly as notebook 09 does with its full parameters
(``notebooks/params/full/09_hybrid_language_model.yaml``: the same configs, parameter matching,
AdamW schedule, batches and validation windows; model init and batches drawn from
``jax.random.key(seed)`` as the notebook's ``seed`` parameter does) and records the validation
bits per byte and the training tokens/s (steps after the first window, validation excluded, as
in the notebook). Seed 0 reproduces ``data/results/stdlib_lm_full.json``. The models:
``hybrid`` (the yaml's ``hybrid_layers``, Kimi Linear's 3 KDA : 1 MLA), ``hybrid_mha`` (the
same pattern with NoPE multi-head attention in place of MLA), ``kda``, ``gdn`` and
``attention`` (RoPE).

It resumes: a (model, seed) row already in ``--output`` is skipped, and each new row is merged
into the file under a lock and written atomically (:func:`kda_lib.lab.records.update_json`), so
a cut loses at most the run in progress and two processes writing the same ``--output`` lose
nothing of each other's. A damaged or unwritable ``--output`` is refused before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import jax
import yaml
from flax import nnx

import kda_lib.teaching.notebook
from kda_lib.lab.corpus import load_stdlib_corpus, text_task, validation_windows
from kda_lib.lab.generate import score_text
from kda_lib.lab.records import output_path_problem, read_json_document, update_json
from kda_lib.lab.train import train
from kda_lib.layers.kda_layer import KDAConfig
from kda_lib.models.tiny_lm import ModelConfig, TinyLM, config_param_count, match_parameter_count

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAMS = ROOT / "notebooks" / "params" / "full" / "09_hybrid_language_model.yaml"


MODELS = ("hybrid", "hybrid_mha", "kda", "gdn", "attention")


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


def run(model_name: str, seed: int) -> dict:
    kda_lib.teaching.notebook.setup(style=False)  # the notebooks' random-number settings
    p = yaml.safe_load(PARAMS.read_text())
    model_seed, data_seed = (
        int(s) for s in jax.random.randint(jax.random.key(seed), (2,), 0, 2**31 - 1)
    )
    config = model_config(p, model_name)
    corpus = load_stdlib_corpus()
    valid = validation_windows(corpus.validation, p["seq_len"], p["val_windows"])
    model = TinyLM(config, rngs=nnx.Rngs(model_seed))
    spent = []

    def validate(record):
        start = time.perf_counter()
        score_text(model, valid, batch_size=p["val_windows"])
        spent.append(time.perf_counter() - start)

    history = train(
        model,
        text_task(corpus.train),
        steps=p["steps"],
        batch_size=p["batch_size"],
        seq_len=p["seq_len"],
        learning_rate=p["learning_rate"],
        seed=data_seed,
        log_every=p["eval_every"],
        progress=validate,
    )
    timed = history["step"][-1] - history["step"][0]
    seconds = history["seconds"][-1] - history["seconds"][0] - sum(spent[:-1])
    bpb = score_text(model, valid, batch_size=p["val_windows"])["bits_per_token"]
    return dict(
        model=model_name,
        seed=seed,
        layers=list(config.layer_mixers),
        bpb=bpb,
        params=config_param_count(config),
        train_tokens_per_second=timed * p["batch_size"] * p["seq_len"] / seconds,
        seconds=history["seconds"][-1],
        corpus=corpus.describe()["fingerprint"],
        platform=jax.devices()[0].platform,
        jax_version=jax.__version__,
    )


def recorded_rows(path: pathlib.Path) -> list[dict]:
    document = read_json_document(path)
    return document.get("runs", []) if document else []


def add_row(document: dict | None, row: dict) -> dict:
    """``document`` (as on disk, None if absent) with ``row`` added, rows sorted by model and
    seed; a (model, seed) row already there is kept."""
    rows = list((document or {}).get("runs", []))
    if not any((r["model"], r["seed"]) == (row["model"], row["seed"]) for r in rows):
        rows.append(row)
    rows.sort(key=lambda r: (r["model"], r["seed"]))
    return dict(setting=str(PARAMS.relative_to(ROOT)), runs=rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--output", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds must be ints >= 0, got {args.seeds}")
    problem = output_path_problem(args.output)
    if problem:
        parser.error(f"--output: {problem}")
    try:
        recorded_rows(args.output)
    except ValueError as error:
        parser.error(f"--output: {error}; move it away or give another path")
    for seed in args.seeds:
        for model_name in args.models:
            rows = recorded_rows(args.output)  # other processes may have added rows
            if any((r["model"], r["seed"]) == (model_name, seed) for r in rows):
                print(f"{model_name} seed {seed}: already in {args.output}, skipped", flush=True)
                continue
            row = run(model_name, seed)
            print(row, flush=True)
            update_json(args.output, lambda document, row=row: add_row(document, row))


if __name__ == "__main__":
    main()
