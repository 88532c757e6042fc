"""Checkers of notebook 04's exercises (the KDA layer); hints never contain the answer.

Both answers are formulas, as functions of the widths, which the checker calls on widths of its
own and compares with what the library's layer holds (:meth:`KDAConfig.parameter_shapes`, the
decode cache's shapes); an answer that runs ``kda_lib`` code (building a layer, the config's
own count) is refused.
"""

from __future__ import annotations

import math

from flax import nnx

from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.layers.params import parameter_count
from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate

# (d, H, K, V, r, w): K != V and r != K so that a swapped width shows
_WIDTHS = (
    (64, 2, 16, 16, 8, 4), (96, 3, 8, 12, 5, 4), (256, 4, 32, 64, 16, 3), (48, 6, 8, 4, 2, 2)
)


def _config(d, H, K, V, r, w, per_head_decay):
    return KDAConfig(
        hidden_size=d,
        num_heads=H,
        head_dim=K,
        value_head_dim=V,
        conv_size=w,
        forget_gate_rank=r,
        output_gate_rank=r,
        per_head_decay=per_head_decay,
    )


def _count(config: KDAConfig) -> int:
    """The layer's parameters, from shapes only (``nnx.eval_shape``)."""
    return parameter_count(nnx.eval_shape(lambda: KimiDeltaAttention(config, rngs=nnx.Rngs(0))))


@checker("04.1")
def gated_deltanet_parameters(answer, **_):
    """``answer(d, H, K, V, r, w) -> count``: the parameters of the layer with one decay per
    head (``per_head_decay=True``: Gated DeltaNet's gate), rank-``r`` gates and conv width
    ``w``."""
    for widths in _WIDTHS:
        got, hint = call_answer(
            answer, *widths, name="gdn_parameters(d, H, K, V, r, w)", own_code=True
        )
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="the count")
        if hint:
            return hint
        want = _count(_config(*widths, per_head_decay=True))
        if int(got) != want:
            per_channel = _count(_config(*widths, per_head_decay=False))
            if int(got) == per_channel:
                return f"at (d, H, K, V, r, w) = {widths} that is KDA's count, per channel"
            return (
                f"wrong at (d, H, K, V, r, w) = {widths}: which parts have one entry per key "
                "channel, and how many do they keep with one decay per head?"
            )
    return None


def _cache_floats(H, K, V, w) -> int:
    """Floats of the layer's own decode cache for one sequence (its ``_cache_shapes``)."""
    from flax import nnx

    from kda_lib.layers.kda_layer import KimiDeltaAttention

    config = _config(H * K, H, K, V, 4, w, per_head_decay=False)
    layer = nnx.eval_shape(lambda: KimiDeltaAttention(config, rngs=nnx.Rngs(0)))
    return sum(math.prod(s) for s in layer._cache_shapes(1).values() if s is not None)


@checker("04.2")
def decode_cache(answer, **_):
    """``answer(H, K, V, w) -> floats``: what one KDA layer keeps per sequence between decode
    steps (``H`` heads, ``K = d_k``, ``V = d_v``, short-conv width ``w``)."""
    for H, K, V, w in ((2, 16, 16, 4), (16, 128, 128, 4), (3, 8, 12, 2), (4, 6, 10, 5)):
        got, hint = call_answer(answer, H, K, V, w, name="cache_floats(H, K, V, w)", own_code=True)
        hint = hint or refuse_degenerate(got, shape=(), integer=True, what="the count")
        if hint:
            return hint
        if int(got) != _cache_floats(H, K, V, w):
            if int(got) == H * K * V:
                return "that is the state alone: what else must a decoder keep to run the layer?"
            return (
                f"wrong at (H, K, V, w) = {(H, K, V, w)}: the state, and what the short "
                "convolutions need of the tokens before"
            )
    return None
