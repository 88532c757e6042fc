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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output", required=True)
    p.add_argument("--seq-lens", default="256,2048")
    p.add_argument("--mixers", default="kda,gdn,mamba2,attention")
    own, rest = p.parse_known_args(argv)
    _, args = sweep.parse(["--phase", "all", "--output", own.output, "--preset", "paper",
                           "--implementation", "auto", *rest])
    device = jax.devices()[0]
    record = dict(kind="train_step_table", device_kind=device.device_kind,
                  platform=device.platform, jax=jax.__version__,
                  flax=importlib.metadata.version("flax"), preset="paper",
                  batch_size=args.batch_size, hidden_size=args.hidden_size,
                  num_layers=args.num_layers, num_heads=args.num_heads, head_dim=args.head_dim,
                  date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  rows=[])
    for seq_len in (int(t) for t in own.seq_lens.split(",")):
        kernel = select_implementation(seq_len=seq_len, num_heads=args.num_heads,
                                       key_dim=args.head_dim, batch=args.batch_size)
        for mixer in own.mixers.split(","):
            row = seconds_per_step(mixer, seq_len, args)
            if mixer == "kda":
                row["kda_implementation"] = kernel
            record["rows"].append(row)
            print(json.dumps(row), flush=True)
            Path(own.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
