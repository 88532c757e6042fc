"""kda_pallas's largest call at every chunk size (engineer review 91, B1): bfloat16 16 value heads
(also 8 q/k heads, grouped), float32 8, bfloat16 V = 256 8; K = 128, B = 1, T = 2,048: compile
fwd+bwd, time it, and whether every gradient is finite."""
import json
import os
import time

import jax
import jax.numpy as jnp

from kda_lib.ops import pallas_tpu
from kda_lib.testing import random_kda_inputs

rows = []
for dtype, heads, qk, vd in (("bfloat16", 16, 16, 128), ("float32", 8, 8, 128),
                             ("bfloat16", 16, 8, 128), ("bfloat16", 8, 8, 256)):
    x = random_kda_inputs(jax.random.key(1), 1, 2048, heads, 128, vd, dtype=jnp.dtype(dtype))
    x = {n: jnp.asarray(a, jnp.float32) if n in ("g", "beta") else a for n, a in x.items()}
    x["q"], x["k"] = x["q"][:, :, :qk], x["k"][:, :, :qk]
    for chunk in (16, 32, 64, 128, 256):
        if (heads, qk, vd) != (16, 16, 128) and chunk not in (16, 256):
            continue

        def loss(x, chunk=chunk):
            o, s = pallas_tpu.kda_pallas(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                         scale=128**-0.5, chunk_size=chunk)
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s)

        row = dict(dtype=dtype, value_heads=heads, qk_heads=qk, V=vd, chunk=chunk)
        t = time.perf_counter()
        try:
            c = jax.jit(jax.grad(loss)).lower(x).compile()
            row["compile_s"] = round(time.perf_counter() - t, 2)
            g = jax.block_until_ready(c(x))
            row["finite"] = bool(all(jnp.isfinite(a).all() for a in jax.tree.leaves(g)))
            t = time.perf_counter()
            for _ in range(5):
                g = c(x)
            jax.block_until_ready(g)
            row["fwdbwd_ms"] = round((time.perf_counter() - t) / 5 * 1e3, 3)
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(os.environ.get("OUT", "."), "chunks.json"), "w") as out:
            json.dump(rows, out, indent=1)
