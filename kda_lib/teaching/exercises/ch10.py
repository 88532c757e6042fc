"""Checkers for notebook 10 (Kimi Linear at scale); worked solutions in
``notebooks/solutions/ch10.py``. 10.1 and 10.3 ask for a function of a model's numbers, tried on
the notebook's preset (their count checked against :mod:`kda_lib.lab.at_scale`) and on models
of the checker's own; so does 10.2, whose count is checked against at_scale's ring and
summary bytes. Each returns None (right) or a hint that does not give the answer away."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.teaching.exercises import checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


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


def _first_miss(answer, trials, name, count):
    """Runs ``answer`` on every trial: ``(hint, None)`` at the first one it calls kda_lib, raises
    or is not one whole number of tokens; ``(None, (args, got, count(*args)))`` at the first
    wrong count; ``(None, None)`` when all are right."""
    for args in trials:
        got, hint = call_own_work(answer, *args, name=name)
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="T")
        if not hint and not _is_int(got):
            hint = "answer with a whole number of tokens"
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


def _kda_layer_bytes(heads, head_dim, conv_size) -> int:
    """One sequence's KDA cache: float32 state H d_k d_v (d_v = d_k) and bf16 conv history of
    w - 1 rows of the 2 H d_k + H d_v conv channels."""
    return 4 * heads * head_dim**2 + 2 * max(conv_size - 1, 0) * 3 * heads * head_dim


def _reduction(context, kda_layers, global_layers, heads, head_dim, conv_size, latent) -> float:
    hybrid = kda_layers * _kda_layer_bytes(heads, head_dim, conv_size) + (
        global_layers * context * 2 * latent
    )
    return 1 - hybrid / ((kda_layers + global_layers) * context * 2 * latent)


def _preset_shape(p) -> dict:
    """A preset's numbers in the exercises' argument names (checked against at_scale below)."""
    from kda_lib.lab import at_scale

    channels = at_scale.kda_conv_channels(p)
    if p.num_v_heads != p.num_heads or channels != 3 * p.num_heads * p.head_dim:
        raise ValueError(f"{p.name}: the exercises assume H_v = H and d_v = d_k")
    return dict(heads=p.num_heads, head_dim=p.head_dim, conv_size=p.conv_size,
                latent=at_scale.mla_cache_numbers(p))


_OWN_MODELS = [  # (kda_layers, global_layers, heads, head_dim, conv_size, latent)
    (3, 1, 4, 64, 4, 96),
    (5, 2, 8, 32, 2, 200),
    (2, 2, 1, 128, 1, 40),
]


@checker("10.1")
def cache_reduction(answer, *, preset: str, context: int):
    """``answer(context, kda_layers, global_layers, heads, head_dim, conv_size, latent) ->
    float``: ``1 - hybrid / all-global`` decode memory of one sequence, the hybrid's KDA layers
    keeping a float32 state (d_v = d_k = head_dim) and bf16 conv history, each global layer
    ``latent`` bf16 numbers per token. Tried on ``preset`` at ``context`` and other contexts,
    then on models of the checker's own; kda_lib may not be called."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    shape = _preset_shape(p)
    layers = (len(p.kda_layers), len(p.global_layers))
    library = 1 - at_scale.model_cache_bytes(p, context) / at_scale.model_cache_bytes(
        p, context, hybrid=False)
    if not math.isclose(_reduction(context, *layers, **shape), library, rel_tol=1e-12):
        raise AssertionError(f"{preset}: the checker's count disagrees with at_scale")
    trials = [(c, *layers, *shape.values()) for c in (context, 1, 1000, 2**20)]
    trials += [(c, *m) for m in _OWN_MODELS for c in (64, 50_000)]
    rng = np.random.default_rng()
    kda_layers = int(rng.integers(2, 9))  # a hybrid: at least as many KDA as global layers
    trials.append((int(rng.integers(2, 10**6)), kda_layers, int(rng.integers(1, kda_layers + 1)),
                   *_drawn(rng)))
    for args in trials:
        got, hint = call_own_work(answer, *args, name="cache_reduction(context, ...)")
        hint = hint or refuse_degenerate(got, shape=(), what="the reduction", allow_zeros=True)
        if hint:
            return hint
        want, got = _reduction(*args), float(got)
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        if got > 1:
            return "a fraction (at most 1), not a percentage"
        kda, glob = args[1], args[2]
        if math.isclose(got, kda / (kda + glob), rel_tol=1e-6):
            return "that is the limit at long contexts: count the KDA layers' own state too"
        return (
            f"at context {args[0]} with {kda} KDA and {glob} global layers your reduction is "
            f"{'above' if got > want else 'below'} the count: the KDA state is float32 "
            "(4 bytes), its conv history and the latents bf16 (2 bytes)"
        )
    return None


def _ring(ranks, heads, head_dim, conv_size, latent) -> int:
    """The smallest whole T with (R - 1)/R T 2 latent > (R - 1) H d_k (2 d_k) 4 + halo, exact
    in integers: T (R - 1) 2 latent > R (summaries + halo)."""
    flat = (ranks - 1) * heads * head_dim * 2 * head_dim * 4 + (
        2 * max(conv_size - 1, 0) * 3 * heads * head_dim)
    return ranks * flat // ((ranks - 1) * 2 * latent) + 1


@checker("10.2")
def ring_crossover(answer, *, preset: str, ranks: int):
    """``answer(ranks, heads, head_dim, conv_size, latent) -> int``: the smallest whole T at
    which ring attention over the MLA latents (``latent`` bf16 numbers per token, (R - 1)/R of
    the sequence) brings each rank more bytes than the KDA summaries (float32, (R - 1) H d_k
    (d_k + d_v), d_v = d_k) plus the conv halo (bf16, (w - 1) 3 H d_k). Tried on ``preset`` at
    ``ranks`` and other rank counts, then on models of the checker's own; kda_lib may not be
    called."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    shape = tuple(_preset_shape(p).values())
    flat = at_scale.cp_summary_bytes(p, ranks) + at_scale.cp_halo_bytes(p)
    t = _ring(ranks, *shape)
    mla = at_scale.mla_cache_numbers(p)
    if not at_scale.ring_attention_bytes(mla, t, ranks) > flat >= at_scale.ring_attention_bytes(
            mla, t - 1, ranks):
        raise AssertionError(f"{preset}: the checker's count disagrees with at_scale")
    rng = np.random.default_rng()
    trials = [(r, *shape) for r in (ranks, 2, 64)]
    trials += [(r, *m[2:]) for m in _OWN_MODELS for r in (3, 16)]
    trials.append((int(rng.integers(2, 129)), *_drawn(rng)))
    hint, miss = _first_miss(answer, trials, "ring_crossover(ranks, ...)", _ring)
    if hint or miss is None:
        return hint
    (ranks, *_), got, want = miss
    if got == want - 1:
        return f"at {ranks} ranks your T is one short: ring attention must move more"
    return (
        f"at {ranks} ranks your T is {'above' if got > want else 'below'} the crossing: the "
        "summaries are float32 (4 bytes), the halo and the latents bf16 (2 bytes); each rank "
        "receives (R - 1)/R of the latents"
    )


def _crossover(batch, heads, head_dim, conv_size, latent, kda_params, mla_params) -> int:
    kda = 2 * kda_params + batch * 2 * _kda_layer_bytes(heads, head_dim, conv_size)
    return max(1, math.ceil((kda - 2 * mla_params) / (batch * 2 * latent)))


_OWN_LAYERS = [  # (heads, head_dim, conv_size, latent, kda_params, mla_params)
    (4, 64, 4, 96, 900_000, 700_000),
    (8, 32, 2, 200, 3_000_000, 2_900_000),
    (2, 128, 1, 40, 500_000, 450_000),
]


@checker("10.3")
def decode_crossover(answer, *, preset: str):
    """``answer(batch, heads, head_dim, conv_size, latent, kda_params, mla_params) -> int``:
    the smallest whole T >= 1 at which one MLA layer's decode step of ``batch`` sequences moves
    at least as many bytes as one KDA layer's: each reads its bf16 weights once per step, MLA
    each sequence's T bf16 latents, KDA each sequence's state read and written (float32 state,
    bf16 conv history). Tried on ``preset`` at several batches, then on layers of the
    checker's own; kda_lib may not be called."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    shape = _preset_shape(p)
    params = (p.kda_parameter_count(), p.mla_parameter_count())
    want_1 = _crossover(1, *shape.values(), *params)
    library = [at_scale.mla_decode_bytes(p, t) >= at_scale.kda_decode_bytes(p)
               for t in (want_1 - 1, want_1)]
    if library != [False, True]:
        raise AssertionError(f"{preset}: the checker's count disagrees with at_scale")
    trials = [(b, *shape.values(), *params) for b in (1, 16, 256)]
    trials += [(b, *layer) for layer in _OWN_LAYERS for b in (1, 7)]
    rng = np.random.default_rng()
    trials.append((int(rng.integers(1, 300)), *_drawn(rng, params=True)))
    hint, miss = _first_miss(answer, trials, "decode_crossover(batch, ...)", _crossover)
    if hint or miss is None:
        return hint
    (batch, *_), got, want = miss
    return (
        f"at batch {batch} your T is {'above' if got > want else 'below'} the crossover: "
        "per step the weights are read once (shared by the batch), the KDA state read and "
        "written for every sequence, the latents read for every sequence"
    )
