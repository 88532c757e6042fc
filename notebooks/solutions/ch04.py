"""Worked solutions of notebook 04's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import numpy as np
from flax import nnx

import kda_lib

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "data" / "fixtures"


def exercise_1(config):
    """Full-rank gates: build the layer with ``forget_gate_rank=None`` and
    ``output_gate_rank=None`` and count its parameters."""
    full = dataclasses.replace(config, forget_gate_rank=None, output_gate_rank=None)
    layer = kda_lib.KimiDeltaAttention(full, rngs=nnx.Rngs(0))
    return sum(a.size for a in jax.tree.leaves(nnx.state(layer, nnx.Param)))


def exercise_2(config, x):
    """One decay per head: the activated gate of a ``per_head_decay=True`` layer."""
    gdn = kda_lib.KimiDeltaAttention(
        dataclasses.replace(config, per_head_decay=True), rngs=nnx.Rngs(0)
    )
    return kda_lib.kda_gate(gdn.project(x).f, gdn.A_log[...], gdn.kernel_kwargs()["dt_bias"])


def exercise_3(fixture, lower_bound=-5.0):
    """The safe-gate fixture: load fla's state dict with ``lower_bound=-5``; the layer is the
    answer (the checker runs it on the fixture's ``x`` and on inputs of its own)."""
    cfg = json.loads(str(fixture["config_json"]))
    config = kda_lib.KDAConfig(
        hidden_size=cfg["hidden_size"],
        num_heads=cfg["num_heads"],
        head_dim=cfg["head_dim"],
        conv_size=cfg["conv_size"],
        lower_bound=lower_bound,
        forget_gate_rank=cfg["head_dim"],
        output_gate_rank=cfg["head_dim"],
        norm_eps=cfg["norm_eps"],
    )
    state_dict = {n.removeprefix("sd/"): fixture[n] for n in fixture.files if n.startswith("sd/")}
    return kda_lib.KimiDeltaAttention.from_fla_state_dict(state_dict, config, rngs=nnx.Rngs(0))


def cases():
    ranks = dict(forget_gate_rank=8, output_gate_rank=8)
    config = kda_lib.KDAConfig(hidden_size=64, num_heads=2, head_dim=16, conv_size=4, **ranks)
    x = jax.random.normal(jax.random.key(0), (2, 12, 64))
    low_rank = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(0))
    kda_g = kda_lib.kda_gate(
        low_rank.project(x).f, low_rank.A_log[...], low_rank.kernel_kwargs()["dt_bias"]
    )
    safe = np.load(FIXTURES / "fla_layer_safe_gate.npz", allow_pickle=False)
    shape = {"batch": 2, "seq_len": 12, "num_heads": 2, "key_dim": 16}
    return [
        (
            "04.1",
            exercise_1(config),
            {"config": config},
            sum(a.size for a in jax.tree.leaves(nnx.state(low_rank, nnx.Param))),
        ),
        ("04.2", exercise_2(config, x), shape, kda_g),
        ("04.3", exercise_3(safe), {"fixture": safe}, exercise_3(safe, lower_bound=None)),
    ]
