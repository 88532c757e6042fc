"""Which in-kernel ways of taking one head of a [T, H, W] block does Mosaic accept, and how fast
is a head-by-head copy [B, T, H, W] -> [B, T, H, W] through each (T = 8,192, H = 16, W = 128)?"""

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

T, H, W = int(os.environ.get("PT", 8192)), 16, 128
INTERPRET = jax.default_backend() != "tpu"


def timeit(f, *a):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(10):
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t)
    return round(statistics.median(ts) * 1e3, 4)


def run(name, kernel, bt, dtype, squeeze=False, beta=False):
    x = jax.random.normal(jax.random.key(0), (1, T, H, W), jnp.float32).astype(dtype)
    b = jax.random.uniform(jax.random.key(1), (1, T, H), jnp.float32)
    if squeeze:
        spec = pl.BlockSpec((1, bt, None, W), lambda i, h, n: (i, n, h, 0))
        grid = (1, H, T // bt)
    else:
        spec = pl.BlockSpec((1, bt, H, W), lambda i, h, n: (i, n, 0, 0))
        grid = (1, 1, T // bt)
    in_specs = [spec] + ([pl.BlockSpec((1, bt, H), lambda i, h, n: (i, n, 0))] if beta else [])
    call = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, dtype),
        interpret=INTERPRET,
    )
    f = jax.jit(lambda *a: call(*a))
    args = (x, b) if beta else (x,)
    row = {"name": name, "dtype": jnp.dtype(dtype).name, "bt": bt}
    try:
        out = np.asarray(f(*args).astype(jnp.float32))
        want = np.asarray(x.astype(jnp.float32)) * 2
        if beta:
            want = want * np.asarray(b)[..., None]
        row["max_err"] = float(np.abs(out - want).max())
        row["ms"] = timeit(f, *args)
    except Exception as e:  # noqa: BLE001
        row["error"] = repr(e)[:400]
    print(json.dumps(row), flush=True)
    return row


def k_int_index(x_ref, o_ref):  # ref indexed by an int on the second-minor (head) axis
    for h in range(H):
        o_ref[0, :, h, :] = x_ref[0, :, h, :] * 2


def k_value_slice(x_ref, o_ref):  # the whole block loaded, then sliced as a value
    x = x_ref[0]
    o_ref[0] = jnp.stack([x[:, h, :] * 2 for h in range(H)], axis=1)


def k_swap(x_ref, o_ref):  # [T, H, W] -> [H, T, W] -> back
    x = jnp.swapaxes(x_ref[0], 0, 1) * 2
    o_ref[0] = jnp.swapaxes(x, 0, 1)


def k_ds(x_ref, o_ref):
    for h in range(H):
        y = x_ref[0, :, pl.ds(h, 1), :] * 2
        o_ref[0, :, pl.ds(h, 1), :] = y


def k_squeezed(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def k_beta(x_ref, b_ref, o_ref):  # beta [T, H] block: one head's column by a lane slice
    for h in range(H):
        o_ref[0, :, h, :] = (
            x_ref[0, :, h, :].astype(jnp.float32) * 2 * b_ref[0][:, h : h + 1]
        ).astype(o_ref.dtype)


def k_whole(x_ref, o_ref):  # the reference: the block as it is (no head taken)
    o_ref[...] = x_ref[...] * 2


if __name__ == "__main__":
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.ones((1, T, H, W), dtype)
        rows.append(
            {
                "name": "xla_x2",
                "dtype": jnp.dtype(dtype).name,
                "ms": timeit(jax.jit(lambda x: x * 2), x),
            }
        )
        xf = jnp.ones((1, T, H * W), dtype)
        spec = pl.BlockSpec((1, 256, 4 * W), lambda i, h, n: (i, n, h))
        call = pl.pallas_call(
            k_whole,
            grid=(1, H // 4, T // 256),
            in_specs=[spec],
            out_specs=spec,
            out_shape=jax.ShapeDtypeStruct(xf.shape, dtype),
            interpret=INTERPRET,
        )
        rows.append(
            {"name": "flat_m4", "dtype": jnp.dtype(dtype).name, "ms": timeit(jax.jit(call), xf)}
        )
        print(json.dumps(rows[-2:]), flush=True)
    for dtype in (jnp.float32, jnp.bfloat16):
        for bt in (64, 256):
            rows.append(run("whole", k_whole, bt, dtype))
            rows.append(run("int_index", k_int_index, bt, dtype))
            rows.append(run("value_slice", k_value_slice, bt, dtype))
            rows.append(run("swap", k_swap, bt, dtype))
            rows.append(run("ds", k_ds, bt, dtype))
            rows.append(run("beta", k_beta, bt, dtype, beta=True))
        rows.append(run("squeezed", k_squeezed, 256, dtype, squeeze=True))
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "probe4d.json"), "w"), indent=1)
