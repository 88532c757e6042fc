"""``kda(...)``: one entry point for every KDA implementation, and the table of them.

:data:`REGISTRY` holds one row per implementation: a plain function ``call(arrays, options)``
and ``refuses(options, here)``, the one place that says what it cannot serve. ``"recurrent"``
(the oracle) and ``"chunked"`` are kda_lib's; ``"tokamax_xla"``, ``"tokamax_xla_chunked"`` and
``"tokamax_mosaic"`` need the ``tokamax`` extra. ``"auto"`` picks one (:func:`auto_forms`;
why: docs/DESIGN.md section 4). A named implementation never falls back: ValueError naming why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_array
from kda_lib.ops.chunked import Precision, chunked_core
from kda_lib.ops.contract import (
    Dims,
    KDAOptions,
    KDAResult,
    check_chunk_size,
    check_flag,
    check_fused_inputs,
    check_kda_inputs,
    check_precision,
    check_segment_ids,
    check_states_fit,
    kda_result,
    resolve_scale,
)
from kda_lib.ops.gating import check_gate_switch, kda_gate
from kda_lib.ops.norms import l2_normalize
from kda_lib.ops.reference import recurrent_core
from kda_lib.ops.segments import (
    NEUTRAL_RAW_GATE,
    canonical_segment_ids,
    check_max_num_segments,
    zero_padding,
)
from kda_lib.ops.tokamax.adapter import (
    TOKAMAX_VARIANTS,
    TokamaxVariant,
    require_tokamax,
    segment_slots_problem,  # noqa: F401 (asked here by the layer)
    tokamax_kda,
    tokamax_mosaic_context_parallel,
    tokamax_problems,
    tpu_generation,
)

__all__ = ["IMPLEMENTATIONS", "KDAResult", "RECURRENT_MAX_AUTO_T", "kda", "select_implementation"]


def kda(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, *,
    scale: float | None = None, initial_state: jax.Array | None = None,
    output_final_state: bool = False, segment_ids: jax.Array | None = None,
    max_num_segments: int | None = None, a_log: jax.Array | None = None,
    dt_bias: jax.Array | None = None, lower_bound: float | None = None,
    use_gate_in_kernel: bool = False, use_qk_l2norm: bool = False,
    allow_neg_eigval: bool = False, chunk_size: int = 64, implementation: str = "auto",
    precision: Precision | None = None, output_chunk_states: bool = False,
    output_token_states: bool = False,
):  # fmt: skip
    """Kimi Delta Attention with a chosen (or automatically selected) implementation.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; beta: ``[B, T, HV]``, HV a positive
        multiple of H (value head j reads q/k head ``j // (HV // H)``).
      g: ``[B, T, HV, K]`` log-space decay (``<= 0``), or the raw gate input with
        ``use_gate_in_kernel`` (activated inside by :func:`kda_lib.kda_gate`).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` (float32), state entering the row's first segment.
      output_final_state: also return the ``[B, HV, K, V]`` state after the last valid token.
      segment_ids: ``[B, T]`` int, 0 = padding; a new segment wherever a real token's id
        differs from the previous real token's.
      max_num_segments: static bound on the segments in one row (tokamax with segments;
        under ``jit`` a row with more comes out NaN).
      a_log: ``[HV]``, dt_bias: ``[HV * K]`` or ``[HV, K]``: the in-kernel gate's parameters.
      lower_bound: in [-5, 0). With ``use_gate_in_kernel`` the safe gate
        ``lower_bound * sigmoid(exp(a_log) * (g + dt_bias))`` (None: the softplus gate, which
        needs ``a_log``); without, as in fla, a promise that ``g >= lower_bound`` (checked
        when ``g`` is concrete). It never switches the gate on.
      use_gate_in_kernel: activate the raw ``g`` inside (default False).
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: the chunked form's chunk length, a power of two (default 64; tokamax: 64).
      implementation: one of :data:`IMPLEMENTATIONS` or ``"auto"`` (default).
      precision: the chunked form's matmul policy ``"highest"``, ``"input"`` or None
        (:func:`kda_lib.kda_chunked`); ``"recurrent"`` honours ``"highest"`` only, tokamax none.
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``
        (``"chunked"``, ``"recurrent"``).
      output_token_states: also return ``token_states [B, T, HV, K, V]`` (``"recurrent"``,
        which ``"auto"`` picks). Interior states past this device's memory are refused.

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` or ``output_token_states`` the 4-tuple :class:`KDAResult`.
    """
    impl, arrays, options = check_call(**locals())  # every parameter, before any other local
    try:
        result = run(impl, arrays, options)
    except TypeError as e:  # forward mode reached the chunked form's hand-written backward
        if "custom_vjp" not in str(e):
            raise
        raise TypeError(
            "forward-mode autodiff (jax.jvp, jax.jacfwd, jax.hessian) cannot run through "
            "implementation='chunked' (which 'auto' runs above "
            f"{RECURRENT_MAX_AUTO_T} tokens for large states or off CPU, and for derivatives "
            "of a gradient): its backward is hand-written; pass implementation='recurrent'"
        ) from e
    return kda_result(*result, asked=options.output_chunk_states or options.output_token_states)


# ------------------------------------------------------------------ the implementations

STATE_PASSING = "state_passing"  # kda_lib's CP route (kda_lib.parallel.context_parallel)


class KDAArrays(NamedTuple):
    """One checked call's arrays (padding zeroed, segment ids canonical): q, k ``[B, T, H,
    K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]``; beta ``[B, T, HV]``; initial_state ``[B,
    HV, K, V]``; segment_ids ``[B, T]``; a_log ``[HV]``; dt_bias ``[HV * K]`` (None: absent)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    initial_state: jax.Array | None
    segment_ids: jax.Array | None
    a_log: jax.Array | None
    dt_bias: jax.Array | None


class Implementation(NamedTuple):
    """One row of :data:`REGISTRY`: ``call(arrays, options) -> (o, final_state, chunk_states,
    token_states)``; ``refuses(options, here) -> [reasons]`` (``here``: also on this machine);
    ``context_parallel``: :data:`STATE_PASSING`, a function, or None; ``variant``: tokamax's
    kernel (None: kda_lib's form)."""

    name: str
    call: Callable
    refuses: Callable
    context_parallel: str | Callable | None = None
    variant: TokamaxVariant | None = None


def _activated(arrays: KDAArrays, options: KDAOptions):
    """q, k (L2-normalised in float32 if asked) and the log-space gate, for kda_lib's forms."""
    q, k, g = arrays.q, arrays.k, arrays.g
    if options.use_qk_l2norm:
        q, k = l2_normalize(q, keep_float32=True), l2_normalize(k, keep_float32=True)
    if options.fused_gate:
        g = kda_gate(g, arrays.a_log, arrays.dt_bias, lower_bound=options.lower_bound)
    return q, k, g


def _recurrent(arrays: KDAArrays, o: KDAOptions):
    q, k, g = _activated(arrays, o)
    out, *states = recurrent_core(
        q, k, arrays.v, g, arrays.beta, dims=o.dims, scale=o.scale,
        initial_state=arrays.initial_state, output_final_state=o.output_final_state,
        segment_ids=arrays.segment_ids, output_token_states=o.output_token_states,
        chunk_states_every=o.chunk_size if o.output_chunk_states else None,
    )  # fmt: skip
    return (out.astype(o.dtype), *states)


def _chunked(arrays: KDAArrays, o: KDAOptions):
    q, k, g = _activated(arrays, o)
    out, final, chunk_states = chunked_core(
        q, k, arrays.v, g, arrays.beta, dims=o.dims, scale=o.scale,
        initial_state=arrays.initial_state, output_final_state=o.output_final_state,
        segment_ids=arrays.segment_ids, chunk_size=o.chunk_size, precision=o.precision,
        output_chunk_states=o.output_chunk_states,
    )  # fmt: skip
    return out.astype(o.dtype), final, chunk_states, None


def _tokamax(variant: TokamaxVariant, arrays: KDAArrays, options: KDAOptions):
    return (*tokamax_kda(variant, arrays, options), None, None)


def _recurrent_refuses(o: KDAOptions, here: bool = True) -> list[str]:
    if o.precision in (None, "highest"):
        return []
    return [f"precision={o.precision!r} applies to the 'chunked' implementation; 'recurrent' "
            "computes in float32 throughout (pass precision=None or 'highest')"]


def _chunked_refuses(o: KDAOptions, here: bool = True) -> list[str]:
    if not o.output_token_states:
        return []
    return ["output_token_states needs implementation='recurrent' (or 'auto'): the chunked "
            "form keeps states at chunk boundaries only (output_chunk_states)"]


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 3))
def _routed(forward: Callable, training: Callable, arrays: KDAArrays, options: KDAOptions):
    """``forward``'s result; its JVP is ``training``'s VJP transposed, so ``jax.jvp`` works
    through a form with hand-written gradients and ``jax.grad`` runs ``training``'s backward."""
    return forward(arrays, options)


@_routed.defjvp
def _routed_jvp(forward, training, options, primals, tangents):
    (arrays,), (tangent,) = primals, tangents
    floats = [n for n, x in arrays._asdict().items() if x is not None and n != "segment_ids"]
    diff = lambda arrays: {n: getattr(arrays, n) for n in floats}  # noqa: E731
    out, pullback = jax.vjp(lambda d: training(arrays._replace(**d), options), diff(arrays))
    (tangent_out,) = jax.linear_transpose(pullback, out)((diff(tangent),))
    return out, tangent_out


REGISTRY: dict[str, Implementation] = {
    row.name: row
    for row in (
        Implementation("recurrent", _recurrent, _recurrent_refuses, STATE_PASSING),
        Implementation("chunked", _chunked, _chunked_refuses, STATE_PASSING),
        *(
            Implementation(name, functools.partial(_tokamax, v),
                           functools.partial(tokamax_problems, v),
                           tokamax_mosaic_context_parallel if v.mosaic else None, v)  # fmt: skip
            for name, v in TOKAMAX_VARIANTS.items()
        ),
    )
}
IMPLEMENTATIONS = tuple(REGISTRY)


def run(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    """``impl.call(arrays, options)`` as one compiled program, traced once per row, options
    and shapes (eagerly too, not op by op); Mosaic as it is (its trace depends on the
    emulated chip, no part of jit's key)."""
    if impl.variant is None:  # only tokamax reads the count: not a reason to recompile
        options = options._replace(segments_per_row=None)
    elif impl.variant.mosaic:
        return impl.call(arrays, options)
    return _compiled(impl, arrays, options)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _compiled(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    return impl.call(arrays, options)


_CACHE_CLEARERS: list = []  # compiled-program caches outside ops (ops imports no layers or lab)


def register_compiled_cache(cache):
    """Have :func:`clear_compiled_forms` clear ``cache`` (``cache_clear`` or ``clear_cache``);
    returns it (a decorator)."""
    clear = getattr(cache, "cache_clear", None) or getattr(cache, "clear_cache", None)
    if clear is None:
        raise TypeError(f"cache must have cache_clear or clear_cache, got {cache!r}")
    _CACHE_CLEARERS.append(clear)
    return cache


def clear_compiled_forms() -> None:
    """Forget every compiled program kda_lib keeps (a patched module constant is read again)."""
    for jitted in (_compiled, chunked_core, recurrent_core):
        jitted.clear_cache()
    for clear in _CACHE_CLEARERS:
        clear()


# ------------------------------------------------------------------ "auto" (DESIGN section 4)

RECURRENT_MAX_AUTO_T = 16  # up to it the scan (decode steps)
CPU_CHUNKED_FORWARD_MIN_STATE = 65536  # B * HV * K * V from which the CPU forward is chunked


def portable_forms(seq_len: int, state_size: int | None = None, platform: str | None = None):
    """``(forward, training)``: kda_lib's forms for an undifferentiated and a differentiated
    call of ``seq_len`` tokens, state ``B * HV * K * V`` (None: small), on ``platform``."""
    if seq_len <= RECURRENT_MAX_AUTO_T:
        return "recurrent", "recurrent"
    if (platform or jax.default_backend()) != "cpu":
        return "chunked", "chunked"
    large = state_size is not None and state_size >= CPU_CHUNKED_FORWARD_MIN_STATE
    return ("chunked" if large else "recurrent"), "chunked"


def auto_forms(o: KDAOptions) -> tuple[str, str]:
    """``(forward, training)`` that ``"auto"`` runs: the scan for token states; tokamax Mosaic
    on a real TPU v6+ where it serves the call; else :func:`portable_forms` (both chunked
    where the scan refuses the precision)."""
    if o.output_token_states:  # only the scan keeps a state per token
        return "recurrent", "recurrent"
    if o.precision is None and tpu_generation() and not REGISTRY["tokamax_mosaic"].refuses(o):
        return "tokamax_mosaic", "tokamax_mosaic"
    d = o.dims
    forward, training = portable_forms(d.seq_len, d.batch * d.num_heads * d.key_dim * d.value_dim)
    return (training if REGISTRY[forward].refuses(o) else forward), training


@functools.cache
def _route(forward: str, training: str) -> Implementation:
    """One row per pair of forms (:func:`run` traces per row): ``forward``'s result with
    ``training``'s derivatives (:func:`_routed`)."""
    if forward == training:
        return REGISTRY[forward]
    forms = {"recurrent": _recurrent, "chunked": _chunked}
    return REGISTRY[training]._replace(
        call=functools.partial(_routed, forms[forward], forms[training])
    )


def _request(*, key_dim=1, seq_len=1, batch=1, num_heads=1, value_dim=None, dtype="float32",
             **fields) -> KDAOptions:  # fmt: skip
    """The options of a call known only in part (the rest: :func:`kda`'s defaults)."""
    dims = Dims(batch, seq_len, num_heads, key_dim, value_dim or key_dim, num_heads)
    defaults = dict(scale=1.0, output_final_state=False, has_initial_state=False,
                    has_segments=False, max_num_segments=None, segments_per_row=None,
                    fused_gate=False, lower_bound=None, use_qk_l2norm=False,
                    allow_neg_eigval=False, chunk_size=64, precision=None, implementation="auto")
    return KDAOptions(dims=dims, dtype=np.dtype(dtype), **{**defaults, **fields})


def select_implementation(*, differentiated: bool = True, **config) -> str:
    """The name ``"auto"`` runs for a (``differentiated``) call of ``config``: ``seq_len``,
    ``key_dim``, ``dtype``, ``lower_bound``, ``fused_gate``, ``batch``, ``num_heads``,
    ``value_dim`` (default ``key_dim``)."""
    return auto_forms(_request(**config))[bool(differentiated)]


# ------------------------------------------------------------------ questions other modules ask


def check_implementation(implementation, owner: str = "implementation") -> str:
    """``implementation`` must be ``"auto"`` or a registered name."""
    if not isinstance(implementation, str) or implementation not in ("auto", *REGISTRY):
        raise ValueError(
            f"{owner} must be 'auto' or one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    return implementation


def refusals(implementation: str, *, here: bool = True, **config) -> list[str]:
    """Why ``implementation`` cannot serve a call of ``config`` (:func:`select_implementation`'s
    fields and :class:`KDAOptions`'); ``here``: on this machine too (none for ``"auto"``)."""
    if check_implementation(implementation) == "auto":
        return []
    return REGISTRY[implementation].refuses(_request(**config), here)


def option_problems(implementation, *, fused_gate: bool, lower_bound, allow_neg_eigval: bool):
    """Why ``implementation`` cannot serve these options on any machine (a layer config)."""
    return refusals(implementation, here=False, fused_gate=fused_gate, lower_bound=lower_bound,
                    allow_neg_eigval=allow_neg_eigval)  # fmt: skip


def needs_segment_bound(implementation: str) -> bool:
    """Whether ``implementation`` needs ``max_num_segments`` with segment ids (tokamax's)."""
    return implementation in TOKAMAX_VARIANTS


def uses_own_context_parallel(implementation: str) -> bool:
    """Whether ``implementation``'s CP route is its own (tokamax Mosaic), not state passing."""
    return callable(REGISTRY.get(implementation, REGISTRY["chunked"]).context_parallel)


def context_parallel_route(implementation: str, seq_len: int):
    """``(name, route)``: the CP route of ``implementation`` (``"auto"``: kda_lib's training
    form for ``seq_len``), :data:`STATE_PASSING` or a function; ValueError if it has none."""
    if check_implementation(implementation) == "auto":
        implementation = portable_forms(seq_len)[1]
    route = _required(implementation).context_parallel
    if route is None:  # tokamax's XLA kernels' loop carries do not vary over the mesh axis
        raise ValueError(
            f"kda_context_parallel runs kda_lib's kernels ('chunked' or 'recurrent'); "
            f"{implementation!r} cannot run inside shard_map here"
        )
    return implementation, route


def _required(implementation: str) -> Implementation:
    """The row of a named implementation; tokamax's only where installed (ModuleNotFoundError
    naming the extra, before any work)."""
    if implementation in TOKAMAX_VARIANTS:
        require_tokamax(f"implementation={implementation!r}")
    return REGISTRY[implementation]


# ------------------------------------------------------------------ one check per call


class CheckedSegmentIds(NamedTuple):
    """Segment ids ``[B, T]`` a caller ran :func:`check_segment_ids` on (the KDA layer, at its
    entry) with the count it returned; :func:`kda` takes them without checking again."""

    ids: jax.Array
    segments_per_row: int | None


def check_call(q, k, v, g, beta, **kw) -> tuple[Implementation, KDAArrays, KDAOptions]:
    """Validate a :func:`kda` call once (arguments as there) and pick its implementation,
    before any work; then the arrays, segment ids canonicalised, padding zeroed."""
    fused_gate = check_gate_switch(kw["use_gate_in_kernel"], kw["a_log"], kw["dt_bias"],
                                   kw["lower_bound"])
    check_implementation(kw["implementation"])
    common = dict(initial_state=kw["initial_state"], allow_neg_eigval=kw["allow_neg_eigval"])
    if fused_gate:
        dims = check_fused_inputs(q, k, v, g, beta, kw["a_log"], kw["dt_bias"], **common)
    else:
        dims = check_kda_inputs(q, k, v, g, beta, lower_bound=kw["lower_bound"], **common)
    segments_per_row = None
    if isinstance(kw["segment_ids"], CheckedSegmentIds):  # the KDA layer checked them
        kw["segment_ids"], segments_per_row = kw["segment_ids"]
    elif kw["segment_ids"] is not None:
        check_array("segment_ids", kw["segment_ids"])
        segments_per_row = check_segment_ids(kw["segment_ids"], dims.batch, dims.seq_len)
    options = _options(kw, dims, q.dtype, fused_gate, segments_per_row)
    if options.implementation == "auto":
        impl = _route(*auto_forms(options))
    else:
        impl = _required(options.implementation)
        problems = impl.refuses(options, True)
        if problems:
            raise ValueError("; ".join(problems))
    return impl, _arrays(q, k, v, g, beta, kw, dims, fused_gate), options


def _options(kw, dims: Dims, dtype, fused_gate: bool, segments_per_row) -> KDAOptions:
    """The checked options; interior states past this device's memory refused by name."""
    precision = check_precision(kw["precision"])
    for flag in ("output_final_state", "output_chunk_states", "output_token_states"):
        check_flag(flag, kw[flag])
    if kw["max_num_segments"] is not None:  # checked with or without ids: never silent
        check_max_num_segments(kw["max_num_segments"])
    chunk, bound = check_chunk_size(kw["chunk_size"]), kw["lower_bound"]
    if kw["output_token_states"]:
        check_states_fit("output_token_states", True, "token_states [B, T, HV, K, V]",
                         dims.seq_len, dims, dtype)  # fmt: skip
    if kw["output_chunk_states"]:
        what = f"at chunk_size={chunk}, chunk_states [B, T // chunk_size, HV, K, V]"
        check_states_fit("output_chunk_states", True, what, dims.seq_len // chunk, dims, dtype)
    return KDAOptions(
        dims=dims, dtype=np.dtype(dtype), scale=resolve_scale(kw["scale"], dims.key_dim),
        output_final_state=kw["output_final_state"],
        has_initial_state=kw["initial_state"] is not None,
        has_segments=kw["segment_ids"] is not None, max_num_segments=kw["max_num_segments"],
        segments_per_row=segments_per_row, fused_gate=fused_gate,
        # without the in-kernel gate lower_bound was a promise about g, checked above
        lower_bound=None if bound is None or not fused_gate else float(bound),
        use_qk_l2norm=check_flag("use_qk_l2norm", kw["use_qk_l2norm"]),
        allow_neg_eigval=check_flag("allow_neg_eigval", kw["allow_neg_eigval"]),
        chunk_size=chunk, precision=precision,
        implementation=kw["implementation"], output_chunk_states=kw["output_chunk_states"],
        output_token_states=kw["output_token_states"],
    )  # fmt: skip


def _arrays(q, k, v, g, beta, kw, dims: Dims, fused_gate: bool) -> KDAArrays:
    q, k, v, g, beta = (jnp.asarray(x) for x in (q, k, v, g, beta))
    state, a_log, dt_bias, ids = (kw[n] for n in ("initial_state", "a_log", "dt_bias",
                                                   "segment_ids"))  # fmt: skip
    state = None if state is None else jnp.asarray(state)
    a_log = None if a_log is None else jnp.asarray(a_log)
    if dt_bias is not None:
        dt_bias = jnp.asarray(dt_bias).reshape(dims.num_heads * dims.key_dim)
    if ids is not None:  # one rule everywhere: a new segment wherever a real token's id changes
        ids = canonical_segment_ids(ids)
        q, k, v, g, beta = zero_padding(
            ids, q, k, v, g, beta, neutral_gate=NEUTRAL_RAW_GATE if fused_gate else 0.0
        )
    return KDAArrays(q, k, v, g, beta, state, ids, a_log, dt_bias)
