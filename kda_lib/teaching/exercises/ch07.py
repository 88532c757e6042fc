"""Checkers of notebook 07's exercises (a grouped-value-head cache, a two-piece prefill, the
crossover with everything counted)."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


def _cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes):
    """A KDA layer's decode cache with grouped value heads: float32 states B HV K V, and for
    conv_size >= 1 the q, k (H K each) and v (HV V) conv histories of conv_size - 1 rows, in
    numbers of ``conv_bytes`` bytes."""
    conv = batch * max(conv_size - 1, 0) * (2 * num_heads * key_dim + num_v_heads * value_dim)
    return 4 * batch * num_v_heads * key_dim * value_dim + conv_bytes * conv


_LAYERS = [  # (B, H, HV, K, V, w, conv bytes): HV = H and HV > H, conv_size 0, 1, 2, 4
    (1, 2, 4, 32, 32, 0, 2), (3, 2, 2, 8, 16, 4, 4), (2, 1, 4, 16, 8, 4, 2), (1, 1, 2, 8, 8, 1, 2),
    (5, 3, 6, 4, 12, 2, 2), (2, 2, 8, 16, 32, 3, 4),
]


@checker("07.1")
def layer_cache_bytes(answer, **_):
    """``answer(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size, conv_bytes) ->
    int``: the bytes of a grouped-value-head KDA layer's decode cache, float32 states and conv
    histories of ``conv_bytes`` bytes a number, tried on layers of the checker's own."""
    for case in _LAYERS:
        got, hint = call_own_work(answer, *case, name="cache_bytes(B, H, HV, K, V, w, conv_bytes)")
        hint = hint or refuse_degenerate(got, shape=(), what=f"bytes for {case}")
        if hint:
            return hint
        if float(got) != round(float(got)):
            return f"bytes for {case} should be a whole number"
        want = _cache_bytes(*case)
        if int(round(float(got))) == want:
            continue
        b, h, hv, k, v, w, cb = case
        if int(round(float(got))) == 4 * (b * h * k * v + b * max(w - 1, 0) * h * (2 * k + v)):
            return f"wrong for {case}: that is section 3's layout (HV = H, all float32)"
        if w == 0:
            return f"wrong for {case}: with conv_size=0 there is no conv history at all"
        if w == 1:
            return f"wrong for {case}: a width-1 conv keeps no earlier rows"
        return f"wrong for {case}: which tensors have H heads, which HV, and in which dtype?"
    return None


def _watched(layer):
    """``(proxy, calls)``: ``proxy`` calls ``layer`` (``init_cache`` and ``__call__`` only) and
    records in ``calls`` each call's ``(start, length, outputs)``: ``start`` is the position the
    call resumes at (the tokens behind the cache it was given, when that cache equals, a copy
    counts, one an earlier call returned; 0 for any other cache), ``outputs`` what it returned."""
    import jax

    calls, returned = [], []  # returned: (cache, tokens behind it)

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
            start = next((n for c, n in returned if cache is not None and same(cache, c)), 0)
            out = layer(x, cache=cache, **kwargs)
            length = int(np.shape(x)[1])
            y = out[0] if isinstance(out, tuple) else out
            calls.append((start, length, np.asarray(y)))
            if isinstance(out, tuple):
                returned.append((out[1], start + length))
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
    returned. Tried on layers, prompts and splits of the checker's own. The answer must return
    the outputs of a call of the watched layer that resumed at ``split`` (a call that sees the
    whole prompt, no resumed cache, or outputs computed elsewhere are refused); the reference
    is computed after the answer has run, so nothing can close over it."""
    for seed, length, split in ((0, 11, 4), (1, 9, 8), (2, 12, 1)):
        layer, x = _layer_and_input(seed, length)
        watched, calls = _watched(layer)
        got, hint = call_answer(answer, watched, x, split, name="second_piece(layer, x, split)")
        shape = (x.shape[0], length - split, x.shape[2])
        hint = hint or refuse_degenerate(
            got, shape=shape, inputs=(np.asarray(x)[:, split:],), what="the outputs"
        )
        if hint:
            return hint
        if any(n > max(split, length - split) for _, n, _ in calls):
            return "a call saw more than one piece: prefill in two calls, not the whole prompt"
        if not any(start == split for start, _, _ in calls):
            return "no call started from the cache of the first split tokens"
        got = np.asarray(got)
        if not any(start == split and n == length - split and np.array_equal(y, got)
                   for start, n, y in calls):
            return "return the outputs of the second call itself (the one resumed at split)"
        want = np.asarray(layer(x))[:, split:]
        err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
        if not err < 1e-5:
            return "the second call must start from the cache the first one returned"
    return None


def _t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes):
    kda = 2 * state_bytes * heads * (key_dim * value_dim
                                     + max(conv_size - 1, 0) * (2 * key_dim + value_dim))
    return max(1, math.ceil(kda / (kv_numbers * cache_bytes)) - 2)


_CASES = [  # (heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes)
    (16, 128, 128, 4, 4096, 4, 4),
    (16, 128, 128, 4, 1024, 4, 2),
    (32, 128, 128, 4, 576, 4, 2),
    (8, 64, 128, 0, 192, 2, 2),
    (2, 32, 32, 2, 96, 4, 2),
    (32, 128, 64, 3, 4000, 4, 2),
]


@checker("07.3")
def decode_crossover(answer, **_):
    """``answer(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, cache_bytes)``:
    the smallest whole context T >= 1 at which an attention decode step (write the new entry,
    read all T + 1) moves at least the bytes of a KDA step (state and conv histories, in the
    state's dtype, read and written)."""
    for case in _CASES:
        got, hint = call_own_work(answer, *case, name="t_star(...)")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what=f"T for {case}")
        if hint:
            return hint
        want = _t_star(*case)
        if int(got) == want:
            continue
        h, k, v, w, n, bs, bc = case
        if int(got) == math.ceil(2 * h * k * v * bs / (n * bc)):
            return (f"wrong for {case}: that is section 5's T*_step; put back the conv "
                    "histories and the new entry")
        if np.isclose(float(got), want / 2, atol=2):
            return f"off by a factor of 2 for {case}: the KDA cache is read and written back"
        return f"wrong for arguments {case}; count both steps' bytes; is it the smallest whole T?"
    return None
