"""Worked solutions of notebook 09's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np


def _kda_layer_bytes(heads, key_dim, conv_size) -> int:
    """A KDA layer's decode cache: H float32 states d_k x d_v (d_v = d_k) and the last w - 1
    inputs of its q, k and v convolutions, 3 H d_k numbers a row (none when w <= 1)."""
    return 4 * (heads * key_dim * key_dim + 3 * max(conv_size - 1, 0) * heads * key_dim)


def half_context(kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size):
    """1: the KDA layers' bytes do not grow with context; the MLA layers' grow by 4 d_c bytes
    each per token. The latents hold at least half when ``T 4 g d_c >= L_kda kda_layer``:
    ``T = ceil(L_kda kda_layer / (4 g d_c))``, at least 1 (at T = 0 nothing is cached), and
    ``math.inf`` with no MLA layer."""
    if mla_layers == 0:
        return math.inf
    fixed = kda_layers * _kda_layer_bytes(heads, key_dim, conv_size)
    return max(1, -(-fixed // (4 * mla_layers * kv_lora_rank)))


def half_context_float(kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size):
    """1, written differently: the ratio in floats, rounded up (exact here: the counts are far
    below 2^53)."""
    if not mla_layers:
        return math.inf
    state = heads * key_dim * (key_dim + 3 * max(conv_size - 1, 0))
    return max(1, math.ceil(kda_layers * state / (mla_layers * kv_lora_rank)))


def absorbed_read(q, latents, w_k, w_v):
    """2: the score of head h at token t is q_h . k_{t,h} = q_h . (W^K_h c_t) = (W^K_h^T q_h) . c_t,
    so the query moves into latent space once, ``q_latent`` (d_qk d_c multiply-adds a head), and
    scores the cached latents directly. The output is sum_t a_t v_{t,h} = W^V_h (sum_t a_t c_t):
    the softmax weights the latents, ``read``, and W^V_h maps that one vector. No key or value
    is formed.

    Explain why (model answer): at context T the expanded read forms T keys and T values, T d_c
    (d_qk + d_v) multiply-adds a head, then scores and weights them, T (d_qk + d_v); the absorbed
    read pays d_c (d_qk + d_v) once and 2 T d_c for the scores and the weighted sum. The term in
    T shrinks from about d_c (d_qk + d_v) to 2 d_c a head, a factor (d_qk + d_v) / 2: decoding
    reads only the latents."""
    q_latent = np.einsum("hk,hkc->hc", q, w_k)
    scores = q_latent @ np.asarray(latents).T / math.sqrt(q.shape[1])
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    read = (weights / weights.sum(axis=1, keepdims=True)) @ latents
    return q_latent, read, np.einsum("hvc,hc->hv", w_v, read)


def absorbed_read_jnp(q, latents, w_k, w_v):
    """2, written differently: jnp in float32, a loop over heads, jax.nn.softmax."""
    import jax
    import jax.numpy as jnp

    parts = []
    for h in range(len(q)):
        q_latent = jnp.asarray(w_k[h], jnp.float32).T @ jnp.asarray(q[h], jnp.float32)
        weights = jax.nn.softmax(jnp.asarray(latents, jnp.float32) @ q_latent / len(q[h]) ** 0.5)
        read = weights @ jnp.asarray(latents, jnp.float32)
        parts.append((q_latent, read, jnp.asarray(w_v[h], jnp.float32) @ read))
    return tuple(jnp.stack(p) for p in zip(*parts, strict=True))


def context_bound(data, order) -> float:
    """3 (``order``, not k: NOTATION gives k to keys): the best prediction of a byte from the
    ``order`` bytes before it, scored on ``data`` itself, is ``data``'s own frequency of that byte
    after that context (Gibbs' inequality, as for ``one_byte_bound``): bits per byte
    ``-sum n(c, x) log2(n(c, x) / n(c)) / N`` over the ``N = len(data) - order`` bytes that have
    ``order`` before them.

    Explain why (model answer): as order grows, fewer contexts repeat; once every context of
    ``order`` bytes occurs once in ``data``, its next byte is certain and the bound is 0. It bounds
    every predictor of a byte from at most ``order`` bytes before it, wherever it was fitted
    (Gibbs' inequality), but not one that sees more bytes; only ``data``'s own frequencies reach
    it, so at large order it is a bound of 0 that says nothing (the recorded runs, fitted
    elsewhere, sit far above 0 at 128 bytes of context). Section 2's one-byte bound is the order =
    1 case, a fair yardstick only because its contexts are few (at most 256 byte values, fewer of
    them in the text) and the frequent ones, which precede nearly every byte, are each seen
    thousands of times."""
    data = bytes(np.asarray(data, np.uint8))
    pairs = Counter((data[t - order:t], data[t]) for t in range(order, len(data)))
    contexts = Counter()
    for (context, _), n in pairs.items():
        contexts[context] += n
    total = sum(pairs.values())
    return -sum(n * math.log2(n / contexts[c]) for (c, _), n in pairs.items()) / total


def context_bound_numpy(data, order) -> float:
    """3, written differently: the contexts and pairs as rows of a sliding window, counted with
    ``np.unique`` (int64: no uint8 overflow); H(next | context) = H(context, next) - H(context),
    in bits per byte scored."""
    data = np.asarray(data, np.int64)
    rows = np.lib.stride_tricks.sliding_window_view(data, order + 1)

    def entropy(x):
        _, counts = np.unique(x, axis=0, return_counts=True)
        p = counts / counts.sum()
        return float(-(p * np.log2(p)).sum())

    return entropy(rows) - (entropy(rows[:, :order]) if order else 0.0)


def cases():
    shape = dict(kda_layers=3, mla_layers=1, heads=2, key_dim=16, kv_lora_rank=16, conv_size=4)

    def conv_rows_left_out(kda, mla, heads, key_dim, rank, conv):  # the states only
        return max(1, -(-kda * 4 * heads * key_dim**2 // (4 * mla * rank))) if mla else math.inf

    def unscaled(q, c, w_k, w_v):  # scores without 1 / sqrt(d_qk)
        return (absorbed_read(q, c, w_k, w_v)[0], *absorbed_read(q * len(q[0]) ** 0.5, c, w_k,
                                                                  w_v)[1:])

    return [
        ("09.1", half_context, dict(shape=shape), conv_rows_left_out),
        ("09.1", half_context_float, dict(shape=shape), lambda *a: half_context(*a) + 1),
        ("09.2", absorbed_read, {}, unscaled),
        ("09.2", absorbed_read_jnp, {}, lambda q, c, w_k, w_v: absorbed_read(q, c, w_k, -w_v)),
        ("09.3", context_bound, {}, lambda data, order: context_bound(data, 0)),
        ("09.3", context_bound_numpy, {}, lambda d, order: context_bound(d, order) * math.log(2)),
    ]
