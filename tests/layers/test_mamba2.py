"""The Mamba2-style mixer: its kernel is the scalar-decay recurrence (checked in float64 in
tests/ops/test_scalar_decay.py); here the layer around it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_call
from flax import nnx

import kda_lib.layers.mamba2 as mamba2
from kda_lib.layers.mamba2 import Mamba2Config, Mamba2Mixer
from kda_lib.ops.scalar_decay import scalar_decay_recurrent

CONFIG = Mamba2Config(hidden_size=16, num_heads=2, head_dim=8, value_head_dim=4, chunk_size=4)


def test_the_layer_runs_the_recurrence_outputs_and_gradients(monkeypatch):
    """The layer with its chunked kernel equals the layer with the one-token recurrence
    (T = 11 over chunks of 4), outputs and parameter gradients."""
    x = jax.random.normal(jax.random.key(0), (2, 11, 16))
    layer = Mamba2Mixer(CONFIG, rngs=nnx.Rngs(0))

    def loss(layer):
        return jnp.sum(layer(x) ** 2)

    def outputs_and_grads(layer):  # a new program each call: it sees the kernel patched or not
        return nnx.jit(lambda layer: (layer(x), nnx.grad(loss)(layer)))(layer)

    y, grads = outputs_and_grads(layer)
    monkeypatch.setattr(
        mamba2,
        "scalar_decay_chunked",
        lambda *a, chunk_size, **kw: scalar_decay_recurrent(*a, **kw),
    )
    y_ref, grads_ref = outputs_and_grads(layer)
    np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)
    # float32 rounding of two summation orders, amplified by the norms' backward (exactness
    # of the kernel itself: float64, tests/ops/test_scalar_decay.py)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref), strict=True):
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * max(scale, 1.0))


def test_one_decay_per_head_and_no_delta_rule():
    layer = Mamba2Mixer(CONFIG, rngs=nnx.Rngs(0))
    assert layer.f_proj.kernel.shape == (16, 2)  # one gate input per head
    assert layer.A_log.shape == layer.dt_bias.shape == (2,)
    assert not hasattr(layer, "b_proj")  # no beta: the write is k v^T, nothing is erased


def test_decoding_continues_the_full_forward_and_bad_caches_are_refused():
    x = jax.random.normal(jax.random.key(1), (2, 9, 16))
    layer = Mamba2Mixer(CONFIG, rngs=nnx.Rngs(0))
    full = jitted_call(layer, x)
    out, cache = jitted_call(layer, x[:, :6], cache=layer.init_cache(2))
    steps = [out]
    for t in range(6, 9):
        out, cache = jitted_call(layer, x[:, t : t + 1], cache=cache)
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, rtol=2e-5, atol=2e-5)
    assert cache.state.shape == (2, 2, 8, 4)
    with pytest.raises(ValueError, match=r"cache\.state has shape \(3, 2, 8, 4\), expected \(2, "):
        layer(x, cache=layer.init_cache(3))
    with pytest.raises(ValueError, match="cache must be a Mamba2Cache, got tuple"):
        layer(x, cache=tuple(layer.init_cache(2)))
    with pytest.raises(ValueError, match="x must have shape"):
        layer(x[..., :8])
    with pytest.raises(ValueError, match="Mamba2Config.head_dim must be"):
        Mamba2Config(hidden_size=16, num_heads=2, head_dim=0, value_head_dim=4)


def test_segments_restart_the_state_and_equal_separate_runs():
    """With segment ids each document runs as if alone (reused id 1 after id 2 is a new
    document), padding outputs 0, and one segment equals no ids; with a cache they are refused."""
    layer = Mamba2Mixer(CONFIG, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 10, 16)), jnp.float32)
    ids = np.array([[0, 1, 1, 0, 2, 2, 1, 1, 0, 0]])  # documents of 2 tokens: one program alone
    y = np.asarray(jitted_call(layer, x, segment_ids=ids))
    for start, stop in ((1, 3), (4, 6), (6, 8)):
        alone = np.asarray(jitted_call(layer, x[:, start:stop]))
        np.testing.assert_allclose(y[0, start:stop], alone[0], rtol=1e-5, atol=1e-6)
    assert not y[0, [0, 3, 8, 9]].any()
    one = np.asarray(jitted_call(layer, x, segment_ids=np.ones((1, 10), np.int32)))
    np.testing.assert_allclose(one, np.asarray(jitted_call(layer, x)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="segment_ids cannot be combined with a cache"):
        layer(x, segment_ids=ids, cache=layer.init_cache(1))
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\]"):
        layer(x, segment_ids=ids[:, :5])
