"""The Mamba2-style recurrence (scalar decay per head, no delta rule): the oracle against a
numpy loop, the chunked form against the oracle in float64 (outputs and gradients)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib.ops.scalar_decay import scalar_decay_chunked, scalar_decay_recurrent


def _inputs(seed, batch=2, seq_len=13, heads=2, key_dim=4, value_dim=3, dtype=jnp.float64):
    keys = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(keys[0], (batch, seq_len, heads, key_dim), dtype)
    k = jax.random.normal(keys[1], (batch, seq_len, heads, key_dim), dtype)
    v = jax.random.normal(keys[2], (batch, seq_len, heads, value_dim), dtype)
    g = -jax.random.uniform(keys[3], (batch, seq_len, heads), dtype, 0.01, 2.0)
    state = jax.random.normal(keys[4], (batch, heads, key_dim, value_dim), dtype)
    return q, k, v, g, state


def test_recurrence_is_decay_then_plain_write_then_read(x64):
    """S <- exp(g_t) S + k_t v_t^T, o_t = scale q_t^T S, by a numpy loop in float64."""
    q, k, v, g, state0 = (np.asarray(x) for x in _inputs(0))
    scale = 0.7
    out = np.zeros(v.shape)
    final = state0.copy()
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            s = final[b, h]
            for t in range(q.shape[1]):
                s = np.exp(g[b, t, h]) * s + np.outer(k[b, t, h], v[b, t, h])
                out[b, t, h] = scale * q[b, t, h] @ s
            final[b, h] = s
    o, last = jax.jit(functools.partial(scalar_decay_recurrent, scale=scale))(
        q, k, v, g, initial_state=state0
    )
    assert o.dtype == jnp.float64
    np.testing.assert_allclose(o, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(last, final, rtol=1e-12, atol=1e-12)


CHUNK_SIZES = (1, 4, 5, 13, 64)


@functools.cache
def _runs():
    """``{form: ((o, final), grads)}`` for the recurrence and the chunked form at every chunk
    size, in one program (once per worker; eagerly, each small op would compile on its own);
    gradients of a random projection of both outputs w.r.t. all five inputs."""
    with jax.enable_x64(True):
        inputs = _inputs(1)
        weights = jax.random.normal(jax.random.key(9), inputs[2].shape, jnp.float64)
        weights_state = jax.random.normal(jax.random.key(8), inputs[4].shape, jnp.float64)

        def loss(form, *args):
            q, k, v, g, state = args
            o, final = form(q, k, v, g, initial_state=state)
            return jnp.sum(o * weights) + jnp.sum(final * weights_state)

        forms = {"recurrent": scalar_decay_recurrent}
        forms.update(
            {f"C={c}": functools.partial(scalar_decay_chunked, chunk_size=c) for c in CHUNK_SIZES}
        )
        argnums = (1, 2, 3, 4, 5)

        @jax.jit
        def outputs_and_grads(*args):
            return {
                name: (form(*args[:4], initial_state=args[4]), jax.grad(loss, argnums)(form, *args))
                for name, form in forms.items()
            }

        return outputs_and_grads(*inputs)


@pytest.mark.xdist_group("scalar_decay_programs")  # one program for every chunk size
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_chunked_equals_the_recurrence_in_float64_outputs_and_gradients(x64, chunk_size):
    """Every chunk size (one token, dividing T or not, T itself, above T), with an initial
    state; gradients of a random projection of both outputs w.r.t. all five inputs."""
    runs = _runs()
    ((o_ref, s_ref), grads_ref), ((o, s), grads) = runs["recurrent"], runs[f"C={chunk_size}"]
    np.testing.assert_allclose(o, o_ref, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(s, s_ref, rtol=1e-11, atol=1e-11)
    for got, want in zip(grads, grads_ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_float32_chunked_stays_close_and_strong_decay_stays_finite():
    q, k, v, g, state = _inputs(2, seq_len=40, dtype=jnp.float32)
    g = g * 30  # exp(g) underflows to 0 within a chunk: still finite, still the recurrence
    (o, s), (o_ref, s_ref) = jax.jit(  # one program (eagerly, every op compiles on its own)
        lambda *a: (
            scalar_decay_chunked(*a[:4], initial_state=a[4], chunk_size=16),
            scalar_decay_recurrent(*a[:4], initial_state=a[4]),
        )
    )(q, k, v, g, state)
    assert bool(jnp.isfinite(o).all())
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s, s_ref, rtol=1e-4, atol=1e-4)
