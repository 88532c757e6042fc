"""Checkers of notebook 09's exercises (the hybrid's cache, its MLA share, context use)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("09.1")
def hybrid_cache_bytes(answer, *, measured: dict):
    """A function of the context giving the hybrid's measured decode cache in bytes."""
    for context, want in measured.items():
        got, hint = call_answer(answer, int(context), name="hybrid_cache_bytes(context) -> int")
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="the bytes")
        if hint:
            return hint
        if got != want:
            return (
                f"at context {context} your count is {'above' if got > want else 'below'} "
                "the measured cache; the MLA cache has room for more than the context"
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
