"""The KDA call contract: the dimensions, options and result every form shares, and the checks
of its inputs. Shapes are one table (:data:`SHAPES`); value checks (beta's range, g's sign,
segment-id runs) read concrete arrays once on the host; under ``jax.jit`` only shapes apply."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib import checks
from kda_lib.checks import check_array, check_flag, is_concrete


class Dims(NamedTuple):
    """One call's sizes: ``num_heads`` the value heads HV, ``qk_heads`` the q/k heads H."""

    batch: int
    seq_len: int
    num_heads: int
    key_dim: int
    value_dim: int
    qk_heads: int

    @property
    def groups(self) -> int:
        """Value heads per q/k head, ``HV // H``."""
        return self.num_heads // self.qk_heads


def repeat_qk_heads(q, k, groups: int):
    """q, k ``[B, T, H, K]`` -> ``[B, T, H * groups, K]``, for forms without grouped heads."""
    if groups == 1:
        return q, k
    return jnp.repeat(q, groups, axis=2), jnp.repeat(k, groups, axis=2)


class KDAOptions(NamedTuple):
    """The checked, static (hashable) options of one :func:`kda_lib.kda` call, defaults as
    there. ``segments_per_row``: the most segments in one row of concrete ids, else None."""

    dims: Dims
    dtype: np.dtype = np.dtype("float32")  # q's dtype: the outputs' dtype
    scale: float = 1.0
    output_final_state: bool = False
    has_segments: bool = False
    max_num_segments: int | None = None
    segments_per_row: int | None = None
    fused_gate: bool = False
    lower_bound: float | None = None
    use_qk_l2norm: bool = False
    allow_neg_eigval: bool = False
    chunk_size: int = 64
    precision: str | None = None
    scan: str | None = None  # kda_chunked's
    output_chunk_states: bool = False
    output_token_states: bool = False


class KDAResult(NamedTuple):
    """The result with interior states (None where not asked): ``output``, ``final_state``, and
    the states after each full chunk ``[B, T // chunk_size, HV, K, V]`` or token ``[B, T, ..]``."""

    output: jax.Array
    final_state: jax.Array | None
    chunk_states: jax.Array | None = None
    token_states: jax.Array | None = None


def not_differentiated(f, kernel: str):
    """``f`` (a kernel's call on arrays) behind a ``custom_vjp`` that nothing differentiates: a
    transform JAX applies to ``kernel`` after :func:`kda_lib.kda` has returned (a ``jax.jvp`` or
    ``jax.grad`` of a jitted gradient) meets JAX's custom_vjp error or this one naming
    ``kernel``, not a bare error from inside the kernel."""

    def never(*_):
        raise NotImplementedError(
            f"{kernel} is differentiated once, in reverse mode: a gradient of a jitted gradient "
            "through it needs implementation='recurrent' (DESIGN section 4)")

    guarded = jax.custom_vjp(f)
    guarded.defvjp(lambda *args: (f(*args), None), never)
    return guarded


def accumulation_dtype(dtype) -> jnp.dtype:
    """float32, or float64 when the inputs are float64 (the oracle under jax_enable_x64)."""
    return jnp.promote_types(dtype, jnp.float32)


# ------------------------------------------------------------------------------ shapes
# Every checked array's shape by argument name: H q/k's heads, HV the value heads (a positive
# multiple of H), N a pool's slots. Messages show these names.
SHAPES = {
    "q": "B T H K", "k": "B T H K", "v": "B T HV V", "g": "B T HV K", "beta": "B T HV",
    "initial_state": "B HV K V", "segment_ids": "B T", "a_log": "HV",
    "q_t": "B H K", "k_t": "B H K", "v_t": "B HV V", "g_t": "B HV K", "beta_t": "B HV",
    "state": "B HV K V", "pool": "N HV K V",
}  # fmt: skip


def check_shapes(sizes: dict, **arrays) -> dict:
    """Each array (None: skipped) floating (``segment_ids``: any) of shape ``SHAPES[name]``
    (known axes match ``sizes``, new ones not 0, HV a multiple of H): ``sizes`` with new axes."""
    for name, x in arrays.items():
        if x is None:
            continue
        check_array(name, x, floating=name != "segment_ids")
        axes, got = SHAPES[name].split(), tuple(x.shape)
        shape = f"{name} must have shape [{', '.join(axes)}]"
        if len(got) != len(axes) and not set(axes) <= set(sizes):
            raise ValueError(f"{shape} ({len(axes)} axes), got shape {got}")
        new = {a: n for a, n in zip(axes, got, strict=False) if a not in sizes}
        for axis in (a for a, n in new.items() if not n):
            raise ValueError(f"{name} [{', '.join(axes)}] is empty: {axis} = 0 (shape {got})")
        known = {**sizes, **new}
        if got != (want := tuple(known[a] for a in axes)):
            raise ValueError(f"{shape}={want}, got shape {got}")
        if "HV" in new and "H" in sizes and new["HV"] % sizes["H"]:
            given = ", ".join(f"{a}={sizes[a]}" for a in axes if a in sizes)
            raise ValueError(f"{shape} with {given} and HV a positive multiple of q's "
                             f"H={sizes['H']} (grouped value heads), got shape {got}")  # fmt: skip
        sizes = known
    return sizes


def check_shape(name: str, x, dims: Dims) -> None:
    """``x`` of shape ``SHAPES[name]`` at ``dims`` (:func:`check_shapes`)."""
    sizes = dict(B=dims.batch, T=dims.seq_len, H=dims.qk_heads, HV=dims.num_heads,
                 K=dims.key_dim, V=dims.value_dim)  # fmt: skip
    check_shapes(sizes, **{name: x})


def checked_dims(q, k, v, g, beta, *, token: bool = False) -> Dims:
    """The checked dimensions of q, k, v, g, beta (``token``: ``q_t`` .. ``beta_t``, T = 1)."""
    names = ("q_t", "k_t", "v_t", "g_t", "beta_t") if token else ("q", "k", "v", "g", "beta")
    s = check_shapes({}, **dict(zip(names, (q, k, v, g, beta), strict=True)))
    return Dims(s["B"], s.get("T", 1), s["HV"], s["K"], s["V"], s["H"])


# ------------------------------------------------------------------------------ one call
def check_kda_inputs(q, k, v, g, beta, *, initial_state=None, allow_neg_eigval=False,
                     raw_gate=False, lower_bound=None, a_log=None, dt_bias=None,
                     values=True) -> Dims:  # fmt: skip
    """One call's arrays checked: their dimensions. ``raw_gate``: g the in-kernel gate's input
    (any sign), else log-space (``>= lower_bound``). ``values=False``: no host reads."""
    dims = checked_dims(q, k, v, g, beta)
    check_shape("initial_state", initial_state, dims)
    check_gate_parameters(a_log, dt_bias, dims)
    allow_neg_eigval = check_flag("allow_neg_eigval", allow_neg_eigval)
    if values:
        check_values(beta, g, allow_neg_eigval=allow_neg_eigval, raw_gate=raw_gate,
                     bound=lower_bound)  # fmt: skip
    return dims


def check_values(beta, g, *, allow_neg_eigval: bool | None, raw_gate: bool, bound=None,
                 token: bool = False) -> None:  # fmt: skip
    """When concrete: finite beta in [0, 1] ([0, 2]: ``allow_neg_eigval``), g in [bound, 0]
    (``token``: named ``beta_t``, ``g_t``)."""
    beta_name, g_name = ("beta_t", "g_t") if token else ("beta", "g")
    beta_max = 2.0 if allow_neg_eigval else 1.0
    lo, hi = _host_range(beta, finite_only=True)
    if lo < 0.0 or hi > beta_max:
        hint = " (pass allow_neg_eigval=True for [0, 2])" if allow_neg_eigval is False else ""
        raise ValueError(f"{beta_name} must lie in [0, {beta_max:g}]{hint}, got values in "
                         f"[{lo:g}, {hi:g}]")  # fmt: skip
    lo, hi = (0.0, 0.0) if raw_gate else _host_range(g, finite_only=False)
    if hi > 0.0:
        raise ValueError(f"{g_name} is a log-space decay and must be <= 0, got max {hi:g}")
    if bound is not None and lo < bound:
        raise ValueError(
            f"g must be >= lower_bound={bound:g} (a log-space g: lower_bound is a promise "
            f"about it), got min {lo:g}; for a raw g pass use_gate_in_kernel=True"
        )


def _host_range(x, *, finite_only: bool) -> tuple[float, float]:
    """``(min, max)`` of concrete ``x``'s values, NaN left out (``finite_only``: every
    non-finite value), else ``(0, 0)``: reduced where ``x`` lives, two numbers read back."""
    if not is_concrete(x) or not np.size(x):
        return (0.0, 0.0)
    with jax.ensure_compile_time_eval():  # a concrete x inside an outer trace: run it now
        lo, hi = checks.host_values(_range(x, finite_only), np.float64)
    return (float(lo), float(hi)) if lo <= hi else (0.0, 0.0)


@functools.partial(jax.jit, static_argnums=1)
def _range(x, finite_only: bool):
    x = x.astype(jnp.float32)
    keep = jnp.isfinite(x) if finite_only else ~jnp.isnan(x)
    return jnp.stack([jnp.where(keep, x, jnp.inf).min(), jnp.where(keep, x, -jnp.inf).max()])


def check_gate_parameters(a_log, dt_bias, dims: Dims) -> None:
    """``a_log [HV]`` and ``dt_bias [HV * K]`` or ``[HV, K]`` (each may be None)."""
    check_shape("a_log", a_log, dims)
    if dt_bias is not None:
        check_array("dt_bias", dt_bias, floating=True)
        flat, split = (dims.num_heads * dims.key_dim,), (dims.num_heads, dims.key_dim)
        if dt_bias.shape not in (flat, split):
            raise ValueError(
                f"dt_bias must have shape [H*K]={flat} or [H, K]={split}, got {dt_bias.shape}"
            )


def check_segment_ids(segment_ids, batch: int, seq_len: int) -> int | None:
    """``segment_ids [B, T]`` ints (0 = padding, an id one run): most segments in a row or None."""
    check_shapes({"B": batch, "T": seq_len}, segment_ids=segment_ids)
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(f"segment_ids must be an integer array, got dtype {segment_ids.dtype}")
    if not is_concrete(segment_ids):
        return None
    ids = checks.host_values(segment_ids)
    if ids.min(initial=0) < 0:
        raise ValueError(f"segment_ids must be >= 0 (0 = padding), got min {ids.min()}")
    previous = np.concatenate([np.zeros_like(ids[:, :1]), ids[:, :-1]], axis=1)
    rows, cols = np.nonzero((ids != 0) & (ids != previous))  # the start of each run
    runs, counts = np.unique(np.stack([rows, ids[rows, cols]], 1), axis=0, return_counts=True)
    if (counts > 1).any():
        row, reused = runs[np.argmax(counts > 1)]
        raise ValueError(
            f"segment_ids row {row} uses id {reused} for two separate runs; each document "
            "needs its own id (one contiguous run per id, padding 0 may only separate "
            "different ids)"
        )
    return int(np.bincount(rows, minlength=batch).max(initial=0))


# ------------------------------------------------------------------------------ options
def check_states_fit(name, value, what: str, count: int, dims: Dims, dtype) -> None:
    """Refuse ``count`` states ``[HV, K, V]`` per row past memory, naming ``name=value``."""
    shape = [dims.batch, count, dims.num_heads, dims.key_dim, dims.value_dim]
    nbytes = np.dtype(accumulation_dtype(dtype)).itemsize * int(np.prod(shape, dtype=object))
    checks.check_allocation(name, value, f"{what} = {shape}", nbytes)


def resolve_scale(scale, key_dim: int) -> float:
    """``scale`` (None: ``K ** -0.5``; a positive number or concrete 0-d array) as a float."""
    if scale is None:
        return key_dim**-0.5
    if isinstance(scale, jax.Array) and not isinstance(scale, jax.core.Tracer) and not scale.ndim:
        scale = checks.host_values(scale).item()
    return checks.check_number("scale", scale, positive=True)


def check_chunk_size(chunk_size) -> int:
    """``chunk_size`` must be a power of two in [1, 4096]."""
    if not checks.is_int(chunk_size) or chunk_size & (chunk_size - 1) or chunk_size > 4096:
        raise ValueError(f"chunk_size must be a power of two in [1, 4096], got {chunk_size!r}")
    return int(chunk_size)


def check_precision(precision):
    """``precision`` must be ``"highest"``, ``"input"`` or None."""
    if not (precision is None or isinstance(precision, str) and precision in ("highest", "input")):
        raise ValueError(f"precision must be 'highest', 'input' or None, got {precision!r}")
    return precision
