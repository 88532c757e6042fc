"""Notebook 08's capacity curve: MQAR recall against the number of key-value pairs, resumable.

    python scripts/recall_capacity.py --output data/results/synthetic_recall_capacity.json \
        --time-limit 270

Per pairs count n of ``--pairs``: MQAR at T = 4 n (this record's choice of short sequences: 2 n
pair tokens, then n queries among n fillers), trained and scored by
``scripts/synthetic_sweep.py``'s runs (its ``Sweep``: training, validation and test streams per
seed, the early stop once validation reaches ``solved``, the test scored once at the end) at
the model of :data:`MODEL` (one layer, heads of ``head_dim`` = d_k = 8), for every
mixer of ``--mixers`` and seed of ``--seeds``, at one fixed rate ``--rate``: not tuned, so no
tuning runs (each document's ``grids`` says so: ``"fixed": true``). A sweep document holds one
setting and ``num_pairs`` is part of it, so each count is its own document, ``--parts``/
``pairs_<n>.json``, resumed run by run. Runs go seed by seed (seed 0 at every count and mixer,
then seed 1, ...), so a cut leaves whole seeds. ``--time-limit S``: no run starts after S
seconds of this call, which then merges what is there and exits 0 (call it again to go on).

After every call the parts are merged into ``--output``: ``{"about", "protocol", "command",
"options", "rate", "parts": [{"setting", "grids", "runs"}, ...]}`` (one part per pairs count, in
order; ``kda_lib.teaching.recall_sweep.capacity_curve`` reads it).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import synthetic_sweep as sweep  # noqa: E402

from kda_lib.lab.records import output_path_problem, replace_problem, write_json  # noqa: E402

# The model and budget of every run (synthetic_sweep's options); --max-steps overrides its value.
MODEL = dict(
    vocab_size=65,  # 32 key tokens, 32 value tokens and the filler: chance 1/32, n <= 32
    hidden_size=64,
    num_layers=1,
    num_heads=2,
    head_dim=8,  # d_k = d_v = 8 per head
    chunk_size=16,
    batch_size=16,
    max_steps=2000,
    eval_every=100,
    eval_batches=8,
    test_batches=16,
)
ABOUT = (
    "Notebook 08's capacity curve (scripts/recall_capacity.py): MQAR test accuracy against the "
    "number of key-value pairs n at T = 4 n, one layer, heads of d_k = 8, a fixed rate."
)


class OutOfTime(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output", required=True, help="the merged JSON (rewritten after each call)")
    p.add_argument("--parts", default="build/recall_capacity", help="one sweep document per n")
    p.add_argument("--pairs", default="2,4,8,16,32", help="pairs counts n, comma-separated")
    p.add_argument("--mixers", default="kda,gdn,mamba2,conv")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rate", default="0.01", help="the fixed AdamW peak rate of every run")
    p.add_argument("--max-steps", type=int, default=MODEL["max_steps"])
    p.add_argument("--time-limit", type=float, default=float("inf"), help="seconds; see above")
    return p


def sweep_argv(args, n: int) -> list[str]:
    """``synthetic_sweep.py``'s command line for the pairs count ``n``."""
    model = dict(MODEL, max_steps=args.max_steps, num_pairs=n)
    options = [f"--{k.replace('_', '-')}={v}" for k, v in model.items()]
    return ["--phase", "seeds", "--output", str(pathlib.Path(args.parts) / f"pairs_{n}.json"),
            "--tasks", "mqar", "--seq-lens", f"mqar={4 * n}", "--mixers", args.mixers,
            "--seeds", args.seeds, "--grid", args.rate, "--max-extensions", "0", *options]


def check_arguments(p: argparse.ArgumentParser, args) -> dict:
    """Refuse (argparse's error, exit 2) before any work what would fail or mislead later:
    ``--pairs`` not distinct ints in [1, 32] (the vocabulary's 32 keys), ``--time-limit`` or
    ``--rate`` not > 0, an ``--output`` that cannot be written or holds a damaged or another
    kind of record, a part that cannot be written; then every count's ``synthetic_sweep.py``
    arguments (its own refusals, e.g. an unknown mixer or a part made with another setting).
    Returns ``{n: the sweep's arguments}``."""
    try:
        pairs = [int(x) for x in args.pairs.split(",")]
    except ValueError:
        p.error(f"--pairs must be comma-separated ints, got {args.pairs!r}")
    top = (MODEL["vocab_size"] - 1) // 2
    if len(set(pairs)) < len(pairs) or not all(1 <= n <= top for n in pairs):
        p.error(f"--pairs must be distinct ints in [1, {top}], got {pairs}")
    if not (args.time_limit > 0):  # nan too
        p.error(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    try:
        rate = float(args.rate)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
        p.error(f"--rate must be a number > 0, got {args.rate!r}")
    if problem := output_path_problem(args.output) or replace_problem(
            args.output, "capacity record", ("about", "parts")):
        p.error(f"--output: {problem}")
    for n in pairs:
        if problem := output_path_problem(pathlib.Path(args.parts) / f"pairs_{n}.json"):
            p.error(f"--parts: {problem}")
    out = {}
    for n in pairs:
        q, out[n] = sweep.parse(sweep_argv(args, n))
        sweep.check_arguments(q, out[n])
    return out


def documents(checked: dict) -> dict[int, sweep.Sweep]:
    """Each pairs count's sweep document, created or resumed, its fixed rate in ``grids``."""
    out = {}
    for n, a in checked.items():
        out[n] = sweep.Sweep(a)
        for mixer in a.mixers.split(","):  # the rate, fixed: recorded as the cell's "grid"
            if f"mqar/{mixer}" not in out[n].doc["grids"]:
                rate = a.grid[0]
                out[n].set_grid(f"mqar/{mixer}", dict(seq_len=4 * n, seed=None, rates=[rate],
                                                      best=rate, inside=False, fixed=True))
    return out


def run(args, docs: dict[int, sweep.Sweep]) -> int:
    """Every run, seed by seed, until done or out of time; the number of runs trained."""
    start, trained = time.monotonic(), 0

    def before_train(key):
        nonlocal trained
        if time.monotonic() - start >= args.time_limit:
            raise OutOfTime(key)
        trained += 1

    for doc in docs.values():
        doc.before_train = before_train
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            for n, doc in docs.items():
                for mixer in args.mixers.split(","):
                    rate = doc.doc["grids"][f"mqar/{mixer}"]["best"]
                    doc.ensure("mqar", mixer, 4 * n, rate, seed, "seeds")
    except OutOfTime as stop:
        print(f"--time-limit {args.time_limit:g} s reached; next run {stop.args[0]}", flush=True)
    return trained


def merge(args, docs: dict[int, sweep.Sweep]) -> dict:
    """The parts in one document (``--output``'s layout, above)."""
    first = next(iter(docs.values())).doc
    return dict(
        about=ABOUT,
        protocol=first["protocol"],
        command="python scripts/recall_capacity.py " + " ".join(
            f"--{k.replace('_', '-')} {getattr(args, k)}"
            for k in ("pairs", "mixers", "seeds", "rate", "max_steps")),
        options=dict(MODEL, max_steps=args.max_steps),
        rate=float(args.rate),
        parts=[{k: d.doc[k] for k in ("setting", "grids", "runs")} for d in docs.values()],
    )


def main(argv=None) -> None:
    p = parser()
    args = p.parse_args(argv)
    docs = documents(check_arguments(p, args))
    trained = run(args, docs)
    for doc in docs.values():
        doc.refresh()
    merged = merge(args, docs)
    write_json(merged, args.output)
    runs = sum(len(part["runs"]) for part in merged["parts"])
    print(f"{trained} runs trained; {runs} in {args.output}", flush=True)


if __name__ == "__main__":
    main()
