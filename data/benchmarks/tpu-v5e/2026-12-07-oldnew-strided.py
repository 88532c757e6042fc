"""The kernel before (build/device/pallas_old.py, commit 5fd45b2: [B, T, H * K] column blocks,
XLA relayouts the inputs) and after (every head's rows of a [B, T * H, K] block, strided loads),
forward and forward + backward at T = 2,048 / 8,192 / 32,768, timed per call and back to back
(10 calls, one wait), in one run; and the largest difference between the two."""

import json  # noqa: E401
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, "build/device")
import pallas_old  # noqa: E402

from kda_lib.ops import pallas_tpu  # noqa: E402
from kda_lib.testing import random_kda_inputs  # noqa: E402


def times(f, x):
    jax.block_until_ready(f(x))
    per = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        per.append(time.perf_counter() - t)  # noqa: E702
    b2b = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(10):
            out = f(x)
        jax.block_until_ready(out)
        b2b.append((time.perf_counter() - t) / 10)
    return round(statistics.median(per) * 1e3, 3), round(min(b2b) * 1e3, 3)



def _gap(a, b):
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


rows = []
for T in (2048, 8192, 32768):
    x = random_kda_inputs(jax.random.key(1), 1, T, 16, 128, dtype=jnp.bfloat16)
    x = {n: jnp.asarray(a, jnp.float32) if n in ("g", "beta") else a for n, a in x.items()}
    for name, M in (("before", pallas_old), ("after", pallas_tpu)):
        fwd = lambda x, M=M: M.kda_pallas(
            x["q"], x["k"], x["v"], x["g"], x["beta"], scale=128**-0.5
        )  # noqa: E731
        loss = lambda x, fwd=fwd: jnp.sum(fwd(x)[0].astype(jnp.float32) ** 2)  # noqa: E731
        row = {"T": T, "kernel": name}
        for mode, f in (("fwd", jax.jit(fwd)), ("fwdbwd", jax.jit(jax.grad(loss)))):
            t = time.perf_counter()
            try:
                jax.block_until_ready(f(x))
                row[f"{mode}_compile_s"] = round(time.perf_counter() - t, 2)
                row[f"{mode}_per_call_ms"], row[f"{mode}_back_to_back_ms"] = times(f, x)
            except Exception as e:  # noqa: BLE001
                row[f"{mode}_error"] = repr(e)[:600]
        if name == "after":
            got = [jax.jit(fwd)(x), jax.jit(jax.grad(loss))(x)]
            diff = jax.tree.map(_gap, got, ref)  # noqa: F821 (set by the "before" row above)
            row["max_abs_diff_vs_before"] = max(jax.tree.leaves(diff))
        else:
            ref = [jax.jit(fwd)(x), jax.jit(jax.grad(loss))(x)]
        rows.append(row)
        print(json.dumps(row), flush=True)
        json.dump(
            rows, open(os.path.join(os.environ.get("OUT", "."), "oldnew.json"), "w"), indent=1
        )
