"""Worked solutions of notebook 05's exercises (``cases()`` feeds them to the checkers).

Both exercises are the backward pass of context parallelism. Forward, rank r's slice maps the
state entering it, S[r], to S[r + 1] = M[r] S[r] + E[r], and rank r's outputs depend on S[r]
(its output pass). Write gs[r] for the gradient of the loss with respect to S[r] and hs[r] for
the part that comes through rank r's own outputs (what the backward of its output pass gives).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def state_gradients(ms, hs):
    """1: S[r] reaches the loss two ways: through rank r's outputs (hs[r]) and through
    S[r + 1] = M[r] S[r] + E[r]. For a loss L(S[r + 1]), dL/dS[r] = M[r]^T dL/dS[r + 1]
    (entry by entry: dS[r + 1]_iv / dS[r]_jv = M[r]_ij, summed over i). So

        gs[R - 1] = hs[R - 1],    gs[r] = hs[r] + M[r]^T gs[r + 1]:

    the fold run right to left, with the transposed maps. The last rank's gradient is known
    first (nothing downstream), rank 0's last: the backward pass has the forward pass's
    dependency chain, reversed."""
    gs, g = [], np.zeros(np.shape(hs)[1:])
    for m, h in zip(ms[::-1], hs[::-1], strict=True):
        g = h + np.asarray(m).T @ g
        gs.append(g)
    return np.stack(gs[::-1])


def state_gradients_jnp(ms, hs):
    """1, written differently: float32 jnp, an index loop, the transpose as an einsum."""
    ms, hs = jnp.asarray(ms, jnp.float32), jnp.asarray(hs, jnp.float32)
    out = [hs[-1]]
    for r in range(len(ms) - 2, -1, -1):
        out.insert(0, hs[r] + jnp.einsum("ij,iv->jv", ms[r], out[0]))
    return jnp.stack(out)


def summary_cotangents(ms, es, hs):
    """2: E[r] enters the loss only through S[r + 1] = M[r] S[r] + E[r], with derivative 1, so
    des[r] = gs[r + 1]; M[r] multiplies S[r], so dms[r] = gs[r + 1] S[r]^T (entry ij:
    sum_v gs[r + 1]_iv S[r]_jv). The last rank's summary feeds only the final state, which the
    loss does not use: it receives zeros, and rank R - 1 need not compute its summary at all
    unless the final state is wanted (for decoding on, notebook 07). Rank 0's dms is zero too
    (the state entering it is zero), though its des is not. The all-gather's backward
    (a reduce-scatter) brings each rank these two arrays, of the summaries' size: flat in T."""
    gs = state_gradients(ms, hs)
    after = np.concatenate([gs[1:], np.zeros_like(gs[:1])])
    states, s = [], np.zeros(np.shape(es)[1:])
    for m, e in zip(ms, es, strict=True):
        states.append(s)
        s = np.asarray(m) @ s + np.asarray(e)
    return np.einsum("riv,rjv->rij", after, np.stack(states)), after


def summary_cotangents_loop(ms, es, hs):
    """2, written differently: one loop per direction, outer products per value column."""
    R, K, V = np.shape(es)
    states = [np.zeros((K, V))]
    for r in range(R - 1):
        states.append(ms[r] @ states[-1] + es[r])
    dms, des, g = np.zeros((R, K, K)), np.zeros((R, K, V)), np.zeros((K, V))
    for r in range(R - 1, -1, -1):
        des[r] = g  # the gradient of the state rank r hands on
        dms[r] = sum(np.outer(g[:, v], states[r][:, v]) for v in range(V))
        g = hs[r] + ms[r].T @ g
    return dms, des


def cases():
    def untransposed(ms, hs):  # M instead of M^T
        return state_gradients(np.swapaxes(ms, 1, 2), hs)

    def by_autodiff(ms, hs):  # right, but jax.grad does the derivation: refused
        import jax

        def loss(nudges):  # nudge every entering state; L = sum_r <hs[r], S[r]>
            total, s = 0.0, jnp.zeros(hs.shape[1:])
            for r in range(len(ms)):
                s = s + nudges[r]
                total = total + jnp.sum(hs[r] * s)
                s = ms[r] @ s
            return total

        return jax.grad(loss)(jnp.zeros(hs.shape))

    def transposed_dm(ms, es, hs):
        dms, des = summary_cotangents(ms, es, hs)
        return np.swapaxes(dms, 1, 2), des

    def leaving_state(ms, es, hs):  # S[r + 1] in place of S[r]
        dms, des = summary_cotangents(ms, es, hs)
        s, out = np.zeros(np.shape(es)[1:]), []
        for m, e in zip(ms, es, strict=True):
            s = m @ s + e
            out.append(s)
        return np.einsum("riv,rjv->rij", des, np.stack(out)), des

    return [
        ("05.1", state_gradients, {}, untransposed),
        ("05.1", state_gradients_jnp, {}, by_autodiff),
        ("05.2", summary_cotangents, {}, transposed_dm),
        ("05.2", summary_cotangents_loop, {}, leaving_state),
    ]
