"""Checkers of notebook 09's exercises, on its hybrid and models and bytes drawn at each call.
Caches float32: a KDA layer's H d_k x d_k states and w - 1 conv rows of 3 H d_k; MLA d_c a token;
MLA's absorbed read against the expanded one."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from kda_lib.teaching import exercises as ex

_NAMES = ("kda_layers", "mla_layers", "heads", "key_dim", "kv_lora_rank", "conv_size")


def _kda_layer(heads, key_dim, conv_size) -> int:  # bytes of one KDA layer's decode cache
    return 4 * (heads * key_dim * key_dim + 3 * max(conv_size - 1, 0) * heads * key_dim)


def _drawn(rng, least=1) -> tuple:
    """A hybrid drawn: (kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size), w >= 1."""
    return (int(rng.integers(least, 8)), int(rng.integers(least, 4)), int(rng.integers(1, 9)),
            int(rng.choice([16, 32, 64, 128])), int(rng.integers(8, 600)), int(rng.integers(1, 6)))


def _half(kda, mla, heads, key_dim, rank, conv, states=True) -> float:
    """The least whole T >= 1 with latents >= the KDA layers' bytes (``states`` False: a slip)."""
    if mla == 0:
        return math.inf
    fixed = kda * (_kda_layer(heads, key_dim, conv) - (0 if states else 4 * heads * key_dim**2))
    return max(1, -(-fixed // (4 * mla * rank)))


@ex.checker("09.1")
def half_context(answer, rng, *, shape: dict):
    """``answer(kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size) -> T``: the least
    whole T >= 1 where MLA latents take at least half the cache (``math.inf`` without MLA); the
    notebook's hybrid, four drawn (one with >= 2 of each layer, one with w = 1), no MLA, no KDA."""
    models = [tuple(int(shape[n]) for n in _NAMES), _drawn(rng), _drawn(rng, 2), _drawn(rng)]
    models += [(*_drawn(rng)[:5], 1), (models[1][0], 0, *models[1][2:]), (0, *models[2][1:])]
    for model in sorted(models, key=lambda m: -_half(*m)):  # largest T first: fewest chance hints
        got, hint = ex.call_answer(answer, *model, name="half_context(kda_layers, ...)",
                                   refuse=dict(shape=(), integer=True, what="T", allow_zeros=True,
                                               infinite=True))
        if hint:
            return hint
        want, where = _half(*model), f"for {dict(zip(_NAMES, model, strict=True))}"
        if got == want:
            continue
        if want == math.inf or got == math.inf:
            return (f"wrong {where}: math.inf only where no context brings the latents level "
                    "(no MLA layer)")
        if int(got) == _half(*model, states=False):
            return f"wrong {where}: a KDA layer keeps its d_k x d_k states too"
        if int(got) in (want - 1, want + 1) or int(got) < 1:
            return (f"off by one {where}: the least whole T >= 1 (at T = 0 nothing is cached) "
                    "where the latents hold at least as many bytes")
        return (f"your T is {'above' if got > want else 'below'} the count {where}: per layer, "
                "what does decoding one more token need (section 5)?")


def _read(q, latents, w_k, w_v) -> tuple:
    """09.2's (q_latent, read, out) in float64 (the drawn scores are of order 1: no overflow)."""
    q_latent = np.einsum("hk,hkc->hc", q, w_k)  # W^K_h^T q_h
    weights = np.exp(q_latent @ latents.T / np.sqrt(q.shape[1]))  # [H, T]
    read = weights / weights.sum(1, keepdims=True) @ latents
    return q_latent, read, np.einsum("hvc,hc->hv", w_v, read)


_READ_HINTS = ("q_latent is each head's query in latent space: q . (W^K_h c) = (W^K_h^T q) . c",
               "read: the latents weighted, per head, by the softmax over the T cached tokens of "
               "q_latent . c_t / sqrt(d_qk)", "out is W^V_h times the head's read")


@ex.checker("09.2")
def absorbed_read(answer, rng, **_):
    """``answer(q, latents, w_k, w_v) -> (q_latent, read, out)``: MLA's decode read with W^K folded
    into the query and W^V into the output ([H, d_c], [H, d_c], [H, d_v]); three drawn shapes of
    2-4 heads and unequal widths, scores of order 1; 1e-4 relative (float32 passes)."""
    for t in rng.integers(3, 40, 3):
        h, (dk, dv, dc) = int(rng.integers(2, 5)), rng.choice(range(2, 17), 3, False).tolist()
        args = [rng.standard_normal(s) / np.sqrt(s[-1] if len(s) > 2 else 1) for s in (
            (h, dk), (t, dc), (h, dk, dc), (h, dv, dc))]
        got, hint = ex.call_answer(answer, *(a.copy() for a in args),
                                   name="absorbed_read(q, latents, w_k, w_v)")
        if hint or (hint := ex.parts(got, "(q_latent, read, out)", *(dict(
                shape=(h, n), what=w) for n, w in ((dc, "q_latent"), (dc, "read"), (dv, "out"))))):
            return hint
        for g, w, text in zip(got, _read(*args), _READ_HINTS, strict=True):
            if not ex.close(g, w, 1e-4):
                return f"{text} (H = {h}, d_qk = {dk}, d_v = {dv}, d_c = {dc}, T = {t})"


def _bound(data, k, log=np.log2, smoothing=0.0, start=None) -> float:
    """Bits per byte of ``data[k:]``, ``data``'s own frequencies after ``k`` bytes (or a slip's)."""
    data = bytes(np.asarray(data, np.uint8))
    start = k if start is None else start
    pairs = Counter((data[max(0, t - k):t], data[t]) for t in range(start, len(data)))
    contexts = Counter(data[max(0, t - k):t] for t in range(start, len(data)))
    bits = sum(n * -log((n + smoothing) / (contexts[c] + 256 * smoothing))
               for (c, _), n in pairs.items())
    return float(bits / sum(pairs.values()))


def _strings(rng) -> list:
    """(uint8 string, k): a 12-byte Markov chain, a text, noise, 3 bytes drawn alike (k = 4-6)."""
    symbols = rng.choice(256, 12, replace=False)
    steps, state, chain = rng.dirichlet(np.full(12, 0.3), size=12), 0, []
    for _ in range(int(rng.integers(1500, 2500))):
        state = rng.choice(12, p=steps[state])
        chain.append(symbols[state])
    text = np.frombuffer(b"def f(x):\n    return x + 1\n" * 30 + bytes(range(200, 256)), np.uint8)
    noise = rng.integers(0, 256, int(rng.integers(300, 600))).astype(np.uint8)
    three = symbols[rng.integers(0, 3, int(rng.integers(2500, 3500)))].astype(np.uint8)  # bound > 1
    return [(np.asarray(chain, np.uint8), int(rng.integers(1, 4))), (text, int(rng.integers(1, 5))),
            (noise, 1), (text, 0), (noise, int(rng.integers(3, 6))),
            (three, int(rng.integers(4, 7)))]


# 09.3's tolerance: float32 entropies (numpy, jnp) land within 2.0e-5 relative at seeds 0-199; the
# nearest slip (data scored from 0, not k) 4.0e-4 away; absolute below 1 bit (a bound of 0)
BOUND_RTOL = 1e-4


@ex.checker("09.3")
def context_bound(answer, rng):
    """``answer(data, order) -> float`` (``k`` here; the page's ``order``, k being NOTATION's keys):
    bits per byte of ``data[k:]`` under its own frequencies after ``k`` bytes; no kda_lib."""
    for data, k in _strings(rng):
        got, hint = ex.call_answer(answer, data.copy(), k, name="context_bound(data, order)",
            refuse=dict(shape=(), allow_zeros=(want := _bound(data, k)) == 0, what="bits per byte"))
        if hint:
            return hint
        if ex.close(got, want, BOUND_RTOL, floor=1.0):
            continue
        slips = {"bits, not nats: log base 2": _bound(data, k, log=np.log), "unsmoothed: the "
                 "bound uses the string's own frequencies": _bound(data, k, smoothing=1.0),
                 "score only the bytes that have order bytes before them, data[order:]": _bound(
                     data, k, start=0), "condition on the order bytes before": _bound(data, 0)}
        text = next((t for t, v in slips.items() if k and ex.close(got, v, BOUND_RTOL, 1.0)),
                    "count the (order bytes, next byte) pairs of data[order:], then their contexts "
                    "(packed into one number, order + 1 bytes need 8 (order + 1)"
                    " bits: no uint8 or int32)" if got >= 0 else "bits per byte are never negative")
        return f"wrong on a {data.size}-byte string at order = {k}: {text}"
