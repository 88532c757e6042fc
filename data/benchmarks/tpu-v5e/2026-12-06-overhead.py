"""Per-call latency vs back-to-back device time on the chip: a scalar op, a copy, the kernel."""

import json  # noqa: E401
import os
import statistics
import time

import jax
import jax.numpy as jnp

from kda_lib.ops import pallas_tpu as P
from kda_lib.testing import random_kda_inputs


def per_call(f, *a, reps=20):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t)
    return round(statistics.median(ts) * 1e3, 4)


def back_to_back(f, *a, n=50):
    jax.block_until_ready(f(*a))
    best = []
    for _ in range(3):
        t = time.perf_counter()
        outs = [f(*a) for _ in range(n)]
        jax.block_until_ready(outs)
        best.append((time.perf_counter() - t) / n)
    return round(min(best) * 1e3, 4)


rows = []
s = jnp.float32(1)
x = jnp.ones((1, 8192, 16, 128), jnp.float32)
cases = [
    ("scalar_add", jax.jit(lambda s: s + 1), (s,)),
    ("copy_f32_67MB", jax.jit(lambda x: x * 2), (x,)),
]
for T in (2048, 8192, 32768):
    k = random_kda_inputs(jax.random.key(1), 1, T, 16, 128, dtype=jnp.bfloat16)
    k = {n: jnp.asarray(a, jnp.float32) if n in ("g", "beta") else a for n, a in k.items()}
    f = jax.jit(lambda k: P.kda_pallas(k["q"], k["k"], k["v"], k["g"], k["beta"], scale=128**-0.5))
    cases.append((f"pallas_fwd_T{T}", f, (k,)))
for name, f, a in cases:
    row = {"name": name, "per_call_ms": per_call(f, *a), "back_to_back_ms": back_to_back(f, *a)}
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "overhead.json"), "w"), indent=1)
