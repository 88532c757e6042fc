"""kda_chunked against the float64 recurrence: outputs, final states and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kda_lib import kda_chunked, kda_recurrent
from kda_lib.chunked import unit_lower_inverse
from kda_lib.testing import assert_close, cast_inputs, random_kda_inputs, relative_l2

NAMES = ("q", "k", "v", "g", "beta")
SHAPES = [  # (B, H, K, V)
    (1, 1, 16, 16),
    (2, 3, 32, 8),
    (1, 2, 8, 24),
]


def _loss_and_grads(fn, inputs, cotangents, wrt):
    def loss(diff):
        o, s = fn(**{**inputs, **diff}, output_final_state=True)
        return jnp.sum(o * cotangents["o"]) + jnp.sum(s * cotangents["s"])

    return jax.jit(jax.grad(loss))({n: inputs[n] for n in wrt})


def _cotangents(key, inputs):
    b, t, h, k = inputs["q"].shape
    v = inputs["v"].shape[-1]
    k1, k2 = jax.random.split(key)
    dtype = inputs["q"].dtype
    return {
        "o": jax.random.normal(k1, (b, t, h, v), dtype),
        "s": jax.random.normal(k2, (b, h, k, v), dtype),
    }


@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 200, 1000])
@pytest.mark.parametrize("gate", ["softplus", "safe"])
def test_chunked_matches_float64_oracle(x64, seq_len, gate):
    batch, heads, key_dim, value_dim = SHAPES[seq_len % len(SHAPES)]
    inputs = cast_inputs(
        random_kda_inputs(
            jax.random.key(seq_len),
            batch,
            seq_len,
            heads,
            key_dim,
            value_dim,
            gate=gate,
            with_state=seq_len % 2 == 1,
        ),
        jnp.float64,
    )
    o_ref, s_ref = kda_recurrent(**inputs, output_final_state=True)
    for scan in ("sequential", "associative"):
        o, s = kda_chunked(**inputs, output_final_state=True, scan=scan)
        assert o.dtype == jnp.float64
        assert_close(o, o_ref, atol=1e-11, rtol=1e-9, name=f"o ({scan})")
        assert_close(s, s_ref, atol=1e-11, rtol=1e-9, name=f"state ({scan})")


@pytest.mark.parametrize("seq_len,with_state", [(1, True), (65, False), (200, True)])
def test_chunked_gradients_match_oracle(x64, seq_len, with_state):
    inputs = cast_inputs(
        random_kda_inputs(jax.random.key(7), 2, seq_len, 2, 16, 8, with_state=with_state),
        jnp.float64,
    )
    cot = _cotangents(jax.random.key(8), inputs)
    wrt = NAMES + (("initial_state",) if with_state else ())
    ref = _loss_and_grads(kda_recurrent, inputs, cot, wrt)
    for scan in ("sequential", "associative"):
        got = _loss_and_grads(functools.partial(kda_chunked, scan=scan), inputs, cot, wrt)
        for name in wrt:
            assert_close(got[name], ref[name], atol=1e-10, rtol=1e-8, name=f"d{name} ({scan})")


def _segment_cases(seq_len):
    ids = np.ones((2, seq_len), np.int32)
    # row 0: boundaries inside a chunk, exactly at chunk edges (64, 128), padding in between
    ids[0, 40:64] = 2
    ids[0, 64:128] = 3
    ids[0, 128:131] = 0
    ids[0, 131:190] = 5
    ids[0, 190:] = 0
    # row 1: leading padding, one long document, a short one at the end
    ids[1, :7] = 0
    ids[1, 7:180] = 9
    ids[1, 180:] = 4
    return jnp.asarray(ids)


def test_chunked_segments_match_oracle(x64):
    seq_len = 200
    inputs = cast_inputs(
        random_kda_inputs(jax.random.key(3), 2, seq_len, 2, 16, 8, with_state=True), jnp.float64
    )
    ids = _segment_cases(seq_len)
    o_ref, s_ref = kda_recurrent(**inputs, output_final_state=True, segment_ids=ids)
    cot = _cotangents(jax.random.key(4), inputs)
    ref = _loss_and_grads(
        functools.partial(kda_recurrent, segment_ids=ids), inputs, cot, NAMES + ("initial_state",)
    )
    for scan in ("sequential", "associative"):
        fn = functools.partial(kda_chunked, segment_ids=ids, scan=scan)
        o, s = jax.jit(lambda x, fn=fn: fn(**x, output_final_state=True))(inputs)
        assert_close(o, o_ref, atol=1e-11, rtol=1e-9, name="o")
        assert_close(s, s_ref, atol=1e-11, rtol=1e-9, name="state")
        assert np.all(np.asarray(o)[np.asarray(ids) == 0] == 0)
        got = _loss_and_grads(fn, inputs, cot, NAMES + ("initial_state",))
        for name in got:
            assert_close(got[name], ref[name], atol=1e-10, rtol=1e-8, name=f"d{name}")


def test_packed_documents_equal_separate_runs():
    """Two documents packed in one row give exactly what each gives alone."""
    inputs = random_kda_inputs(jax.random.key(5), 1, 150, 2, 16, 16)
    ids = jnp.asarray(np.r_[np.full(70, 1), np.full(80, 2)][None], jnp.int32)
    run = jax.jit(lambda x, ids=None: kda_chunked(**x, segment_ids=ids, output_final_state=True))
    o_packed, s_packed = run(inputs, ids)
    first = {n: x[:, :70] for n, x in inputs.items()}
    second = {n: x[:, 70:] for n, x in inputs.items()}
    assert_close(o_packed[:, :70], run(first)[0], atol=2e-6, rtol=1e-5)
    o2, s2 = run(second)
    assert_close(o_packed[:, 70:], o2, atol=2e-6, rtol=1e-5)
    assert_close(s_packed, s2, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("seq_len", [64, 300])
def test_float32_chunked_close_to_float64_oracle(seq_len):
    inputs = random_kda_inputs(jax.random.key(11), 2, seq_len, 2, 32, 32, with_state=True)
    o, s = kda_chunked(**inputs, output_final_state=True)
    with jax.enable_x64(True):
        o_ref, s_ref = kda_recurrent(**cast_inputs(inputs, jnp.float64), output_final_state=True)
    assert o.dtype == jnp.float32 and s.dtype == jnp.float32
    assert_close(o, o_ref, atol=1e-5, rtol=1e-4)
    assert_close(s, s_ref, atol=1e-5, rtol=1e-4)


def test_bf16_inputs_float32_accumulation():
    inputs = random_kda_inputs(jax.random.key(12), 1, 256, 2, 32, 32, with_state=True)
    bf16 = {n: x if n == "initial_state" else x.astype(jnp.bfloat16) for n, x in inputs.items()}
    # "highest": every matmul in float32, the point here (the default, "input", feeds bf16
    # operands to the matmuls: tests/test_precision.py)
    o, s = kda_chunked(**bf16, output_final_state=True, precision="highest")
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    # reference: the same bf16-rounded inputs, computed in float32
    o_ref, s_ref = kda_recurrent(**cast_inputs(bf16, jnp.float32), output_final_state=True)
    assert relative_l2(o, o_ref) < 1e-2
    assert_close(s, s_ref, atol=1e-4, rtol=1e-4)
    grads = jax.jit(
        jax.grad(lambda x: jnp.sum(kda_chunked(**{**bf16, **x})[0].astype(jnp.float32)))
    )({n: bf16[n] for n in NAMES})
    for name, grad in grads.items():
        assert grad.dtype == jnp.bfloat16 and np.isfinite(np.asarray(grad, np.float32)).all(), name


@pytest.mark.parametrize("case", ["at_lower_bound", "huge_a_log"])
def test_saturated_gates_are_finite_and_exact(x64, case):
    inputs = cast_inputs(
        random_kda_inputs(jax.random.key(13), 1, 300, 2, 16, 16, with_state=True), jnp.float64
    )
    if case == "at_lower_bound":
        inputs["g"] = jnp.full_like(inputs["g"], -5.0)
    else:  # A = exp(20): softplus gates of order -1e8
        inputs["g"] = inputs["g"] * jnp.exp(20.0)
    o_ref, s_ref = kda_recurrent(**inputs, output_final_state=True)
    for dtype in (jnp.float64, jnp.float32):
        cast = cast_inputs(inputs, dtype)
        o, s = jax.jit(lambda x: kda_chunked(**x, output_final_state=True))(cast)
        tol = 1e-10 if dtype == jnp.float64 else 1e-5
        assert_close(o, o_ref, atol=tol, rtol=tol * 10)
        assert_close(s, s_ref, atol=tol, rtol=tol * 10)
        grads = jax.jit(
            jax.grad(
                lambda x, cast=cast: jnp.sum(
                    kda_chunked(**{**cast, **x}, output_final_state=True)[1]
                )
            )
        )({n: cast[n] for n in NAMES + ("initial_state",)})
        for name, grad in grads.items():
            assert np.isfinite(np.asarray(grad)).all(), name


_PREFIX_INPUTS = random_kda_inputs(jax.random.key(21), 1, 160, 2, 16, 16)
_prefix_fn = jax.jit(lambda x: kda_chunked(**x)[0])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.integers(1, 159), seed=st.integers(0, 2**16), which=st.sampled_from(NAMES))
def test_prefix_invariance(prefix, seed, which):
    """Changing any input at t >= P leaves every output at t < P unchanged."""
    base = _PREFIX_INPUTS
    noise = jax.random.uniform(jax.random.key(seed), base[which].shape, minval=0.0, maxval=1.0)
    changed = {
        "g": -noise * 5.0,
        "beta": noise,
        "q": noise - 0.5,
        "k": noise - 0.5,
        "v": 10 * noise,
    }[which]
    mask = (jnp.arange(160) >= prefix).reshape((1, 160) + (1,) * (base[which].ndim - 2))
    edited = {**base, which: jnp.where(mask, changed, base[which])}
    before, after = _prefix_fn(base), _prefix_fn(edited)
    assert_close(after[:, :prefix], before[:, :prefix], atol=1e-6, rtol=1e-6)


def test_unit_lower_inverse_exact(x64):
    a = jnp.tril(jax.random.normal(jax.random.key(0), (3, 64, 64), jnp.float64) * 0.3, -1)
    inv = unit_lower_inverse(a)
    eye = np.eye(64)
    assert_close(
        np.asarray(inv) @ (eye + np.asarray(a)),
        np.broadcast_to(eye, (3, 64, 64)),
        atol=1e-10,
        rtol=0,
    )
    assert_close(
        unit_lower_inverse(a[:, :8, :8]) @ (eye[:8][:, :8] + a[:, :8, :8]),
        np.broadcast_to(eye[:8, :8], (3, 8, 8)),
        atol=1e-12,
        rtol=0,
    )


def test_chunk_size_variants(x64):
    inputs = cast_inputs(random_kda_inputs(jax.random.key(31), 1, 100, 2, 8, 8), jnp.float64)
    o_ref = kda_recurrent(**inputs)[0]
    for chunk_size in (1, 2, 8, 16, 32, 128):
        assert_close(
            jax.jit(lambda x, c=chunk_size: kda_chunked(**x, chunk_size=c)[0])(inputs),
            o_ref,
            atol=1e-11,
            rtol=1e-9,
            name=f"chunk_size={chunk_size}",
        )


@pytest.mark.parametrize("fn", [kda_chunked, kda_recurrent])
def test_bad_inputs_name_the_argument(fn):
    ok = random_kda_inputs(jax.random.key(0), 2, 10, 3, 4, 5)

    def call(**changes):
        return fn(**{**ok, **changes})

    with pytest.raises(ValueError, match=r"q must have shape \[B, T, H, K\]"):
        call(q=ok["q"][0])
    with pytest.raises(ValueError, match=r"k must have shape"):
        call(k=ok["k"][:, :, :2])
    with pytest.raises(ValueError, match=r"v must have shape \[B, T, H, V\]"):
        call(v=ok["v"][:, :9])
    with pytest.raises(ValueError, match=r"g must have shape"):
        call(g=ok["g"][:1])
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, H\]"):
        call(beta=ok["beta"][..., None])
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        call(beta=ok["beta"] + 1.0)
    with pytest.raises(ValueError, match=r"g is a log-space decay and must be <= 0"):
        call(g=-ok["g"])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[B, H, K, V\]"):
        call(initial_state=jnp.zeros((2, 3, 5, 4)))
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\]"):
        call(segment_ids=jnp.ones((2, 9), jnp.int32))
    with pytest.raises(ValueError, match="uses id 1 for two separate runs"):
        call(segment_ids=jnp.asarray([[1] * 4 + [2] * 3 + [1] * 3] * 2, jnp.int32))
    with pytest.raises(ValueError, match="uses id 3 for two separate runs"):
        call(segment_ids=jnp.asarray([[3] * 4 + [0] * 3 + [3] * 3] * 2, jnp.int32))
    with pytest.raises(ValueError, match="segment_ids must be an integer array"):
        call(segment_ids=jnp.ones((2, 10)))
    # allow_neg_eigval widens the beta range to [0, 2]
    call(beta=ok["beta"] * 2, allow_neg_eigval=True)
    if fn is kda_chunked:
        with pytest.raises(ValueError, match="chunk_size must be a power of two"):
            call(chunk_size=48)
        with pytest.raises(ValueError, match="scan must be"):
            call(scan="parallel")


@pytest.mark.parametrize("bad", ["none", "nan_beta", "inf_v", "nan_q", "neg_inf_g", "inf_state"])
def test_isolate_non_finite_shortcut_equals_segments(bad):
    """kda_chunked's cond-guarded isolation gives isolate_non_finite's values, flags, gradients."""
    from kda_lib.chunked import _isolate_non_finite
    from kda_lib.segments import isolate_non_finite

    x = random_kda_inputs(jax.random.key(41), 2, 12, 2, 4, 3, with_state=True)
    x["k"] = x["k"].at[0, 3, 1, 2].set(0.0)  # an exact zero at a token that is replaced
    where = {
        "nan_beta": ("beta", (0, 3, 1), jnp.nan),
        "inf_v": ("v", (1, 5, 0, 2), jnp.inf),
        "nan_q": ("q", (0, 7, 1, 0), jnp.nan),
        "neg_inf_g": ("g", (1, 2, 0, 1), -jnp.inf),
        "inf_state": ("initial_state", (0, 1, 2, 1), jnp.inf),
    }.get(bad)
    if where is not None:
        name, index, value = where
        x[name] = x[name].at[index].set(value)
    ids = jnp.asarray(np.r_[np.full(5, 1), np.full(7, 2)][None].repeat(2, 0), jnp.int32)
    args = tuple(x[n] for n in NAMES + ("initial_state",))

    def total(fn, *a):
        *arrays, flags = fn(*a, ids)
        finite = [jnp.where(jnp.isfinite(y), y, 0.0) for y in arrays]
        return sum(jnp.sum(y * (i + 1.0)) for i, y in enumerate(finite)), (arrays, flags)

    for fn in (_isolate_non_finite, isolate_non_finite):
        (_, out), grads = jax.jit(
            jax.value_and_grad(functools.partial(total, fn), (0, 1, 2, 3, 4, 5), has_aux=True)
        )(*args)
        if fn is _isolate_non_finite:
            got = (out, grads)
        else:
            want = (out, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
