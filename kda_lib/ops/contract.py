"""The KDA call contract: the checked dimensions and options every form takes, and the input
checks behind them (shapes first, then cheap value checks).

Value checks (beta range, gate sign, segment-id runs) only run on concrete arrays; under
``jax.jit`` the arguments are tracers and only the shape checks apply.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_array, is_concrete, is_int


class Dims(NamedTuple):
    """Dimensions of one KDA call. ``num_heads`` counts the value heads HV (the recurrence's
    heads: v, g, beta, the state); ``qk_heads`` counts the q/k heads H, HV a multiple of H
    (grouped value heads: value head j reads q/k head ``j // (HV // H)``)."""

    batch: int
    seq_len: int
    num_heads: int
    key_dim: int
    value_dim: int
    qk_heads: int

    @property
    def groups(self) -> int:
        """Value heads per q/k head, ``HV // H`` (1 without grouped value heads)."""
        return self.num_heads // self.qk_heads


def repeat_qk_heads(q, k, groups: int):
    """q, k ``[B, T, H, K]`` -> ``[B, T, H * groups, K]``: value head j gets q/k head
    ``j // groups`` (grouped value heads, for forms that do not map heads natively). Under
    ``jax.grad`` the gradient of a q/k head sums over its group."""
    if groups == 1:
        return q, k
    return jnp.repeat(q, groups, axis=2), jnp.repeat(k, groups, axis=2)


class KDAOptions(NamedTuple):
    """The checked, static (hashable) options of one :func:`kda_lib.kda` call, built once by
    :func:`kda_lib.ops.api.check_call`. ``segments_per_row``: the most segments in one
    row when the ids were concrete, else None."""

    dims: Dims
    dtype: np.dtype  # q's dtype: the outputs' dtype
    scale: float
    output_final_state: bool
    has_initial_state: bool
    has_segments: bool
    max_num_segments: int | None
    segments_per_row: int | None
    fused_gate: bool
    lower_bound: float | None
    use_qk_l2norm: bool
    allow_neg_eigval: bool
    chunk_size: int
    precision: str | None
    implementation: str
    output_chunk_states: bool = False
    output_token_states: bool = False


class KDAResult(NamedTuple):
    """What the KDA forms return when interior states are asked for (``output_chunk_states``
    or ``output_token_states``); without them they return the pair ``(o, final_state)`` as
    always. Fields not asked for are None.

    * ``output`` ``[B, T, HV, V]`` in q's dtype.
    * ``final_state`` ``[B, HV, K, V]`` float32 (float64 for float64 inputs) or None.
    * ``chunk_states`` ``[B, T // chunk_size, HV, K, V]``: entry i is the state after tokens
      ``0 .. (i + 1) * chunk_size - 1``, i.e. the final state of the same call on that prefix
      (with ``initial_state`` it includes it; with ``segment_ids`` it is the state of the
      segment running at that boundary, the segment of the last real token at or before it,
      or the initial state if there is none yet). Only full chunks; T < chunk_size gives 0.
    * ``token_states`` ``[B, T, HV, K, V]``: entry t is the state after token t (the same rule),
      e.g. the state after a draft's accepted prefix in speculative decoding.
    """

    output: jax.Array
    final_state: jax.Array | None
    chunk_states: jax.Array | None = None
    token_states: jax.Array | None = None


def check_flag(name: str, value) -> bool:
    """``value`` must be a Python bool (ValueError naming ``name`` otherwise)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def kda_result(o, final_state, chunk_states=None, token_states=None, *, asked: bool):
    """``KDAResult`` when interior states were ``asked`` for, else the pair ``(o, final)``."""
    if asked:
        return KDAResult(o, final_state, chunk_states, token_states)
    return o, final_state


def host_values(x, dtype=None) -> np.ndarray:
    """``x``'s values on the host: the one place the checks read an array (tests count the
    calls: an eager :func:`kda_lib.kda` call reads beta and the segment ids once each)."""
    return np.asarray(x, dtype)


def _shape_error(name: str, expected: str, got) -> ValueError:
    return ValueError(f"{name} must have shape {expected}, got shape {tuple(got)}")


def check_kda_inputs(
    q,
    k,
    v,
    g,
    beta,
    *,
    initial_state=None,
    segment_ids=None,
    allow_neg_eigval=False,
    raw_gate=False,
    lower_bound=None,
) -> Dims:
    """Validate the core-op arguments (batch-first layout) and return their dimensions.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``, g ``[B, T, HV, K]``, beta ``[B, T, HV]`` and
    initial_state ``[B, HV, K, V]``, with HV a positive multiple of H (grouped value heads;
    HV = H without). ``raw_gate``: g is a raw gate input (any sign), not a log-space decay;
    else a ``lower_bound`` is a promise ``g >= lower_bound`` (checked with ``g <= 0``).
    """
    dims = _checked_dims(q, k, v, g, beta)
    if initial_state is not None:
        check_array("initial_state", initial_state)
        if not jnp.issubdtype(initial_state.dtype, jnp.floating):
            raise ValueError(
                f"initial_state must be a floating-point array, got dtype {initial_state.dtype}"
            )
        check_state(initial_state, dims, "initial_state")
    if segment_ids is not None:
        check_array("segment_ids", segment_ids)
        check_segment_ids(segment_ids, dims.batch, dims.seq_len)
    _check_values(beta, g, allow_neg_eigval=allow_neg_eigval, raw_gate=raw_gate, bound=lower_bound)
    return dims


def _checked_dims(q, k, v, g, beta) -> Dims:
    """The shapes and dtypes of :func:`check_kda_inputs`'s arrays, and their dimensions."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_array(name, x)
    if q.ndim != 4:
        raise _shape_error("q", "[B, T, H, K]", q.shape)
    batch, seq_len, qk_heads, key_dim = q.shape
    if seq_len < 1:
        raise ValueError(f"q must have at least one time step (T >= 1), got shape {q.shape}")
    for letter, size in (("B", batch), ("H", qk_heads), ("K", key_dim)):
        if size < 1:
            raise ValueError(f"q [B, T, H, K] is empty: {letter} = 0 (shape {q.shape})")
    if k.shape != q.shape:
        raise _shape_error("k", f"[B, T, H, K]={q.shape} (same as q)", k.shape)
    if v.ndim != 4 or v.shape[:2] != (batch, seq_len) or v.shape[2] % qk_heads or not v.shape[2]:
        raise _shape_error(
            "v",
            f"[B, T, H, V]=({batch}, {seq_len}, {qk_heads}, V), or [B, T, HV, V] with HV a "
            f"positive multiple of q's H={qk_heads} (grouped value heads),",
            v.shape,
        )
    num_heads, value_dim = v.shape[2:]
    if value_dim < 1:
        raise ValueError(f"v [B, T, H, V] is empty: V = 0 (shape {v.shape})")
    gate_shape = (batch, seq_len, num_heads, key_dim)
    if g.shape != gate_shape:
        raise _shape_error("g", f"[B, T, H, K]={gate_shape} (H: v's heads)", g.shape)
    if beta.shape != (batch, seq_len, num_heads):
        raise _shape_error("beta", f"[B, T, H]={(batch, seq_len, num_heads)}", beta.shape)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    return Dims(batch, seq_len, num_heads, key_dim, value_dim, qk_heads)


def _check_values(beta, g, *, allow_neg_eigval: bool, raw_gate: bool, bound=None) -> None:
    """beta in range and a log-space g <= 0, read on the host when concrete (not under jit)."""
    beta_max = 2.0 if allow_neg_eigval else 1.0
    # numpy, not jnp: under jit a concrete array captured by closure would become a tracer
    # value checks skip non-finite entries: those are handled (and propagated like the
    # recurrence does) by every form; a NaN is not "beta out of range"
    if is_concrete(beta):
        finite = host_values(beta, np.float32)
        finite = finite[np.isfinite(finite)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        if not (lo >= 0.0 and hi <= beta_max):
            raise ValueError(
                f"beta must lie in [0, {beta_max:g}]"
                + ("" if allow_neg_eigval else " (pass allow_neg_eigval=True for [0, 2])")
                + f", got values in [{lo:g}, {hi:g}]"
            )
    if not raw_gate and is_concrete(g):
        values = host_values(g, np.float32)
        values = values[~np.isnan(values)]
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if not hi <= 0.0:
            raise ValueError(f"g is a log-space decay and must be <= 0, got max {hi:g}")
        if bound is not None and not lo >= bound:
            raise ValueError(
                f"g must be >= lower_bound={bound:g} (a log-space g: lower_bound is a promise "
                f"about it), got min {lo:g}; for a raw g pass use_gate_in_kernel=True"
            )


def check_fused_inputs(
    q,
    k,
    v,
    g,
    beta,
    a_log,
    dt_bias,
    *,
    initial_state=None,
    segment_ids=None,
    allow_neg_eigval=False,
) -> Dims:
    """:func:`check_kda_inputs` for the fused gate, where ``g`` is the raw gate input (any
    sign), plus ``a_log [HV]`` (or None: the safe gate without a rate) and ``dt_bias [HV * K]``
    (or ``[HV, K]``, or None); HV: v's heads."""
    dims = check_kda_inputs(
        q,
        k,
        v,
        g,
        beta,
        initial_state=initial_state,
        segment_ids=segment_ids,
        allow_neg_eigval=allow_neg_eigval,
        raw_gate=True,
    )
    if a_log is not None:
        check_array("a_log", a_log)
        if a_log.shape != (dims.num_heads,):
            raise ValueError(f"a_log must have shape [H]=({dims.num_heads},), got {a_log.shape}")
    if dt_bias is not None:
        check_array("dt_bias", dt_bias)
        flat, split = (dims.num_heads * dims.key_dim,), (dims.num_heads, dims.key_dim)
        if dt_bias.shape not in (flat, split):  # the same rule as kda_lib.kda_gate
            raise ValueError(
                f"dt_bias must have shape [H*K]={flat} or [H, K]={split}, got {dt_bias.shape}"
            )
    return dims


def check_segment_ids(segment_ids, batch: int, seq_len: int) -> int | None:
    """``segment_ids`` ``[B, T]`` int, 0 = padding, each non-zero id one contiguous run.
    Returns the most segments in one row (concrete ids), or None (traced ids)."""
    if segment_ids.shape != (batch, seq_len):
        raise _shape_error("segment_ids", f"[B, T]={(batch, seq_len)}", segment_ids.shape)
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(f"segment_ids must be an integer array, got dtype {segment_ids.dtype}")
    if not is_concrete(segment_ids):
        return None
    ids = host_values(segment_ids)
    if ids.min() < 0:
        raise ValueError(f"segment_ids must be >= 0 (0 = padding), got min {ids.min()}")
    most = 0
    for row in range(batch):
        row_ids = ids[row]
        starts = (row_ids != 0) & np.concatenate([[True], row_ids[1:] != row_ids[:-1]])
        run_ids = row_ids[starts]
        most = max(most, run_ids.size)
        values, counts = np.unique(run_ids, return_counts=True)
        if (counts > 1).any():
            reused = values[counts > 1][0]
            raise ValueError(
                f"segment_ids row {row} uses id {reused} for two separate runs; each document "
                "needs its own id (one contiguous run per id, padding 0 may only separate "
                "different ids)"
            )
    return most


def check_state(state, dims: Dims, name: str = "state") -> None:
    expected = (dims.batch, dims.num_heads, dims.key_dim, dims.value_dim)
    if state.shape != expected:
        raise _shape_error(name, f"[B, H, K, V]={expected}", state.shape)


def resolve_scale(scale, key_dim: int) -> float:
    """``scale`` as a Python float: None -> ``K ** -0.5``; a positive finite number (Python,
    numpy or a concrete 0-d jax array) is accepted; anything else raises, naming it."""
    if scale is None:
        return key_dim**-0.5
    if isinstance(scale, jax.core.Tracer):
        raise ValueError(
            "scale must be a static number (a Python float), not a traced value; "
            "close over it instead of passing it through jit"
        )
    if isinstance(scale, (bool, str, bytes)) or np.ndim(scale) != 0:
        raise ValueError(f"scale must be a positive float or None (K ** -0.5), got {scale!r}")
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise ValueError(
            f"scale must be a positive float or None (K ** -0.5), got {scale!r}"
        ) from None
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
    return value


def check_chunk_size(chunk_size) -> int:
    """``chunk_size`` must be a power of two >= 1 (the chunked form's tokens per chunk); the
    same rule for every implementation, whether or not it chunks."""
    if not is_int(chunk_size) or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 1, got {chunk_size!r}")
    return int(chunk_size)


PRECISIONS = ("highest", "input")


def check_precision(precision):
    """``precision`` (the chunked form's matmul policy) must be ``"highest"``, ``"input"`` or
    None (the default for the inputs' dtype)."""
    if precision is not None and (not isinstance(precision, str) or precision not in PRECISIONS):
        raise ValueError(f"precision must be 'highest', 'input' or None, got {precision!r}")
    return precision


def accumulation_dtype(dtype) -> jnp.dtype:
    """float32, or float64 when the inputs are float64 (the oracle under jax_enable_x64)."""
    return jnp.promote_types(dtype, jnp.float32)
