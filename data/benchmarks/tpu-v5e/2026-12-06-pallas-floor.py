"""State-loop micro-ablations (session 6): every variant uses abl2's `state_only` stand-ins for
the intra part and changes only the loop body, to find where the loop's 2.0 ms at T = 8,192 go.

Run on the lent v5e from build/device/ (abl2 there is 2026-12-06-pallas-ablations.py) as
build/device/s15.sh and s16.sh; made the `rows` of 2026-12-06-pallas-floor-8d2d20c.json.
"""

import sys

import jax.numpy as jnp

sys.path.insert(0, "build/device")
import abl2  # noqa: E402
from abl2 import P  # noqa: E402

SF = P.state_forward


def no_loop(intra, state, low):  # the loop's products gone: overhead of stand-ins, I/O, writes
    attn_qk, w, u, q_in, k_out, keep = intra
    return u + w, state


def no_out(intra, state, low):  # no q_in S, no attn_qk U'
    attn_qk, w, u, q_in, k_out, keep = intra
    corrected = u - P._dot(w, state, P._passes(low)[2])
    return corrected, keep * state + P._dot_t(k_out, corrected, P._passes(low)[2])


def no_update(intra, state, low):  # the state only decays: no k_out^T U'
    attn_qk, w, u, q_in, k_out, keep = intra
    p_score, _, p_state = P._passes(low)
    corrected = u - P._dot(w, state, p_state)
    o = P._dot(q_in, state, p_state) + P._dot(attn_qk, corrected, p_score)
    return o, keep * state


def stacked(intra, state, low):  # [w; q_in] against the state in one product
    attn_qk, w, u, q_in, k_out, keep = intra
    p_score, _, p_state = P._passes(low)
    ws, qs = P._halves(P._dot(jnp.concatenate([w, q_in], axis=-2), state, p_state))
    corrected = u - ws
    o = qs + P._dot(attn_qk, corrected, p_score)
    return o, keep * state + P._dot_t(k_out, corrected, p_state)


def kt_contract(intra, state, low):  # k_out^T U' as one dot_general contracting rows (no transpose)
    attn_qk, w, u, q_in, k_out, keep = intra
    p_score, _, p_state = P._passes(low)
    corrected = u - P._dot(w, state, p_state)
    o = P._dot(q_in, state, p_state) + P._dot(attn_qk, corrected, p_score)
    n = k_out.ndim
    upd = P._dot_fwd_impl(k_out, corrected, p_state, ((n - 2,), (n - 2,)))
    return o, keep * state + upd


def bf16_state(intra, state, low):  # every loop product one bf16 pass
    attn_qk, w, u, q_in, k_out, keep = intra
    corrected = u - P._dot(w, state, 1)
    o = P._dot(q_in, state, 1) + P._dot(attn_qk, corrected, 1)
    return o, keep * state + P._dot_t(k_out, corrected, 1)


cheap = abl2.PATCHES["state_only"]["chunk_intra"]
for name, fn in dict(
    no_loop=no_loop,
    no_out=no_out,
    no_update=no_update,
    stacked=stacked,
    kt_contract=kt_contract,
    bf16_state=bf16_state,
).items():
    abl2.PATCHES["so_" + name] = {"chunk_intra": cheap, "state_forward": fn}
# the full kernel with a loop variant
for name, fn in dict(stacked=stacked, kt_contract=kt_contract).items():
    abl2.PATCHES["full_" + name] = {"state_forward": fn}


def naive_intra(q, k, v, g, beta, *, scale, low):  # timing only: one product for the scores
    f32, size = jnp.float32, q.shape[-2]
    p_score, p_inner, _ = P._passes(low)
    k32, q32 = k.astype(f32), q.astype(f32) * scale
    cum = jnp.cumsum(jnp.maximum(g, -0.1), axis=-2)  # bounded: finite for timing
    decay_in = jnp.exp(cum)
    last = P._column(P._row(decay_in, size - 1))
    kin, kout = k32 * decay_in, k32 * jnp.exp(-cum)
    both = P._dot(jnp.concatenate([q32 * decay_in, kin], axis=-2), kout, p_score, True)
    attn_qk, attn_kk = P._halves(both)
    attn_qk = jnp.where(P._rows(attn_qk.shape) >= P._cols(attn_qk.shape), attn_qk, 0.0)
    attn_kk = beta * jnp.where(P._rows(attn_kk.shape) > P._cols(attn_kk.shape), attn_kk, 0.0)
    solve = P._unit_lower_inverse(attn_kk, p_inner)
    w = P._dot(solve, beta * kin, p_inner)
    u = P._dot(solve, beta * v.astype(f32), p_inner)
    return (
        attn_qk,
        w,
        u,
        q32 * decay_in,
        k32 * jnp.exp(last.reshape(*last.shape[:-2], 1, -1) - cum),
        last,
    )


ORIG_INV = P._unit_lower_inverse
abl2.PATCHES["io_base"] = {"state_forward": abl2.intra_only}
abl2.PATCHES["io_no_inverse"] = {
    "state_forward": abl2.intra_only,
    "_unit_lower_inverse": lambda a, p: a + P._eye(a.shape[-1]),
}
abl2.PATCHES["io_naive_scores"] = {"state_forward": abl2.intra_only, "chunk_intra": naive_intra}
abl2.ORIGINAL["_unit_lower_inverse"] = ORIG_INV


def column_t(row):  # [..., 1, D] -> [..., D, 1] by an XLU transpose of a sublane broadcast
    d = row.shape[-1]
    return jnp.swapaxes(jnp.broadcast_to(row, (*row.shape[:-2], 128, d)), -1, -2)[..., :1]


def column_cheap(row):  # timing only: a broadcast of one element, no transpose
    return jnp.broadcast_to(row[..., :1, :1], (*row.shape[:-2], row.shape[-1], 1))


def min_intra(q, k, v, g, beta, *, scale, low):  # timing only: no exp, no row/column
    f32, size = jnp.float32, q.shape[-2]
    k32 = k.astype(f32)
    attn = jnp.zeros((*q.shape[:-2], size, size), f32)
    return (
        attn,
        k32,
        v.astype(f32),
        q.astype(f32),
        k32 + g,
        g[..., :1, :1] + jnp.zeros((*g.shape[:-2], k.shape[-1], 1), f32),
    )


abl2.ORIGINAL["_column"] = P._column
abl2.ORIGINAL["_write"] = P._write
abl2.PATCHES["nl_no_column"] = {**abl2.PATCHES["so_no_loop"], "_column": column_cheap}
abl2.PATCHES["nl_tcol"] = {**abl2.PATCHES["so_no_loop"], "_column": column_t}
abl2.PATCHES["nl_min_intra"] = {**abl2.PATCHES["so_no_loop"], "chunk_intra": min_intra}
abl2.PATCHES["nl_min_intra_nocol"] = {
    **abl2.PATCHES["so_no_loop"],
    "chunk_intra": min_intra,
    "_column": column_cheap,
}
abl2.PATCHES["nl_no_write"] = {**abl2.PATCHES["nl_min_intra_nocol"], "_write": lambda *a: None}
abl2.PATCHES["full_tcol"] = {"_column": column_t}
abl2.PATCHES["io_tcol"] = {**abl2.PATCHES["io_base"], "_column": column_t}

if __name__ == "__main__":
    abl2.main(__import__("json").loads(sys.argv[1]))
