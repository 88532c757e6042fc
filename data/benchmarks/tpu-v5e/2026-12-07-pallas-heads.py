"""kda_pallas at the presets' head counts: bfloat16 H = 16, 32, 64, 96 and float32 H = 16, 32
(K = V = 128, B = 1, T = 8,192), forward and forward + backward, per call and back to back
(10 calls, one wait); how many calls kda_pallas splits the heads into (ROW_BYTES)."""

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

from kda_lib.ops import pallas_tpu
from kda_lib.testing import random_kda_inputs


def times(f, x):
    jax.block_until_ready(f(x))
    per = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        per.append(time.perf_counter() - t)
    b2b = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(10):
            out = f(x)
        jax.block_until_ready(out)
        b2b.append((time.perf_counter() - t) / 10)
    return round(statistics.median(per) * 1e3, 3), round(min(b2b) * 1e3, 3)


rows = []
T = int(os.environ.get("T", 8192))
for dtype, H in [("bfloat16", h) for h in (16, 32, 64, 96)] + [("float32", 16), ("float32", 32)]:
    x = random_kda_inputs(jax.random.key(1), 1, T, H, 128, dtype=jnp.dtype(dtype))
    x = {n: jnp.asarray(a, jnp.float32) if n in ("g", "beta") else a for n, a in x.items()}

    def fwd(x):
        return pallas_tpu.kda_pallas(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=128**-0.5)

    def loss(x):
        return jnp.sum(fwd(x)[0].astype(jnp.float32) ** 2)

    row = {"dtype": dtype, "H": H, "T": T}
    for mode, f in (("fwd", jax.jit(fwd)), ("fwdbwd", jax.jit(jax.grad(loss)))):
        t = time.perf_counter()
        try:
            jax.block_until_ready(f(x))
            row[f"{mode}_compile_s"] = round(time.perf_counter() - t, 2)
            row[f"{mode}_per_call_ms"], row[f"{mode}_back_to_back_ms"] = times(f, x)
        except Exception as e:  # noqa: BLE001
            row[f"{mode}_error"] = repr(e)[:600]
    rows.append(row)
    print(json.dumps(row), flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "heads.json"), "w"), indent=1)
