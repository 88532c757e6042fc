"""``implementation="auto"`` on CPU: a call that is not differentiated runs the scan (measured
faster forward-only), a differentiated one the chunked form's forward and gradient
(``kda_lib.backends._scan_forward_chunked_gradient``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kda_lib.backends
import kda_lib.kernel
from kda_lib import kda, kda_chunked, kda_recurrent
from kda_lib.testing import random_kda_inputs, relative_l2

B, T, H, K, V = 2, 150, 2, 16, 8  # T: two full chunks and a partial one


@pytest.fixture(scope="module")
def case():
    inputs = random_kda_inputs(jax.random.key(0), B, T, H, K, V)
    args = tuple(inputs[n] for n in ("q", "k", "v", "g", "beta"))
    segment_ids = jnp.concatenate(  # two segments, then padding
        [jnp.ones((B, 70), jnp.int32), jnp.full((B, 70), 2, jnp.int32),
         jnp.zeros((B, T - 140), jnp.int32)], axis=1)
    initial_state = jax.random.normal(jax.random.key(1), (B, H, K, V))
    options = dict(segment_ids=segment_ids, output_final_state=True)
    return args, initial_state, options


def _loss(fn, options):
    def loss(q, k, v, g, beta, initial_state):
        o, final = fn(q, k, v, g, beta, initial_state=initial_state, **options)
        return jnp.sum(jnp.sin(o)) + jnp.sum(final**2)

    return loss


def test_cpu_routes_forward_through_the_scan():
    assert kda_lib.kernel.scan_forward("cpu")
    assert not kda_lib.kernel.scan_forward("gpu") and not kda_lib.kernel.scan_forward("tpu")
    assert jax.default_backend() == "cpu"  # the suite runs on CPU: the tests below rely on it


def test_forward_only_is_the_scan(case):
    args, initial_state, options = case
    got = jax.jit(lambda *a: kda(*a, initial_state=initial_state, **options))(*args)
    want = jax.jit(lambda *a: kda_recurrent(*a, initial_state=initial_state, **options))(*args)
    for name, x, y in zip(("o", "final_state"), got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def test_gradient_is_the_chunked_forms(case):
    args, initial_state, options = case
    argnums = tuple(range(6))
    auto_value, auto_grads = jax.jit(
        jax.value_and_grad(_loss(kda, options), argnums=argnums))(*args, initial_state)
    chunk_value, chunk_grads = jax.jit(
        jax.value_and_grad(_loss(kda_chunked, options), argnums=argnums))(*args, initial_state)
    # one program vs another: XLA may order a sum differently, nothing more
    assert abs(float(auto_value - chunk_value)) <= 1e-6 * abs(float(chunk_value))
    for name, x, y in zip(("q", "k", "v", "g", "beta", "initial_state"), auto_grads, chunk_grads,
                          strict=True):
        assert float(relative_l2(x, y)) <= 1e-6, name
        assert float(jnp.abs(x).max()) > 0, name  # gradients reach every input


def test_a_precision_request_keeps_the_chunked_forward(case):
    """An explicit precision is the chunked form's policy: no scan in between."""
    args, initial_state, options = case
    got = jax.jit(lambda *a: kda(*a, initial_state=initial_state, precision="highest",
                                 **options))(*args)
    want = jax.jit(lambda *a: kda_chunked(*a, initial_state=initial_state, **options))(*args)
    for x, y in zip(got, want, strict=True):
        assert float(relative_l2(x, y)) <= 1e-6


def test_other_platforms_keep_the_chunked_forward(case, monkeypatch):
    args, initial_state, options = case

    def routed_through_the_scan(fn):  # the custom_vjp's forward rule is named in the jaxpr
        return "_chunked_with_vjp" in str(jax.make_jaxpr(fn)(*args))

    def auto():  # a new function per trace: JAX caches traces by function
        return lambda *a: kda(*a, initial_state=initial_state, **options)

    assert routed_through_the_scan(auto())
    monkeypatch.setattr(kda_lib.backends, "SCAN_FORWARD_PLATFORMS", ())
    assert not routed_through_the_scan(auto())
    got = jax.jit(auto())(*args)
    want = jax.jit(lambda *a: kda_chunked(*a, initial_state=initial_state, **options))(*args)
    for x, y in zip(got, want, strict=True):
        assert float(relative_l2(x, y)) <= 1e-6
