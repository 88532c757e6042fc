"""Checkers of notebook 09's exercises (the hybrid's cache, its MLA share, context use)."""

from __future__ import annotations

import numpy as np

from kda_lib.teaching.exercises import checker


@checker("09.1")
def hybrid_cache_bytes(answer, *, measured: dict):
    """A function of the context giving the hybrid's measured decode cache in bytes."""
    if not callable(answer):
        return "give a function hybrid_cache_bytes(context) -> int"
    for context, want in measured.items():
        try:
            got = answer(int(context))
        except Exception as error:  # noqa: BLE001 - a student's function may fail any way
            return f"your function raised {type(error).__name__} at context {context}"
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
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return "give a fraction, one float"
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
    if answer not in bpb_by_position:
        return f"give one of {sorted(bpb_by_position)}"
    gains = {name: _gain(curve) for name, curve in bpb_by_position.items()}
    if gains[answer] == max(gains.values()):
        return None
    return "compare the mean of the first quarter of positions with that of the last quarter"
