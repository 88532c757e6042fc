"""Forget-gate activations and the initialisers of their parameters.

KDA's forget gate is a per-channel log-space decay ``g <= 0``. It is computed from a raw
projection ``f`` of the input, a per-channel bias ``dt_bias`` and a per-head rate
``A = exp(A_log)``:

* softplus gate (``lower_bound=None``): ``g = -A * softplus(f + dt_bias)``, unbounded below;
* safe gate (``lower_bound`` in [-5, 0)): ``g = lower_bound * sigmoid(A * (f + dt_bias))``,
  so every step decays by at most ``exp(lower_bound)``;
* safe gate without a rate (``a_log=None``, ``lower_bound`` set; fla's ``A_log=None``, fla PR
  #1107): ``g = lower_bound * sigmoid(f + dt_bias)``, i.e. ``A = 1``. The softplus gate has no
  such form (fla refuses ``A_log=None`` without ``lower_bound``, and so does kda_lib).

:class:`GateForm` names these forms (and the clamped softplus gate of MaxText's Kimi K3 layer,
``max(-A softplus(f + dt_bias), lower_bound)``) for every config that chooses one:
:class:`kda_lib.KDAConfig` and :class:`kda_lib.models.presets.ModelPreset`.
"""

from __future__ import annotations

import enum
import math

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_allocation, check_array, check_int

LOWER_BOUND_RANGE = (-5.0, 0.0)


class GateForm(enum.StrEnum):
    """How the forget gate applies ``lower_bound`` (the forms above).

    ``SOFTPLUS``: ``-A softplus(f + dt_bias)``, no bound (``lower_bound=None``);
    ``SAFE_SIGMOID``: ``lower_bound * sigmoid(A (f + dt_bias))``, this repository's safe gate;
    ``CLAMPED_SOFTPLUS``: ``max(-A softplus(f + dt_bias), lower_bound)`` (MaxText's Kimi K3).
    """

    SOFTPLUS = "softplus"
    SAFE_SIGMOID = "safe_sigmoid"
    CLAMPED_SOFTPLUS = "clamped_softplus"


def check_gate_form(gate_form, lower_bound: float | None, *, where: str = "gate_form") -> GateForm:
    """``gate_form`` as a :class:`GateForm` that fits ``lower_bound``, or a ValueError naming
    ``where``.

    A plain string is accepted (``"safe_sigmoid"``); None picks the form ``lower_bound``
    implies (``SOFTPLUS`` without a bound, else ``SAFE_SIGMOID``). A given form must agree
    with ``lower_bound``: only the softplus gate has no bound.
    """
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
    """Raise ValueError unless ``lower_bound`` is None or a float in [-5, 0)."""
    if lower_bound is None:
        return
    lo, hi = LOWER_BOUND_RANGE
    # numpy scalars count as numbers (np.float32(-5.0) is a fine bound); bools and arrays do not
    number = isinstance(lower_bound, (int, float, np.integer, np.floating)) and not isinstance(
        lower_bound, bool
    )
    if not number or not lo <= float(lower_bound) < hi:
        raise ValueError(
            f"lower_bound must be a float in [{lo:g}, {hi:g}) (or None for the softplus gate), "
            f"got {lower_bound!r}"
        )


def kda_gate(
    f: jax.Array,
    a_log: jax.Array | None,
    dt_bias: jax.Array | None,
    *,
    lower_bound: float | None = None,
) -> jax.Array:
    """Log-space forget gate ``g`` from the raw gate input ``f``.

    Args:
      f: raw gate input ``[B, T, H, K]`` (any float dtype).
      a_log: per-head log rate ``[H]``; ``A = exp(a_log)``. None: no rate (``A = 1``), for the
        safe gate only (``lower_bound`` set).
      dt_bias: per-channel bias ``[H * K]`` (fla's layout) or ``[H, K]``, or None for no bias.
      lower_bound: None for the softplus gate, else the safe gate's bound in [-5, 0).

    Returns:
      ``g`` ``[B, T, H, K]`` float32 (float64 for float64 ``f``), ``<= 0``.
    """
    check_lower_bound(lower_bound)
    for name, x in (("f", f), ("a_log", a_log), ("dt_bias", dt_bias)):
        if x is not None:
            check_array(name, x)
            if not jnp.issubdtype(x.dtype, jnp.floating):
                raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    if f.ndim != 4:
        raise ValueError(f"f must have shape [B, T, H, K], got shape {f.shape}")
    num_heads, head_dim = f.shape[2], f.shape[3]
    if a_log is None and lower_bound is None:
        raise ValueError(
            "a_log=None needs lower_bound (the safe gate lower_bound * sigmoid(f + dt_bias)); "
            "the softplus gate -exp(a_log) * softplus(f + dt_bias) needs a_log"
        )
    if a_log is not None and a_log.shape != (num_heads,):
        raise ValueError(f"a_log must have shape [H]=({num_heads},), got {a_log.shape}")
    acc = jnp.promote_types(f.dtype, jnp.float32)  # float64 for the float64 oracle
    x = f.astype(acc)
    if dt_bias is not None:
        if dt_bias.shape == (num_heads * head_dim,):
            dt_bias = dt_bias.reshape(num_heads, head_dim)
        elif dt_bias.shape != (num_heads, head_dim):
            raise ValueError(
                f"dt_bias must have shape [H*K]=({num_heads * head_dim},) or "
                f"[H, K]=({num_heads}, {head_dim}), got {dt_bias.shape}"
            )
        x = x + dt_bias.astype(acc)
    if a_log is None:  # the safe gate without a rate (A = 1)
        return float(lower_bound) * jax.nn.sigmoid(x)
    # [H, 1], broadcasts over K; capped at the largest float (exp(88.8) overflows float32), so
    # that a rate times an input of 0 is 0, not inf * 0 = NaN
    rate = jnp.minimum(jnp.exp(a_log.astype(acc)), jnp.finfo(acc).max)[:, None]
    if lower_bound is None:
        return -rate * jax.nn.softplus(x)
    return float(lower_bound) * jax.nn.sigmoid(rate * x)


def init_a_log(
    key: jax.Array,
    num_heads: int,
    *,
    safe_gate: bool = False,
    low: float = 1.0,
    high: float = 16.0,
) -> jax.Array:
    """``A_log`` ``[H]`` float32: ``log U(low, high)``; zeros for the safe gate (A = 1)."""
    _check_parameter_size(key, num_heads=num_heads)
    if safe_gate:
        return jnp.zeros((num_heads,), jnp.float32)
    if not 0 < low < high:
        raise ValueError(f"init_a_log needs 0 < low < high, got low={low}, high={high}")
    return jnp.log(jax.random.uniform(key, (num_heads,), jnp.float32, low, high))


def init_dt_bias(
    key: jax.Array,
    num_heads: int,
    head_dim: int,
    *,
    dt_min: float = 1e-3,
    dt_max: float = 1e-1,
    dt_floor: float = 1e-4,
) -> jax.Array:
    """``dt_bias`` ``[H * K]`` float32 with ``softplus(dt_bias) = dt``.

    ``dt`` is log-uniform in ``[dt_min, dt_max]`` and floored at ``dt_floor``; the bias is its
    inverse softplus ``dt + log(-expm1(-dt))``, so that at init the softplus gate decays each
    channel by ``exp(-A * dt)`` per token.
    """
    _check_parameter_size(key, num_heads=num_heads, head_dim=head_dim)
    if not 0 < dt_min < dt_max:
        raise ValueError(f"init_dt_bias needs 0 < dt_min < dt_max, got {dt_min}, {dt_max}")
    u = jax.random.uniform(key, (num_heads * head_dim,), jnp.float32)
    dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = jnp.maximum(dt, dt_floor)
    return dt + jnp.log(-jnp.expm1(-dt))


def _check_parameter_size(key, **sizes) -> None:
    """Each size a positive int (not a bool), and, when ``key`` is concrete (not traced, as
    under ``nnx.eval_shape``, where nothing is allocated), their float32 product able to fit in
    memory, refused naming the sizes before anything is allocated."""
    for name, value in sizes.items():
        check_int(name, value)
    if isinstance(key, jax.core.Tracer):
        return
    check_allocation(
        " x ".join(sizes), " x ".join(str(v) for v in sizes.values()),
        f"a float32 parameter of {math.prod(sizes.values())} numbers",
        4 * math.prod(sizes.values()),
    )  # fmt: skip
