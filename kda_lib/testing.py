"""Helpers shared by the tests, the benchmark and the notebooks: random KDA inputs and
tolerance-aware comparisons."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.ops.gating import kda_gate

GATES = ("softplus", "safe", "raw")
SAFE_LOWER_BOUND = -5.0


def _unit(x: jax.Array) -> jax.Array:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


# the padded sizes :func:`random_normal` draws at: powers of two from this one up
MIN_DRAW = 1024


def random_normal(key: jax.Array, shape: tuple[int, ...], dtype=float) -> jax.Array:
    """``jax.random.normal(key, shape, dtype)``: the same numbers, compiled once per padded
    size instead of once per shape (about 0.1 to 0.3 s each on CPU: most of what a test's
    inputs cost at a new shape).

    With the partitionable threefry (JAX's default) the draw for ``shape`` is the draw for the
    flat size, reshaped, and a longer flat draw begins with it: this draws ``n = prod(shape)``
    numbers as the first ``n`` of a power-of-two draw (at least MIN_DRAW). With the
    non-partitionable threefry (the notebooks' setting) a longer draw is other numbers, so the
    draw is made at ``shape`` itself. ``tests/ops/test_reference.py`` checks the equality.
    """
    if not jax.config.jax_threefry_partitionable:
        return jax.random.normal(key, shape, dtype)
    size = math.prod(shape)
    padded = max(MIN_DRAW, 1 << max(size - 1, 0).bit_length())
    flat = np.asarray(jax.random.normal(key, (padded,), dtype))
    # device_put, not jnp.asarray: the latter compiles a small program per shape
    return jax.device_put(flat[:size].reshape(shape))


def random_kda_inputs(
    key: jax.Array,
    batch: int,
    seq_len: int,
    heads: int,
    key_dim: int,
    value_dim: int | None = None,
    *,
    dtype=jnp.float32,
    gate: str = "softplus",
    gate_scale: float = 1.0,
    with_state: bool = False,
) -> dict[str, jax.Array]:
    """Random inputs for :func:`kda_lib.kda` and friends, the one generator of the project.

    q/k ``[B, T, H, K]`` are L2-normalised Gaussians, v ``[B, T, H, V]`` Gaussian (V defaults
    to K), beta ``[B, T, H]`` = sigmoid of a Gaussian. The gate input f is Gaussian; per-head
    ``a_log = log(linspace(1, 16, H))`` and ``dt_bias ~ 0.5 N(0, 1)`` ``[H * K]``.

    Args:
      gate: ``"softplus"`` or ``"safe"`` (lower bound -5): ``g`` is the activated log-space
        decay ``[B, T, H, K]`` (times ``gate_scale``); ``"raw"``: ``g`` is the raw gate input
        and the dict also holds ``a_log``, ``dt_bias``, ``lower_bound`` (-5) and
        ``use_gate_in_kernel=True`` for the fused gate.
      with_state: add ``initial_state`` ``[B, H, K, V]`` float32 (0.5 N(0, 1)).
      dtype: dtype of q, k, v, g, beta (the state and fused-gate parameters stay float32).

    Returns:
      ``dict(q, k, v, g, beta[, initial_state][, a_log, dt_bias, lower_bound,
      use_gate_in_kernel])``.
    """
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    value_dim = key_dim if value_dim is None else value_dim
    ks = jax.random.split(key, 7)
    shape = (batch, seq_len, heads, key_dim)
    draws = dict(
        q=random_normal(ks[0], shape, jnp.float32),
        k=random_normal(ks[1], shape, jnp.float32),
        v=random_normal(ks[2], (batch, seq_len, heads, value_dim), jnp.float32),
        f=random_normal(ks[3], shape, jnp.float32),
        # these two in the default float dtype (float64 under x64), as they always were
        dt_bias=random_normal(ks[4], (heads * key_dim,)),
        beta=random_normal(ks[5], (batch, seq_len, heads)),
    )
    if with_state:
        draws["state"] = random_normal(ks[6], (batch, heads, key_dim, value_dim), jnp.float32)
    out = _inputs_from_draws(draws, dtype=jnp.dtype(dtype), gate=gate, gate_scale=gate_scale)
    if gate == "raw":
        out.update(lower_bound=SAFE_LOWER_BOUND, use_gate_in_kernel=True)
    return out


@functools.partial(jax.jit, static_argnames=("dtype", "gate", "gate_scale"))
def _inputs_from_draws(draws: dict, *, dtype, gate: str, gate_scale: float) -> dict:
    """:func:`random_kda_inputs` from its Gaussian draws, as one program: eagerly, each of its
    dozen small ops compiles on its own at every new shape."""
    heads = draws["q"].shape[2]
    q, k = (_unit(draws[n]) for n in ("q", "k"))
    a_log = jnp.log(jnp.linspace(1.0, 16.0, heads))
    dt_bias = draws["dt_bias"] * 0.5
    beta = jax.nn.sigmoid(draws["beta"])
    if gate == "raw":
        g = draws["f"]
    else:
        lower_bound = None if gate == "softplus" else SAFE_LOWER_BOUND
        g = kda_gate(draws["f"], a_log, dt_bias, lower_bound=lower_bound) * gate_scale
    out = {n: x.astype(dtype) for n, x in dict(q=q, k=k, v=draws["v"], g=g, beta=beta).items()}
    if "state" in draws:
        out["initial_state"] = 0.5 * draws["state"]
    if gate == "raw":
        out.update(a_log=a_log, dt_bias=dt_bias)
    return out


# (atol, rtol) by the dtype of the array under test
DEFAULT_TOLERANCES = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-5, 1e-5),
    "bfloat16": (2e-2, 2e-2),
    "float16": (5e-3, 5e-3),
}


def _as_f64(x) -> np.ndarray:
    # via float32 first: numpy cannot cast bfloat16 straight to float64 on every version
    x = np.asarray(x)
    return (
        x.astype(np.float64)
        if x.dtype.kind == "f" and x.itemsize >= 4
        else x.astype(np.float32).astype(np.float64)
    )


def tolerances(dtype) -> tuple[float, float]:
    """Default ``(atol, rtol)`` for arrays of ``dtype``."""
    return DEFAULT_TOLERANCES.get(jnp.dtype(dtype).name, DEFAULT_TOLERANCES["float32"])


def assert_close(
    actual, expected, *, atol: float | None = None, rtol: float | None = None, name: str = "array"
) -> float:
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` elementwise; return max abs error.

    Tolerances default by ``actual``'s dtype (bf16-aware, see DEFAULT_TOLERANCES). Shapes must
    match exactly (no broadcasting). NaN or inf anywhere in ``actual`` fails.
    """
    # the dtype jnp.asarray(actual) would have, without compiling a program for it
    dtype = actual.dtype if hasattr(actual, "dtype") else np.asarray(actual).dtype
    actual_dtype = jax.dtypes.canonicalize_dtype(dtype)
    default_atol, default_rtol = tolerances(actual_dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    a, e = _as_f64(actual), _as_f64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected shape {e.shape}")
    if not np.isfinite(a).all():
        raise AssertionError(f"{name}: {np.size(a) - np.isfinite(a).sum()} non-finite values")
    err = np.abs(a - e)
    bad = err > atol + rtol * np.abs(e)
    max_err = float(err.max()) if err.size else 0.0
    if bad.any():
        where = np.unravel_index(np.argmax(err), err.shape)
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{bad.size} values outside atol={atol:g}, rtol={rtol:g}; "
            f"max abs error {max_err:.3g} at {tuple(int(i) for i in where)} "
            f"(actual {a[where]:.6g}, expected {e[where]:.6g}); "
            f"relative L2 {relative_l2(a, e):.3g}"
        )
    return max_err


def relative_l2(actual, expected) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (0 when both are zero)."""
    a, e = _as_f64(actual), _as_f64(expected)
    denom = np.linalg.norm(e)
    diff = np.linalg.norm(a - e)
    return float(diff / denom) if denom > 0 else float(diff)


def cast_inputs(inputs: dict, dtype) -> dict:
    """Every array of an input dict (as from :func:`random_kda_inputs`) cast to ``dtype``;
    non-array entries (``lower_bound``) are kept."""
    return {n: x.astype(dtype) if hasattr(x, "astype") else x for n, x in inputs.items()}
