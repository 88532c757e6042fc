"""The script behind the kernel ablations on the lent v5e: 2026-12-06-pallas-ablations.json (a
tidied copy of the probe that ran at commit 3dbbc9d: the 16-row Neumann inverse, LOW_PASSES
(3, 6, 3)) and 2026-12-06-pallas-ablations-7baba4e.json (this file as run at commit 7baba4e;
``heads`` and ``bwd_only`` added since the first). With kda_lib importable from the checkout
(append to the image's PYTHONPATH: its JAX lives on it), the variants are a record's rows
without their results:

    V=$(jq -c '[.rows[] | del(.fwd_ms, .fwd_compile_s, .fwdbwd_ms, .fwdbwd_compile_s,
        .corr_err, .error)]' data/benchmarks/tpu-v5e/2026-12-06-pallas-ablations-7baba4e.json)
    PYTHONPATH=$PYTHONPATH:. python3 data/benchmarks/tpu-v5e/2026-12-06-pallas-ablations.py "$V"

Each variant patches :mod:`kda_lib.ops.pallas_tpu` (its passes, chunk, block, heads per
program, or a stand-in for one part) and times the kernel's forward at T = 8,192 (bf16 q/k/v,
B = 1, H = 16, K = V = 128, no non-finite fallback): compile, 2 warm-ups, the median of 10
calls. ``acc``: also the forward's largest error over the four correlated-key cases of
tests/ops/test_pallas_tpu.py against the float64 recurrence on the host; ``bwd``: also forward
+ backward (``bwd_only``: that alone). Rows: ``$OUT/ablations.json``.
"""

import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib import kda_recurrent
from kda_lib.ops import pallas_tpu as P
from kda_lib.testing import random_kda_inputs

ORIGINAL = {n: getattr(P, n) for n in ("state_forward", "chunk_intra", "_dot_fwd_impl",
                                       "BLOCK_T", "HEADS", "LOW_PASSES")}  # fmt: skip


def bench(f, *args, reps=10):
    start = time.time()
    jax.block_until_ready(f(*args))
    compile_s = time.time() - start
    for _ in range(2):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3), round(compile_s, 2)


def correlated(noise, beta, gate):  # as tests/ops/test_pallas_tpu.py's _correlated
    rng, shape = np.random.default_rng(0), (1, 64, 2, 128)
    keys = rng.standard_normal(128) + noise * rng.standard_normal(shape)
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    bf16 = lambda a: jnp.asarray(a, jnp.bfloat16)  # noqa: E731
    return dict(q=bf16(rng.standard_normal(shape)), k=bf16(keys),
                v=bf16(rng.standard_normal(shape)), g=jnp.full(shape, gate, jnp.float32),
                beta=jnp.full(shape[:3], beta, jnp.float32))  # fmt: skip


def native(a, b, passes, dims):
    """Mosaic's own float32 product: one dot_general at HIGHEST (or NATIVE3's precision)."""
    batch = ((0,), (0,)) if a.ndim == 3 else ((), ())
    if passes == 1 or (a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16):
        a, b, precision = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), "DEFAULT"
    else:
        precision = "HIGHEST" if passes == 6 else os.environ.get("NATIVE3", "HIGHEST")
    return jax.lax.dot_general(a.astype(b.dtype), b, (dims, batch),
                               precision=getattr(jax.lax.Precision, precision),
                               preferred_element_type=jnp.float32)  # fmt: skip


def intra_only(intra, state, low):  # no state products: what chunk_intra costs
    attn_qk, w, u, q_in, k_out, keep = intra
    return u + w + q_in + k_out + jnp.sum(attn_qk, -1, keepdims=True) + jnp.sum(keep), state


def cheap_intra(q, k, v, g, beta, *, scale, low):  # elementwise stand-ins of the same shapes
    size, k32 = q.shape[-2], k.astype(jnp.float32)
    attn = jnp.where(P._rows((size, size)) >= P._cols((size, size)), beta, 0.0)
    last = P._column(P._row(jnp.exp(g), size - 1))
    return attn, k32 * beta, v.astype(jnp.float32) * beta, q.astype(jnp.float32), k32 * jnp.exp(
        g), last  # fmt: skip


PATCHES = {"intra_only": {"state_forward": intra_only}, "state_only": {"chunk_intra": cheap_intra},
           "native": {"_dot_fwd_impl": native}}  # fmt: skip


def main(variants):
    rel = lambda a, b: float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())  # noqa: E731
    cases = [correlated(*c) for c in [(0.0, 1.0, 0.0), (0.05, 1.0, 0.0), (0.3, 0.9, 0.0),
                                      (0.1, 1.0, -0.2)]]  # fmt: skip
    with jax.default_device(jax.devices("cpu")[0]), jax.enable_x64(True):
        want = [np.asarray(kda_recurrent(**{n: jnp.asarray(np.asarray(a.astype(jnp.float32),
                np.float64)) for n, a in x.items()})[0]) for x in cases]  # fmt: skip
    x = random_kda_inputs(jax.random.key(1), 1, 8192, 16, 128, dtype=jnp.bfloat16)
    x = {n: jnp.asarray(a, jnp.float32) if n in ("g", "beta") else a for n, a in x.items()}
    rows = []
    for v in variants:
        for name, value in ORIGINAL.items():
            setattr(P, name, value)
        P.LOW_PASSES, P.BLOCK_T = tuple(v.get("passes", P.LOW_PASSES)), v.get("block_t", P.BLOCK_T)
        P.HEADS = tuple(v.get("heads", P.HEADS))
        for patch in v.get("patch", []):
            for name, value in PATCHES[patch].items():
                setattr(P, name, value)
        os.environ.update({"NATIVE3": v["native3"]} if "native3" in v else {})
        jax.clear_caches()
        chunk = v.get("chunk", 64)
        def fwd(x, chunk=chunk):
            return P.kda_pallas(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=128**-0.5,
                                chunk_size=chunk, non_finite_fallback=False)  # fmt: skip

        row = dict(v)
        try:
            if v.get("acc"):
                row["corr_err"] = [round(rel(jax.jit(fwd)(c)[0].astype(jnp.float32), w), 5)
                                   for c, w in zip(cases, want, strict=True)]  # fmt: skip
            if not v.get("bwd_only"):
                row["fwd_ms"], row["fwd_compile_s"] = bench(jax.jit(fwd), x)
            if v.get("bwd"):
                loss = lambda x, fwd=fwd: jnp.sum(fwd(x)[0].astype(jnp.float32) ** 2)  # noqa: E731
                row["fwdbwd_ms"], row["fwdbwd_compile_s"] = bench(jax.jit(jax.grad(loss)), x)
        except Exception as error:  # a variant Mosaic refuses is recorded, not fatal
            row["error"] = repr(error)[:800]
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(os.environ.get("OUT", "."), "ablations.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
