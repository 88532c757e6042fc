"""The Mamba2-style mixer: its kernel is the scalar-decay recurrence (checked in float64 in
tests/ops/test_scalar_decay.py); here the layer around it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_call
from flax import nnx

import kda_lib.layers.mamba2 as mamba2
from kda_lib.layers.mamba2 import Mamba2Config, Mamba2Mixer
from kda_lib.ops.scalar_decay import scalar_decay_chunked, scalar_decay_recurrent

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


def _mamba2_loop(f, a_log, dt_bias, b, c, x, scale, *, scale_writes):
    """Mamba2's recurrence by a numpy loop in float64, per batch row and head:
    ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T`` (``w_t = 1`` instead of ``dt_t`` without
    ``scale_writes``), ``y_t = scale C_t^T h_t``, ``dt_t = softplus(f_t + dt_bias)``,
    ``A = -exp(a_log)``."""
    out = np.zeros(x.shape)
    final = np.zeros((x.shape[0], x.shape[2], b.shape[-1], x.shape[-1]))
    for i in range(x.shape[0]):
        for h in range(x.shape[2]):
            state = np.zeros((b.shape[-1], x.shape[-1]))
            for t in range(x.shape[1]):
                dt = np.log1p(np.exp(f[i, t, h] + dt_bias[h]))
                write = dt if scale_writes else 1.0
                state = np.exp(-np.exp(a_log[h]) * dt) * state + write * np.outer(
                    b[i, t, h], x[i, t, h]
                )
                out[i, t, h] = scale * c[i, t, h] @ state
            final[i, h] = state
    return out, final


@pytest.mark.parametrize("scale_writes", [True, False])
def test_the_discretisation_in_float64_equals_a_direct_loop(x64, scale_writes):
    """``discretize`` and the chunked kernel (chunks of 4 over T = 11) give Mamba2's
    ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t`` (``scale_writes``; the stand-in writes
    ``B_t x_t``), steps from 1e-3 to about 20, to float64 rounding."""
    rng = np.random.default_rng(3)
    batch, seq_len, heads, key_dim, value_dim = 2, 11, 3, 4, 5
    f = rng.normal(size=(batch, seq_len, heads)) * 3.0
    a_log, dt_bias = rng.normal(size=heads), np.array([-6.0, 0.0, 3.0])
    b, c = rng.normal(size=(2, batch, seq_len, heads, key_dim))
    x = rng.normal(size=(batch, seq_len, heads, value_dim))
    want, want_final = _mamba2_loop(f, a_log, dt_bias, b, c, x, 0.5, scale_writes=scale_writes)
    # each function one program (eagerly, each of their small ops would compile on its own)
    discretize = jax.jit(functools.partial(mamba2.discretize, scale_writes=scale_writes))
    g, written = discretize(jnp.asarray(f), jnp.asarray(a_log), jnp.asarray(dt_bias),
                            jnp.asarray(b))  # fmt: skip
    assert g.dtype == written.dtype == jnp.float64
    for form in (functools.partial(scalar_decay_chunked, chunk_size=4), scalar_decay_recurrent):
        o, final = jax.jit(functools.partial(form, scale=0.5))(jnp.asarray(c), written,
                                                               jnp.asarray(x), g)  # fmt: skip
        np.testing.assert_allclose(o, want, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(final, want_final, rtol=1e-11, atol=1e-12)


def test_the_mamba2_dt_layer_scales_each_write_by_its_step():
    """Same parameters, same inputs: the ``scale_writes`` layer hands the kernel ``dt_t k_t``
    where the stand-in hands ``k_t`` (``dt_t = softplus(f_proj(x_t) + dt_bias)``, recomputed
    here in float64), and the same log decay ``dt_t A``."""
    x = jax.random.normal(jax.random.key(2), (2, 7, 16))
    seen = {}

    def recording(name):
        def kernel(q, k, v, g, **kw):
            seen[name] = np.asarray(k, np.float64), np.asarray(g, np.float64)
            return scalar_decay_recurrent(q, k, v, g, initial_state=kw.get("initial_state"))

        return kernel

    layers = {}
    for name, scale_writes in (("dt", True), ("plain", False)):
        layers[name] = Mamba2Mixer(dataclasses.replace(CONFIG, scale_writes=scale_writes),
                                   rngs=nnx.Rngs(0))  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(mamba2, "scalar_decay_chunked", recording(name))
            layers[name](x)
    for a, b in zip(*(jax.tree.leaves(nnx.state(layers[n])) for n in ("dt", "plain")), strict=True):
        np.testing.assert_array_equal(a, b)  # the flag adds no parameter and changes no init
    layer = layers["dt"]
    f = np.asarray(x, np.float64) @ np.asarray(layer.f_proj.kernel[...], np.float64)
    dt = np.log1p(np.exp(f + np.asarray(layer.dt_bias[...], np.float64)))
    (k_dt, g_dt), (k, g) = seen["dt"], seen["plain"]
    np.testing.assert_allclose(k_dt, dt[..., None] * k, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_dt, g, rtol=0, atol=0)
    np.testing.assert_allclose(g, -np.exp(np.asarray(layer.A_log[...], np.float64)) * dt,
                               rtol=1e-5, atol=1e-7)  # fmt: skip


def test_a_vanishing_step_leaves_mamba2_dts_state_empty_not_the_stand_ins():
    """Review 2026-12-06 (issue 73): at a step of about 1e-13 the stand-in's state (writes not
    scaled) is larger than at a step of about 2 (nothing decays, everything is written); with
    Mamba2's discretisation it is about 1e-13 times a unit write."""
    x = jax.random.normal(jax.random.key(4), (1, 24, 16))
    norms = {}
    for scale_writes in (True, False):
        for dt_bias in (-30.0, 1.85):  # softplus: 9.4e-14 and 2.0 (f_proj zeroed: f_t = 0)
            layer = Mamba2Mixer(dataclasses.replace(CONFIG, scale_writes=scale_writes),
                                rngs=nnx.Rngs(0))  # fmt: skip
            layer.f_proj.kernel[...] = jnp.zeros_like(layer.f_proj.kernel[...])
            layer.dt_bias[...] = jnp.full_like(layer.dt_bias[...], dt_bias)
            _, cache = jitted_call(layer, x, cache=layer.init_cache(1))
            norms[scale_writes, dt_bias] = float(jnp.linalg.norm(cache.state))
    assert norms[False, -30.0] > 1.5 * norms[False, 1.85]  # the stand-in: a small step, a big state
    assert norms[True, -30.0] < 1e-11 and norms[True, 1.85] > 0.1
