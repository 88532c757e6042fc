"""Is the kernel's floor XLA's relayout of [B, T, H, K] to [B, T, H * K]? Time the forward from
4-d inputs (as kda() passes them) and from 3-d ones reshaped inside (the copies cancel), and
list the optimized HLO's non-kernel ops.

Run on the lent v5e from build/device/ as build/device/s17.sh (abl3 there is 2026-12-06-pallas-
floor.py); made the `layout_rows` of 2026-12-06-pallas-floor-8d2d20c.json.
"""

import json
import os
import re
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "build/device")
import abl3, abl2  # noqa
from abl2 import P, bench
from kda_lib.testing import random_kda_inputs

x = random_kda_inputs(jax.random.key(1), 1, 8192, 16, 128, dtype=jnp.bfloat16)
x = {n: jnp.asarray(a, jnp.float32) if n in ("g", "beta") else a for n, a in x.items()}
flat = {n: (a.reshape(1, 8192, -1) if a.ndim == 4 else a) for n, a in x.items()}


def fwd4(x):
    return P.kda_pallas(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        scale=128**-0.5,
        chunk_size=64,
        non_finite_fallback=False,
    )


def fwd3(x3):
    x = {
        n: (a.reshape(1, 8192, 16, -1) if a.ndim == 3 and n != "beta" else a) for n, a in x3.items()
    }
    o, s = fwd4(x)
    return o.reshape(1, 8192, -1), s


rows = []
for patch in ([], ["nl_no_write"]):
    for n, v in abl2.ORIGINAL.items():
        setattr(P, n, v)
    for p in patch:
        for n, v in abl2.PATCHES[p].items():
            setattr(P, n, v)
    jax.clear_caches()
    for name, f, arg in (("4d", fwd4, x), ("3d", fwd3, flat)):
        row = {"patch": patch, "inputs": name}
        row["fwd_ms"], row["compile_s"] = bench(jax.jit(f), arg)
        text = jax.jit(f).lower(arg).compile().as_text()
        ops = re.findall(r"^\s*(?:ROOT )?\S+ = (\S+) (\w+)\(", text, re.M)
        row["ops"] = sorted(
            {
                f"{op}:{shape}"
                for shape, op in ops
                if "8192" in shape and op not in ("parameter", "get-tuple-element", "tuple")
            }
        )[:40]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if name == "4d" and not patch:
            open(os.path.join(os.environ.get("OUT", "."), "fwd4.hlo.txt"), "w").write(text)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "layout.json"), "w"), indent=1)
