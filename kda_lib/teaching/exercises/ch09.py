"""Checkers of notebook 09's exercises (the hybrid's cache, its MLA share, context use)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import checker, refuse_degenerate
from kda_lib.teaching.exercises._routes import call_own_work


def _hybrid_bytes(context, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size,
                  decode_steps) -> int:
    kda_layer = 4 * (heads * key_dim * key_dim + 3 * max(conv_size - 1, 0) * heads * key_dim)
    mla_layer = 4 * (context + decode_steps + 1) * kv_lora_rank + 4
    return kda_layers * kda_layer + mla_layers * mla_layer


_SHAPES = [  # (kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size, decode_steps)
    (3, 1, 4, 32, 64, 4, 8),
    (2, 2, 2, 16, 8, 2, 0),
    (5, 1, 1, 8, 48, 1, 3),
]


@checker("09.1")
def hybrid_cache_bytes(answer, *, measured: dict, shape: dict):
    """``answer(context, kda_layers, mla_layers, heads, key_dim, kv_lora_rank, conv_size,
    decode_steps) -> int``: a hybrid's decode cache in bytes. Compared with the notebook's
    measurement (``measured``: context -> bytes, for the model ``shape``, a dict of those
    arguments), then tried on contexts nobody measured and on models of the checker's own, so a
    lookup or a fit of the measurements cannot pass. kda_lib may not be called."""
    names = ("kda_layers", "mla_layers", "heads", "key_dim", "kv_lora_rank", "conv_size",
             "decode_steps")
    own = tuple(int(shape[n]) for n in names)
    trials = [(int(c), own, int(b)) for c, b in measured.items()]
    unmeasured = [c for c in (3, 100, 777, 5000) if c not in measured]
    trials += [(c, own, _hybrid_bytes(c, *own)) for c in unmeasured]
    trials += [(c, sh, _hybrid_bytes(c, *sh)) for sh in _SHAPES for c in (10, 300)]
    for context, sh, want in trials:
        got, hint = call_own_work(
            answer, context, *sh, name="hybrid_cache_bytes(context, ...)"
        )
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="the bytes")
        if hint:
            return hint
        if int(got) != want:
            where = "measured" if context in measured and sh == own else "expected"
            return (
                f"at context {context} for {dict(zip(names, sh, strict=True))} your count is "
                f"{'above' if got > want else 'below'} the {where} cache; the MLA cache has "
                "room for more than the context"
            )
    return None


@checker("09.2")
def attention_share(
    answer,
    *,
    cache_bytes: int,
    kda_layers: int,
    heads: int,
    key_dim: int,
    value_dim: int,
    conv_size: int,
):
    """The share of the hybrid's cache held by its global (MLA) layers: all but the KDA
    layers' fixed caches."""
    hint = refuse_degenerate(answer, shape=(), what="the share")
    if hint:
        return hint
    value = float(answer)
    kda_layer = 4 * (
        heads * key_dim * value_dim + (conv_size - 1) * heads * (2 * key_dim + value_dim)
    )
    want = 1 - kda_layers * kda_layer / cache_bytes
    if np.isclose(value, want, rtol=1e-6):
        return None
    if np.isclose(value, 1 - want, rtol=1e-6):
        return "that is the KDA layers' share"
    return "subtract the KDA layers' fixed caches (state + conv tails) from the total"


def _gain(curve) -> float:
    y = np.asarray(curve)
    return float(y[: y.size // 4].mean() - y[-(y.size // 4) :].mean())


@checker("09.3")
def largest_context_gain(answer, *, bpb_by_position: dict):
    """The model whose bits per byte fall most from the first to the last quarter."""
    if not isinstance(answer, str) or answer not in bpb_by_position:
        return f"give one name (a string), one of {sorted(bpb_by_position)}"
    gains = {name: _gain(curve) for name, curve in bpb_by_position.items()}
    if gains[answer] == max(gains.values()):
        return None
    return "compare the mean of the first quarter of positions with that of the last quarter"
