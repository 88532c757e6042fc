"""Notebook 04's checkers: 04.1/b a gate input for a half-life, 04.2 a backward, 04.3 a cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.gating import kda_gate
from kda_lib.teaching import exercises as ex

AUTODIFF = {p: "your answer runs JAX's autodiff (jax.grad, jax.vjp, jet, ...), which would do "
               "the derivation: write the gradient yourself (NumPy or jnp)"
            for p in ("jax._src.interpreters.ad", "jax.experimental.jet", "jax.experimental.ode")}
TIME_LIMIT_S = 5.0
LN2 = float(np.log(2.0))
_softplus_inverse = lambda y: np.log(np.expm1(y))
# 04.1's slips: the f each gives from (half-life t, A_log, dt_bias b), and its hint
_GATE_SLIPS = (
    (lambda t, a, b: _softplus_inverse(1 / (np.exp(a) * t)) - b, "half is kept where e^(g t) = "
     "1/2, -g = ln 2 / t (1 / t keeps 1/e: a time constant; log base 2 of 2 is 1, not ln 2)"),
    (lambda t, a, b: _softplus_inverse(np.log10(2) / (np.exp(a) * t)) - b,
     "the decay is e^g: solve e^(g t) = 1/2 with the natural log"),
    (lambda t, a, b: LN2 / (np.exp(a) * t) - b, "f + dt_bias goes through softplus before "
     "e^A_log scales it: invert softplus(x) = log(1 + e^x)"),
    (lambda t, a, b: np.log(LN2 / (np.exp(a) * t)) - b, "softplus(x) = log(1 + e^x) is e^x "
     "only for x << 0 (long half-lives): invert it exactly"),
    (lambda t, a, b: _softplus_inverse(LN2 / (a * t)) - b, "A_log stores log a_h: the rate is "
     "e^A_log"),
    (lambda t, a, b: _softplus_inverse(LN2 / t) - b, "the rate a_h = e^A_log scales softplus"),
    *((lambda t, a, b, s=s: _softplus_inverse(LN2 / (np.exp(a) * t)) + s * b, "dt_bias is "
       "added to f inside the softplus: take it off the softplus' argument") for s in (0, 1)),
    (lambda t, a, b: _softplus_inverse(LN2 / np.exp(a)) - b + 0 * t, "that halves in one token "
     "whatever t: t tokens of decay keep e^(g t)"),
    *((lambda t, a, b, n=n: _softplus_inverse(LN2 / (np.exp(a) * (t + n))) - b, "t tokens of "
       "decay, each keeping e^g, keep e^(g t): not t - 1 or t + 1 of them") for n in (-1, 1)),
)


def _half_lives(f, a_log, dt_bias, lower_bound=None):
    """The half-life (tokens) of each channel under ``kda_lib.kda_gate`` in float64."""
    with jax.enable_x64(True):
        g = kda_gate(*(jnp.asarray(x, jnp.float64) for x in (np.asarray(f)[None, None], a_log,
                                                            dt_bias)), lower_bound=lower_bound)
    return LN2 / -np.asarray(g[0, 0], np.float64)


@ex.checker("04.1")
def gate_input_for(answer, rng):
    """``answer(half_life [H, K], a_log [H], dt_bias [H, K]) -> f [H, K]``: the raw input, held,
    at which the softplus gate keeps half after ``half_life`` tokens, to 1e-5 by kda_lib's gate;
    half-lives 3 to 300 tokens, then 0.3 to 3, then 10^3 to 10^4."""
    for low, high in ((3.0, 300.0), (0.3, 3.0), (1e3, 1e4)):
        H, K = (int(n) for n in rng.integers((1, 2), (4, 9)))
        t = np.exp(rng.uniform(np.log(low), np.log(high), (H, K)))
        a_log = np.log(rng.uniform(1, 16, H)).astype(np.float32)  # as init_a_log draws it
        b = rng.uniform(-7, 1, (H, K)).astype(np.float32)  # init_dt_bias's -6.9 .. -2.3, wider
        got, hint = ex.call_answer(answer, t.copy(), a_log.copy(), b.copy(), refuse=dict(
            shape=(H, K), inputs=(t, b), what="f"), name="gate_input_for(t, a_log, dt_bias)")
        if hint:
            return hint
        with np.errstate(all="ignore"):  # a huge f: g = 0, an infinite half-life
            error = np.abs(_half_lives(got, a_log, b) / t - 1)
        if error.max() <= 1e-5:
            continue
        where = f"f is off at half-lives of {low:g} to {high:g} tokens: "
        args = t, a_log.astype(np.float64)[:, None], b.astype(np.float64)
        if slip := ex.slip(got, _GATE_SLIPS, *args):
            return where + slip
        if error.max() < 0.05 and np.all(error[LN2 / (np.exp(args[1]) * t) > 0.05] <= 1e-5):
            return where + ("close, but off where y = softplus(f + dt_bias) is tiny: e^y - 1 "
                            "keeps few digits there in float32 (np.expm1, or float64)")
        return where + "solve e^(g t) = 1/2 for f, g = -e^A_log softplus(f + dt_bias)"


_logit = lambda y: np.log(y) - np.log1p(-y)  # the sigmoid's inverse
# 04.1b's slips: the f each gives from (half-life t, g_min m, A_log a, dt_bias b), and its hint
_SAFE_SLIPS = (
    (lambda t, m, a, b: _logit(LN2 / (-m * t)) - b, "a_h = e^A_log multiplies f + dt_bias in the "
     "sigmoid: divide by it"),
    (lambda t, m, a, b: _logit(LN2 / (-m * t)) / a - b, "A_log stores log a_h: a_h = e^A_log"),
    (lambda t, m, a, b: _logit(LN2 / (-m * t)) / np.exp(a) + b, "dt_bias is added to f inside "
     "the sigmoid: take it off"),
    (lambda t, m, a, b: np.log(LN2 / (-m * t)) / np.exp(a) - b, "sigma(x) = 1 / (1 + e^-x) is "
     "e^x only for x << 0: its inverse is log(y / (1 - y))"),
    (lambda t, m, a, b: _softplus_inverse(LN2 / (np.exp(a) * t)) - b, "that is the softplus "
     "gate's f (1a); the safe gate is g = g_min sigma(a_h (f + dt_bias))"),
)


@ex.checker("04.1b")
def safe_gate_input_for(answer, rng):
    """``answer(half_life [H, K], lower_bound, a_log [H], dt_bias [H, K]) -> f [H, K]``: 04.1 for
    the safe gate, inf where no real f does (t <= ln 2 / |g_min|); a_h <= 0.05 in the second."""
    for m_low, rates, biases in ((0.2, (1, 16), (-7, 1)), (0.05, (0.005, 0.05), (-80, -40)),
                                 (4.0, (0.3, 16), (-7, 1))):
        H, K = (int(n) for n in rng.integers((1, 3), (4, 9)))
        m, out = -float(rng.uniform(m_low, 5.0)), rng.random((H, K)) < 0.25  # out of reach
        out.flat[:3] = True, False, False  # at the bound: (0.95, 1) x out, (1, 1.05], (1.05, 1.5]
        t = LN2 / -m * np.where(out, rng.uniform(0.2, 1, (H, K)), np.exp(rng.uniform(0, 6, (H, K))))
        t.flat[:3] = LN2 / -m * rng.uniform((0.95, 1.001, 1.05), (1, 1.05, 1.5))  # x the bound
        a_log = np.log(rng.uniform(*rates, H)).astype(np.float32)
        b = rng.uniform(*biases, (H, K)).astype(np.float32)
        got, hint = ex.call_answer(answer, t.copy(), m, a_log.copy(), b.copy(), refuse=dict(
            shape=(H, K), inputs=(t, b), what="f", infinite=True),
            name="safe_gate_input_for(half_life, lower_bound, a_log, dt_bias)")
        if hint:  # NaN or -inf only where t is out of reach: +inf there, f's limit at the bound
            band = "NaN" in hint and bool(np.isfinite(np.asarray(got, np.float64))[~out].all())
            return hint + (" (+inf where no real f exists, not NaN or -inf: f -> +inf as t nears "
                           "those half-lives)" * band)
        got, where = np.asarray(got, np.float64), f"f is off at g_min = {m:.3g}: "
        if not np.array_equal(np.isinf(got), out):
            return where + ("inf marks the wrong half-lives: -g = |g_min| sigma(a_h (f + "
                            "dt_bias)) stays below |g_min| at every real f; which half-lives can "
                            "it then not reach? inf exactly there, a real f elsewhere")
        with np.errstate(all="ignore"):
            error = np.abs(_half_lives(np.where(out, 0, got), a_log, b, m) / t - 1)[~out]
        if error.max() <= 1e-5:
            continue
        args = (np.asarray(x, np.float64) for x in (t, m, a_log[:, None] + 0 * b, b))
        return where + (ex.slip(got[~out], _SAFE_SLIPS, *(x[~out] if x.ndim else x for x in args))
                        or "solve e^(g t) = 1/2 for f, g = g_min sigma(a_h (f + dt_bias))")


def _norm_trial(rng, rows, width, eps, small):
    """Float32 ``o [rows, V]`` (every third row times ``small``), ``eta``, ``dn``; float64 do."""
    o = rng.standard_normal((rows, width))
    o[::3] *= small
    eta, dn = rng.uniform(0.5, 1.5, width), rng.standard_normal((rows, width))
    r = np.sqrt(np.mean(o**2, axis=-1, keepdims=True) + eps)
    want = eta * dn / r - o * np.sum(eta * dn * o, axis=-1, keepdims=True) / (width * r**3)
    return tuple(a.astype(np.float32) for a in (o, eta, dn)), want


def _far_rows(answer, expected, rtol: float) -> bool:
    """Some row of ``answer [rows, V]`` off by over ``rtol`` of that row's largest |expected|."""
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    scale = np.maximum(np.abs(expected).max(axis=-1), 1e-3)
    return not bool(np.all(np.abs(answer - expected).max(axis=-1) <= rtol * scale))


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


# 04.3's slips: the count each gives from (d, H, d_k K, d_v V, w), and its hint
_CACHE_SLIPS = (
    (lambda d, H, K, V, w: H * K * V + w * H * (2 * K + V), "a convolution's window holds w "
     "tokens, the new one among them: the cache keeps the w - 1 before it"),
    (lambda d, H, K, V, w: H * K * V + max(w - 1, 0) * 3 * d, "the short convolutions run after "
     "the projections, on the channels of q, k and v (H d_k, H d_k, H d_v), not on x"),
    (lambda d, H, K, V, w: H * K * V + max(w - 1, 0) * d, "one history of x, the projections "
     "recomputed, is a valid design (smaller when d < H(2 d_k + d_v)), but not this layer's: its "
     "caches keep q, k and v after the projections, as its convolutions read them"),
    (lambda d, H, K, V, w: H * K * V, "a decode step brings one token: the short convolutions "
     "need the inputs of the tokens before it too"),
    (lambda d, H, K, V, w: H * K * V + (w - 1) * H * (2 * K + V), "w = 0 means no convolution, "
     "and nothing to keep for it (not a negative count)"),
    (lambda d, H, K, V, w: H * K * K + max(w - 1, 0) * H * (2 * K + V), "the state of a head is "
     "d_k x d_v (keys by values), not d_k x d_k"),
    (lambda d, H, K, V, w: K * V + max(w - 1, 0) * H * (2 * K + V), "every head has its own "
     "state: H of them"),
    (lambda d, H, K, V, w: H * K * V + max(w - 1, 0) * H * (K + V), "q has its own short "
     "convolution too: three of them (q, k, v)"),
)


def _cache_sizes(rng, w, k_not=None):
    """(d, H, d_k, d_v) where the slips wrong at this w differ from each other and 0 (at w >= 2
    only the w = 0 slip is right); d_k != k_not (d_k = w - 1 mimics the d_k x d_k state slip)."""
    while True:
        H, K, V, d = (int(rng.integers(*span)) for span in ((2, 5), (2, 9), (2, 10), (2, 17)))
        right = H * K * V + max(w - 1, 0) * H * (2 * K + V)
        off = [n for n in (wrong(4 * d, H, K, V, w) for wrong, _ in _CACHE_SLIPS) if n != right]
        off += [0] * (K == k_not)  # drawn again
        if 0 not in off and len(set(off)) == len(off) >= (len(_CACHE_SLIPS) - 1) * (w >= 2):
            return 4 * d, H, K, V


@ex.checker("04.3")
def decode_cache_numbers(answer, rng):
    """``answer(d, H, d_k, d_v, w) -> int``: the numbers one layer keeps per sequence between
    decode steps, against ``KimiDeltaAttention.init_cache`` (w from 2 to 6, then 0, then 1)."""
    from flax import nnx

    from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention

    for w in (int(rng.integers(2, 7)), 0, 1):
        d, H, K, V = _cache_sizes(rng, w)
        got, hint = ex.call_answer(answer, d, H, K, V, w, name="decode_cache_numbers(d, H, d_k, "
                                   "d_v, w)", refuse=dict(shape=(), what="the count", integer=True))
        if hint:
            return hint
        config = KDAConfig(hidden_size=d, num_heads=H, head_dim=K, value_head_dim=V, conv_size=w)
        layer = nnx.eval_shape(lambda c=config: KimiDeltaAttention(c, rngs=nnx.Rngs(0)))
        want = sum(int(np.prod(a.shape)) for a in layer.init_cache(1) if a is not None)
        if float(got) == want:
            continue
        where = f"wrong at d = {d}, H = {H}, d_k = {K}, d_v = {V}, w = {w}: "
        more = [_cache_sizes(rng, w, k_not=w - 1) for _ in range(2)]  # a slip: matches thrice
        calls = [ex.call_answer(answer, *m, w, refuse=dict(shape=(), integer=True)) for m in more]
        for wrong, slip in _CACHE_SLIPS:
            if float(got) == wrong(d, H, K, V, w) and all(h is None and float(g) == wrong(
                    *m, w) for (g, h), m in zip(calls, more, strict=True)):
                return where + slip
        return where + ("which parts of section 1 look back past the new token, and how much of "
                        "their past does the layer as built keep? (count per sequence)")
