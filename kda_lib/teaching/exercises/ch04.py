"""Checkers of notebook 04: 04.1 the conv's ring-buffer decode step, 04.2 the RMSNorm's backward."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching import exercises as ex

AUTODIFF = {p: "your answer runs JAX's autodiff (jax.grad, jax.vjp, jet, ...), which would do "
               "the derivation: write the gradient yourself (NumPy or jnp)"
            for p in ("jax._src.interpreters.ad", "jax.experimental.jet", "jax.experimental.ode")}
TIME_LIMIT_S = 5.0
_far = lambda answer, expected, rtol=1e-4: not ex.close(answer, expected, rtol, floor=1e-3)


def _far_rows(answer, expected, rtol: float) -> bool:
    """Some row of ``answer [rows, V]`` off by over ``rtol`` of that row's largest |expected|."""
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    scale = np.maximum(np.abs(expected).max(axis=-1), 1e-3)
    return not bool(np.all(np.abs(answer - expected).max(axis=-1) <= rtol * scale))


@ex.checker("04.1")
def conv_ring_step(answer, rng):
    """``answer(ring [B, w-1, C], start, xi_t [B, C], kernel [w, C]) -> (ring, start, conv_t)``:
    ``ring[:, (start + j) % (w - 1)]`` holds ``xi_{t-(w-1)+j}`` (tap ``kernel[j]``); w = 2 to 5."""
    name = "conv_step(ring, start, xi_t, kernel)"
    for width in (2, 3, 4, 5):
        B, C = (int(n) for n in rng.integers(1, 5, 2))
        history = list(rng.standard_normal((width - 1, B, C)).astype(np.float32))  # oldest first
        start = int(rng.integers(width - 1))
        ring = np.stack(np.roll(np.stack(history), start, axis=0), axis=1)  # slot start: oldest
        kernel = rng.standard_normal((width, C)).astype(np.float32)
        for step in range(5):
            xi_t = rng.standard_normal((B, C)).astype(np.float32)
            got, hint = ex.call_answer(answer, ring.copy(), start, xi_t.copy(), kernel, name=name)
            hint = hint or ex.parts(got, "the triple (ring, start, conv_t)", dict(
                shape=ring.shape, inputs=(xi_t,), what="ring"), dict(
                shape=(), what="start", integer=True, allow_zeros=True), dict(
                shape=xi_t.shape, inputs=(xi_t,), what="conv_t"))
            if hint:
                return hint
            where = f" (w = {width}, step {step + 1})"
            window = np.stack([*history, xi_t]).astype(np.float64)  # oldest first, xi_t last
            if _far(got[2], np.einsum("wbc,wc->bc", window, kernel)):
                slots_in_order = not _far(got[2], np.einsum("wbc,wc->bc", np.concatenate(
                    [np.moveaxis(ring, 1, 0), xi_t[None]]), kernel))
                return ("conv_t is off" + where + (": it is 16-bit; compute in float32 or wider"
                        if np.asarray(got[2]).dtype.itemsize < 4 else ": the ring's rows are not "
                        "oldest first; slot start holds the oldest" if slots_in_order and start else
                        ": kernel row w - 1 meets xi_t, row w - 1 - lag the input lag tokens back"))
            want = np.where(np.arange(width - 1)[None, :, None] == start, xi_t[:, None], ring)
            if _far(got[0], want):
                moved = not _far(np.asarray(got[0])[:, -1], xi_t) and width > 2
                return ("ring is off" + where + (": a ring buffer moves no row; write xi_t over "
                        "the oldest input only" if moved else ": which slot does xi_t replace?"))
            if int(got[1]) != (start + 1) % (width - 1):
                return "start is off" + where + ": after the write, which slot holds the oldest?"
            ring, start, history = want, (start + 1) % (width - 1), [*history[1:], xi_t]


def _norm_trial(rng, rows, width, eps, small):
    """Float32 ``o [rows, V]`` (every third row times ``small``), ``eta``, ``dn``; float64 do."""
    o = rng.standard_normal((rows, width))
    o[::3] *= small
    eta, dn = rng.uniform(0.5, 1.5, width), rng.standard_normal((rows, width))
    r = np.sqrt(np.mean(o**2, axis=-1, keepdims=True) + eps)
    want = eta * dn / r - o * np.sum(eta * dn * o, axis=-1, keepdims=True) / (width * r**3)
    return tuple(a.astype(np.float32) for a in (o, eta, dn)), want


# (rows range, V range, eps, scale of the small rows); the last is wide, under the time limit
_NORM_SIZES = (((4, 9), (6, 12), 1e-5, 1e-3), ((3, 7), (12, 24), 1e-6, 3e-3),
               ((14, 19), (16000, 16500), 1e-5, 1e-3))


@ex.checker("04.2")
def rmsnorm_backward(answer, rng, **_):
    """``answer(o [rows, V], eta [V], dn [rows, V], eps) -> do [rows, V]``: d sum(dn * n) / do for
    ``n = o * eta / sqrt(mean(o^2, -1) + eps)``, without autodiff; sizes drawn at every call."""
    for rows, width, eps, small in _NORM_SIZES:
        rows, width = int(rng.integers(*rows)), int(rng.integers(*width))
        (o, eta, dn), want = _norm_trial(rng, rows, width, eps, small)
        got, hint = ex.call_answer(
            answer, o, eta, dn, eps, name="rmsnorm_backward(o, eta, dn, eps)", refused=AUTODIFF,
            limit_s=TIME_LIMIT_S, slow=f"your function took over {TIME_LIMIT_S:.0f} s on o "
            f"[{rows}, {width}]: the gradient is a few sums per row; an explicit V x V Jacobian "
            "per row (or naive finite differences) is too slow at these sizes",
            refuse=dict(shape=o.shape, inputs=(o, dn), what="do"))
        if hint:
            return hint
        if _far_rows(got, want, rtol=1e-3):
            r = np.sqrt(np.mean(np.square(o, dtype=np.float64), -1, keepdims=True) + eps)
            if not _far_rows(got, eta * dn / r, 1e-3):
                return "that treats the RMS as a constant: it depends on o too"
            return (f"do is off on o [{rows}, {width}] (row by row, each to its own scale): n "
                    "depends on o directly and through the RMS; differentiate both (eps inside "
                    "the square root)")
