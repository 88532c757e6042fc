"""``kda(...)``: one entry point for every KDA implementation, and the table of them.

``"recurrent"`` (:func:`kda_lib.kda_recurrent`, the oracle), ``"chunked"``
(:func:`kda_lib.kda_chunked`), and tokamax's ``"tokamax_xla"``, ``"tokamax_xla_chunked"`` (the
in-kernel safe gate only) and ``"tokamax_mosaic"`` (TPU v6+, or :func:`kda_lib.emulate_tpu`),
which need the ``tokamax`` extra (ModuleNotFoundError naming it, before any work). ``"auto"``
picks one (:func:`choose`; why and what was measured: docs/DESIGN.md section 4). A named
implementation never falls back: if it cannot serve the call, a ValueError names the constraint.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import allocation_problem, check_array
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
    repeat_qk_heads,
    resolve_scale,
)
from kda_lib.ops.gating import check_lower_bound, kda_gate
from kda_lib.ops.norms import l2_normalize
from kda_lib.ops.reference import recurrent_core
from kda_lib.ops.segments import (
    NEUTRAL_RAW_GATE,
    canonical_segment_ids,
    check_max_num_segments,
    zero_padding,
)
from kda_lib.ops.tokamax.adapter import (
    TOKAMAX_CHUNK,
    TOKAMAX_VARIANTS,
    TokamaxVariant,
    missing_tokamax_problem,
    mosaic_problems,
    require_tokamax,
    segment_slot_count,
    tokamax_kda,
    tokamax_mosaic_context_parallel,
    tpu_generation,
)

__all__ = [
    "IMPLEMENTATIONS",
    "KDAResult",
    "RECURRENT_MAX_AUTO_T",
    "kda",
    "portable_implementation",
    "select_implementation",
]


def kda(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    segment_ids: jax.Array | None = None,
    max_num_segments: int | None = None,
    a_log: jax.Array | None = None,
    dt_bias: jax.Array | None = None,
    lower_bound: float | None = None,
    use_gate_in_kernel: bool = False,
    use_qk_l2norm: bool = False,
    allow_neg_eigval: bool = False,
    chunk_size: int = 64,
    implementation: str = "auto",
    precision: Precision | None = None,
    output_chunk_states: bool = False,
    output_token_states: bool = False,
):
    """Kimi Delta Attention with a chosen (or automatically selected) implementation.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; beta: ``[B, T, HV]``, HV a positive
        multiple of H (value head j reads q/k head ``j // (HV // H)``).
      g: ``[B, T, HV, K]``: log-space decay (``<= 0``), or with ``use_gate_in_kernel`` the raw
        gate input, activated inside by :func:`kda_lib.kda_gate`.
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` (float32), state entering the row's first segment.
      output_final_state: also return the ``[B, HV, K, V]`` state after the last valid token.
      segment_ids: ``[B, T]`` int, 0 = padding; a new segment wherever a real token's id
        differs from the previous real token's (:mod:`kda_lib.ops.segments`).
      max_num_segments: static bound on the segments in one row (tokamax with segments);
        checked when eager, under ``jit`` a row with more comes out NaN.
      a_log: ``[HV]`` per-head log rate of the in-kernel gate (``use_gate_in_kernel`` only).
      dt_bias: ``[HV * K]`` or ``[HV, K]`` gate bias (``use_gate_in_kernel`` only).
      lower_bound: a bound in [-5, 0). With ``use_gate_in_kernel`` it selects the safe gate
        ``lower_bound * sigmoid(exp(a_log) * (g + dt_bias))`` (``a_log`` None: rate 1;
        ``lower_bound`` None: the softplus gate, which needs ``a_log``). Without, as in fla,
        a promise that the log-space ``g >= lower_bound``, checked when ``g`` is concrete
        (ValueError naming both); it never switches the gate on.
      use_gate_in_kernel: activate the raw ``g`` inside (default False). ``a_log`` or
        ``dt_bias`` without it is refused.
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: the chunked form's chunk length, a power of two (default 64; tokamax's
        chunked kernels take 64 only).
      implementation: one of IMPLEMENTATIONS or ``"auto"``.
      precision: the chunked form's matmul policy, ``"highest"``, ``"input"`` or None
        (:func:`kda_lib.kda_chunked`); ``"recurrent"`` honours ``"highest"`` only, tokamax none.
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``, the
        state after every full chunk (``"chunked"``, ``"recurrent"``).
      output_token_states: also return ``token_states [B, T, HV, K, V]``, the state after
        every token (``"recurrent"``, which ``"auto"`` picks). Either is refused, naming it,
        when the states cannot fit in this device's memory.

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` or ``output_token_states`` the 4-tuple :class:`KDAResult`
      ``(output, final_state, chunk_states, token_states)`` (None where not asked).
    """
    # every parameter by name, before any other local exists (check_call takes them all)
    impl, arrays, options = check_call(**locals())
    result = run(impl, arrays, options)
    return kda_result(*result, asked=options.output_chunk_states or options.output_token_states)


# ------------------------------------------------------------------ the implementations

STATE_PASSING = "state_passing"  # kda_lib's CP route (kda_lib.parallel.context_parallel)


class KDAArrays(NamedTuple):
    """One checked call's arrays: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g
    ``[B, T, HV, K]`` (raw with the in-kernel gate); beta ``[B, T, HV]``; initial_state
    ``[B, HV, K, V]`` | None; segment_ids canonical ``[B, T]`` | None; a_log ``[HV]`` | None;
    dt_bias ``[HV * K]`` | None. Padding already zeroed."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    initial_state: jax.Array | None
    segment_ids: jax.Array | None
    a_log: jax.Array | None
    dt_bias: jax.Array | None


def _none(**_) -> list[str]:
    return []


class Implementation(NamedTuple):
    """One row of :data:`REGISTRY`. ``call(arrays, options) -> (o, final_state, chunk_states,
    token_states)``; ``problems(options)``: why it cannot serve a checked call (empty if it
    can); ``option_problems(fused_gate=, lower_bound=, allow_neg_eigval=)``: why not on any
    machine; ``config_problems(key_dim=, dtype=, lower_bound=, fused_gate=)``: why not on this
    machine; ``context_parallel``: :data:`STATE_PASSING`, a function of its own, or None;
    ``token_by_token``: T dependent steps; ``compiled_once``: :func:`run` traces it once per
    options and shapes; ``variant``: tokamax's kernel, None for kda_lib's forms."""

    name: str
    call: Callable
    problems: Callable
    option_problems: Callable = _none
    config_problems: Callable = _none
    context_parallel: str | Callable | None = None
    token_by_token: bool = False
    compiled_once: bool = True
    variant: TokamaxVariant | None = None


def _activated(arrays: KDAArrays, options: KDAOptions):
    """q, k (L2-normalised in float32 if asked) and the log-space gate, for kda_lib's forms."""
    q, k, g = arrays.q, arrays.k, arrays.g
    if options.use_qk_l2norm:
        q, k = l2_normalize(q, keep_float32=True), l2_normalize(k, keep_float32=True)
    if options.fused_gate:
        g = kda_gate(g, arrays.a_log, arrays.dt_bias, lower_bound=options.lower_bound)
    return q, k, g


def _common(arrays: KDAArrays, options: KDAOptions) -> dict:
    return dict(dims=options.dims, scale=options.scale, initial_state=arrays.initial_state,
                output_final_state=options.output_final_state, segment_ids=arrays.segment_ids)


def _recurrent(arrays, options):
    q, k, g = _activated(arrays, options)
    every = options.chunk_size if options.output_chunk_states else None
    out, *states = recurrent_core(
        q, k, arrays.v, g, arrays.beta, chunk_states_every=every,
        output_token_states=options.output_token_states, **_common(arrays, options),
    )
    return (out.astype(options.dtype), *states)


def _recurrent_problems(options):
    if options.precision in (None, "highest"):
        return []
    return [f"precision={options.precision!r} applies to the 'chunked' implementation; "
            "'recurrent' computes in float32 throughout (pass precision=None or 'highest')"]


def _chunked(arrays, options):
    q, k, g = _activated(arrays, options)
    out, final, chunk_states = chunked_core(
        q, k, arrays.v, g, arrays.beta, chunk_size=options.chunk_size,
        precision=options.precision, output_chunk_states=options.output_chunk_states,
        **_common(arrays, options),
    )
    return out.astype(options.dtype), final, chunk_states, None


def _chunked_problems(options):
    if not options.output_token_states:
        return []
    return ["output_token_states needs implementation='recurrent' (or 'auto'): the chunked "
            "form keeps states at chunk boundaries only (output_chunk_states)"]


def _tokamax(variant, arrays, options):
    """tokamax's kernel: q/k heads repeated for grouped value heads, ``a_log = 0`` for the
    rate-free safe gate."""
    q, k = repeat_qk_heads(arrays.q, arrays.k, options.dims.groups)
    a_log = arrays.a_log
    if options.fused_gate and a_log is None:
        a_log = jnp.zeros((options.dims.num_heads,), jnp.float32)
    gate = (a_log, arrays.dt_bias)
    out, final = tokamax_kda(variant, q, k, arrays.v, arrays.g, arrays.beta,
                             arrays.initial_state, arrays.segment_ids, gate, options)
    return out, final, None, None


def _tokamax_row(name, *, safe_gate_only=False, kernel_problems=None, **fields) -> Implementation:
    """A tokamax kernel's row: what it refuses anywhere (beta over 1; for ``safe_gate_only``
    any gate but the in-kernel safe gate), here (the extra missing, ``kernel_problems``) and
    per call (precision, interior states, chunk size, segments without their bound)."""
    variant = TOKAMAX_VARIANTS[name]

    def option_problems(*, fused_gate, lower_bound, allow_neg_eigval):
        found = []
        if allow_neg_eigval:
            found.append(f"{name} requires beta in [0, 1]; allow_neg_eigval is not supported")
        if safe_gate_only and not (fused_gate and lower_bound is not None):
            found.append(
                f"{name} needs the fused safe gate (it needs the safe gate's lower_bound, with "
                "or without a_log, and a raw gate input g); use implementation='chunked' for "
                "log-space gates"
            )
        return found

    def kernel(**config):
        if kernel_problems is not None:
            return kernel_problems(**config)
        return option_problems(allow_neg_eigval=False, **config) if safe_gate_only else []

    def config_problems(*, key_dim, dtype, lower_bound, fused_gate):
        missing = missing_tokamax_problem(f"implementation={name!r}")
        config = dict(lower_bound=lower_bound, fused_gate=fused_gate)
        extra = dict(key_dim=key_dim, dtype=dtype) if kernel_problems is not None else {}
        return ([missing] if missing else []) + kernel(**config, **extra)

    problems = functools.partial(_tokamax_problems, name, variant, option_problems, config_problems)
    return Implementation(
        name, functools.partial(_tokamax, variant), problems, option_problems,
        config_problems, token_by_token=not variant.chunked, variant=variant, **fields,
    )


def _tokamax_problems(name, variant, option_problems, config_problems, o):
    """Why tokamax's kernel ``name`` cannot serve the checked call ``o``."""
    found = []
    if variant.mosaic:  # the chip can change between calls (emulate_tpu)
        found += config_problems(key_dim=o.dims.key_dim, dtype=o.dtype,
                                 lower_bound=o.lower_bound, fused_gate=o.fused_gate)
    found += option_problems(fused_gate=o.fused_gate, lower_bound=o.lower_bound,
                             allow_neg_eigval=o.allow_neg_eigval)
    if o.precision is not None:
        found.append(f"precision={o.precision!r} applies to kda_lib's 'chunked' "
                     f"implementation; {name!r} chooses its own matmul precision "
                     "(pass precision=None)")
    for flag in ("output_chunk_states", "output_token_states"):
        if getattr(o, flag):
            found.append(f"{name} returns no interior states ({flag}); use kda_lib's "
                         "'chunked' or 'recurrent' implementation")
    if variant.chunked and o.chunk_size != TOKAMAX_CHUNK:
        found.append(f"{name} supports chunk_size={TOKAMAX_CHUNK} only, got {o.chunk_size}")
    if not o.has_segments:
        return found
    if o.max_num_segments is None:
        return found + [f"{name} with segment_ids needs max_num_segments (a static bound "
                        "on the ids)"]
    most = o.segments_per_row
    if most is not None and most > o.max_num_segments:
        return found + [f"segment_ids has a row with {most} segments but "
                        f"max_num_segments={o.max_num_segments}"]
    slots = segment_slots_problem(name, o.dims, o.max_num_segments, segments_per_row=most)
    return found + ([slots] if slots else [])


RECURRENT = Implementation("recurrent", _recurrent, _recurrent_problems,
                           context_parallel=STATE_PASSING, token_by_token=True)
CHUNKED = Implementation("chunked", _chunked, _chunked_problems, context_parallel=STATE_PASSING)
REGISTRY: dict[str, Implementation] = {
    row.name: row
    for row in (
        RECURRENT,
        CHUNKED,
        _tokamax_row("tokamax_xla"),
        _tokamax_row("tokamax_xla_chunked", safe_gate_only=True),
        # its trace depends on the (emulated) chip, no part of jit's key: not compiled once
        _tokamax_row("tokamax_mosaic", kernel_problems=mosaic_problems, compiled_once=False,
                     context_parallel=tokamax_mosaic_context_parallel),
    )
}
IMPLEMENTATIONS = tuple(REGISTRY)


def run(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    """``impl.call(arrays, options)`` as one compiled program, traced once per implementation,
    options and shapes (eagerly, not op by op); as it is where ``compiled_once`` is False."""
    if impl.compiled_once:
        if impl.variant is None:  # only tokamax reads the count: not a reason to recompile
            options = options._replace(segments_per_row=None)
        return _compiled(impl, arrays, options)
    return impl.call(arrays, options)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _compiled(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    return impl.call(arrays, options)


_CACHE_CLEARERS: list = []  # compiled-program caches outside ops (ops imports no layers or lab)


def register_compiled_cache(cache):
    """Have :func:`clear_compiled_forms` clear ``cache`` too: an ``functools.lru_cache``
    (``cache_clear``) or a jitted function (``clear_cache``). Returns ``cache`` (a decorator)."""
    clear = getattr(cache, "cache_clear", None) or getattr(cache, "clear_cache", None)
    if clear is None:
        raise TypeError(f"cache must have cache_clear or clear_cache, got {cache!r}")
    _CACHE_CLEARERS.append(clear)
    return cache


def clear_compiled_forms() -> None:
    """Forget every compiled program kda_lib keeps, so that a module constant changed at run
    time is read again by the next call."""
    for jitted in (_compiled, chunked_core, recurrent_core):
        jitted.clear_cache()
    for clear in _CACHE_CLEARERS:
        clear()


# ------------------------------------------------------------------ "auto"

# the rules and their recorded grid: docs/DESIGN.md section 4
RECURRENT_MAX_AUTO_T = 16  # up to it the scan (decode steps)
CPU_FORWARD, CPU_TRAINING = "recurrent", "chunked"  # above it on CPU, undifferentiated or not
CPU_CHUNKED_FORWARD_MIN_STATE = 65536  # B * HV * K * V from which the CPU forward is chunked


def portable_forms(
    seq_len: int, state_size: int | None = None, platform: str | None = None
) -> tuple[str, str]:
    """``(forward, training)``: kda_lib's forms for an undifferentiated and a differentiated call
    of ``seq_len`` tokens with ``state_size = B * HV * K * V`` (None: small) on ``platform``
    (default: JAX's default backend)."""
    if seq_len <= RECURRENT_MAX_AUTO_T:
        return "recurrent", "recurrent"
    if (platform or jax.default_backend()) != "cpu":
        return "chunked", "chunked"
    large = state_size is not None and state_size >= CPU_CHUNKED_FORWARD_MIN_STATE
    return ("chunked" if large else CPU_FORWARD), CPU_TRAINING


def _mosaic_serves(problems: list[str], precision) -> bool:
    return precision is None and tpu_generation() is not None and not problems  # a real TPU


def select_implementation(
    *, seq_len: int, key_dim: int, dtype, lower_bound, fused_gate: bool, differentiated=True,
    batch: int = 1, num_heads: int = 1, value_dim: int | None = None,
):
    """The name ``"auto"`` picks for a (``differentiated``) call of this configuration
    (``value_dim`` default ``key_dim``)."""
    config = dict(key_dim=key_dim, dtype=dtype, lower_bound=lower_bound, fused_gate=fused_gate)
    if _mosaic_serves(REGISTRY["tokamax_mosaic"].config_problems(**config), None):
        return "tokamax_mosaic"
    state_size = batch * num_heads * key_dim * (value_dim or key_dim)
    forward, training = portable_forms(seq_len, state_size)
    return training if differentiated else forward


def portable_implementation(seq_len: int) -> str:
    """The training form of :func:`portable_forms` (``"auto"``'s CP route)."""
    return portable_forms(seq_len)[1]


def choose(options: KDAOptions) -> Implementation:
    """``"auto"``: the scan for token states; tokamax Mosaic on a real TPU v6+ where it serves
    the call; else :func:`portable_forms` (a precision the scan refuses keeps both chunked)."""
    if options.output_token_states:  # only the scan keeps a state per token
        return RECURRENT
    mosaic = REGISTRY["tokamax_mosaic"]
    if _mosaic_serves(mosaic.problems(options), options.precision):
        return mosaic
    d = options.dims
    forward, training = portable_forms(d.seq_len, d.batch * d.num_heads * d.key_dim * d.value_dim)
    if REGISTRY[forward].problems(options) and d.seq_len > RECURRENT_MAX_AUTO_T:
        forward = training
    return _route(forward, training)


@functools.cache
def _route(forward: str, training: str) -> Implementation:
    """One row per pair of forms (:func:`run` traces per row): where they differ, a
    ``jax.custom_jvp`` whose primal is ``forward`` and whose JVP is ``training``'s VJP
    transposed, so ``jax.jvp`` works and ``jax.grad`` runs ``training``'s forward and
    backward exactly."""
    if forward == training:
        return REGISTRY[forward]
    fwd, trn = REGISTRY[forward], REGISTRY[training]
    return trn._replace(
        call=functools.partial(_routed, fwd, trn),
        problems=lambda options: fwd.problems(options) + trn.problems(options),
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 3))
def _routed(forward: Implementation, training: Implementation, arrays, options):
    return forward.call(arrays, options)


@_routed.defjvp
def _routed_jvp(forward, training, options, primals, tangents):
    (arrays,), (tangent,) = primals, tangents
    floats = [n for n, x in arrays._asdict().items() if x is not None and n != "segment_ids"]
    out, pullback = jax.vjp(
        lambda diff: training.call(arrays._replace(**diff), options),
        {n: getattr(arrays, n) for n in floats},
    )
    push = jax.linear_transpose(pullback, out)
    (tangent_out,) = push(({n: getattr(tangent, n) for n in floats},))
    return out, tangent_out


# ------------------------------------------------------------------ questions other modules ask


def check_implementation(implementation, owner: str = "implementation") -> str:
    """``implementation`` must be ``"auto"`` or a registered name."""
    if not isinstance(implementation, str) or (
        implementation != "auto" and implementation not in REGISTRY
    ):
        raise ValueError(
            f"{owner} must be 'auto' or one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    return implementation


def _required(implementation: str) -> Implementation:
    """The row of a named implementation, tokamax's only where installed (ModuleNotFoundError
    naming the extra)."""
    impl = REGISTRY[implementation]
    if impl.variant is not None:
        require_tokamax(f"implementation={implementation!r}")
    return impl


def resolve(options: KDAOptions) -> Implementation:
    """``"auto"``'s choice, or the requested implementation if it can serve the checked call
    (never a fallback: ValueError naming why)."""
    if options.implementation == "auto":
        return choose(options)
    impl = _required(options.implementation)
    problems = impl.problems(options)
    if problems:
        raise ValueError("; ".join(problems))
    return impl


def context_parallel_route(implementation: str, seq_len: int):
    """``(name, route)``: the CP route of ``implementation`` (``"auto"``: kda_lib's form for
    ``seq_len``), :data:`STATE_PASSING` or a function; ValueError if it has none."""
    check_implementation(implementation)
    if implementation == "auto":
        implementation = portable_implementation(seq_len)
    route = _required(implementation).context_parallel
    if route is None:  # tokamax's XLA kernels' loop carries do not vary over the mesh axis
        raise ValueError(
            f"kda_context_parallel runs kda_lib's kernels ('chunked' or 'recurrent'); "
            f"{implementation!r} cannot run inside shard_map here"
        )
    return implementation, route


def option_problems(implementation, *, fused_gate: bool, lower_bound, allow_neg_eigval: bool):
    """Why ``implementation`` cannot serve these options anywhere (none for ``"auto"``)."""
    impl = REGISTRY.get(check_implementation(implementation))
    if impl is None:
        return []
    return impl.option_problems(
        fused_gate=fused_gate, lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval
    )


def segment_slots_problem(
    implementation: str, dims: Dims, max_num_segments: int, *,
    segments_per_row: int | None = None, name: str = "max_num_segments",
) -> str | None:
    """Why tokamax's float32 per-segment states ``[B, slots, HV, K, V]`` cannot fit here,
    naming ``name`` (the argument that sets the bound), or None (also for kda_lib's forms)."""
    impl = REGISTRY.get(implementation)
    if impl is None or impl.variant is None:
        return None
    slots = segment_slot_count(
        impl.variant, max_num_segments, dims.seq_len, segments_per_row=segments_per_row
    )
    shape = (dims.batch, slots, dims.num_heads, dims.key_dim, dims.value_dim)
    what = (f"{implementation}'s per-segment states [B, slots, HV, K, V] = {list(shape)} "
            "(float32; a slot per segment the bound allows, at most about T)")
    problem = allocation_problem(what, 4 * math.prod(shape))
    return f"{name}={max_num_segments}: {problem}" if problem else None


def needs_segment_bound(implementation: str) -> bool:
    """Whether ``implementation`` needs ``max_num_segments`` with segment ids (tokamax's)."""
    return implementation != "auto" and REGISTRY[implementation].variant is not None


def uses_own_context_parallel(implementation: str) -> bool:
    """Whether ``implementation``'s CP route is its own (it needs the mesh and a shard_map
    without the vma check), not kda_lib's state passing."""
    route = REGISTRY.get(implementation, CHUNKED).context_parallel
    return route is not None and route != STATE_PASSING


# ------------------------------------------------------------------ one check per call


def check_call(q, k, v, g, beta, **kw) -> tuple[Implementation, KDAArrays, KDAOptions]:
    """Validate a :func:`kda` call once (arguments as there) and pick its implementation,
    before any work; then the arrays as jax arrays, segment ids canonicalised, padding zeroed."""
    a_log, dt_bias, lower_bound = kw["a_log"], kw["dt_bias"], kw["lower_bound"]
    fused_gate = check_flag("use_gate_in_kernel", kw["use_gate_in_kernel"])
    check_lower_bound(lower_bound)
    for name in ("a_log", "dt_bias"):
        if not fused_gate and kw[name] is not None:
            raise ValueError(
                f"{name} is a parameter of the in-kernel gate: pass use_gate_in_kernel=True "
                "with it (g is then the raw gate input), or activate g with kda_lib.kda_gate"
            )
    if fused_gate and a_log is None and lower_bound is None:
        raise ValueError(
            "use_gate_in_kernel=True needs a_log (the softplus gate) or lower_bound (the safe "
            "gate), or both"
        )
    implementation = check_implementation(kw["implementation"])
    segment_ids = kw["segment_ids"]
    common = dict(initial_state=kw["initial_state"], allow_neg_eigval=kw["allow_neg_eigval"])
    if fused_gate:
        dims = check_fused_inputs(q, k, v, g, beta, a_log, dt_bias, **common)
    else:
        dims = check_kda_inputs(q, k, v, g, beta, lower_bound=lower_bound, **common)
    segments_per_row = None
    if segment_ids is not None:
        check_array("segment_ids", segment_ids)
        segments_per_row = check_segment_ids(segment_ids, dims.batch, dims.seq_len)
    options = _options(kw, dims, q.dtype, fused_gate, implementation, segments_per_row)
    _check_state_outputs(options)
    impl = resolve(options)
    return impl, _arrays(q, k, v, g, beta, kw, dims, fused_gate), options


def _check_state_outputs(options: KDAOptions) -> None:
    """Refuse interior states larger than this device's memory, naming the flag, before work."""
    dims, chunk = options.dims, options.chunk_size
    if options.output_token_states:
        what = "token_states [B, T, HV, K, V]"
        check_states_fit("output_token_states", True, what, dims.seq_len, dims, options.dtype)
    if options.output_chunk_states:
        what = f"at chunk_size={chunk}, chunk_states [B, T // chunk_size, HV, K, V]"
        count = dims.seq_len // chunk
        check_states_fit("output_chunk_states", True, what, count, dims, options.dtype)


def _options(kw, dims, dtype, fused_gate, implementation, segments_per_row) -> KDAOptions:
    precision = check_precision(kw["precision"])
    for flag in ("output_final_state", "output_chunk_states", "output_token_states"):
        check_flag(flag, kw[flag])
    segment_bound, bound = kw["max_num_segments"], kw["lower_bound"]
    if segment_bound is not None:  # checked with or without ids: a bad bound is never silent
        check_max_num_segments(segment_bound)
    return KDAOptions(
        dims=dims,
        dtype=np.dtype(dtype),
        scale=resolve_scale(kw["scale"], dims.key_dim),
        output_final_state=kw["output_final_state"],
        has_initial_state=kw["initial_state"] is not None,
        has_segments=kw["segment_ids"] is not None,
        max_num_segments=segment_bound,
        segments_per_row=segments_per_row,
        fused_gate=fused_gate,
        # without the in-kernel gate lower_bound was a promise about g, checked above
        lower_bound=None if bound is None or not fused_gate else float(bound),
        use_qk_l2norm=bool(kw["use_qk_l2norm"]),
        allow_neg_eigval=bool(kw["allow_neg_eigval"]),
        chunk_size=check_chunk_size(kw["chunk_size"]),
        precision=precision,
        implementation=implementation,
        output_chunk_states=kw["output_chunk_states"],
        output_token_states=kw["output_token_states"],
    )


def _arrays(q, k, v, g, beta, kw, dims, fused_gate) -> KDAArrays:
    q, k, v, g, beta = (jnp.asarray(x) for x in (q, k, v, g, beta))
    initial_state, segment_ids = kw["initial_state"], kw["segment_ids"]
    initial_state = None if initial_state is None else jnp.asarray(initial_state)
    a_log = None if kw["a_log"] is None else jnp.asarray(kw["a_log"])
    dt_bias = kw["dt_bias"]
    if dt_bias is not None:
        dt_bias = jnp.asarray(dt_bias).reshape(dims.num_heads * dims.key_dim)
    if segment_ids is not None:
        # one rule for every implementation: a new segment wherever a real token's id differs
        # from the previous real token's (reused or int64 ids included); padding by selection
        segment_ids = canonical_segment_ids(segment_ids)
        q, k, v, g, beta = zero_padding(
            segment_ids, q, k, v, g, beta, neutral_gate=NEUTRAL_RAW_GATE if fused_gate else 0.0
        )
    return KDAArrays(q, k, v, g, beta, initial_state, segment_ids, a_log, dt_bias)
