"""Seed spread of notebook 09's full setting: one model, one seed per call, merged into a JSON.

    python scripts/stdlib_lm_seeds.py --model kda --seed 1 \
        --output data/results/stdlib_lm_seeds.json

Builds and trains the model exactly as notebook 09 does with its full parameters
(``notebooks/params/full/09_hybrid_language_model.yaml``: the same configs, parameter matching,
AdamW schedule, batches and validation windows; model init and batches drawn from
``jax.random.key(seed)`` as the notebook's ``seed`` parameter does) and records the validation
bits per byte and the training tokens/s (steps after the first window, validation excluded, as
in the notebook). Seed 0 reproduces ``data/results/stdlib_lm_full.json``. One model per call,
so a long sweep can be run as short jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import jax
import yaml
from flax import nnx

import kda_lib.notebook
from kda_lib.corpus import load_stdlib_corpus, text_task, validation_windows
from kda_lib.generate import score_text
from kda_lib.models import ModelConfig, TinyLM, config_param_count, match_parameter_count
from kda_lib.records import write_json
from kda_lib.train import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAMS = ROOT / "notebooks" / "params" / "full" / "09_hybrid_language_model.yaml"


def run(model_name: str, seed: int) -> dict:
    kda_lib.notebook.setup(style=False)  # the notebooks' random-number settings
    p = yaml.safe_load(PARAMS.read_text())
    model_seed, data_seed = (
        int(s) for s in jax.random.randint(jax.random.key(seed), (2,), 0, 2**31 - 1)
    )
    base = ModelConfig(
        vocab_size=256,
        hidden_size=p["hidden_size"],
        num_layers=p["num_layers"],
        num_heads=p["num_heads"],
        head_dim=p["head_dim"],
        implementation=p["implementation"],
    )
    patterns = {
        "attention": ("attention",),
        "kda": ("kda",),
        "gdn": ("gdn",),
        "hybrid": tuple(p["hybrid_layers"]),
    }
    target = config_param_count(dataclasses.replace(base, layers=patterns["kda"]))
    config = match_parameter_count(
        dataclasses.replace(base, layers=patterns[model_name], rope=model_name != "hybrid"), target
    )
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
        bpb=bpb,
        params=config_param_count(config),
        train_tokens_per_second=timed * p["batch_size"] * p["seq_len"] / seconds,
        seconds=history["seconds"][-1],
        corpus=corpus.describe()["fingerprint"],
        platform=jax.devices()[0].platform,
        jax_version=jax.__version__,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--model", choices=("attention", "kda", "gdn", "hybrid"), required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--output", type=pathlib.Path, required=True)
    args = parser.parse_args()
    row = run(args.model, args.seed)
    print(row, flush=True)
    import json

    rows = json.loads(args.output.read_text())["runs"] if args.output.exists() else []
    rows = [r for r in rows if (r["model"], r["seed"]) != (args.model, args.seed)] + [row]
    rows.sort(key=lambda r: (r["model"], r["seed"]))
    write_json(dict(setting=str(PARAMS.relative_to(ROOT)), runs=rows), args.output)


if __name__ == "__main__":
    main()
