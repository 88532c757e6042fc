"""Random KDA inputs and tolerance-aware comparisons for the tests, benchmark and notebooks."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_number
from kda_lib.ops.gating import kda_gate

GATES = ("softplus", "safe", "raw")
SAFE_LOWER_BOUND = -5.0
MIN_DRAW = 1024  # random_normal draws powers of two from this size up
# (atol, rtol) by the dtype of the array under test
DEFAULT_TOLERANCES = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-5, 1e-5),
    "bfloat16": (2e-2, 2e-2),
    "float16": (5e-3, 5e-3),
}
# float32 layer comparisons on a TPU: the layer's float32 forms (the Pallas kernels in six
# bfloat16 passes, XLA's matmuls at "highest", the chip's exp, log and rsqrt) measured up to
# 2.6e-5 apart from each other and from fla's recorded output (v5e, 2026-12-06,
# data/tests/tpu-v5e/), where a CPU keeps them within 1e-5
CHIP_FLOAT32_ATOL = 5e-5


def random_normal(key: jax.Array, shape: tuple[int, ...], dtype=float) -> jax.Array:
    """``jax.random.normal(key, shape, dtype)``, compiled per power-of-two size, not per shape."""
    if not jax.config.jax_threefry_partitionable:
        return jax.random.normal(key, shape, dtype)
    size = math.prod(shape)
    padded = max(MIN_DRAW, 1 << max(size - 1, 0).bit_length())
    flat = np.asarray(jax.random.normal(key, (padded,), dtype))
    return jax.device_put(flat[:size].reshape(shape))  # jnp.asarray would compile per shape


def random_kda_inputs(key: jax.Array, batch: int, seq_len: int, heads: int, key_dim: int,
                      value_dim: int | None = None, *, dtype=jnp.float32, gate: str = "softplus",
                      gate_scale: float = 1.0,
                      with_state: bool = False) -> dict[str, jax.Array]:  # fmt: skip
    """Keyword arguments for :func:`kda_lib.kda` in ``dtype``: q, k unit Gaussians, v (V = K if
    None), beta a sigmoid of one, g from a Gaussian gate input (``a_log = log(linspace(1, 16,
    H))``, ``dt_bias ~ 0.5 N``): ``gate`` "softplus", "safe" (bound -5; times ``gate_scale``)
    or "raw" (with the fused gate's arguments). ``with_state``: ``initial_state ~ 0.5 N``."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    value_dim = key_dim if value_dim is None else value_dim
    ks = jax.random.split(key, 7)
    shape = (batch, seq_len, heads, key_dim)
    draws = dict(q=random_normal(ks[0], shape, jnp.float32),
                 k=random_normal(ks[1], shape, jnp.float32),
                 v=random_normal(ks[2], (batch, seq_len, heads, value_dim), jnp.float32),
                 f=random_normal(ks[3], shape, jnp.float32),
                 # these two in the default float dtype (float64 under x64)
                 dt_bias=random_normal(ks[4], (heads * key_dim,)),
                 beta=random_normal(ks[5], (batch, seq_len, heads)))  # fmt: skip
    if with_state:
        draws["state"] = random_normal(ks[6], (batch, heads, key_dim, value_dim), jnp.float32)
    out = _inputs_from_draws(draws, dtype=jnp.dtype(dtype), gate=gate, gate_scale=gate_scale)
    if gate == "raw":
        out.update(lower_bound=SAFE_LOWER_BOUND, use_gate_in_kernel=True)
    return out


@functools.partial(jax.jit, static_argnames=("dtype", "gate", "gate_scale"))
def _inputs_from_draws(draws: dict, *, dtype, gate: str, gate_scale: float) -> dict:
    q, k = (draws[n] / jnp.linalg.norm(draws[n], axis=-1, keepdims=True) for n in ("q", "k"))
    a_log = jnp.log(jnp.linspace(1.0, 16.0, draws["q"].shape[2]))
    dt_bias = draws["dt_bias"] * 0.5
    g = draws["f"]
    if gate != "raw":
        lower_bound = None if gate == "softplus" else SAFE_LOWER_BOUND
        g = kda_gate(g, a_log, dt_bias, lower_bound=lower_bound) * gate_scale
    out = dict(q=q, k=k, v=draws["v"], g=g, beta=jax.nn.sigmoid(draws["beta"]))
    out = {n: x.astype(dtype) for n, x in out.items()}
    if "state" in draws:
        out["initial_state"] = 0.5 * draws["state"]
    if gate == "raw":
        out.update(a_log=a_log, dt_bias=dt_bias)
    return out


def _as_f64(x) -> np.ndarray:
    x = np.asarray(x)  # via float32: numpy cannot cast bfloat16 to float64 on every version
    small = x.dtype.kind != "f" or x.itemsize < 4
    return (x.astype(np.float32) if small else x).astype(np.float64)


def assert_close(actual, expected, *, atol: float | None = None, rtol: float | None = None,
                 name: str = "array") -> float:  # fmt: skip
    """Assert ``|actual - expected| <= atol + rtol * |expected|``, equal shapes, finite
    ``actual``; return the max abs error. Defaults: :data:`DEFAULT_TOLERANCES` by dtype."""
    dtype = actual.dtype if hasattr(actual, "dtype") else np.asarray(actual).dtype
    # the dtype as given, not jax's canonical one (float32 outside x64): float64 stays float64
    default = DEFAULT_TOLERANCES.get(np.dtype(dtype).name, DEFAULT_TOLERANCES["float32"])
    atol = default[0] if atol is None else atol
    rtol = default[1] if rtol is None else rtol
    a, e = _as_f64(actual), _as_f64(expected)
    if not np.isfinite(a).all():
        raise AssertionError(f"{name}: {np.size(a) - np.isfinite(a).sum()} non-finite values")
    l2 = f"relative L2 {relative_l2(a, e):.3g}" if a.shape == e.shape else "shapes differ"
    np.testing.assert_allclose(a, e, rtol, atol, strict=True, err_msg=f"{name}: {l2}")
    return float(np.abs(a - e).max()) if a.size else 0.0


def float32_tolerance(atol: float, rtol: float) -> dict:
    """``dict(atol=, rtol=)`` for a float32 comparison: as given on a CPU (or GPU); on a TPU
    ``atol`` at least :data:`CHIP_FLOAT32_ATOL`, ``rtol`` unchanged."""
    atol, rtol = (check_number(n, v, minimum=0.0) for n, v in (("atol", atol), ("rtol", rtol)))
    floor = CHIP_FLOAT32_ATOL if jax.default_backend() == "tpu" else 0.0
    return dict(atol=max(atol, floor), rtol=rtol)


def relative_l2(actual, expected) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (``||actual||`` when it is zero)."""
    a, e = _as_f64(actual), _as_f64(expected)
    denom, diff = np.linalg.norm(e), np.linalg.norm(a - e)
    return float(diff / denom) if denom > 0 else float(diff)


def cast_inputs(inputs: dict, dtype) -> dict:
    """Every array of an input dict cast to ``dtype``; other entries kept."""
    return {n: x.astype(dtype) if hasattr(x, "astype") else x for n, x in inputs.items()}
