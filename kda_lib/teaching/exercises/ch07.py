"""Checkers of notebook 07's exercises (any layer's cache, a two-piece prefill, the crossover)."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


def _cache_bytes(batch, num_heads, key_dim, value_dim, conv_size) -> int:
    """A KDA layer's decode cache: float32 states B H K V, and for conv_size >= 1 the q, k, v
    conv histories of conv_size - 1 rows (B (w - 1) H (2 K + V) float32 numbers)."""
    conv = batch * max(conv_size - 1, 0) * num_heads * (2 * key_dim + value_dim)
    return 4 * (batch * num_heads * key_dim * value_dim + conv)


_LAYERS = [(1, 2, 32, 32, 0), (3, 2, 8, 16, 4), (2, 4, 16, 8, 0), (1, 1, 8, 8, 1), (5, 3, 4, 12, 2)]


@checker("07.1")
def layer_cache_bytes(answer, **_):
    """``answer(batch, num_heads, key_dim, value_dim, conv_size) -> int``: the bytes of a KDA
    layer's decode cache, tried on layers of the checker's own (K != V, conv_size 0, 1, 2, 4)."""
    for case in _LAYERS:
        got, hint = call_own_work(answer, *case, name="cache_bytes(B, H, K, V, conv_size)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what=f"bytes for {case}")
        if hint:
            return hint
        want = _cache_bytes(*case)
        if int(got) == want:
            continue
        if case[-1] == 0:
            return f"wrong for {case}: with conv_size=0 there is no conv history at all"
        if case[-1] == 1:
            return f"wrong for {case}: a width-1 conv keeps no earlier rows"
        return f"wrong for {case}: count q and k (K each) and v (V) per head, 4 bytes a number"
    return None


def _watched(layer):
    """``(proxy, calls)``: ``proxy`` calls ``layer`` (``init_cache`` and ``__call__`` only; the
    layer itself is not an attribute of it) and records in ``calls`` each call's length and
    whether its cache equals one a previous call returned (a copy counts)."""
    import jax

    calls, returned = [], []

    def same(a, b):
        left, right = jax.tree.leaves(a), jax.tree.leaves(b)
        return len(left) == len(right) and all(
            np.shape(u) == np.shape(w) and np.array_equal(np.asarray(u), np.asarray(w))
            for u, w in zip(left, right, strict=True)
        )

    class Watched:
        def init_cache(self, *args, **kwargs):
            return layer.init_cache(*args, **kwargs)

        def __call__(self, x, cache=None, **kwargs):
            resumed = cache is not None and any(same(cache, c) for c in returned)
            calls.append((int(np.shape(x)[1]), resumed))
            out = layer(x, cache=cache, **kwargs)
            if isinstance(out, tuple):
                returned.append(out[1])
            return out

    return Watched(), calls


def _layer_and_input(seed: int, length: int):
    import jax
    from flax import nnx

    import kda_lib

    config = kda_lib.KDAConfig(
        hidden_size=16, num_heads=2, head_dim=8, conv_size=3, implementation="recurrent"
    )
    layer = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(seed))
    return layer, jax.random.normal(jax.random.key(seed), (2, length, 16))


@checker("07.2")
def second_piece(answer, **_):
    """``answer(layer, x_prompt, split) -> y``: the outputs of positions ``split`` on, computed
    by a second call that starts from the cache the first call (positions before ``split``)
    returned. Tried on layers, prompts and splits of the checker's own; a call that sees the
    whole prompt, or no resumed cache, is refused."""
    for seed, length, split in ((0, 11, 4), (1, 9, 8), (2, 12, 1)):
        layer, x = _layer_and_input(seed, length)
        want = np.asarray(layer(x))[:, split:]
        watched, calls = _watched(layer)
        got, hint = call_answer(answer, watched, x, split, name="second_piece(layer, x, split)")
        hint = hint or refuse_degenerate(
            got, shape=want.shape, inputs=(np.asarray(x)[:, split:],), what="the outputs"
        )
        if hint:
            return hint
        if any(n > max(split, length - split) for n, _ in calls):
            return "a call saw more than one piece: prefill in two calls, not the whole prompt"
        if not any(resumed for _, resumed in calls):
            return "no call started from the cache an earlier call returned"
        err = np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)
        if not err < 1e-5:
            return "the second call must start from the cache the first one returned"
    return None


def _t_star(heads, key_dim, value_dim, kv_numbers, state_bytes, cache_bytes) -> int:
    return math.ceil(2 * heads * key_dim * value_dim * state_bytes / (kv_numbers * cache_bytes))


_CASES = [  # (heads, key_dim, value_dim, kv_numbers, state_bytes, cache_bytes)
    (16, 128, 128, 4096, 4, 4),
    (16, 128, 128, 1024, 4, 2),
    (16, 128, 128, 576, 4, 2),
    (8, 64, 128, 192, 2, 2),
    (2, 32, 32, 96, 4, 2),
    (32, 128, 64, 4000, 4, 2),
]


@checker("07.3")
def decode_crossover(answer, **_):
    """A function giving the smallest context at which an attention decode step moves at least
    the bytes of a KDA step (state read and written)."""
    for case in _CASES:
        got, hint = call_own_work(answer, *case, name="t_star(...)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what=f"T for {case}")
        if hint:
            return hint
        want = _t_star(*case)
        if got != want:
            if got is not None and np.isclose(float(got), want / 2, atol=1):
                return f"off by a factor of 2 for {case}: the state is read and written back"
            return f"wrong for arguments {case}; is it the smallest whole T?"
    return None
