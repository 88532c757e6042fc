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

from kda_lib.checks import check_allocation, check_array, is_concrete, is_int


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
    or ``output_token_states``; without them the pair ``(o, final_state)``); fields not asked
    for are None. ``output [B, T, HV, V]`` in q's dtype; ``final_state [B, HV, K, V]`` in the
    accumulation dtype; ``chunk_states [B, T // chunk_size, HV, K, V]`` the state after each
    full chunk; ``token_states [B, T, HV, K, V]`` the state after each token (with segment ids:
    of the segment of the last real token so far, or the initial state). docs/DESIGN.md.
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
    calls: an eager :func:`kda_lib.kda` call reads beta, the segment ids and a log-space g
    once each; under ``jit`` nothing is read)."""
    return np.asarray(x, dtype)


# The shapes of the checked arrays, by argument name: the axes as messages show them. H is
# q/k's heads for q and k (and their one-token forms), v's heads HV for the rest.
SHAPES = {
    "q": "B T H K", "k": "B T H K", "v": "B T H V", "g": "B T H K", "beta": "B T H",
    "initial_state": "B H K V", "segment_ids": "B T",
    "q_t": "B H K", "k_t": "B H K", "v_t": "B HV V", "g_t": "B HV K", "beta_t": "B HV",
    "state": "B H K V", "pool": "N HV K V",
}  # fmt: skip
_QK = ("q", "k", "q_t", "k_t")


def check_shape(name: str, x, dims: Dims, *, slots: int | None = None) -> None:
    """``x`` must have the shape ``SHAPES[name]`` at ``dims`` (N: ``slots``); the message names
    the argument and says the expected and the received shape."""
    axes = SHAPES[name].split()
    heads = dims.qk_heads if name in _QK else dims.num_heads
    sizes = dict(B=dims.batch, T=dims.seq_len, H=heads, HV=heads, K=dims.key_dim,
                 V=dims.value_dim, N=slots)  # fmt: skip
    want = tuple(sizes[a] for a in axes)
    if tuple(x.shape) != want:
        raise ValueError(
            f"{name} must have shape [{', '.join(axes)}]={want}, got shape {tuple(x.shape)}"
        )


def check_float_arrays(**arrays) -> None:
    """Each non-None argument must be a floating-point jax or numpy array."""
    for name, x in arrays.items():
        if x is None:
            continue
        check_array(name, x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")


def _check_not_empty(name: str, x, shown) -> None:
    for axis, size in zip(SHAPES[name].split(), shown(x), strict=True):
        if not size:
            axes = ", ".join(SHAPES[name].split())
            raise ValueError(f"{name} [{axes}] is empty: {axis} = 0 (shape {shown(x)})")


def checked_dims(q, k, v, g, beta, *, token: bool = False) -> Dims:
    """The dimensions of one call's q, k, v, g, beta (the token inputs ``q_t`` .. ``beta_t`` of
    a decoding step with ``token``: T = 1), every shape and dtype checked."""
    names = ("q_t", "k_t", "v_t", "g_t", "beta_t") if token else ("q", "k", "v", "g", "beta")
    arrays = dict(zip(names, (q, k, v, g, beta), strict=True))
    check_float_arrays(**arrays)
    shown = lambda x: tuple(x.shape)  # noqa: E731
    if token:  # one token: the sequence's axes with T = 1
        q, v = q[:, None], v[:, None]
        shown = lambda x: tuple(x.shape[:1] + x.shape[2:])  # noqa: E731
    axes = {n: ", ".join(SHAPES[n].split()) for n in names}
    if q.ndim != 4:
        rank = len(SHAPES[names[0]].split())
        raise ValueError(f"{names[0]} must have shape [{axes[names[0]]}] ({rank} axes), got shape "
                         f"{shown(q)}")  # fmt: skip
    _check_not_empty(names[0], q, shown)
    batch, seq_len, qk_heads, key_dim = q.shape
    if v.ndim != 4 or v.shape[:2] != (batch, seq_len) or v.shape[2] % qk_heads or not v.shape[2]:
        sizes, heads = (f"B={batch}", "HV") if token else (f"B={batch}, T={seq_len}", "H")
        raise ValueError(
            f"{names[2]} must have shape [{axes[names[2]]}] with {sizes} and {heads} a positive "
            f"multiple of q's H={qk_heads} (grouped value heads), got shape {shown(v)}"
        )
    _check_not_empty(names[2], v, shown)
    dims = Dims(batch, seq_len, v.shape[2], key_dim, v.shape[3], qk_heads)
    one = Dims(batch, 1, *dims[2:]) if token else dims
    for name in names[1:]:
        check_shape(name, arrays[name], one)
    return dims


def check_kda_inputs(q, k, v, g, beta, *, initial_state=None, segment_ids=None,
                     allow_neg_eigval=False, raw_gate=False, lower_bound=None) -> Dims:  # fmt: skip
    """Validate the core-op arguments (batch-first layout) and return their dimensions.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``, g ``[B, T, HV, K]``, beta ``[B, T, HV]`` and
    initial_state ``[B, HV, K, V]``, with HV a positive multiple of H (grouped value heads;
    HV = H without). ``raw_gate``: g is a raw gate input (any sign), not a log-space decay;
    else a ``lower_bound`` is a promise ``g >= lower_bound`` (checked with ``g <= 0``).
    """
    dims = checked_dims(q, k, v, g, beta)
    check_float_arrays(initial_state=initial_state)
    if initial_state is not None:
        check_shape("initial_state", initial_state, dims)
    if segment_ids is not None:
        check_array("segment_ids", segment_ids)
        check_segment_ids(segment_ids, dims.batch, dims.seq_len)
    check_values(beta, g, allow_neg_eigval=allow_neg_eigval, raw_gate=raw_gate, bound=lower_bound)
    return dims


def check_values(beta, g, *, allow_neg_eigval: bool, raw_gate: bool, bound=None) -> None:
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


def check_fused_inputs(q, k, v, g, beta, a_log, dt_bias, *, initial_state=None,
                       segment_ids=None, allow_neg_eigval=False) -> Dims:  # fmt: skip
    """:func:`check_kda_inputs` for the fused gate, where ``g`` is the raw gate input (any
    sign), plus ``a_log [HV]`` (or None: the safe gate without a rate) and ``dt_bias [HV * K]``
    (or ``[HV, K]``, or None); HV: v's heads."""
    dims = check_kda_inputs(q, k, v, g, beta, initial_state=initial_state, raw_gate=True,
                            segment_ids=segment_ids, allow_neg_eigval=allow_neg_eigval)  # fmt: skip
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
    check_shape("segment_ids", segment_ids, Dims(batch, seq_len, 1, 1, 1, 1))
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


def check_states_fit(name, value, what: str, count: int, dims: Dims, dtype) -> None:
    """Refuse ``count`` states ``[HV, K, V]`` per row (``[B, count, HV, K, V]``, in ``dtype``'s
    accumulation dtype) larger than this machine's memory, naming ``name=value``: the one size
    check of interior states (token states, chunk states, per-segment slots)."""
    shape = [dims.batch, count, dims.num_heads, dims.key_dim, dims.value_dim]
    nbytes = np.dtype(accumulation_dtype(dtype)).itemsize * int(np.prod(shape, dtype=object))
    check_allocation(name, value, f"{what} = {shape}", nbytes)


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
