import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import init_a_log, init_dt_bias, kda, kda_gate
from kda_lib.testing import assert_close


def _np_softplus(x):
    return np.logaddexp(0.0, x)


@pytest.mark.parametrize("lower_bound", [None, -5.0, -1.0])
def test_gate_matches_formula(lower_bound):
    f = jax.random.normal(jax.random.key(0), (2, 5, 3, 4)) * 3
    a_log = jnp.array([0.0, 1.0, 2.5])
    dt_bias = jax.random.normal(jax.random.key(1), (12,))
    g = kda_gate(f, a_log, dt_bias, lower_bound=lower_bound)
    assert g.dtype == jnp.float32 and g.shape == f.shape
    x = np.asarray(f, np.float64) + np.asarray(dt_bias, np.float64).reshape(3, 4)
    rate = np.exp(np.asarray(a_log, np.float64))[:, None]
    expected = (
        -rate * _np_softplus(x) if lower_bound is None else lower_bound / (1 + np.exp(-rate * x))
    )
    assert_close(g, expected, atol=1e-5, rtol=1e-5)
    assert (np.asarray(g) <= 0).all()
    if lower_bound is not None:
        assert (np.asarray(g) >= lower_bound).all()


def test_gate_accepts_head_major_bias_and_bf16():
    f = jax.random.normal(jax.random.key(0), (1, 3, 2, 4)).astype(jnp.bfloat16)
    a_log = jnp.zeros(2)
    bias = jnp.arange(8.0) / 8
    g1 = kda_gate(f, a_log, bias)
    g2 = kda_gate(f, a_log, bias.reshape(2, 4))
    assert g1.dtype == jnp.float32
    np.testing.assert_array_equal(g1, g2)


@pytest.mark.parametrize("bad", [0.0, -5.5, 1.0, "x"])
def test_gate_rejects_lower_bound_out_of_range(bad):
    with pytest.raises(ValueError, match=r"lower_bound must be a float in \[-5, 0\)"):
        kda_gate(jnp.zeros((1, 1, 1, 2)), jnp.zeros(1), None, lower_bound=bad)


def test_gate_shape_errors():
    with pytest.raises(ValueError, match="a_log must have shape"):
        kda_gate(jnp.zeros((1, 2, 3, 4)), jnp.zeros(2), None)
    with pytest.raises(ValueError, match="dt_bias must have shape"):
        kda_gate(jnp.zeros((1, 2, 3, 4)), jnp.zeros(3), jnp.zeros(11))
    with pytest.raises(ValueError, match=r"f must have shape \[B, T, H, K\]"):
        kda_gate(jnp.zeros((2, 3, 4)), jnp.zeros(3), None)


def test_inits():
    a_log = init_a_log(jax.random.key(0), 1000)
    a = np.exp(np.asarray(a_log))
    assert a_log.dtype == jnp.float32
    assert a.min() >= 1.0 and a.max() <= 16.0 and a.std() > 3.0  # spread over U(1, 16)
    np.testing.assert_array_equal(init_a_log(jax.random.key(0), 4, safe_gate=True), np.zeros(4))
    dt_bias = init_dt_bias(jax.random.key(1), 8, 128)
    assert dt_bias.shape == (8 * 128,) and dt_bias.dtype == jnp.float32
    dt = _np_softplus(np.asarray(dt_bias, np.float64))
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 1e-1 * 1.001
    # log-uniform: the median dt sits near the geometric mean 1e-2
    assert 5e-3 < np.median(dt) < 2e-2
    floored = _np_softplus(
        np.asarray(init_dt_bias(jax.random.key(2), 1, 64, dt_min=1e-6, dt_max=1e-5), np.float64)
    )
    np.testing.assert_allclose(floored, 1e-4, rtol=1e-3)


def test_an_overflowing_rate_times_a_zero_input_is_not_nan():
    """exp(A_log) overflows float32 from A_log = 88.8 (a checkpoint may hold it): where
    f + dt_bias == 0 the safe gate is lower_bound * sigmoid(0), the softplus gate is never NaN
    (-inf: full decay), and kda() with the in-kernel gate gives finite outputs."""
    f = jnp.array([0.0, 1.0, -1.0, 0.0]).reshape(1, 1, 2, 2)
    a_log = jnp.array([89.0, 100.0])
    safe = np.asarray(kda_gate(f, a_log, None, lower_bound=-5.0))
    np.testing.assert_array_equal(safe.ravel(), [-2.5, -5.0, 0.0, -2.5])
    assert not np.isnan(np.asarray(kda_gate(f, a_log, None))).any()
    q = k = v = jnp.ones((1, 1, 2, 2))
    o, _ = kda(q, k, v, f, jnp.full((1, 1, 2), 0.5), a_log=a_log, lower_bound=-5.0,
               use_gate_in_kernel=True)  # fmt: skip
    assert np.isfinite(np.asarray(o)).all()
