"""Checkers of notebook 04's exercises (the KDA layer); hints never contain the answer.

Both ask for a function that the page does not compute, which the checker calls on inputs of
its own and compares with its own float64 NumPy: 04.1 the short convolution's decode step
(a cache of past inputs instead of the whole sequence), 04.2 the per-head RMSNorm's backward
pass. An answer that runs ``kda_lib``, tokamax or fla code is refused, and 04.2 also refuses
JAX's autodiff (which would do the derivation) and, through a time limit on a wide trial,
finite differences.
"""

from __future__ import annotations

import time

import numpy as np

from kda_lib.teaching.exercises import again, call_answer, checker, refuse_degenerate, seeded
from kda_lib.teaching.exercises._routes import modules_entered
from kda_lib.teaching.exercises.ch01 import _time_limit, _TooSlow

_CONV_SIZES = ((2, 5, 4), (1, 3, 2), (3, 4, 3))  # (B, C, w): w = 2 to 4
_TOKENS = 5  # decode steps per size, from a cache of earlier (random) inputs
_AUTODIFF = ("jax._src.interpreters.ad", "jax.experimental.jet", "jax.experimental.ode")
# (N range, V range, eps, scale of the small rows), N and V drawn per call (no table keyed on
# the shapes passes); the last is wide, under the time limit
_NORM_SIZES = (((4, 9), (6, 12), 1e-5, 1e-3), ((3, 7), (12, 24), 1e-6, 3e-3),
               ((14, 19), (16000, 16500), 1e-5, 1e-3))
TIME_LIMIT_S = 5.0


def _far(answer, expected, rtol: float = 1e-4) -> bool:
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    return bool(np.abs(answer - expected).max() > rtol * max(float(np.abs(expected).max()), 1e-3))


def _conv_trial(rng, batch, channels, width):
    """Float32 inputs: a cache ``[B, w - 1, C]`` (the w - 1 inputs before, oldest first), the
    new inputs ``[T, B, C]`` and a kernel ``[w, C]``; and the float64 conv outputs ``[T, B, C]``
    of the whole sequence (cache, then inputs) at the new tokens."""
    cache = rng.standard_normal((batch, width - 1, channels)).astype(np.float32)
    xs = rng.standard_normal((_TOKENS, batch, channels)).astype(np.float32)
    kernel = rng.standard_normal((width, channels)).astype(np.float32)
    seq = np.concatenate([cache.transpose(1, 0, 2), xs]).astype(np.float64)  # [w - 1 + T, B, C]
    want = [sum(kernel[j] * seq[t + j] for j in range(width)) for t in range(_TOKENS)]
    return cache, xs, kernel, np.stack(want)


@checker("04.1")
def conv_decode_step(answer, **_):
    """``answer(cache [B, w-1, C], x_t [B, C], kernel [w, C]) -> (new_cache [B, w-1, C],
    y_t [B, C])``: one decode step of the depthwise causal conv (no SiLU), ``kernel[w - 1]`` on
    the current token, the cache holding the ``w - 1`` inputs before it, oldest first."""
    rng = np.random.default_rng(4)
    name = "conv_step(cache, x_t, kernel)"
    for batch, channels, width in _CONV_SIZES:
        cache, xs, kernel, want = _conv_trial(rng, batch, channels, width)
        for t in range(_TOKENS):
            result, hint = call_answer(answer, cache, xs[t], kernel, name=name, own_code=True)
            if hint:
                return hint
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                return "the function should return the pair (new_cache, y_t)"
            for got, shape, what in zip(result, (cache.shape, xs[t].shape), ("new_cache", "y_t"),
                                        strict=True):  # fmt: skip
                hint = refuse_degenerate(got, shape=shape, inputs=(cache, xs[t]), what=what)
                if hint:
                    return hint
            if _far(result[1], want[t]):
                return (f"y_t is off (w = {width}, step {t + 1}): kernel row w - 1 multiplies the "
                        "current input, row j the input w - 1 - j tokens before it")
            seq = np.concatenate([cache, xs[t][:, None]], axis=1)
            if _far(result[0], seq[:, 1:]):
                return (f"new_cache is off (w = {width}, step {t + 1}): what must the next step "
                        "find there, in which order?")
            cache = np.asarray(result[0], np.float32)
    return None


def _norm_trial(rng, rows, width, eps, small):
    """``o [N, V]`` (every third row scaled by ``small``: its mean square near ``eps``),
    ``eta [V]`` (not 1: the Jacobian is then not symmetric), ``dy [N, V]``, float32, and the
    float64 gradient ``do``."""
    o = rng.standard_normal((rows, width))
    o[::3] *= small
    eta, dy = rng.uniform(0.5, 1.5, width), rng.standard_normal((rows, width))
    r = np.sqrt(np.mean(o**2, axis=-1, keepdims=True) + eps)
    want = eta * dy / r - o * np.sum(eta * dy * o, axis=-1, keepdims=True) / (width * r**3)
    return tuple(a.astype(np.float32) for a in (o, eta, dy)), want


@checker("04.2")
def rmsnorm_backward(answer, *, seed=None, **_):
    """``answer(o [N, V], eta [V], dy [N, V], eps) -> do [N, V]``: the gradient of
    ``sum(dy * y)`` with respect to ``o``, for ``y = o * eta / sqrt(mean(o^2, -1) + eps)`` (each
    row one head and token), without JAX's autodiff; N and V drawn at every call (``seed``
    repeats them)."""
    seed, rng = seeded(seed)
    name = "rmsnorm_backward(o, eta, dy, eps)"
    for rows, width, eps, small in _NORM_SIZES:
        rows, width = int(rng.integers(*rows)), int(rng.integers(*width))
        (o, eta, dy), want = _norm_trial(rng, rows, width, eps, small)
        start = time.monotonic()
        try:
            with _time_limit(TIME_LIMIT_S), modules_entered(_AUTODIFF) as autodiff:
                got, hint = call_answer(answer, o, eta, dy, eps, name=name, own_code=True)
        except _TooSlow:
            got, hint = None, "slow"
        if hint == "slow" or (hint is None and time.monotonic() - start > TIME_LIMIT_S):
            return (f"your function took over {TIME_LIMIT_S:.0f} s at N, V = {rows}, {width}: the "
                    "gradient is a few sums per row; finite differences cannot get there"
                    + again(seed))
        if autodiff:
            return ("your answer runs JAX's autodiff (jax.grad, jax.vjp, ...), which would do "
                    "the derivation for you: write the gradient yourself (NumPy or jnp)")
        hint = hint or refuse_degenerate(got, shape=o.shape, inputs=(o, dy), what="do")
        if hint:
            return hint
        if _far(got, want, rtol=1e-3):
            if not _far(got, eta * dy / np.sqrt(np.mean(o**2, -1, keepdims=True) + eps), 1e-3):
                return "that treats the RMS as a constant: it depends on o too" + again(seed)
            return (f"do is off at N, V = {rows}, {width}: y depends on o directly and through "
                    "the RMS; differentiate both (eps inside the square root)" + again(seed))
    return None
