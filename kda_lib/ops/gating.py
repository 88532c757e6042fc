"""KDA's forget gate, a per-channel log-space decay ``g <= 0`` from a raw projection ``f``, a
per-channel bias ``dt_bias`` and a per-head rate ``A = exp(A_log)`` (``a_log=None``: A = 1):
the softplus gate ``g = -A * softplus(f + dt_bias)`` (``lower_bound=None``) or the safe gate
``g = lower_bound * sigmoid(A * (f + dt_bias))`` (``lower_bound`` in [-5, 0)); and the
initialisers of its parameters."""

from __future__ import annotations

import enum
import math

import jax
import jax.numpy as jnp

from kda_lib.checks import check_allocation, check_array, check_flag, check_int, is_number
from kda_lib.ops.contract import Dims, check_gate_parameters

LOWER_BOUND_RANGE = (-5.0, 0.0)


class GateForm(enum.StrEnum):
    """The gate's form: softplus (no bound), safe sigmoid, or ``CLAMPED_SOFTPLUS``
    ``max(-A softplus(f + dt_bias), lower_bound)`` (MaxText's Kimi K3)."""

    SOFTPLUS = "softplus"
    SAFE_SIGMOID = "safe_sigmoid"
    CLAMPED_SOFTPLUS = "clamped_softplus"


def check_gate_form(gate_form, lower_bound: float | None, *, where: str = "gate_form") -> GateForm:
    """``gate_form`` (a :class:`GateForm`, its value, or None: from ``lower_bound``) checked
    against ``lower_bound`` (only softplus has none); a ValueError names ``where``."""
    if gate_form is None:
        return GateForm.SOFTPLUS if lower_bound is None else GateForm.SAFE_SIGMOID
    try:
        form = GateForm(gate_form)
    except ValueError:
        allowed = tuple(form.value for form in GateForm)
        raise ValueError(f"{where} must be one of {allowed}, got {gate_form!r}") from None
    if (form is GateForm.SOFTPLUS) != (lower_bound is None):
        raise ValueError(
            f"{where}={form.value!r} does not fit lower_bound={lower_bound} (only the softplus "
            "gate has no bound; after dataclasses.replace with a new lower_bound, pass "
            "gate_form=None to derive the form again)"
        )
    return form


def check_lower_bound(lower_bound: float | None) -> None:
    """``lower_bound`` must be None or a number in [-5, 0)."""
    lo, hi = LOWER_BOUND_RANGE
    if lower_bound is not None and not (is_number(lower_bound) and lo <= lower_bound < hi):
        raise ValueError(
            f"lower_bound must be a float in [{lo:g}, {hi:g}) (or None for the softplus gate), "
            f"got {lower_bound!r}"
        )


def check_gate_switch(use_gate_in_kernel, a_log, dt_bias, lower_bound) -> bool:
    """The in-kernel gate's switch (returned): a_log, dt_bias need it; it needs a_log or bound."""
    fused = check_flag("use_gate_in_kernel", use_gate_in_kernel)
    check_lower_bound(lower_bound)
    for name, value in (("a_log", a_log), ("dt_bias", dt_bias)):
        if not fused and value is not None:
            raise ValueError(
                f"{name} is a parameter of the in-kernel gate: pass use_gate_in_kernel=True "
                "with it (g is then the raw gate input), or activate g with kda_lib.kda_gate"
            )
    if fused and a_log is None and lower_bound is None:
        raise ValueError("use_gate_in_kernel=True needs a_log (the softplus gate) or "
                         "lower_bound (the safe gate), or both")  # fmt: skip
    return fused


def kda_gate(f: jax.Array, a_log: jax.Array | None, dt_bias: jax.Array | None, *,
             lower_bound: float | None = None) -> jax.Array:  # fmt: skip
    """The log-space gate ``g [B, T, H, K]`` (module docstring), float32 (float64 for float64
    ``f``), from ``f [B, T, H, K]``, ``a_log [H]`` or None, ``dt_bias [H * K]`` or ``[H, K]``
    or None; ``lower_bound`` None for the softplus gate (default)."""
    check_lower_bound(lower_bound)
    check_array("f", f, floating=True)
    if f.ndim != 4:
        raise ValueError(f"f must have shape [B, T, H, K], got shape {f.shape}")
    heads, key_dim = f.shape[2], f.shape[3]
    if a_log is None and lower_bound is None:
        raise ValueError(
            "a_log=None needs lower_bound (the safe gate lower_bound * sigmoid(f + dt_bias)); "
            "the softplus gate -exp(a_log) * softplus(f + dt_bias) needs a_log"
        )
    check_gate_parameters(a_log, dt_bias, Dims(f.shape[0], f.shape[1], heads, key_dim, 1, heads))
    acc = jnp.promote_types(f.dtype, jnp.float32)  # float64 for the float64 oracle
    x = f.astype(acc)
    if dt_bias is not None:
        x = x + dt_bias.reshape(heads, key_dim).astype(acc)
    if a_log is None:
        return float(lower_bound) * jax.nn.sigmoid(x)
    # [H, 1]; capped at the largest float so that a rate times an input of 0 is 0, not NaN
    rate = jnp.minimum(jnp.exp(a_log.astype(acc)), jnp.finfo(acc).max)[:, None]
    if lower_bound is None:
        return -rate * jax.nn.softplus(x)
    return float(lower_bound) * jax.nn.sigmoid(rate * x)


def init_a_log(key: jax.Array, num_heads: int, *, safe_gate: bool = False, low: float = 1.0,
               high: float = 16.0) -> jax.Array:  # fmt: skip
    """``A_log [H]`` float32: ``log U(low, high)``; zeros for the safe gate (A = 1)."""
    _check_parameter_size(key, num_heads=num_heads)
    if safe_gate:
        return jnp.zeros((num_heads,), jnp.float32)
    if not 0 < low < high:
        raise ValueError(f"init_a_log needs 0 < low < high, got low={low}, high={high}")
    return jnp.log(jax.random.uniform(key, (num_heads,), jnp.float32, low, high))


def init_dt_bias(key: jax.Array, num_heads: int, head_dim: int, *, dt_min: float = 1e-3,
                 dt_max: float = 1e-1, dt_floor: float = 1e-4) -> jax.Array:  # fmt: skip
    """``dt_bias [H * K]`` float32: inverse softplus of log-uniform ``dt`` (floored at dt_floor)."""
    _check_parameter_size(key, num_heads=num_heads, head_dim=head_dim)
    if not 0 < dt_min < dt_max:
        raise ValueError(f"init_dt_bias needs 0 < dt_min < dt_max, got {dt_min}, {dt_max}")
    u = jax.random.uniform(key, (num_heads * head_dim,), jnp.float32)
    dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)),
                     dt_floor)  # fmt: skip
    return dt + jnp.log(-jnp.expm1(-dt))


def _check_parameter_size(key, **sizes) -> None:
    """Each size a positive int; their float32 product refused past memory (not traced)."""
    for name, value in sizes.items():
        check_int(name, value)
    if not isinstance(key, jax.core.Tracer):
        count = math.prod(sizes.values())
        check_allocation(" x ".join(sizes), " x ".join(str(v) for v in sizes.values()),
                         f"a float32 parameter of {count} numbers", 4 * count)  # fmt: skip
