"""Tolerance helpers shared by the tests and the notebooks' assertions."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

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
    actual_dtype = jnp.asarray(actual).dtype
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
