"""The oracle itself, checked against an independent numpy loop (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda, kda_pool_step, kda_pool_verify, kda_recurrent, kda_step
from kda_lib.testing import assert_close, random_kda_inputs


def numpy_kda(q, k, v, g, beta, scale, state0, segment_ids):
    """Textbook loop over batch, value head and time, in float64 (value head h reads q/k head
    ``h // (HV // H)``). Returns ``(o, final state, the state after every token)``."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    batch, seq_len, heads, _ = v.shape
    groups = heads // q.shape[2]
    out = np.zeros(v.shape)
    final = np.array(state0, np.float64)
    states = np.zeros((batch, seq_len, *final.shape[1:]))
    for b in range(batch):
        ids = segment_ids[b]
        nonzero = ids[ids != 0]
        for h in range(heads):
            state = final[b, h].copy()
            prev = nonzero[0] if nonzero.size else 0
            for t in range(seq_len):
                if ids[t] != 0:
                    if ids[t] != prev:
                        state[:] = 0
                        prev = ids[t]
                    q_t, k_t = q[b, t, h // groups], k[b, t, h // groups]
                    state = state * np.exp(g[b, t, h])[:, None]
                    state = state + beta[b, t, h] * np.outer(k_t, v[b, t, h] - k_t @ state)
                    out[b, t, h] = scale * q_t @ state
                states[b, t, h] = state
            final[b, h] = state
    return out, final, states


@pytest.mark.parametrize("with_segments", [False, True])
def test_recurrent_matches_numpy_loop(x64, with_segments):
    inputs = random_kda_inputs(
        jax.random.key(0), 2, 37, 4, 8, 5, dtype=jnp.float64, with_state=True
    )
    inputs["q"], inputs["k"] = inputs["q"][:, :, :2], inputs["k"][:, :, :2]  # HV = 2 H
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
    o_np, s_np, _ = numpy_kda(
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


@pytest.mark.tpu
def test_step_by_step_decoding_equals_recurrence():
    """kda_step token by token, grouped value heads (HV = 2 H), equals kda_recurrent."""
    inputs = random_kda_inputs(jax.random.key(1), 2, 9, 6, 8, 4, with_state=True)
    inputs["q"], inputs["k"] = inputs["q"][:, :, :3], inputs["k"][:, :, :3]
    o, s = kda_recurrent(**inputs, output_final_state=True)
    state = inputs["initial_state"]
    outs = []
    tokens = [np.asarray(inputs[n]) for n in ("q", "k", "v", "g", "beta")]  # host slices below
    for t in range(9):
        state, o_t = kda_step(state, *(a[:, t] for a in tokens))
        outs.append(o_t)
    assert state.dtype == jnp.float32
    assert_close(jnp.stack(outs, 1), o, atol=1e-6, rtol=1e-6)
    assert_close(state, s, atol=1e-6, rtol=1e-6)


# T a multiple of the chunk (4) in float32, not in bfloat16
@pytest.mark.tpu
@pytest.mark.parametrize("dtype, seq_len", [(jnp.float32, 8), (jnp.bfloat16, 5)])
def test_serving_surface_matches_the_float64_loop(dtype, seq_len):
    """Every serving entry at combined settings: the default scale with K != V, grouped value
    heads (HV = 2 H), an initial state per row, accepted counts 0, 1 and all. kda_step,
    kda_pool_step, kda_pool_verify and kda's token and chunk states (chunk 4) against the
    float64 loop on the same (rounded) inputs; outputs in the inputs' dtype, states float32."""
    b, h, hv, k, v, c = 3, 2, 4, 8, 4, 4
    rng = np.random.default_rng(seq_len)
    qk = rng.normal(size=(2, b, seq_len, h, k))
    qk /= np.linalg.norm(qk, axis=-1, keepdims=True)
    x = dict(q=qk[0], k=qk[1], v=rng.normal(size=(b, seq_len, hv, v)),
             g=-rng.uniform(0, 0.5, (b, seq_len, hv, k)),
             beta=rng.uniform(size=(b, seq_len, hv)))  # fmt: skip
    x = {n: jnp.asarray(a, dtype) for n, a in x.items()}
    state0 = rng.normal(size=(b, hv, k, v)).astype(np.float32)
    ones = np.ones((b, seq_len), int)
    o_ref, _, s_ref = numpy_kda(*x.values(), k**-0.5, state0, ones)  # the default scale
    o_tol = dict(atol=1e-5, rtol=1e-5) if dtype == jnp.float32 else dict(atol=2e-2, rtol=2e-2)

    def check(o, o_want, states, s_want, what, s_tol=1e-5):
        assert o.dtype == dtype and states.dtype == jnp.float32, what
        assert_close(o, o_want, **o_tol, name=f"{what} outputs")
        assert_close(states, s_want, atol=s_tol, rtol=s_tol, name=f"{what} states")

    state, outs = jnp.asarray(state0), []
    tokens = [np.asarray(a) for a in x.values()]  # sliced on the host: no program per token
    for t in range(seq_len):
        state, o_t = kda_step(state, *(a[:, t] for a in tokens))
        outs.append(o_t)
    check(jnp.stack(outs, 1), o_ref, state, s_ref[:, -1], "kda_step")
    slots = np.array([4, 0, 2])
    pool = np.full((6, hv, k, v), 1e30, np.float32)
    pool[slots] = state0
    pool, slots = jnp.asarray(pool), jnp.asarray(slots)
    new_pool, o = kda_pool_step(jnp.array(pool), slots, *(a[:, 0] for a in tokens))
    check(o, o_ref[:, 0], new_pool[slots], s_ref[:, 0], "kda_pool_step")
    counts = np.array([0, 1, seq_len])
    new_pool, o = kda_pool_verify(pool, slots, *x.values(), jnp.asarray(counts))
    kept = np.stack([state0[0], s_ref[1, 0], s_ref[2, -1]])
    check(o, o_ref, new_pool[slots], kept, "kda_pool_verify")
    assert (np.asarray(new_pool)[[1, 3, 5]] == 1e30).all()
    result = kda(**x, initial_state=jnp.asarray(state0), output_token_states=True)
    check(result.output, o_ref, result.token_states, s_ref, "token_states")
    for implementation in ("chunked", "recurrent"):
        result = kda(**x, initial_state=jnp.asarray(state0), output_chunk_states=True,
                     chunk_size=c, implementation=implementation)  # fmt: skip
        assert result.chunk_states.shape[1] == seq_len // c
        low = implementation == "chunked" and dtype == jnp.bfloat16  # bf16 matmuls
        check(result.output, o_ref, result.chunk_states, s_ref[:, c - 1 :: c][:, : seq_len // c],
              f"{implementation} chunk_states", s_tol=2e-3 if low else 1e-5)  # fmt: skip


def test_output_dtype_follows_q_and_state_is_float32():
    inputs = random_kda_inputs(jax.random.key(2), 1, 5, 2, 4, 4, dtype=jnp.bfloat16)
    o, s = kda_recurrent(**inputs, output_final_state=True)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    o, s = kda_recurrent(**inputs)
    assert s is None


def test_step_errors():
    state = jnp.zeros((1, 2, 4, 3))
    q = jnp.zeros((1, 2, 4))
    with pytest.raises(ValueError, match=r"state must have shape \[B, HV, K, V\]"):
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
