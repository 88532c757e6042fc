"""Normalisations shared by the KDA layer and the model mixers: unit-length q/k
(:func:`l2_normalize`) and KDA's gated output norm (:func:`gated_rms_norm`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6, *, keep_float32: bool = False) -> jax.Array:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (eps 1e-6, as fla and tokamax), computed
    in float32 (or float64) and finite up to float32's largest values. Returned in ``x``'s
    dtype, or in the compute dtype with ``keep_float32=True`` (for a float32 kernel)."""
    compute = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(compute)
    # scaled by an exact power of two so the sum of squares cannot overflow (DESIGN section 3)
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
    """``o / rms(o) * weight * sigmoid(gate)`` in float32: o, gate ``[..., V]``, weight ``[V]``."""
    of = o.astype(jnp.float32)
    normed = of * jax.lax.rsqrt(jnp.mean(of * of, axis=-1, keepdims=True) + eps)
    return normed * weight.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))
