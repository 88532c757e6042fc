"""Checkers of notebook 10: what the page does not compute (10.1 against GQA, 10.2 ring attention,
10.3 fp8 and int4 weights), on its preset (as :mod:`kda_lib.lab.at_scale`), own and drawn models."""

from __future__ import annotations

import contextlib
import math
from fractions import Fraction

import numpy as np

from kda_lib.teaching import exercises as ex

_INT32_MAX = 2**31 - 1  # where jnp's default int wraps around


def _preset_model(name) -> tuple:
    """(kda_layers, global_layers, heads, head_dim, conv_size, mla_numbers) of a preset."""
    from kda_lib.lab import at_scale
    from kda_lib.models import presets

    p = presets.PRESETS[name]
    if p.num_v_heads != p.num_heads or at_scale.kda_conv_channels(p) != 3 * p.num_heads * (
            p.head_dim):
        raise ValueError(f"{p.name}: the exercises assume H_v = H and d_v = d_k")
    return (len(p.kda_layers), len(p.global_layers), p.num_heads, p.head_dim, p.conv_size,
            at_scale.mla_cache_numbers(p))


def _tokens_miss(answer, trials, name, count, largest):
    """:func:`first_miss` on whole tokens, float32, int32 slips hinted (``largest``: products)."""
    hint, miss = ex.first_miss(answer, trials, name, count, lambda got, want: int(
        got) == want and got == want, shape=(), integer=True, what="T", allow_zeros=True)
    if miss and int(miss[1]) == count(*miss[0], f32=True):  # whatever dtype it returns
        return (f"your T is {int(miss[1]):,}, the count {miss[2]:,}: the quotient "
                "rounded to float32 (24 bits) is off a whole token here (rare); use ints"), None
    dtype = np.asarray(miss[1]).dtype if miss else None
    if miss and dtype.kind in "iu" and dtype.itemsize <= 4 and largest(*miss[0]) > _INT32_MAX:
        return (f"your count is a 32-bit int (jnp's default) and a product here is "
                f"{largest(*miss[0]):,}, past 2^31 - 1 = 2,147,483,647, where int32 wraps around "
                "to a wrong value: compute in Python ints (or int64)"), None
    return hint, miss and (miss[0], int(miss[1]), miss[2])


def _drawn(rng, *, params: bool = False) -> tuple:
    """Drawn heads, head_dim, conv_size, mla_numbers (``params``: the layers' parameter counts)."""
    shape = (int(rng.integers(1, 17)), int(rng.choice([16, 32, 64, 128])),
             int(rng.integers(1, 6)), int(rng.integers(32, 700)))
    mla = int(rng.integers(100_000, 5_000_000))
    return (*shape, mla + int(rng.integers(0, 1_000_000)), mla) if params else shape


def _kda_layer_bytes(heads, head_dim, conv_size) -> int:
    """One sequence's KDA cache: float32 state H d_k^2, bf16 conv history (w - 1) 3 H d_k."""
    return 4 * heads * head_dim**2 + 2 * max(conv_size - 1, 0) * 3 * heads * head_dim


def _reduction_context(fraction, kda_layers, global_layers, heads, head_dim, conv_size, mla_numbers,
                       kv_heads, baseline=None):
    """T with ``1 - hybrid / all-GQA = fraction`` (exact): ``T (L (1 - f) c_G - g c) = k S`` (c_G,
    c a token's GQA, MLA bytes; S a KDA cache); ``math.inf`` past the limit; ``baseline``: slips."""
    gqa = 2 * 2 * kv_heads * head_dim if baseline is None else baseline
    room = ((1 - Fraction(fraction)) * (kda_layers + global_layers) * gqa
            - global_layers * 2 * mla_numbers)
    kda = kda_layers * _kda_layer_bytes(heads, head_dim, conv_size)
    return Fraction(kda) / room if room > 0 else math.inf


_OWN_MODELS = [  # (kda_layers, global_layers, heads, head_dim, conv_size, mla_numbers, kv_heads)
    (3, 1, 4, 64, 4, 96, 2), (5, 2, 8, 32, 2, 200, 8), (2, 2, 1, 128, 1, 40, 1)]
_FRACTIONS = (0.0, 0.25, 0.5, 0.625, 0.875)  # exact in binary
_AT_LIMIT_TRIAL = (0.875, 3, 1, 4, 64, 4, 128, 2)  # exactly at its limit 1 - 128 / 1024


def _fractions(model, first=(), reached=True) -> list[float]:
    """``first`` and _FRACTIONS below ``model``'s limit (``reached`` False: at or above it)."""
    kda, glob, _, head_dim, _, mla_numbers, kv_heads = model
    limit = 1 - glob * mla_numbers / ((kda + glob) * 2 * kv_heads * head_dim)
    return [f for f in dict.fromkeys((*first, *_FRACTIONS)) if (f < limit) == reached]


def _drawn_gqa(rng) -> tuple:
    """A drawn hybrid, KDA layers no fewer than global ones, latents no wider than GQA's."""
    kda, (heads, head_dim, conv_size, _) = int(rng.integers(2, 9)), _drawn(rng)
    kv_heads = int(rng.choice([g for g in range(1, heads + 1) if heads % g == 0]))
    mla_numbers = int(rng.integers(8, 2 * kv_heads * head_dim + 1))
    return kda, int(rng.integers(1, kda + 1)), heads, head_dim, conv_size, mla_numbers, kv_heads


@ex.checker("10.1")
def reduction_context(answer, rng, *, preset: str, fraction: float):
    """``answer(fraction, kda_layers, global_layers, heads, head_dim, conv_size, mla_numbers,
    kv_heads) -> float``: T where a hybrid's decode memory is ``fraction`` below all-GQA's, else
    ``math.inf``; on ``preset`` (8, 1, 32 kv heads), own models, one at its limit, one drawn."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    model = _preset_model(preset)
    trials = [(f, *model, g) for g in (8, 1, 32) for f in _fractions((*model, g), (fraction,))[:3]]
    trials += [(f, *model, 1) for f in _fractions((*model, 1), (fraction,), reached=False)[:2]]
    trials += [(f, *m) for m in _OWN_MODELS for f in _fractions(m)[::2]] + [_AT_LIMIT_TRIAL]
    choices = _fractions(drawn := _drawn_gqa(rng))
    trials += [(choices[int(rng.integers(len(choices)))], *drawn)]
    trials += [(f, *drawn) for f in _fractions(drawn, reached=False)[:1]]
    return _reduction_hint(answer, trials)


def _special_float(got) -> str | None:
    """"NaN", "math.inf" or "-math.inf" where ``got`` is one such float, else None."""
    with contextlib.suppress(Exception):  # a ragged list or the like: not one number
        value = np.asarray(got)
        if value.shape == () and value.dtype.kind == "f" and not np.isfinite(value):
            return "NaN" if np.isnan(value) else "math.inf" if value > 0 else "-math.inf"


def _reduction_hint(answer, trials) -> str | None:
    for args in trials:
        got, hint = ex.call_answer(answer, *args, name="reduction_context(fraction, ...)")
        if hint:
            return hint
        fraction, kda, glob, _, head_dim, _, mla_numbers, kv_heads = args
        want, special = float(_reduction_context(*args)), _special_float(got)
        where = f"at fraction {fraction}, {kda} KDA + {glob} global layers, {kv_heads} kv heads"
        if special in ("NaN", "-math.inf"):
            return (f"{where}, yours is {special}: give T as a positive real number, or math.inf "
                    "where no context reaches the fraction")
        if want == math.inf and special == "math.inf":
            continue
        if special == "math.inf":
            return (f"{where}, yours is math.inf, yet a finite T reaches this fraction: "
                    "math.inf only where no context does")
        if hint := ex.refuse_degenerate(got, shape=(), what="T", allow_zeros=True):
            return hint
        if want == math.inf:
            return (f"{where}, yours is a finite T, yet no context reaches this fraction (the "
                    "reduction only nears its limit as T grows): return math.inf there")
        got = float(got)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        slips = {  # the baseline priced as all-MLA; the global layers priced as GQA
            "yours is against all-MLA (section 6's reduction): the baseline here is GQA, its "
            "keys and values cached": _reduction_context(*args, baseline=2 * mla_numbers),
            "your hybrid's global layers cache GQA's keys and values: they are MLA layers, "
            "caching latents": _reduction_context(*args[:6], 2 * kv_heads * head_dim, kv_heads),
            "yours is where the reduction is 0: use fraction": _reduction_context(0, *args[1:])}
        for words, slip in slips.items():
            if slip > 0 and math.isclose(got, float(slip), rel_tol=1e-6) and (fraction or (
                    not words.startswith("yours is where"))):
                return f"{where}, {words}"
        if abs(got - want) < 1 and got.is_integer():
            return f"{where}, yours is a whole number of tokens: give T as a real number"
        return (f"{where}, your T is {'above' if got > want else 'below'} the count: the "
                "reduction is 1 - hybrid / all-GQA, the KDA state float32, its conv history, "
                "the latents and GQA's keys and values bf16")


def _ring_bytes(ranks, heads, head_dim, conv_size) -> int:
    """R times a rank's summaries (float32) and conv halo (bf16): the count's largest product."""
    return ranks * ((ranks - 1) * heads * head_dim * 2 * head_dim * 4
                    + 2 * max(conv_size - 1, 0) * 3 * heads * head_dim)


def _ring(ranks, heads, head_dim, conv_size, mla_numbers, f32=False) -> int:
    """The least whole T with T (R - 1) 2 mla_numbers > R (summaries + halo); ``f32``: a slip."""
    num, den = _ring_bytes(ranks, heads, head_dim, conv_size), (ranks - 1) * 2 * mla_numbers
    return int(np.float32(num / den)) + 1 if f32 else num // den + 1


@ex.checker("10.2")
def ring_crossover(answer, rng, *, preset: str, ranks: int):
    """``answer(ranks, heads, head_dim, conv_size, mla_numbers) -> int``: the least whole T where
    ring attention over MLA latents brings a rank more bytes than KDA's summaries and conv halo."""
    shape = _preset_model(preset)[2:]
    trials = [(r, *shape) for r in (ranks, 2, 64)]
    trials += [(r, *m[2:6]) for m in _OWN_MODELS for r in (3, 16)]
    trials.append((int(rng.integers(2, 129)), *_drawn(rng)))
    hint, miss = _tokens_miss(answer, trials, "ring_crossover(ranks, ...)", _ring,
                              lambda *a: _ring_bytes(*a[:4]))
    if hint or miss is None:
        return hint
    args, got, want = miss
    if got == want - 1:
        return f"at {args[0]} ranks your T is one short: ring attention must move more"
    largest = _ring_bytes(*args[:4])
    overflow = (f"; a product here, R x (summaries + halo) = {largest:,}, passes 2^31 - 1: in "
                "jnp's int32 it wraps around, so compute in Python ints or int64"
                if largest > _INT32_MAX else "")
    return (f"at {args[0]} ranks your T is {'above' if got > want else 'below'} the crossing: "
            "each rank receives R - 1 summaries (M, E), H d_k (d_k + d_v) float32 numbers each, "
            "a bf16 halo, and (R - 1)/R of the latents (bf16)" + overflow)


def _crossover(batch, heads, head_dim, conv_size, mla_numbers, kda_params, mla_params,
               weight_bytes, f32=False) -> int:
    """The least whole T >= 1 where MLA's step moves at least KDA's bytes; ``f32``: a slip."""
    excess = (Fraction(weight_bytes) * (kda_params - mla_params)
              + batch * 2 * _kda_layer_bytes(heads, head_dim, conv_size))
    return max(1, math.ceil((np.float32 if f32 else Fraction)(excess / (batch * 2 * mla_numbers))))


_OWN_LAYERS = [  # (heads, head_dim, conv_size, mla_numbers, kda_params, mla_params, weight_bytes)
    (4, 64, 4, 96, 900_000, 700_000, 2), (8, 32, 2, 200, 3_000_000, 2_900_000, 1),
    (2, 128, 1, 40, 500_000, 450_000, 0.5)]


def _clamped(rng) -> tuple:
    """A drawn layer whose MLA weights outweigh KDA's bytes: the formula's T <= 0, T* = 1."""
    batch, (heads, head_dim, conv_size, mla_numbers) = int(rng.integers(1, 5)), _drawn(rng)
    weight_bytes, kda = float(rng.choice([0.5, 1, 2])), int(rng.integers(100_000, 2_000_000))
    state = batch * 2 * _kda_layer_bytes(heads, head_dim, conv_size)
    mla = kda + math.ceil(state / weight_bytes) + int(rng.integers(0, 10**6))
    return batch, heads, head_dim, conv_size, mla_numbers, kda, mla, weight_bytes


@ex.checker("10.3")
def decode_crossover(answer, rng, *, preset: str):
    """``answer(batch, heads, head_dim, conv_size, mla_numbers, kda_params, mla_params,
    weight_bytes) -> int``: the least whole T >= 1 where an MLA decode step of ``batch`` moves at
    least KDA's bytes; on ``preset`` (fp8, int4), own layers, two drawn (one MLA-weight-bound)."""
    from kda_lib.models import presets

    p = presets.PRESETS[preset]
    shape, params = _preset_model(preset)[2:], (p.kda_parameter_count(), p.mla_parameter_count())
    trials = [(b, *shape, *params, w) for b, w in ((1, 1), (16, 1), (256, 1), (1, 0.5))]
    trials += [(b, *layer) for layer in _OWN_LAYERS for b in (1, 7)]
    trials += [(int(rng.integers(1, 300)), *_drawn(rng, params=True),
                float(rng.choice([0.5, 1, 2]))), _clamped(rng)]
    hint, miss = _tokens_miss(answer, trials, "decode_crossover(batch, ...)", _crossover,
                              lambda b, h, d, w, _, kp, mp, wb: 2 * max(kp, mp) + b * 2 * (
                                  _kda_layer_bytes(h, d, w)))
    if hint or miss is None:
        return hint
    (batch, *_, weight_bytes), got, want = miss
    where = f"at batch {batch} with weight_bytes = {weight_bytes}"
    if got == want + 1:
        return f"{where} your T is one too many: MLA must move at least as many bytes, equal counts"
    if got < 1:
        return ("T is at least 1: where MLA's weights alone outweigh KDA's bytes, the formula "
                "gives T <= 0 and MLA moves more from T = 1 on")
    return (f"{where} your T is {'above' if got > want else 'below'} the crossover: per step the "
            "weights are read once (shared by the batch), the KDA cache (its state and its conv "
            "history, as in section 4) read and written for every sequence, the latents read "
            "for every sequence")
