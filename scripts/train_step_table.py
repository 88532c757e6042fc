"""Seconds per training step of synthetic_sweep.py's models (``--preset paper``: 2 layers,
width 256, batch 32, MQAR) for each mixer and T, with ``implementation="auto"`` (on a TPU the
Pallas kernels where they serve): compile once, 3 warm-up steps, the median of 10 timed steps.

    python scripts/train_step_table.py --output data/results/train_steps_tpu.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path

import jax
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
import synthetic_sweep as sweep  # noqa: E402

from kda_lib.lab.records import output_path_problem, write_json  # noqa: E402
from kda_lib.lab.train import make_optimizer, make_task, train_step  # noqa: E402
from kda_lib.models.tiny_lm import TinyLM  # noqa: E402
from kda_lib.ops.api import select_implementation  # noqa: E402


def seconds_per_step(mixer: str, seq_len: int, args, reps: int = 10) -> dict:
    model = TinyLM(sweep._model_config(mixer, args), rngs=nnx.Rngs(0))
    optimizer = make_optimizer(model, steps=100, learning_rate=1e-3)
    step = nnx.cached_partial(train_step, model, optimizer)
    task_fn = make_task("mqar", **sweep.task_options("mqar", args))
    batch = jax.jit(lambda key: task_fn(key, args.batch_size, seq_len))(jax.random.key(0))
    start = time.perf_counter()
    jax.block_until_ready(step(batch))
    compile_s = time.perf_counter() - start
    for _ in range(3):
        jax.block_until_ready(step(batch))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(step(batch))
        times.append(time.perf_counter() - start)
    return dict(mixer=mixer, T=seq_len, seconds_per_step=statistics.median(times),
                min_s=min(times), max_s=max(times), reps=reps, first_step_s=compile_s)


def parse_args(argv=None):
    """``(own options, synthetic_sweep's arguments)``, checked before any work (argparse's
    error, exit status 2); the rest of ``argv`` goes to synthetic_sweep.py's parser."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output", required=True, help="the JSON record (replaced)")
    p.add_argument("--seq-lens", default="256,2048", help="comma-separated T")
    p.add_argument("--mixers", default="kda,gdn,mamba2,attention")
    own, rest = p.parse_known_args(argv)
    sweep_parser, args = sweep.parse(["--phase", "all", "--output", own.output, "--preset",
                                      "paper", "--implementation", "auto", *rest])  # fmt: skip
    sweep.check_arguments(sweep_parser, args)
    try:
        own.seq_lens = [int(t) for t in own.seq_lens.split(",")]
    except ValueError:
        p.error(f"--seq-lens must be comma-separated ints, got {own.seq_lens!r}")
    shortest = 3 * args.num_pairs  # MQAR: the pairs, then room for every query
    if min(own.seq_lens) < shortest:
        p.error(f"--seq-lens must all be >= 3 * num_pairs = {shortest}, got {own.seq_lens}")
    own.mixers = own.mixers.split(",")
    if unknown := sorted(set(own.mixers) - set(sweep.MIXERS.split(","))):
        p.error(f"--mixers: unknown {unknown}; choose from {sweep.MIXERS}")
    if problem := output_path_problem(own.output):
        p.error(f"--output: {problem}")
    return own, args


def main(argv=None):
    own, args = parse_args(argv)
    device = jax.devices()[0]
    record = dict(kind="train_step_table", device_kind=device.device_kind,
                  platform=device.platform, jax=jax.__version__,
                  flax=importlib.metadata.version("flax"), preset="paper",
                  batch_size=args.batch_size, hidden_size=args.hidden_size,
                  num_layers=args.num_layers, num_heads=args.num_heads, head_dim=args.head_dim,
                  date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  rows=[])  # fmt: skip
    for seq_len in own.seq_lens:
        kernel = select_implementation(seq_len=seq_len, num_heads=args.num_heads,
                                       key_dim=args.head_dim, batch=args.batch_size)
        for mixer in own.mixers:
            row = seconds_per_step(mixer, seq_len, args)
            if mixer == "kda":
                row["kda_implementation"] = kernel
            record["rows"].append(row)
            print(json.dumps(row), flush=True)
            write_json(record, own.output)


if __name__ == "__main__":
    main()
