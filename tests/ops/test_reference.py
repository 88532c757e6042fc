"""The oracle itself, checked against an independent numpy loop (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda_recurrent, kda_step
from kda_lib.testing import assert_close, random_kda_inputs


def numpy_kda(q, k, v, g, beta, scale, state0, segment_ids):
    """Textbook loop over batch, head and time, in float64."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    batch, seq_len, heads, _ = q.shape
    out = np.zeros(v.shape)
    final = np.array(state0, np.float64)
    for b in range(batch):
        ids = segment_ids[b]
        nonzero = ids[ids != 0]
        for h in range(heads):
            state = final[b, h].copy()
            prev = nonzero[0] if nonzero.size else 0
            for t in range(seq_len):
                if ids[t] == 0:
                    continue
                if ids[t] != prev:
                    state[:] = 0
                    prev = ids[t]
                state = state * np.exp(g[b, t, h])[:, None]
                state = state + beta[b, t, h] * np.outer(
                    k[b, t, h], v[b, t, h] - k[b, t, h] @ state
                )
                out[b, t, h] = scale * q[b, t, h] @ state
            final[b, h] = state
    return out, final


@pytest.mark.parametrize("with_segments", [False, True])
def test_recurrent_matches_numpy_loop(x64, with_segments):
    inputs = random_kda_inputs(
        jax.random.key(0), 2, 37, 2, 8, 5, dtype=jnp.float64, with_state=True
    )
    ids = np.ones((2, 37), np.int64)
    if with_segments:
        ids[0, :3] = 0
        ids[0, 3:20] = 4
        ids[0, 20:25] = 0
        ids[0, 25:] = 2
        ids[1, 10:] = 3
    o, s = kda_recurrent(
        **inputs,
        output_final_state=True,
        scale=0.3,
        segment_ids=jnp.asarray(ids) if with_segments else None,
    )
    o_np, s_np = numpy_kda(
        inputs["q"],
        inputs["k"],
        inputs["v"],
        inputs["g"],
        inputs["beta"],
        0.3,
        inputs["initial_state"],
        ids,
    )
    assert o.dtype == jnp.float64 and s.dtype == jnp.float64
    assert_close(o, o_np, atol=1e-12, rtol=1e-12)
    assert_close(s, s_np, atol=1e-12, rtol=1e-12)
    if with_segments:
        assert np.all(np.asarray(o)[ids == 0] == 0)  # padding outputs exactly 0


def test_step_by_step_decoding_equals_recurrence():
    inputs = random_kda_inputs(jax.random.key(1), 2, 9, 3, 8, 4, with_state=True)
    o, s = kda_recurrent(**inputs, output_final_state=True)
    state = inputs["initial_state"]
    outs = []
    for t in range(9):
        state, o_t = kda_step(state, *(inputs[n][:, t] for n in ("q", "k", "v", "g", "beta")))
        outs.append(o_t)
    assert state.dtype == jnp.float32
    assert_close(jnp.stack(outs, 1), o, atol=1e-6, rtol=1e-6)
    assert_close(state, s, atol=1e-6, rtol=1e-6)


def test_output_dtype_follows_q_and_state_is_float32():
    inputs = random_kda_inputs(jax.random.key(2), 1, 5, 2, 4, 4, dtype=jnp.bfloat16)
    o, s = kda_recurrent(**inputs, output_final_state=True)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    o, s = kda_recurrent(**inputs)
    assert s is None


def test_step_errors():
    state = jnp.zeros((1, 2, 4, 3))
    q = jnp.zeros((1, 2, 4))
    with pytest.raises(ValueError, match=r"state must have shape \[B, H, K, V\]"):
        kda_step(jnp.zeros((1, 2, 4, 4)), q, q, jnp.zeros((1, 2, 3)), q, jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"beta_t must have shape \[B, HV\]"):
        kda_step(state, q, q, jnp.zeros((1, 2, 3)), q, jnp.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"q_t must have shape \[B, H, K\]"):
        kda_step(state, q[0], q, jnp.zeros((1, 2, 3)), q, jnp.zeros((1, 2)))


# ------------------------------------------------- the inputs' generator (kda_lib.testing)


@pytest.mark.parametrize("partitionable", [True, False])
def test_the_padded_draw_is_jax_random_normal(partitionable):
    """kda_lib.testing.random_normal (random_kda_inputs' draws and the tests', taken from a
    longer flat draw) gives jax.random.normal's numbers at every shape, in float32 and in the
    default dtype under x64 (float64)."""
    from kda_lib.testing import MIN_DRAW, random_normal

    shapes = [(1,), (3, 5), (2, 7, 3, 4), (MIN_DRAW + 1,), (2, 100, 2, 16)]
    with jax.threefry_partitionable(partitionable):
        for i, shape in enumerate(shapes):
            key = jax.random.key(i)
            got = random_normal(key, shape, jnp.float32)
            assert got.dtype == jnp.float32
            np.testing.assert_array_equal(got, jax.random.normal(key, shape, jnp.float32))
            with jax.enable_x64(True):
                got = random_normal(key, shape)
                assert got.dtype == jnp.float64
                np.testing.assert_array_equal(got, jax.random.normal(key, shape))
