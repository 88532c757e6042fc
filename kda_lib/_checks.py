"""Input validation shared by every KDA form: shapes first, then cheap value checks.

Value checks (beta range, gate sign, segment-id runs) only run on concrete arrays; under
``jax.jit`` the arguments are tracers and only the shape checks apply.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Dims(NamedTuple):
    batch: int
    seq_len: int
    num_heads: int
    key_dim: int
    value_dim: int


def _shape_error(name: str, expected: str, got) -> ValueError:
    return ValueError(f"{name} must have shape {expected}, got shape {tuple(got)}")


def is_concrete(x) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def check_kda_inputs(
    q, k, v, g, beta, *, initial_state=None, segment_ids=None, allow_neg_eigval=False
) -> Dims:
    """Validate the core-op arguments (batch-first layout) and return their dimensions."""
    if q.ndim != 4:
        raise _shape_error("q", "[B, T, H, K]", q.shape)
    batch, seq_len, num_heads, key_dim = q.shape
    if seq_len < 1:
        raise ValueError(f"q must have at least one time step (T >= 1), got shape {q.shape}")
    if k.shape != q.shape:
        raise _shape_error("k", f"[B, T, H, K]={q.shape} (same as q)", k.shape)
    if v.ndim != 4 or v.shape[:3] != (batch, seq_len, num_heads):
        raise _shape_error("v", f"[B, T, H, V]=({batch}, {seq_len}, {num_heads}, V)", v.shape)
    value_dim = v.shape[3]
    if g.shape != q.shape:
        raise _shape_error("g", f"[B, T, H, K]={q.shape} (same as q)", g.shape)
    if beta.shape != (batch, seq_len, num_heads):
        raise _shape_error("beta", f"[B, T, H]={(batch, seq_len, num_heads)}", beta.shape)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    if initial_state is not None:
        expected = (batch, num_heads, key_dim, value_dim)
        if initial_state.shape != expected:
            raise _shape_error("initial_state", f"[B, H, K, V]={expected}", initial_state.shape)
    if segment_ids is not None:
        check_segment_ids(segment_ids, batch, seq_len)
    beta_max = 2.0 if allow_neg_eigval else 1.0
    # numpy, not jnp: under jit a concrete array captured by closure would become a tracer
    if is_concrete(beta):
        lo, hi = (
            float(np.min(np.asarray(beta, np.float32))),
            float(np.max(np.asarray(beta, np.float32))),
        )
        if not (lo >= 0.0 and hi <= beta_max):
            raise ValueError(
                f"beta must lie in [0, {beta_max:g}]"
                + ("" if allow_neg_eigval else " (pass allow_neg_eigval=True for [0, 2])")
                + f", got values in [{lo:g}, {hi:g}]"
            )
    if is_concrete(g):
        hi = float(np.max(np.asarray(g, np.float32)))
        if not hi <= 0.0:
            raise ValueError(f"g is a log-space decay and must be <= 0, got max {hi:g}")
    return Dims(batch, seq_len, num_heads, key_dim, value_dim)


def check_segment_ids(segment_ids, batch: int, seq_len: int) -> None:
    """``segment_ids`` ``[B, T]`` int, 0 = padding, each non-zero id one contiguous run."""
    if segment_ids.shape != (batch, seq_len):
        raise _shape_error("segment_ids", f"[B, T]={(batch, seq_len)}", segment_ids.shape)
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(f"segment_ids must be an integer array, got dtype {segment_ids.dtype}")
    if not is_concrete(segment_ids):
        return
    ids = np.asarray(segment_ids)
    if ids.min() < 0:
        raise ValueError(f"segment_ids must be >= 0 (0 = padding), got min {ids.min()}")
    for row in range(batch):
        row_ids = ids[row]
        starts = (row_ids != 0) & np.concatenate([[True], row_ids[1:] != row_ids[:-1]])
        run_ids = row_ids[starts]
        values, counts = np.unique(run_ids, return_counts=True)
        if (counts > 1).any():
            reused = values[counts > 1][0]
            raise ValueError(
                f"segment_ids row {row} uses id {reused} for two separate runs; each document "
                "needs its own id (one contiguous run per id, padding 0 may only separate "
                "different ids)"
            )


def check_state(state, dims: Dims, name: str = "state") -> None:
    expected = (dims.batch, dims.num_heads, dims.key_dim, dims.value_dim)
    if state.shape != expected:
        raise _shape_error(name, f"[B, H, K, V]={expected}", state.shape)


def resolve_scale(scale: float | None, key_dim: int) -> float:
    if scale is None:
        return key_dim**-0.5
    if not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive float or None (K ** -0.5), got {scale!r}")
    return float(scale)


def accumulation_dtype(dtype) -> jnp.dtype:
    """float32, or float64 when the inputs are float64 (the oracle under jax_enable_x64)."""
    return jnp.promote_types(dtype, jnp.float32)
