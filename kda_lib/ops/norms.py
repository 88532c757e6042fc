"""Normalisations shared by the KDA layer and the model mixers (pure functions on arrays).

* :func:`l2_normalize`: unit-length q/k per head (eps 1e-6, as fla and tokamax);
* :func:`gated_rms_norm`: the per-head output norm of KDA, ``rmsnorm(o) * weight * sigmoid(gate)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6, *, keep_float32: bool = False) -> jax.Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis, computed in float32 (or float64), without
    overflow for large vectors (below).

    Returned in ``x``'s dtype, or in the float32 compute dtype with ``keep_float32=True`` (what
    a float32 kernel should consume: rounding a normalised bf16 vector back to bf16 only to
    upcast it again throws away precision).
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(compute)
    # vectors whose largest entry exceeds 1 are multiplied by a power of two 2^-e near its
    # inverse (exact), eps with them, so the sum of squares cannot overflow; e stops where 2^-e
    # would be subnormal (flushed to zero on CPU). The scale is a constant for autodiff (exact:
    # the formula is homogeneous in (x, sqrt(eps))). DESIGN.md, "l2_normalize".
    largest = jax.lax.stop_gradient(jnp.max(jnp.abs(xf), axis=-1, keepdims=True))
    _, exponent = jnp.frexp(jnp.where(largest > 1, largest, 1))  # NaN/inf: no scaling
    exponent = jnp.minimum(exponent - 1, -jnp.finfo(compute).minexp)
    inverse = jnp.ldexp(jnp.ones_like(largest), -jnp.where(jnp.isfinite(largest), exponent, 0))
    scaled = xf * inverse
    normed = scaled * jax.lax.rsqrt(
        jnp.sum(scaled * scaled, axis=-1, keepdims=True) + eps * inverse * inverse
    )
    return normed if keep_float32 else normed.astype(x.dtype)


def gated_rms_norm(
    o: jax.Array, weight: jax.Array, gate: jax.Array, *, eps: float = 1e-5
) -> jax.Array:
    """``o / rms(o) * weight * sigmoid(gate)`` over the last axis, in float32.

    Args:
      o: ``[..., V]`` per-head outputs; weight: ``[V]``; gate: ``[..., V]`` (pre-sigmoid).
      eps: added to the mean square (default 1e-5).

    Returns:
      float32 ``[..., V]`` (callers cast to their compute dtype).
    """
    of = o.astype(jnp.float32)
    normed = of * jax.lax.rsqrt(jnp.mean(of * of, axis=-1, keepdims=True) + eps)
    return normed * weight.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))
