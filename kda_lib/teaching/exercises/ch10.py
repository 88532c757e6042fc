"""Checkers for notebook 10 (Kimi Linear at scale); worked solutions in
``notebooks/solutions/ch10.py``. 10.1 and 10.3 ask for a function of a model's numbers in a
variant the page does not compute (10.1 the reduction against GQA, 10.3 fp8 and int4 weights),
tried on the notebook's preset (their count checked against :mod:`kda_lib.lab.at_scale`), on
models of the checker's own and on drawn ones (``seed`` repeats a call); so does 10.2, checked
against at_scale's ring and summary bytes. Each returns None (right) or a hint
that does not give the answer away."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from kda_lib.teaching.exercises import again, call_answer, checker, refuse_degenerate, seeded


def _preset(name):
    from kda_lib.models import presets

    return presets.PRESETS[name]


def _is_int(answer) -> bool:
    """A whole number of tokens: a Python, numpy or jax int, a 0-d array of one, or a whole
    float (``np.ceil``'s, ``jnp.ceil``'s)."""
    if np.ndim(answer) != 0:
        return False
    value = answer.item() if hasattr(answer, "item") else answer
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    return isinstance(value, int)


_INT32_MAX = 2**31 - 1


def _wrapped(got, largest) -> str | None:
    """The hint for a wrong count in 32-bit ints whose products pass ``2**31 - 1``."""
    if np.asarray(got).dtype.itemsize <= 4 and np.asarray(got).dtype.kind in "iu" and (
            largest > _INT32_MAX):
        return (f"your count is a 32-bit int (jnp's default) and a product here is {largest:,},"
                " past 2^31 - 1 = 2,147,483,647, where int32 wraps around to a wrong value: "
                "compute in Python ints (or int64)")
    return None


def _first_miss(answer, trials, name, count, largest):
    """Runs ``answer`` on every trial: ``(hint, None)`` at the first one it calls kda_lib, raises,
    is not one whole number of tokens or overflowed int32 (``largest(*args)`` the trial's
    largest product); ``(None, (args, got, count(*args)))`` at the first wrong count;
    ``(None, None)`` when all are right."""
    for args in trials:
        got, hint = call_answer(answer, *args, name=name)
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="T", allow_zeros=True)
        if not hint and not _is_int(got):
            hint = "answer with a whole number of tokens"
        if not hint and int(got) != count(*args):
            hint = _wrapped(got, largest(*args))
        if hint:
            return hint, None
        if int(got) != count(*args):
            return None, (args, int(got), count(*args))
    return None, None


def _drawn(rng, *, params: bool = False) -> tuple:
    """A model drawn at check time (so a table of the fixed trials fails): heads, head_dim,
    conv_size, latent, and with ``params`` the KDA and MLA layers' parameter counts."""
    shape = (int(rng.integers(1, 17)), int(rng.choice([16, 32, 64, 128])),
             int(rng.integers(1, 6)), int(rng.integers(32, 700)))
    if not params:
        return shape
    mla = int(rng.integers(100_000, 5_000_000))
    return (*shape, mla + int(rng.integers(0, 1_000_000)), mla)


def _kda_layer_bytes(heads, head_dim, conv_size, state_bytes=4, cache_bytes=2) -> int:
    """One sequence's KDA cache: a state of H d_k d_v numbers (d_v = d_k), ``state_bytes``
    each, and the conv history, w - 1 rows of the 2 H d_k + H d_v conv channels,
    ``cache_bytes`` each."""
    return (state_bytes * heads * head_dim**2
            + cache_bytes * max(conv_size - 1, 0) * 3 * heads * head_dim)


def _reduction_context(fraction, kda_layers, global_layers, heads, head_dim, conv_size, latent,
                       kv_heads, baseline=None) -> Fraction | float:
    """The T at which ``1 - hybrid / all-GQA`` equals ``fraction`` (exact): ``T (L (1 - f) c_G -
    g c) = k S``, c_G and c the bytes of one token's GQA keys and values and MLA latents, k of
    the L layers KDA, g global, S one KDA cache; ``math.inf`` where no T reaches it (f at or
    above the limit). ``baseline``: c_G replaced (the hints' slips)."""
    kda, layers = _kda_layer_bytes(heads, head_dim, conv_size), kda_layers + global_layers
    gqa = 2 * 2 * kv_heads * head_dim if baseline is None else baseline
    room = (1 - Fraction(fraction)) * layers * gqa - global_layers * 2 * latent
    return Fraction(kda_layers * kda) / room if room > 0 else math.inf


def _reduction_limit(kda_layers, global_layers, head_dim, latent, kv_heads) -> float:
    """The largest reduction, T -> infinity: 1 - g latent / (L 2 G d_k)."""
    return 1 - global_layers * latent / ((kda_layers + global_layers) * 2 * kv_heads * head_dim)


def _preset_shape(p) -> dict:
    """A preset's numbers in the exercises' argument names (checked against at_scale below)."""
    from kda_lib.lab import at_scale

    channels = at_scale.kda_conv_channels(p)
    if p.num_v_heads != p.num_heads or channels != 3 * p.num_heads * p.head_dim:
        raise ValueError(f"{p.name}: the exercises assume H_v = H and d_v = d_k")
    return dict(heads=p.num_heads, head_dim=p.head_dim, conv_size=p.conv_size,
                latent=at_scale.mla_cache_numbers(p))


_OWN_MODELS = [  # (kda_layers, global_layers, heads, head_dim, conv_size, latent, kv_heads)
    (3, 1, 4, 64, 4, 96, 2),
    (5, 2, 8, 32, 2, 200, 8),
    (2, 2, 1, 128, 1, 40, 1),
]
_FRACTIONS = (0.0, 0.25, 0.5, 0.625, 0.875)  # exact in binary; each trial keeps those < limit
# a fraction exactly at its model's limit, 1 - 128 / 1024: no T reaches it (room exactly 0)
_AT_LIMIT_TRIAL = (0.875, 3, 1, 4, 64, 4, 128, 2)


def _fractions(model, first=(), reached=True) -> list[float]:
    """``first`` and _FRACTIONS below ``model``'s limit, or (``reached`` False) at or above it,
    each once, in first-seen order."""
    kda, glob, _, head_dim, _, latent, kv_heads = model
    limit = _reduction_limit(kda, glob, head_dim, latent, kv_heads)
    return [f for f in dict.fromkeys((*first, *_FRACTIONS)) if (f < limit) == reached]


def _drawn_gqa(rng) -> tuple:
    """A hybrid drawn at check time: at least as many KDA as global layers, and latents no
    wider than GQA's keys and values (so a reduction of a half is always reachable)."""
    kda = int(rng.integers(2, 9))
    heads, head_dim, conv_size, _ = _drawn(rng)
    kv_heads = int(rng.choice([g for g in range(1, heads + 1) if heads % g == 0]))
    latent = int(rng.integers(8, 2 * kv_heads * head_dim + 1))
    return kda, int(rng.integers(1, kda + 1)), heads, head_dim, conv_size, latent, kv_heads


@checker("10.1")
def reduction_context(answer, *, preset: str, fraction: float, seed=None):
    """``answer(fraction, kda_layers, global_layers, heads, head_dim, conv_size, latent,
    kv_heads) -> float``: the context T at which the decode memory of one sequence in a hybrid
    (KDA layers: float32 state, d_v = d_k = head_dim, bf16 conv history; global layers: MLA,
    ``latent`` bf16 numbers a token) is ``fraction`` below that of the same depth of GQA layers
    (``kv_heads`` bf16 keys and values of ``head_dim`` a token), 0 <= fraction < 1; ``math.inf``
    where no T reaches it, fraction at or above the limit 1 - global latent / (layers 2
    kv_heads head_dim). Tried on ``preset`` at ``fraction`` and other fractions, with 8, 1 and
    32 key/value heads (with 1, fractions out of reach too), then on models of the checker's
    own, a fraction exactly at a model's limit and one model drawn (``seed`` repeats it);
    kda_lib may not be called."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    shape = _preset_shape(p)
    model = (len(p.kda_layers), len(p.global_layers), *shape.values())
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    t = float(_reduction_context(fraction, *model, 8))
    gqa = p.num_layers * t * at_scale.attention_cache_numbers(8, p.head_dim) * at_scale.BF16
    if t < math.inf and not math.isclose(1 - at_scale.model_cache_bytes(p, t) / gqa, fraction,
                                         abs_tol=1e-12):  # fmt: skip
        raise AssertionError(f"{preset}: the checker's count disagrees with at_scale")
    trials = [(f, *model, g) for g in (8, 1, 32) for f in _fractions((*model, g), (fraction,))[:3]]
    trials += [(f, *model, 1) for f in _fractions((*model, 1), (fraction,), reached=False)[:2]]
    trials += [(f, *m) for m in _OWN_MODELS for f in _fractions(m)[::2]] + [_AT_LIMIT_TRIAL]
    seed, rng = seeded(seed)
    drawn = _drawn_gqa(rng)
    choices = _fractions(drawn)
    trials.append((choices[int(rng.integers(len(choices)))], *drawn))
    trials += [(f, *drawn) for f in _fractions(drawn, reached=False)[:1]]
    hint = _reduction_hint(answer, trials)
    return hint and hint + again(seed)


def _reduction_hint(answer, trials) -> str | None:
    for args in trials:
        got, hint = call_answer(answer, *args, name="reduction_context(fraction, ...)")
        want, (fraction, kda, glob, _, head_dim, _, latent, kv_heads) = (
            float(_reduction_context(*args)), args)
        where = (f"at fraction {fraction} with {kda} KDA and {glob} global layers, {kv_heads} "
                 "key/value heads")
        special = None if hint else _special_float(got)  # None too where the answer failed
        if special in ("NaN", "-math.inf"):
            return (f"{where}, yours is {special}: give T as a positive real number, or math.inf "
                    "where no context reaches the fraction")
        if not hint and want == math.inf:
            if special == "math.inf":
                continue
            return refuse_degenerate(got, shape=(), what="T", allow_zeros=True) or (
                f"{where}, yours is a finite T, yet no context reaches this fraction (the "
                "reduction only nears its limit as T grows): return math.inf there")
        if special == "math.inf":
            return (f"{where}, yours is math.inf, yet a finite T reaches this fraction: "
                    "math.inf only where no context does")
        hint = hint or refuse_degenerate(got, shape=(), what="T", allow_zeros=True)
        if hint:
            return hint
        got = float(got)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        slips = {  # the baseline priced as all-MLA; the global layers priced as GQA (a latent
            # of 2 G d_k numbers a token)
            "yours is against all-MLA (section 6's reduction): the baseline here is GQA, its "
            "keys and values cached": _reduction_context(*args, baseline=2 * latent),
            "your hybrid's global layers cache GQA's keys and values: they are MLA layers, "
            "caching latents": _reduction_context(*args[:6], 2 * kv_heads * head_dim, kv_heads)}
        for words, slip in slips.items():
            if slip > 0 and math.isclose(got, float(slip), rel_tol=1e-6):
                return f"{where}, {words}"
        if fraction and math.isclose(got, float(_reduction_context(0, *args[1:])), rel_tol=1e-6):
            return f"{where}, yours is where the reduction is 0: use fraction"
        if abs(got - want) < 1 and got.is_integer():
            return f"{where}, yours is a whole number of tokens: give T as a real number"
        return (f"{where}, your T is {'above' if got > want else 'below'} the count: the "
                "reduction is 1 - hybrid / all-GQA, the KDA state float32, its conv history, "
                "the latents and GQA's keys and values bf16")
    return None


def _special_float(got) -> str | None:
    """"NaN", "math.inf" or "-math.inf" where ``got`` is one float of that value (a Python, numpy
    or jax float, or a 0-d array of one), else None (bfloat16, dtype kind not "f", included)."""
    try:
        value = np.asarray(got)
    except Exception:  # noqa: BLE001 - a ragged list or the like: not one number
        return None
    if value.shape != () or value.dtype.kind != "f" or np.isfinite(value):
        return None
    return "NaN" if np.isnan(value) else "math.inf" if value > 0 else "-math.inf"


def _ring(ranks, heads, head_dim, conv_size, latent) -> int:
    """The smallest whole T with (R - 1)/R T 2 latent > (R - 1) H d_k (2 d_k) 4 + halo, exact
    in integers: T (R - 1) 2 latent > R (summaries + halo)."""
    return _ring_bytes(ranks, heads, head_dim, conv_size) // (
        (ranks - 1) * 2 * latent) + 1


def _ring_bytes(ranks, heads, head_dim, conv_size) -> int:
    """A rank's summaries (float32) and conv halo (bf16), times R: the count's largest product."""
    return ranks * ((ranks - 1) * heads * head_dim * 2 * head_dim * 4
                    + 2 * max(conv_size - 1, 0) * 3 * heads * head_dim)


@checker("10.2")
def ring_crossover(answer, *, preset: str, ranks: int, seed=None):
    """``answer(ranks, heads, head_dim, conv_size, latent) -> int``: the smallest whole T at
    which ring attention over the MLA latents (``latent`` bf16 numbers per token, (R - 1)/R of
    the sequence) brings each rank more bytes than the KDA summaries (float32, (R - 1) H d_k
    (d_k + d_v), d_v = d_k) plus the conv halo (bf16, (w - 1) 3 H d_k). Tried on ``preset`` at
    ``ranks`` and other rank counts, then on models of the checker's own and one drawn
    (``seed`` repeats it); kda_lib may not be called."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    shape = tuple(_preset_shape(p).values())
    flat = at_scale.cp_summary_bytes(p, ranks) + at_scale.cp_halo_bytes(p)
    t = _ring(ranks, *shape)
    mla = at_scale.mla_cache_numbers(p)
    if not at_scale.ring_attention_bytes(mla, t, ranks) > flat >= at_scale.ring_attention_bytes(
            mla, t - 1, ranks):
        raise AssertionError(f"{preset}: the checker's count disagrees with at_scale")
    seed, rng = seeded(seed)
    trials = [(r, *shape) for r in (ranks, 2, 64)]
    trials += [(r, *m[2:6]) for m in _OWN_MODELS for r in (3, 16)]
    trials.append((int(rng.integers(2, 129)), *_drawn(rng)))
    hint, miss = _first_miss(answer, trials, "ring_crossover(ranks, ...)", _ring,
                             lambda *a: _ring_bytes(*a[:4]))
    if hint or miss is None:
        return hint and hint + again(seed)
    args, got, want = miss
    ranks, largest = args[0], _ring_bytes(*args[:4])
    if got == want - 1:
        return f"at {ranks} ranks your T is one short: ring attention must move more" + again(seed)
    overflow = (f"; a product here, R x (summaries + halo) = {largest:,}, passes 2^31 - 1: in "
                "jnp's int32 it wraps around, so compute in Python ints or int64"
                if largest > _INT32_MAX else "")
    return (
        f"at {ranks} ranks your T is {'above' if got > want else 'below'} the crossing: the "
        "summaries are float32 (4 bytes), the halo and the latents bf16 (2 bytes); each rank "
        "receives (R - 1)/R of the latents" + overflow + again(seed)
    )


def _crossover_bytes(batch, heads, head_dim, conv_size, latent, kda_params, mla_params,
                     weight_bytes) -> Fraction:
    """KDA's bytes less MLA's weights, per step: the numerator of the crossing (exact)."""
    return (Fraction(weight_bytes) * (kda_params - mla_params)
            + batch * 2 * _kda_layer_bytes(heads, head_dim, conv_size))


def _crossover(batch, heads, head_dim, conv_size, latent, *params) -> int:
    excess = _crossover_bytes(batch, heads, head_dim, conv_size, latent, *params)
    return max(1, math.ceil(excess / (batch * 2 * latent)))


_OWN_LAYERS = [  # (heads, head_dim, conv_size, latent, kda_params, mla_params, weight_bytes)
    (4, 64, 4, 96, 900_000, 700_000, 2),
    (8, 32, 2, 200, 3_000_000, 2_900_000, 1),
    (2, 128, 1, 40, 500_000, 450_000, 0.5),
]


def _clamped(rng) -> tuple:
    """A drawn layer whose MLA weights outweigh KDA's by more than the batch's states: the
    formula gives T <= 0 and the answer is T = 1."""
    batch, (heads, head_dim, conv_size, latent), weight_bytes = (
        int(rng.integers(1, 5)), _drawn(rng), float(rng.choice([0.5, 1, 2])))
    kda = int(rng.integers(100_000, 2_000_000))
    state = batch * 2 * _kda_layer_bytes(heads, head_dim, conv_size)
    mla = kda + math.ceil(state / weight_bytes) + int(rng.integers(0, 10**6))
    return batch, heads, head_dim, conv_size, latent, kda, mla, weight_bytes


@checker("10.3")
def decode_crossover(answer, *, preset: str, seed=None):
    """``answer(batch, heads, head_dim, conv_size, latent, kda_params, mla_params,
    weight_bytes) -> int``: the smallest whole T >= 1 at which one MLA layer's decode step of
    ``batch`` sequences moves at least as many bytes as one KDA layer's: each reads its
    weights (``weight_bytes`` per parameter: fp8 1, int4 0.5) once per step, MLA each
    sequence's T bf16 latents, KDA each sequence's state read and written (float32 state,
    bf16 conv history). Tried on ``preset`` with fp8 and int4 weights (never the page's bf16),
    then on layers of the checker's own and two drawn, one where MLA's weights alone outweigh
    KDA's bytes (``seed`` repeats them); kda_lib may not be called."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    shape = tuple(_preset_shape(p).values())
    params = (p.kda_parameter_count(), p.mla_parameter_count())
    want_1 = _crossover(1, *shape, *params, 2)
    library = [at_scale.mla_decode_bytes(p, t) >= at_scale.kda_decode_bytes(p)
               for t in (want_1 - 1, want_1)]
    if library != [False, True]:
        raise AssertionError(f"{preset}: the checker's count disagrees with at_scale")
    trials = [(b, *shape, *params, w) for b, w in ((1, 1), (16, 1), (256, 1), (1, 0.5))]
    trials += [(b, *layer) for layer in _OWN_LAYERS for b in (1, 7)]
    seed, rng = seeded(seed)
    trials += [(int(rng.integers(1, 300)), *_drawn(rng, params=True),
                float(rng.choice([0.5, 1, 2]))), _clamped(rng)]
    hint, miss = _first_miss(answer, trials, "decode_crossover(batch, ...)", _crossover,
                             lambda b, h, d, w, _, kp, mp, wb: 2 * max(kp, mp) + b * 2 * (
                                 _kda_layer_bytes(h, d, w)))
    if hint or miss is None:
        return hint and hint + again(seed)
    (batch, *_, weight_bytes), got, want = miss
    if got == want + 1:
        return (f"at batch {batch} with weight_bytes = {weight_bytes} your T is one too many: MLA "
                "must move at least as many bytes, equal counts" + again(seed))
    if got < 1:
        return ("T is at least 1: where MLA's weights alone outweigh KDA's bytes, the formula "
                "gives T <= 0 and MLA moves more from T = 1 on" + again(seed))
    return (
        f"at batch {batch} with weight_bytes = {weight_bytes} your T is "
        f"{'above' if got > want else 'below'} the crossover: per step the weights are read "
        "once (shared by the batch), the KDA cache (its state and its conv history, as in "
        "section 4) read and written for every sequence, the latents read for every sequence"
        + again(seed)
    )
