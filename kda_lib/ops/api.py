"""``kda(...)``: one entry point for every KDA implementation, and the table behind it.

The implementations are one object each in :data:`REGISTRY`: ``"recurrent"``
(:func:`kda_lib.kda_recurrent`, the oracle), ``"chunked"`` (:func:`kda_lib.kda_chunked`), and
tokamax's ``"tokamax_xla"``, ``"tokamax_xla_chunked"`` (the in-kernel safe gate only) and
``"tokamax_mosaic"`` (TPU v6+, or :func:`kda_lib.emulate_tpu`), which need the ``tokamax``
extra (ModuleNotFoundError naming it, before any work). Each says what it cannot serve
(``problems(options)``: empty if it can) and computes on a call checked once by
:func:`check_call`. ``"auto"`` picks one (:func:`choose`). A named implementation never falls
back: if it cannot serve the call, a ValueError names the constraint. docs/DESIGN.md section 4
says why and what was measured.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import allocation_problem, check_allocation, check_array
from kda_lib.ops.chunked import Precision, chunked_core
from kda_lib.ops.contract import (
    Dims,
    KDAOptions,
    KDAResult,
    accumulation_dtype,
    check_chunk_size,
    check_flag,
    check_fused_inputs,
    check_kda_inputs,
    check_precision,
    check_segment_ids,
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

# kda_lib's CP route (kda_lib.parallel.context_parallel), any backend that takes an initial
# state and returns a final one
STATE_PASSING = "state_passing"


class KDAArrays(NamedTuple):
    """The arrays of one checked call: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g
    ``[B, T, HV, K]`` (raw with the fused gate); beta ``[B, T, HV]``; initial_state
    ``[B, HV, K, V]`` | None; segment_ids canonical ``[B, T]`` | None; a_log ``[HV]`` | None;
    dt_bias ``[HV * K]`` | None. Padding already zeroed (a raw gate set to its neutral value)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    initial_state: jax.Array | None
    segment_ids: jax.Array | None
    a_log: jax.Array | None
    dt_bias: jax.Array | None


class Backend:
    """One implementation. ``token_by_token``: T dependent steps; ``compiled_once``: :func:`run`
    may trace it once per options and shapes; ``context_parallel``: :data:`STATE_PASSING`, a
    function of its own, or None."""

    name: str
    needs: frozenset = frozenset()
    context_parallel: str | Callable | None = None
    token_by_token: bool = False
    compiled_once: bool = True

    def problems(self, options: KDAOptions) -> list[str]:
        return []

    def config_problems(self, *, key_dim: int, dtype, lower_bound, fused_gate: bool) -> list[str]:
        """Why it cannot serve this configuration on this machine, before there are inputs."""
        return []

    def option_problems(self, *, fused_gate: bool, lower_bound, allow_neg_eigval: bool):
        """Why it cannot serve these options on any machine (a layer config's refusals)."""
        return []

    def __call__(self, arrays: KDAArrays, options: KDAOptions):
        raise NotImplementedError


def run(backend: Backend, arrays: KDAArrays, options: KDAOptions):
    """``backend(arrays, options)`` as one compiled program, traced once per backend, options
    and shapes (eagerly, not op by op); backends with ``compiled_once`` False as they are."""
    if backend.compiled_once:
        return _compiled(backend, arrays, options)
    return backend(arrays, options)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _compiled(backend: Backend, arrays: KDAArrays, options: KDAOptions):
    return backend(arrays, options)


# the clear functions of compiled-program caches outside ops (ops imports no layers or lab)
_CACHE_CLEARERS: list = []


def register_compiled_cache(cache):
    """Have :func:`clear_compiled_forms` clear ``cache`` too: an ``functools.lru_cache``
    (``cache_clear``) or a jitted function (``clear_cache``). Returns ``cache`` (a decorator)."""
    clear = getattr(cache, "cache_clear", None) or getattr(cache, "clear_cache", None)
    if clear is None:
        raise TypeError(f"cache must have cache_clear or clear_cache, got {cache!r}")
    _CACHE_CLEARERS.append(clear)
    return cache


def clear_compiled_forms() -> None:
    """Forget every compiled program kda_lib keeps (the forms' and each registered cache's), so
    that a module constant changed at run time is read again by the next call."""
    for jitted in (_compiled, chunked_core, recurrent_core):
        jitted.clear_cache()
    for clear in _CACHE_CLEARERS:
        clear()


def _activated(arrays: KDAArrays, options: KDAOptions):
    """q, k (L2-normalised in float32 if asked) and the log-space gate, for kda_lib's forms."""
    q, k, g = arrays.q, arrays.k, arrays.g
    if options.use_qk_l2norm:
        q, k = l2_normalize(q, keep_float32=True), l2_normalize(k, keep_float32=True)
    if options.fused_gate:
        g = kda_gate(g, arrays.a_log, arrays.dt_bias, lower_bound=options.lower_bound)
    return q, k, g


def _core_kwargs(arrays: KDAArrays, options: KDAOptions) -> dict:
    return dict(
        dims=options.dims,
        scale=options.scale,
        initial_state=arrays.initial_state,
        output_final_state=options.output_final_state,
        segment_ids=arrays.segment_ids,
    )


class Recurrent(Backend):
    """``"recurrent"``: the scan (:func:`kda_lib.kda_recurrent`), float32 throughout."""

    name = "recurrent"
    context_parallel = STATE_PASSING
    token_by_token = True

    def problems(self, options):
        if options.precision not in (None, "highest"):
            return [
                f"precision={options.precision!r} applies to the 'chunked' implementation; "
                "'recurrent' computes in float32 throughout (pass precision=None or 'highest')"
            ]
        return []

    def __call__(self, arrays, options):
        q, k, g = _activated(arrays, options)
        out, *states = recurrent_core(
            q,
            k,
            arrays.v,
            g,
            arrays.beta,
            chunk_states_every=options.chunk_size if options.output_chunk_states else None,
            output_token_states=options.output_token_states,
            **_core_kwargs(arrays, options),
        )
        return (out.astype(options.dtype), *states)


class Chunked(Backend):
    """``"chunked"``: kda_lib's chunkwise form (:func:`kda_lib.kda_chunked`)."""

    name = "chunked"
    context_parallel = STATE_PASSING

    def problems(self, options):
        if options.output_token_states:
            return [
                "output_token_states needs implementation='recurrent' (or 'auto'): the chunked "
                "form keeps states at chunk boundaries only (output_chunk_states)"
            ]
        return []

    def __call__(self, arrays, options):
        q, k, g = _activated(arrays, options)
        out, final, chunk_states = chunked_core(
            q,
            k,
            arrays.v,
            g,
            arrays.beta,
            chunk_size=options.chunk_size,
            precision=options.precision,
            output_chunk_states=options.output_chunk_states,
            **_core_kwargs(arrays, options),
        )
        return out.astype(options.dtype), final, chunk_states, None


class Tokamax(Backend):
    """tokamax's kernels (:mod:`kda_lib.ops.tokamax.adapter`): q/k heads repeated for grouped
    value heads, ``a_log = 0`` for the rate-free safe gate."""

    needs = frozenset({"max_num_segments"})

    def __init__(self, name: str, variant: TokamaxVariant, context_parallel=None):
        self.name, self.variant, self.context_parallel = name, variant, context_parallel
        self.token_by_token = not variant.chunked

    def option_problems(self, *, fused_gate, lower_bound, allow_neg_eigval):
        if allow_neg_eigval:
            return [f"{self.name} requires beta in [0, 1]; allow_neg_eigval is not supported"]
        return []

    def config_problems(self, *, key_dim, dtype, lower_bound, fused_gate):
        """tokamax itself missing (an extra: the message names it), then the kernel's own."""
        missing = missing_tokamax_problem(f"implementation={self.name!r}")
        return ([missing] if missing else []) + self.kernel_problems(
            key_dim=key_dim, dtype=dtype, lower_bound=lower_bound, fused_gate=fused_gate
        )

    def kernel_problems(self, *, key_dim, dtype, lower_bound, fused_gate):
        """What the kernel cannot serve of this configuration here (tokamax installed)."""
        return []

    def problems(self, options):
        name = self.name
        found = self.option_problems(
            fused_gate=options.fused_gate,
            lower_bound=options.lower_bound,
            allow_neg_eigval=options.allow_neg_eigval,
        )
        if options.precision is not None:
            found.append(
                f"precision={options.precision!r} applies to kda_lib's 'chunked' implementation; "
                f"{name!r} chooses its own matmul precision (pass precision=None)"
            )
        for flag in ("output_chunk_states", "output_token_states"):
            if getattr(options, flag):
                found.append(
                    f"{name} returns no interior states ({flag}); use kda_lib's 'chunked' or "
                    "'recurrent' implementation"
                )
        if self.variant.chunked and options.chunk_size != TOKAMAX_CHUNK:
            found.append(
                f"{name} supports chunk_size={TOKAMAX_CHUNK} only, got {options.chunk_size}"
            )
        return found + self._segment_problems(options)

    def _segment_problems(self, options):
        if not options.has_segments:
            return []
        if options.max_num_segments is None:
            return [
                f"{self.name} with segment_ids needs max_num_segments (a static bound on the ids)"
            ]
        most = options.segments_per_row
        if most is not None and most > options.max_num_segments:
            return [
                f"segment_ids has a row with {most} segments but max_num_segments="
                f"{options.max_num_segments}"
            ]
        problem = segment_slots_problem(
            self.name, options.dims, options.max_num_segments, segments_per_row=most
        )
        return [problem] if problem else []

    def __call__(self, arrays, options):
        q, k = repeat_qk_heads(arrays.q, arrays.k, options.dims.groups)
        a_log = arrays.a_log
        if options.fused_gate and a_log is None:
            a_log = jnp.zeros((options.dims.num_heads,), jnp.float32)
        out, final = tokamax_kda(
            self.variant,
            q,
            k,
            arrays.v,
            arrays.g,
            arrays.beta,
            arrays.initial_state,
            arrays.segment_ids,
            (a_log, arrays.dt_bias),
            options,
        )
        return out, final, None, None


class TokamaxXlaChunked(Tokamax):
    """tokamax's pure-JAX chunked form: it takes the fused safe gate only."""

    def option_problems(self, *, fused_gate, lower_bound, allow_neg_eigval):
        found = super().option_problems(
            fused_gate=fused_gate, lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval
        )
        if not (fused_gate and lower_bound is not None):
            found.append(
                f"{self.name} needs the fused safe gate (it needs the safe gate's lower_bound, "
                "with or without a_log, and a raw gate input g); use implementation='chunked' "
                "for log-space gates"
            )
        return found

    def kernel_problems(self, *, key_dim, dtype, lower_bound, fused_gate):
        return self.option_problems(
            fused_gate=fused_gate, lower_bound=lower_bound, allow_neg_eigval=False
        )


class TokamaxMosaic(Tokamax):
    """tokamax's Pallas Mosaic kernel: TPU v6+ (or :func:`kda_lib.emulate_tpu`); its own CP
    route. Not compiled once: its trace depends on the emulated chip, no part of jit's key."""

    compiled_once = False

    def problems(self, options):
        found = self.config_problems(
            key_dim=options.dims.key_dim,
            dtype=options.dtype,
            lower_bound=options.lower_bound,
            fused_gate=options.fused_gate,
        )
        return found + super().problems(options)

    def kernel_problems(self, *, key_dim, dtype, lower_bound, fused_gate):
        return mosaic_problems(
            key_dim=key_dim, dtype=dtype, lower_bound=lower_bound, fused_gate=fused_gate
        )


RECURRENT, CHUNKED = Recurrent(), Chunked()
REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        RECURRENT,
        CHUNKED,
        Tokamax("tokamax_xla", TOKAMAX_VARIANTS["tokamax_xla"]),
        TokamaxXlaChunked("tokamax_xla_chunked", TOKAMAX_VARIANTS["tokamax_xla_chunked"]),
        TokamaxMosaic(
            "tokamax_mosaic",
            TOKAMAX_VARIANTS["tokamax_mosaic"],
            context_parallel=tokamax_mosaic_context_parallel,
        ),
    )
}
IMPLEMENTATIONS = tuple(REGISTRY)


# ------------------------------------------------------------------ the "auto" policy

# the rules and their recorded grid: docs/DESIGN.md section 4
RECURRENT_MAX_AUTO_T = 16  # up to it the scan (decode steps)
CPU_FORWARD, CPU_TRAINING = "recurrent", "chunked"  # above it on CPU, undifferentiated or not
CPU_CHUNKED_FORWARD_MIN_STATE = 65536  # B * HV * K * V from which the CPU forward is chunked


def portable_forms(
    seq_len: int, state_size: int | None = None, platform: str | None = None
) -> tuple[str, str]:
    """``(forward, training)``: kda_lib's forms for an undifferentiated and a differentiated call
    of ``seq_len`` tokens whose state has ``state_size = B * HV * K * V`` numbers (None: small)
    on ``platform`` (default: JAX's default backend)."""
    if seq_len <= RECURRENT_MAX_AUTO_T:
        return "recurrent", "recurrent"
    if (platform or jax.default_backend()) == "cpu":
        large = state_size is not None and state_size >= CPU_CHUNKED_FORWARD_MIN_STATE
        return ("chunked" if large else CPU_FORWARD), CPU_TRAINING
    return "chunked", "chunked"


def select_implementation(
    *,
    seq_len: int,
    key_dim: int,
    dtype,
    lower_bound,
    fused_gate: bool,
    differentiated=True,
    batch: int = 1,
    num_heads: int = 1,
    value_dim: int | None = None,
):
    """The name ``"auto"`` picks for a (``differentiated``) call of this configuration: tokamax
    Mosaic on a real TPU v6+ where it serves it, else :func:`portable_forms` with the state of
    ``batch * num_heads * key_dim * value_dim`` (``value_dim`` default ``key_dim``)."""
    if tpu_generation() is not None and not REGISTRY["tokamax_mosaic"].config_problems(
        key_dim=key_dim, dtype=dtype, lower_bound=lower_bound, fused_gate=fused_gate
    ):
        return "tokamax_mosaic"
    state_size = batch * num_heads * key_dim * (value_dim or key_dim)
    forward, training = portable_forms(seq_len, state_size)
    return training if differentiated else forward


def portable_implementation(seq_len: int) -> str:
    """The training form of :func:`portable_forms` (``"auto"``'s CP route)."""
    return portable_forms(seq_len)[1]


class Routed(Backend):
    """``"auto"``'s route when the best forward and the best training form differ: a
    ``jax.custom_jvp`` whose primal (what runs when nothing differentiates the call) is
    ``forward`` and whose JVP is ``training``'s, built from its VJP by transposition (the
    chunked form's backward is hand-written, so it has no JVP of its own). Forward mode
    (``jax.jvp``, ``jax.jacfwd``) works; reverse mode transposes that JVP back, so a
    differentiated call runs exactly ``training``'s forward and backward."""

    def __init__(self, forward: Backend, training: Backend):
        self.forward, self.training = forward, training
        self.name = training.name  # what runs under differentiation; CP takes its route
        self.context_parallel = training.context_parallel

    def problems(self, options):
        return self.forward.problems(options) + self.training.problems(options)

    def __call__(self, arrays, options):
        return _routed(self.forward, self.training, options, arrays)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _routed(forward: Backend, training: Backend, options: KDAOptions, arrays: KDAArrays):
    return forward(arrays, options)


@_routed.defjvp
def _routed_jvp(forward, training, options, primals, tangents):
    (arrays,), (tangent,) = primals, tangents
    floats = [n for n, x in arrays._asdict().items() if x is not None and n != "segment_ids"]

    def run(diff):
        return training(arrays._replace(**diff), options)

    out, pullback = jax.vjp(run, {n: getattr(arrays, n) for n in floats})
    push = jax.linear_transpose(pullback, out)
    (tangent_out,) = push(({n: getattr(tangent, n) for n in floats},))
    return out, tangent_out


@functools.cache
def _route(forward: str, training: str) -> Backend:
    """The backend for a pair of forms, one object per pair (:func:`run` traces per backend)."""
    if forward == training:
        return REGISTRY[forward]
    return Routed(REGISTRY[forward], REGISTRY[training])


def choose(options: KDAOptions) -> Backend:
    """``"auto"``: the scan for token states; tokamax Mosaic on a real TPU v6+ when it serves
    the call and no precision is asked; else :func:`portable_forms` (:class:`Routed` when the
    two differ; a precision the scan refuses keeps both on ``"chunked"``)."""
    dims = options.dims
    if options.output_token_states:  # only the scan keeps a state per token
        return RECURRENT
    mosaic = REGISTRY["tokamax_mosaic"]
    if (
        options.precision is None
        and tpu_generation() is not None  # a real TPU: emulated, Mosaic is far slower
        and not mosaic.problems(options)
    ):
        return mosaic
    state_size = dims.batch * dims.num_heads * dims.key_dim * dims.value_dim
    forward, training = portable_forms(dims.seq_len, state_size)
    if REGISTRY[forward].problems(options) and dims.seq_len > RECURRENT_MAX_AUTO_T:
        forward = training
    return _route(forward, training)


def resolve(options: KDAOptions) -> Backend:
    """The backend for a checked call: ``"auto"``'s choice, or the requested one if it can
    serve the inputs (a requested implementation never falls back: ValueError naming why)."""
    if options.implementation == "auto":
        return choose(options)
    backend = REGISTRY[options.implementation]
    if isinstance(backend, Tokamax):  # an extra: ModuleNotFoundError naming it
        require_tokamax(f"implementation={backend.name!r}")
    problems = backend.problems(options)
    if problems:
        raise ValueError("; ".join(problems))
    return backend


def context_parallel_route(implementation: str, seq_len: int):
    """The CP route of ``implementation`` (``"auto"``: kda_lib's own form for ``seq_len``):
    ``(name, route)`` with route :data:`STATE_PASSING` or a function; ValueError if it has none."""
    check_implementation(implementation)
    if implementation == "auto":
        implementation = portable_implementation(seq_len)
    backend = REGISTRY[implementation]
    if isinstance(backend, Tokamax):
        require_tokamax(f"implementation={implementation!r}")
    route = backend.context_parallel
    if route is None:
        # tokamax's XLA kernels build loop carries that do not vary over the mesh axis, which
        # shard_map rejects; its Mosaic kernel has its own CP path (ContextParallelMetadata)
        raise ValueError(
            f"kda_context_parallel runs kda_lib's kernels ('chunked' or 'recurrent'); "
            f"{implementation!r} cannot run inside shard_map here"
        )
    return implementation, route


def check_implementation(implementation, owner: str = "implementation") -> str:
    """``implementation`` must be ``"auto"`` or a registered name."""
    if not isinstance(implementation, str) or (
        implementation != "auto" and implementation not in REGISTRY
    ):
        raise ValueError(
            f"{owner} must be 'auto' or one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    return implementation


def option_problems(implementation, *, fused_gate: bool, lower_bound, allow_neg_eigval: bool):
    """Why ``implementation`` cannot serve these options anywhere (:meth:`Backend.option_problems`;
    none for ``"auto"``, which picks one that can)."""
    backend = REGISTRY.get(check_implementation(implementation))
    if backend is None:
        return []
    return backend.option_problems(
        fused_gate=fused_gate, lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval
    )


def segment_slots_problem(
    implementation: str,
    dims: Dims,
    max_num_segments: int,
    *,
    segments_per_row: int | None = None,
    name: str = "max_num_segments",
) -> str | None:
    """Why tokamax's float32 per-segment states ``[B, slots, HV, K, V]`` cannot fit here,
    naming ``name`` (the argument that sets the bound), or None (also for kda_lib's forms)."""
    backend = REGISTRY.get(implementation)
    if not isinstance(backend, Tokamax):
        return None
    slots = segment_slot_count(
        backend.variant, max_num_segments, dims.seq_len, segments_per_row=segments_per_row
    )
    shape = (dims.batch, slots, dims.num_heads, dims.key_dim, dims.value_dim)
    what = (
        f"{implementation}'s per-segment states [B, slots, HV, K, V] = {list(shape)} "
        "(float32; a slot per segment the bound allows, at most about T)"
    )
    problem = allocation_problem(what, 4 * math.prod(shape))
    return f"{name}={max_num_segments}: {problem}" if problem else None


def needs_segment_bound(implementation: str) -> bool:
    """Whether ``implementation`` needs ``max_num_segments`` with segment ids."""
    return implementation != "auto" and "max_num_segments" in REGISTRY[implementation].needs


def uses_own_context_parallel(implementation: str) -> bool:
    """Whether ``implementation``'s CP route is its own (it needs the mesh and a shard_map
    without the vma check), not kda_lib's state passing."""
    route = REGISTRY.get(implementation, CHUNKED).context_parallel
    return route is not None and route != STATE_PASSING


# ------------------------------------------------------------------ one check per call


def check_call(q, k, v, g, beta, **kw) -> tuple[Backend, KDAArrays, KDAOptions]:
    """Validate a :func:`kda_lib.kda` call once (arguments as there) and pick its backend,
    before any work; then the arrays as jax arrays, segment ids canonicalised, padding zeroed
    (once: backends do none of it again)."""
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
    initial_state, segment_ids = kw["initial_state"], kw["segment_ids"]
    common = dict(initial_state=initial_state, allow_neg_eigval=kw["allow_neg_eigval"])
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
    backend = resolve(options)
    return backend, _arrays(q, k, v, g, beta, kw, dims, fused_gate), options


def _check_state_outputs(options: KDAOptions) -> None:
    """Refuse interior states larger than this device's memory, naming the flag, before work."""
    dims, chunk = options.dims, options.chunk_size
    state = [dims.num_heads, dims.key_dim, dims.value_dim]
    itemsize = np.dtype(accumulation_dtype(options.dtype)).itemsize
    asked = (
        ("output_token_states", "token_states [B, T, HV, K, V]", dims.seq_len, ""),
        ("output_chunk_states", "chunk_states [B, T // chunk_size, HV, K, V]",
         dims.seq_len // chunk, f" at chunk_size={chunk}"),
    )  # fmt: skip
    for flag, what, count, where in asked:
        if getattr(options, flag):
            shape = [dims.batch, count, *state]
            nbytes = itemsize * math.prod(shape)
            check_allocation(flag, True, f"{what} = {shape}{where}", nbytes)


def _options(kw, dims, dtype, fused_gate, implementation, segments_per_row) -> KDAOptions:
    precision = check_precision(kw["precision"])
    for flag in ("output_final_state", "output_chunk_states", "output_token_states"):
        check_flag(flag, kw[flag])
    segment_bound, bound = kw["max_num_segments"], kw["lower_bound"]
    if kw["segment_ids"] is not None and segment_bound is not None:
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


# ------------------------------------------------------------------ the entry point


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
        multiple of H (grouped value heads: value head j reads q/k head ``j // (HV // H)``).
      g: ``[B, T, HV, K]``: log-space decay (``<= 0``), or with ``use_gate_in_kernel`` the raw
        gate input, activated inside by :func:`kda_lib.kda_gate` (fused into tokamax's
        kernels).
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
        ``lower_bound * sigmoid(exp(a_log) * (g + dt_bias))`` (``a_log`` None: rate 1, fla's
        ``A_log=None``; ``lower_bound`` None: the softplus gate, which needs ``a_log``).
        Without, as in fla, it is a promise that the log-space ``g >= lower_bound``, checked
        when ``g`` is concrete (ValueError naming both); it never switches the gate on.
      use_gate_in_kernel: activate the raw ``g`` inside (default False; fla's and tokamax's
        name). ``a_log`` or ``dt_bias`` without it is refused.
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: the chunked form's chunk length, a power of two (default 64; checked for
        every implementation; tokamax's chunked kernels take 64 only).
      implementation: one of IMPLEMENTATIONS or ``"auto"``.
      precision: the chunked form's matmul policy, ``"highest"``, ``"input"`` or None (see
        :func:`kda_lib.kda_chunked`); ``"recurrent"`` honours ``"highest"`` only, tokamax none.
      output_chunk_states: also return ``chunk_states [B, T // chunk_size, HV, K, V]``, the
        state after every full chunk (default False; ``"chunked"`` and ``"recurrent"``).
      output_token_states: also return ``token_states [B, T, HV, K, V]``, the state after
        every token (default False; ``"recurrent"``, which ``"auto"`` picks). Either refused,
        naming it, when the states cannot fit in this device's memory.

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] float32 | None)``; with
      ``output_chunk_states`` or ``output_token_states`` the 4-tuple :class:`KDAResult`
      ``(output, final_state, chunk_states, token_states)`` (None where not asked), so that
      ``o, state = kda(..., output_chunk_states=True)`` fails loudly on unpacking.
    """
    # every parameter by name, before any other local exists (check_call takes them all)
    backend, arrays, options = check_call(**locals())
    result = run(backend, arrays, options)
    return kda_result(*result, asked=options.output_chunk_states or options.output_token_states)
