"""Checkers of notebook 04's exercises (the KDA layer); hints never contain the answer."""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.layers.params import parameter_count
from kda_lib.teaching.exercises import call_answer, checker, refuse_degenerate


@checker("04.1")
def full_rank_gates(answer, *, config: KDAConfig):
    """``answer``: the number of parameters of ``config``'s layer with full-rank gates
    (``forget_gate_rank=None``, ``output_gate_rank=None``)."""
    full = dataclasses.replace(config, forget_gate_rank=None, output_gate_rank=None)
    expected = parameter_count(nnx.eval_shape(lambda: KimiDeltaAttention(full, rngs=nnx.Rngs(0))))
    hint = refuse_degenerate(answer, shape=(), integer=True, what="the parameter count")
    if hint:
        return hint
    if int(answer) != expected:
        return "not the full-rank count: f_proj and g_proj become single d x (H * K) matrices"
    return None


@checker("04.2")
def one_decay_per_head(answer, *, batch, seq_len, num_heads, key_dim):
    """``answer``: the log decays ``g [B, T, H, K]`` of a ``per_head_decay=True`` layer."""
    hint = refuse_degenerate(answer, shape=(batch, seq_len, num_heads, key_dim), what="g")
    if hint:
        return hint
    g = np.asarray(answer, np.float64)
    if not np.all(g <= 0):
        return "a log decay is <= 0: is this the activated gate (kda_gate), not its input?"
    if np.abs(g - g[..., :1]).max() > 1e-6:
        return "the channels of a head do not share one decay: was per_head_decay=True set?"
    if np.ptp(g, axis=1).max() == 0:
        return "g does not depend on the token: is it the gate of the layer's input x?"
    return None


def _safe_gate_layer(fixture):
    """The checker's own layer from the safe-gate fixture's state dict and config."""
    import json

    cfg = json.loads(str(fixture["config_json"]))
    config = KDAConfig(
        hidden_size=cfg["hidden_size"],
        num_heads=cfg["num_heads"],
        head_dim=cfg["head_dim"],
        conv_size=cfg["conv_size"],
        lower_bound=cfg["lower_bound"],
        forget_gate_rank=cfg["head_dim"],
        output_gate_rank=cfg["head_dim"],
        norm_eps=cfg["norm_eps"],
    )
    state_dict = {n.removeprefix("sd/"): fixture[n] for n in fixture.files if n.startswith("sd/")}
    return KimiDeltaAttention.from_fla_state_dict(state_dict, config, rngs=nnx.Rngs(0))


@checker("04.3")
def safe_gate_fixture(answer, *, fixture):
    """``answer``: the layer loaded from the safe-gate fixture (any callable ``x -> y``). The
    checker runs it on the fixture's ``x`` (against fla's ``y``) and on inputs of its own
    (against a layer it loads itself), so fla's recorded ``y`` is not an answer."""
    import jax

    x, fla_y = np.asarray(fixture["x"]), np.asarray(fixture["y"], np.float64)
    own_x = np.asarray(jax.random.normal(jax.random.key(43), (1, 9, x.shape[-1])))
    for inputs, want, where in (
        (x, fla_y, "on the fixture's x"),
        (own_x, None, "on inputs of the checker's own"),
    ):
        y, hint = call_answer(
            answer, inputs, name="the layer", wanted="the loaded layer (a callable x -> y)"
        )
        if want is None:
            want = np.asarray(_safe_gate_layer(fixture)(inputs), np.float64)
        hint = hint or refuse_degenerate(y, shape=want.shape, inputs=(inputs,), what="y")
        if hint:
            return hint
        if np.abs(np.asarray(y, np.float64) - want).max() > 5e-6 + 1e-5 * np.abs(want).max():
            return (
                f"the layer's y differs {where}: the fixture was made with the safe gate "
                "(lower_bound=-5)"
            )
    return None
