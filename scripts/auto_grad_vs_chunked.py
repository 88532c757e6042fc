"""Issue 26 item 7: ``kda(implementation="auto")`` under ``jax.grad`` on CPU (the scan forward
with the chunked gradient) against plain ``"chunked"`` fwd+bwd, one interleaved run at
T = 256, 1024, 4096 with kda_lib.lab.bench's jobs (inputs, gradients, timing).

The route it measures was removed on that measurement (``auto`` is plain ``"chunked"`` above 16
tokens now, so after the removal both rows time the same program). To reproduce the recorded
data, run it at a commit that has the route (up to ``64411ba``, the last before its removal)::

    git checkout 64411ba
    python scripts/auto_grad_vs_chunked.py --reps 7 \
        --out data/benchmarks/comparisons/auto-grad-vs-chunked-cpu.json
"""

from __future__ import annotations

import argparse
import statistics

import jax

from kda_lib.lab.bench import BenchConfig, TimedProgram, kda_entry, kernel_inputs, with_gradients
from kda_lib.lab.record_runs import check_option_minimums
from kda_lib.lab.records import dumps, output_path_problem, write_json


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked before any timing (argparse's error, exit status 2)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default="-", help="JSON path ('-', the default: print it)")
    args = parser.parse_args(argv)
    check_option_minimums(parser, args, dict(reps=1, warmup=0))
    if min(args.seq_lens) < 1:
        parser.error(f"--seq-lens must all be >= 1, got {args.seq_lens}")
    problem = None if args.out == "-" else output_path_problem(args.out)
    if problem:
        parser.error(f"--out: {problem}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = BenchConfig(batch=1, heads=4, key_dim=64, value_dim=64, dtype="float32")
    key = jax.random.key(0)
    jobs = []
    for seq_len in args.seq_lens:
        inputs = tuple(kernel_inputs(cfg, seq_len, key).values())
        for impl in ("auto", "chunked"):
            fn = with_gradients(kda_entry(impl), inputs, jax.random.key(1))
            jobs.append(TimedProgram(impl, seq_len, "fwd+bwd", fn, inputs))
    for job in jobs:
        job.prepare(args.warmup)
    for _ in range(args.reps):  # interleaved: a change of load hits every job alike
        for job in jobs:
            job.time_once()
    records = [job.record() for job in jobs]
    by = {(r["impl"], r["T"]): r["median_ms"] for r in records}
    ratios = {str(t): by[("auto", t)] / by[("chunked", t)] for t in args.seq_lens}
    document = dict(
        config=dict(**{k: str(v) for k, v in vars(cfg).items()}, reps=args.reps),
        jax_version=jax.__version__,
        records=records,
        ratios={"auto/chunked": {"fwd+bwd": ratios}},
    )
    for t in args.seq_lens:
        times = {i: statistics.median(j.times_ms) for j in jobs if j.seq_len == t for i in [j.impl]}
        print(
            f"T={t}: auto {times['auto']:.1f} ms, chunked {times['chunked']:.1f} ms, "
            f"ratio {ratios[str(t)]:.3f}"
        )
    if args.out == "-":
        print(dumps(document), end="")
    else:
        write_json(document, args.out)


if __name__ == "__main__":
    main()
