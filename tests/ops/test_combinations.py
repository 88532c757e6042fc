"""Values across combinations (issue 75.7): the chunked form at its chunk boundaries with gates
under which the state survives every chunk (a test whose gates erase the state within a chunk
cannot see a boundary mistake; at the default chunk size: tests/ops/test_chunked.py's
test_a_state_that_survives_the_chunks_matches_the_oracle); a NaN at the first token of a
chunk (with the chunk states too); and the bfloat16 and float16 states and pools a caller may
pass, each against the recurrence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda, kda_pool_step, kda_pool_verify, kda_recurrent, kda_step
from kda_lib.testing import assert_close, random_kda_inputs

B, H, K, V = 2, 2, 8, 8
SURVIVING = 1e-3  # gate_scale: a chunk of 64 keeps > 0.1 of the state in every channel


def _inputs(seq_len, seed=0):
    return random_kda_inputs(jax.random.key(seed), B, seq_len, H, K, V, gate="softplus",
                             gate_scale=SURVIVING, with_state=True)  # fmt: skip


# (T, chunk_size): T == C, and T a multiple of C with three chunks. (Rows at 4C and at the
# default chunk size, 64 and 192 tokens, ran the same programs but for sizes; T = 3C at the
# default chunk size, a state surviving each chunk, outputs, final state and gradients and this
# test's boundary check: tests/ops/test_chunked.py::test_a_state_that_survives_the_chunks_...)
BOUNDARIES = [(16, 16), (48, 16)]


@pytest.mark.parametrize(("seq_len", "chunk_size"), BOUNDARIES)
def test_chunk_boundaries_with_a_state_that_survives_each_chunk(x64, seq_len, chunk_size):
    """The chunked form's outputs and final state equal the float64 recurrence at T == C and
    T = 3C; the gates keep > 0.1 of the state across every chunk, and the test can see a
    boundary mistake: dropping the state at the last chunk's first token moves its outputs by
    far more than the tolerance."""
    x = {n: a.astype(jnp.float64) for n, a in _inputs(seq_len).items()}
    chunk = chunk_size
    kept = np.exp(np.asarray(x["g"]).reshape(B, -1, chunk, H, K).sum(axis=2))
    assert kept.min() > 0.1, kept.min()  # the state survives each chunk
    o, state = kda(**x, implementation="chunked", output_final_state=True, chunk_size=chunk)
    o_ref, state_ref = kda_recurrent(**x, output_final_state=True)
    assert o.dtype == jnp.float64
    assert_close(o, o_ref, atol=1e-10, rtol=1e-10, name="outputs")
    assert_close(state, state_ref, atol=1e-10, rtol=1e-10, name="final state")
    last = {n: a[:, seq_len - chunk :] for n, a in x.items() if n != "initial_state"}
    dropped = kda_recurrent(**last)[0]  # the last chunk without the state before it
    assert float(jnp.abs(dropped - o_ref[:, seq_len - chunk :]).max()) > 1e-3


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
@pytest.mark.parametrize("implementation", ["chunked", "auto"])
def test_a_nan_at_a_chunk_s_first_token_spreads_as_in_the_recurrence(implementation, name):
    """A NaN in one channel of the second chunk's first token (T = 48, C = 16) makes exactly the
    outputs and final-state entries non-finite that the recurrence makes non-finite; the first
    chunk stays finite."""
    x = _inputs(48, seed=1)
    where = (0, 16, 1) + ((2,) if x[name].ndim == 4 else ())  # row 0, token C, head 1, ch. 2
    x[name] = x[name].at[where].set(jnp.nan)
    o, state = kda(**x, implementation=implementation, chunk_size=16, output_final_state=True)
    o_ref, state_ref = kda_recurrent(**x, output_final_state=True)
    np.testing.assert_array_equal(np.isfinite(o), np.isfinite(o_ref))
    np.testing.assert_array_equal(np.isfinite(state), np.isfinite(state_ref))
    assert np.isfinite(np.asarray(o[:, :16])).all() and not np.isfinite(np.asarray(o)).all()


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_a_bad_value_at_a_chunk_s_first_token_leaves_the_boundary_before_it(x64, name):
    """A NaN (g: -inf, a full erase) in one channel of the second chunk's first token, with
    the chunk states asked for (T = 48, C = 16, prefix caching), in float64: the chunked form's
    outputs, chunk states and final state are non-finite exactly where the float64 recurrence's
    are and equal it elsewhere; the boundary before the bad token (after token C - 1) stays
    finite."""
    x = {n: jnp.asarray(np.asarray(a, np.float64)) for n, a in _inputs(48, seed=4).items()}
    where = (0, 16, 1) + ((2,) if x[name].ndim == 4 else ())
    x[name] = x[name].at[where].set(-jnp.inf if name == "g" else jnp.nan)
    got, want = (kda(**x, implementation=form, chunk_size=16, output_final_state=True,
                     output_chunk_states=True) for form in ("chunked", "recurrent"))  # fmt: skip
    for field in ("output", "final_state", "chunk_states"):
        a, b = np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b), err_msg=field)
        assert_close(a[np.isfinite(b)], b[np.isfinite(b)], name=field)  # float64's table
    assert np.isfinite(np.asarray(got.chunk_states[:, 0])).all()


def _token(seed=2):
    """Four tokens' inputs in kda's argument order, and a state."""
    x = _inputs(4, seed)
    return {n: x[n] for n in ("q", "k", "v", "g", "beta")}, x["initial_state"]


def _first(x):
    """The first token of each input: kda_step's ``q_t .. beta_t``."""
    return tuple(a[:, 0] for a in x.values())


HALF = [jnp.bfloat16, jnp.float16]


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: jnp.dtype(d).name)
def test_a_half_precision_pool_keeps_its_dtype_and_steps_as_its_values_in_float32(dtype):
    """kda_pool_step and kda_pool_verify on a bfloat16 (float16) pool: the pool keeps its dtype,
    a touched slot holds the float32 step from its values, rounded (one rounding: the dtype's
    relative spacing); untouched slots keep their bits."""
    x, state = _token()
    spacing = 2.0 ** -jnp.finfo(dtype).nmant
    pool = jnp.concatenate([state, -state]).astype(dtype)  # slots 0..3
    slots = jnp.array([3, 0], jnp.int32)
    start = pool[slots].astype(jnp.float32)
    want_state, want_o = kda_step(start, *_first(x))
    new_pool, o = kda_pool_step(jnp.array(pool), slots, *_first(x))
    assert new_pool.dtype == dtype and o.dtype == jnp.float32
    assert_close(o, want_o, atol=1e-6, rtol=1e-6, name="pool step outputs")
    assert_close(new_pool[slots].astype(jnp.float32), want_state.astype(dtype),
                 atol=0, rtol=spacing, name="pool step states")  # fmt: skip
    np.testing.assert_array_equal(np.asarray(new_pool[1:3]), np.asarray(pool[1:3]))
    accepted = jnp.array([4, 2], jnp.int32)
    new_pool, o = kda_pool_verify(jnp.array(pool), slots, *x.values(), accepted)
    ref = kda(**x, initial_state=start, output_token_states=True)
    assert new_pool.dtype == dtype
    assert_close(o, ref.output, atol=1e-5, rtol=1e-5, name="pool verify outputs")
    kept = ref.token_states[jnp.arange(2), accepted - 1].astype(dtype)
    assert_close(new_pool[slots].astype(jnp.float32), kept, atol=1e-6, rtol=spacing,
                 name="pool verify states")  # fmt: skip


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("implementation", ["recurrent", "chunked"])
def test_a_half_precision_initial_state_is_read_as_its_float32_values(implementation, dtype):
    """kda and kda_step take a bfloat16 (float16) state as its values in float32 (the state
    they return is float32): the same results as the state cast to float32 first."""
    x, state = _token(seed=3)
    half = state.astype(dtype)
    o16, s16 = kda(**x, initial_state=half, implementation=implementation, chunk_size=2,
                   output_final_state=True)  # fmt: skip
    o32, s32 = kda(**x, initial_state=half.astype(jnp.float32), implementation=implementation,
                   chunk_size=2, output_final_state=True)  # fmt: skip
    assert s16.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(o16), np.asarray(o32))
    np.testing.assert_array_equal(np.asarray(s16), np.asarray(s32))
    step16, step32 = (kda_step(s, *_first(x)) for s in (half, half.astype(
        jnp.float32)))  # fmt: skip
    assert step16[0].dtype == jnp.float32
    for a, b in zip(step16, step32, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
