"""Linear attention with one scalar decay per head and no delta rule (Mamba2's SSD form).

Per head, with state ``S [K, V]``::

    S = exp(g_t) * S + outer(k_t, v_t)      # scalar forget gate, plain (additive) write
    o_t = (scale * q_t) @ S                 # read after write

Mamba2's with ``k`` as B, ``q`` as C, ``v`` as x, ``g = -A dt``. ``q, k [B, T, H, K]``, ``v [B,
T, H, V]``, ``g [B, T, H]`` (<= 0), state ``[B, H, K, V]``, ``scale`` default ``K ** -0.5``;
both forms return ``(o [B, T, H, V] in v's dtype, final_state)`` (float32, float64 for float64).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _prepared(q, k, v, g, scale, initial_state):
    """``(q * scale, k, v, g, S0)`` in the compute dtype."""
    dtype = jnp.promote_types(jnp.result_type(q, k, v, g), jnp.float32)
    if initial_state is None:
        batch, _, heads, key_dim = q.shape
        initial_state = jnp.zeros((batch, heads, key_dim, v.shape[-1]), dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, g, initial_state = (x.astype(dtype) for x in (q, k, v, g, initial_state))
    return q * scale, k, v, g, initial_state


def scalar_decay_recurrent(q, k, v, g, *, scale=None, initial_state=None, resets=None):
    """One token at a time (the oracle); ``resets [B, T]`` bool (optional): at a True token the
    carried state is dropped before the token writes (a new document starts there)."""
    out_dtype = v.dtype
    q, k, v, g, state = _prepared(q, k, v, g, scale, initial_state)
    resets = jnp.zeros(q.shape[:2], bool) if resets is None else resets

    def step(s, inputs):
        q_t, k_t, v_t, g_t, r_t = inputs
        carried = jnp.where(r_t[:, None, None, None], 0.0, jnp.exp(g_t)[..., None, None] * s)
        s = carried + k_t[..., :, None] * v_t[..., None, :]
        return s, jnp.einsum("bhk,bhkv->bhv", q_t, s)

    time_first = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, resets)]
    state, o = jax.lax.scan(step, state, time_first)
    return jnp.moveaxis(o, 0, 1).astype(out_dtype), state


def scalar_decay_chunked(q, k, v, g, *, scale=None, initial_state=None, chunk_size=64):
    """In chunks: masked, decayed ``(q k^T) v`` inside a chunk, the state passed between."""
    out_dtype = v.dtype
    q, k, v, g, state = _prepared(q, k, v, g, scale, initial_state)
    batch, seq_len, heads, _ = q.shape
    size = min(chunk_size, seq_len)

    def split(x):  # [B, T, ...] -> [B, N, C, ...], T padded with zeros
        x = jnp.pad(x, [(0, 0), (0, -seq_len % size)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(batch, -1, size, *x.shape[2:])

    q, k, v, g = (split(x) for x in (q, k, v, g))
    cum = jnp.cumsum(g, axis=2)  # [B, N, C, H]: log decay from the chunk's start
    causal = jnp.tril(jnp.ones((size, size), bool))[None, None, :, :, None]
    gap = jnp.where(causal, cum[:, :, :, None] - cum[:, :, None], 0.0)  # [B, N, i, j, H]
    decay = jnp.where(causal, jnp.exp(gap), 0.0)
    scores = jnp.einsum("bnihk,bnjhk->bnijh", q, k) * decay
    o_intra = jnp.einsum("bnijh,bnjhv->bnihv", scores, v)
    to_end = jnp.exp(cum[:, :, -1:] - cum)  # [B, N, C, H]: decay from token j to the chunk end
    writes = jnp.einsum("bnjh,bnjhk,bnjhv->bnhkv", to_end, k, v)
    through = jnp.exp(cum[:, :, -1])  # [B, N, H]: the decay across a whole chunk

    def carry(s, chunk):
        write, across = chunk
        return across[..., None, None] * s + write, s  # emits the state before the chunk

    chunks = (jnp.moveaxis(writes, 1, 0), jnp.moveaxis(through, 1, 0))
    final, before = jax.lax.scan(carry, state, chunks)
    before = jnp.moveaxis(before, 0, 1)  # [B, N, H, K, V]
    o_inter = jnp.exp(cum)[..., None] * jnp.einsum("bnihk,bnhkv->bnihv", q, before)
    o = (o_intra + o_inter).reshape(batch, -1, heads, o_intra.shape[-1])[:, :seq_len]
    return o.astype(out_dtype), final
