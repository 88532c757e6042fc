"""``kda(...)``: one entry point for every KDA implementation, and :data:`REGISTRY`, one row
per implementation: ``call(arrays, options)`` and ``refuses(options, here)``, the one place that
says what it cannot serve. ``"auto"`` takes the first row that serves the call (DESIGN section
4); a named implementation never falls back (ValueError naming why)."""

from __future__ import annotations

import functools
from collections import namedtuple

import jax
import jax.numpy as jnp

from kda_lib.checks import check_flag, check_float_dtype, check_int
from kda_lib.ops import contract, pallas_tpu
from kda_lib.ops.chunked import Precision, ScanMode, chunked_core
from kda_lib.ops.contract import Dims, KDAOptions, KDAResult
from kda_lib.ops.gating import check_gate_switch, check_lower_bound, kda_gate
from kda_lib.ops.norms import l2_normalize
from kda_lib.ops.reference import recurrent_core
from kda_lib.ops.segments import NEUTRAL_RAW_GATE, canonical_segment_ids, zero_padding
from kda_lib.ops.tokamax import adapter
from kda_lib.ops.tokamax.adapter import TOKAMAX_VARIANTS, tokamax_kda, tpu_generation

# kda_prechecked is the KDA layer's entry (its inputs checked there), not a public surface
__all__ = ["IMPLEMENTATIONS", "KDAResult", "RECURRENT_MAX_AUTO_T", "kda", "kda_chunked",
           "kda_recurrent", "select_implementation"]  # fmt: skip


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
    """Kimi Delta Attention by ``implementation`` (``"auto"``: DESIGN section 4).

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``, HV a multiple of H (value head j reads q/k
        head ``j // (HV // H)``); beta: ``[B, T, HV]`` in [0, 1] ([0, 2] with
        ``allow_neg_eigval``, which only widens the range); g: ``[B, T, HV, K]``, a log-space
        decay ``<= 0``, or with ``use_gate_in_kernel`` the raw input of :func:`kda_lib.kda_gate`
        (``a_log [HV]``, ``dt_bias [HV * K]`` or ``[HV, K]``, ``lower_bound``).
      scale: default ``K ** -0.5``. initial_state: ``[B, HV, K, V]`` float32 (default zeros).
      segment_ids: ``[B, T]`` int, 0 = padding; a new segment wherever a real token's id
        changes. max_num_segments: a static bound on segments per row (tokamax; under ``jit``
        a row over it comes out NaN).
      lower_bound: in [-5, 0): the safe gate's bound; without ``use_gate_in_kernel``, a promise
        ``g >= lower_bound`` (checked when concrete). use_qk_l2norm: L2-normalise q, k first.
      chunk_size: a power of two (64). implementation: ``"auto"`` or one of
        :data:`IMPLEMENTATIONS`. precision: as in :func:`kda_lib.kda_chunked`.
      output_final_state, output_chunk_states, output_token_states: also return the state after
        the last valid token, each chunk ``[B, T // chunk_size, HV, K, V]`` or each token ``[B,
        T, HV, K, V]``.

    Returns:
      ``(o [B, T, HV, V] in q's dtype, final_state [B, HV, K, V] | None)``, states in float32
      (float64 for float64 inputs); with interior states a :class:`KDAResult`. Forward over
      reverse (``jax.hessian``, ``jvp`` of ``grad``) runs through the chunked form. Autodiff a
      form's hand-written backward cannot serve (``jax.jvp`` of ``"chunked"`` with a tangent
      in q, k, g or beta; on ``"pallas_tpu"`` and tokamax's any forward mode and a gradient of
      a gradient) is refused by name, eagerly or under ``jit``; ``auto`` runs the recurrence
      there instead (float32 token by token: ``precision`` and ``chunk_size`` no longer apply).
      A transform of a jitted ``kda()`` or gradient meets JAX's error (DESIGN section 4).
    """
    return _run_call(*check_call(**locals()))  # every parameter, before any other local


def kda_recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                  segment_ids=None, allow_neg_eigval=False, output_token_states=False):  # fmt: skip
    """:func:`kda` with ``implementation="recurrent"`` (a ``lax.scan``, kda_lib/ops/reference.py),
    ``g`` log-space; float64 inputs give the float64 oracle (under ``jax_enable_x64``)."""
    return kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
               output_final_state=output_final_state, segment_ids=segment_ids,
               allow_neg_eigval=allow_neg_eigval, output_token_states=output_token_states,
               implementation="recurrent")  # fmt: skip


def kda_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                segment_ids=None, allow_neg_eigval=False, chunk_size: int = 64,
                scan: ScanMode | None = None, precision: Precision | None = None,
                output_chunk_states: bool = False):  # fmt: skip
    """:func:`kda` with ``implementation="chunked"`` (kda_lib/ops/chunked.py), ``g`` log-space.
    ``scan``: ``"streaming"`` (None: the default) or ``"associative"``.
    ``precision``: ``"highest"`` every matmul in float32 (float64); ``"input"`` or None:
    bfloat16/float16 inputs' scores in that dtype, accumulated in float32."""
    if scan not in (None, "streaming", "associative"):
        raise ValueError(f"scan must be one of 'streaming', 'associative' or None, got {scan!r}")
    kw = {**kda.__kwdefaults__, **locals(), "implementation": "chunked"}
    impl, arrays, options = check_call(**{n: x for n, x in kw.items() if n != "scan"})
    return _run_call(impl, arrays, options._replace(scan=scan))


def kda_prechecked(q, k, v, g, beta, *, segments_per_row: int | None = None, **kwargs):
    """:func:`kda` for the KDA layer, which checked the values at its entry: shapes and options
    checked, nothing read on the host; ``segment_ids`` canonical with at most
    ``segments_per_row`` segments in a row (None: unknown); tokamax's per-segment states at
    ``max_num_segments`` checked to fit (``KDALayer._check_inputs``)."""
    kw = {**kda.__kwdefaults__, **kwargs}
    return _run_call(*check_call(q, k, v, g, beta, prechecked=True,
                                 segments_per_row=segments_per_row, **kw))  # fmt: skip


def _run_call(impl, arrays, options):
    """:func:`run`, autodiff that ``impl``'s hand-written backward cannot serve refused by name
    (``"auto"``: the recurrence run instead), the result as :func:`kda` returns it."""
    limit = impl.autodiff_limit  # "pure": the chunked form's custom_vjps see q, k, g, beta
    if limit and unserved_autodiff(arrays if limit == "any" else (
            arrays.q, arrays.k, arrays.g, arrays.beta, arrays.a_log, arrays.dt_bias), limit):
        if impl.autodiff_fallback:  # "auto": the recurrence (float32, no chunks) in every mode
            impl = REGISTRY[impl.autodiff_fallback]
        else:
            modes = ("jax.jvp, jax.jacfwd, jax.hessian, a gradient of a gradient" if limit == "any"
                     else "jax.jvp, jax.jacfwd innermost with a tangent in q, k, g or beta; "
                     "forward over reverse, jax.hessian, runs")  # fmt: skip
            raise TypeError(
                f"autodiff beyond one reverse pass ({modes}) cannot run through implementation="
                f"{impl.name!r}: its backward is hand-written (DESIGN section 4); pass "
                "implementation='recurrent'")
    result = run(impl, arrays, options)
    interior = options.output_chunk_states or options.output_token_states
    return KDAResult(*result) if interior else result[:2]


def unserved_autodiff(arrays, limit: str) -> bool:
    """Whether ``arrays`` are differentiated in a way a hand-written backward cannot serve, read
    from the tracers that carry them (JAX's JVP and linearize tracers, through ``jit``, ``vmap``
    and the like), ordered by how deep each transform is nested. ``limit="pure"``: the innermost
    transform carrying them is forward mode (``jax.jvp``, ``jax.jacfwd``; forward over reverse,
    ``jax.hessian``, runs); ``"any"``: forward mode at any depth or two reverse passes (``jax.grad``
    of ``jax.grad``, of the same array or of two). A transform JAX applies after the call has
    returned (``jax.jvp`` or ``jax.grad`` of a jitted gradient) leaves none to read: the error
    there is JAX's or the kernel's (DESIGN section 4)."""
    traces = {}  # id: (depth, kind) of each JVP or linearize trace carrying one of the arrays
    for x in jax.tree.leaves(tuple(arrays)):
        while isinstance(x, jax.core.Tracer):
            if (kind := type(x).__name__) in ("JVPTracer", "LinearizeTracer"):
                traces[id(x._trace)] = (_nesting(x._trace), kind)
            x = getattr(x, "primal", getattr(x, "val", None))
    kinds = [kind for _, kind in sorted(traces.values())]  # outermost first
    if limit == "pure":
        return kinds[-1:] == ["JVPTracer"]
    return "JVPTracer" in kinds or kinds.count("LinearizeTracer") > 1


def _nesting(trace) -> int:
    """How many traces ``trace`` is nested in (its chain of ``parent_trace``)."""
    depth = 0
    while (trace := getattr(trace, "parent_trace", None)) is not None:
        depth += 1
    return depth


# ------------------------------------------------------------------ the implementations
STATE_PASSING = "state_passing"  # kda_lib's CP route (kda_lib.parallel.context_parallel)
# one checked call's arrays as in kda() (None: absent; ids canonical, padding zeroed, dt_bias flat)
KDAArrays = namedtuple("KDAArrays", "q k v g beta initial_state segment_ids a_log dt_bias")
# call(arrays, options) -> (o, final, chunk_states, token_states); refuses(options, here) -> [why
# not]; context_parallel: STATE_PASSING, a function or None; variant: tokamax's kernel or None;
# autodiff_limit: the autodiff its hand-written backward cannot serve (unserved_autodiff), "pure"
# (a jvp straight over the call) or "any" (the Pallas kernels, tokamax's: once in reverse only),
# else None; autodiff_fallback: the row run there instead ("auto"'s rows: "recurrent"), else None
Implementation = namedtuple("Implementation", "name call refuses context_parallel variant "
                            "autodiff_limit autodiff_fallback",
                            defaults=(None, None))  # fmt: skip


def _own_form(core, arrays: KDAArrays, o: KDAOptions, **extra):
    """kda_lib's ``core`` on q, k (L2-normalised if asked), the log-space gate; o in q's dtype."""
    q, k, g = arrays.q, arrays.k, arrays.g
    if o.use_qk_l2norm:
        q, k = l2_normalize(q, keep_float32=True), l2_normalize(k, keep_float32=True)
    if o.fused_gate:
        g = kda_gate(g, arrays.a_log, arrays.dt_bias, lower_bound=o.lower_bound)
    out, *states = core(q, k, arrays.v, g, arrays.beta, dims=o.dims, scale=o.scale,
                        initial_state=arrays.initial_state, segment_ids=arrays.segment_ids,
                        output_final_state=o.output_final_state, **extra)  # fmt: skip
    return (out.astype(o.dtype), *states)


def _recurrent(arrays: KDAArrays, o: KDAOptions):
    every = o.chunk_size if o.output_chunk_states else None
    return _own_form(recurrent_core, arrays, o, output_token_states=o.output_token_states,
                     chunk_states_every=every)  # fmt: skip


def _chunked(arrays: KDAArrays, o: KDAOptions):
    return (*_own_form(chunked_core, arrays, o, chunk_size=o.chunk_size, precision=o.precision,
                       scan=o.scan, output_chunk_states=o.output_chunk_states), None)  # fmt: skip


def _pallas(arrays: KDAArrays, o: KDAOptions):
    return (*_own_form(pallas_tpu.pallas_core, arrays, o, chunk_size=o.chunk_size,
                       precision=o.precision, dtype=o.dtype), None)  # fmt: skip


def _recurrent_refuses(o: KDAOptions, here: bool = True) -> list[str]:
    return [f"precision={o.precision!r} applies to the 'chunked' implementation; 'recurrent' "
            "computes in float32 throughout (pass precision=None or 'highest')"
            ] if o.precision not in (None, "highest") else []  # fmt: skip


def _chunked_refuses(o: KDAOptions, here: bool = True) -> list[str]:
    return ["output_token_states needs implementation='recurrent' (or 'auto'): the chunked "
            "form keeps states at chunk boundaries only (output_chunk_states)"
            ] if o.output_token_states else []  # fmt: skip


REGISTRY: dict[str, Implementation] = {
    "recurrent": Implementation("recurrent", _recurrent, _recurrent_refuses, STATE_PASSING, None),
    "chunked": Implementation("chunked", _chunked, _chunked_refuses, STATE_PASSING, None, "pure"),
    "pallas_tpu": Implementation("pallas_tpu", _pallas, pallas_tpu.problems, STATE_PASSING,
                                 None, "any"),
    **{name: Implementation(name, lambda arrays, o, v=v: (*tokamax_kda(v, arrays, o), None, None),
                            functools.partial(adapter.tokamax_problems, v),
                            adapter.tokamax_mosaic_context_parallel if v.mosaic else None, v,
                            "any")
       for name, v in TOKAMAX_VARIANTS.items()},
}  # fmt: skip
IMPLEMENTATIONS = tuple(REGISTRY)
# "auto"'s row: it refuses nothing; check_call runs _route(*auto_forms(options)) for it
AUTO = Implementation("auto", None, lambda o, here=True: [], STATE_PASSING, None)


def implementation_row(implementation, owner: str = "implementation") -> Implementation:
    """The row of ``implementation`` (``"auto"``: :data:`AUTO`), else ValueError naming owner."""
    if not isinstance(implementation, str) or implementation not in ("auto", *REGISTRY):
        raise ValueError(f"{owner} must be 'auto' or one of {IMPLEMENTATIONS}, got "
                         f"{implementation!r}")  # fmt: skip
    return REGISTRY.get(implementation, AUTO)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 3))
def _routed(forward, training, arrays: KDAArrays, options: KDAOptions):
    """``forward``'s result; under jvp or grad ``training``'s, its VJP transposed as the JVP."""
    return forward(arrays, options)


@_routed.defjvp
def _routed_jvp(forward, training, options, primals, tangents):
    (arrays,), (tangent,) = primals, tangents
    floats = [n for n, x in arrays._asdict().items() if x is not None and n != "segment_ids"]
    diff = lambda arrays: {n: getattr(arrays, n) for n in floats}
    out, pullback = jax.vjp(lambda d: training(arrays._replace(**d), options), diff(arrays))
    (tangent_out,) = jax.linear_transpose(pullback, out)((diff(tangent),))
    return out, tangent_out


@functools.cache
def _route(forward: str, training: str) -> Implementation:
    """``"auto"``'s row for a pair of forms: ``forward``'s result with ``training``'s
    derivatives; forward-mode autodiff over a hand-written backward runs ``"recurrent"``."""
    fallback = None if training == "recurrent" else "recurrent"  # the scan needs none
    row = REGISTRY[training]._replace(autodiff_fallback=fallback)
    if forward == training:
        return row
    return row._replace(call=functools.partial(_routed, REGISTRY[forward].call, row.call),
                        autodiff_limit=None)  # the route's JVP serves forward mode


def run(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    """``impl.call(arrays, options)``: one program per row, options, shapes (Mosaic: unjitted)."""
    if impl.variant is None:  # only tokamax reads the count: not a reason to recompile
        options = options._replace(segments_per_row=None)
    elif impl.variant.mosaic:
        return impl.call(arrays, options)
    # auto's row and the explicit one: one program
    return _compiled(impl._replace(autodiff_fallback=None), arrays, options)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _compiled(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    return impl.call(arrays, options)


_CACHE_CLEARERS: list = []  # compiled-program caches outside ops (ops imports no layers or lab)


def register_compiled_cache(cache):
    """Decorator: :func:`clear_compiled_forms` also clears ``cache``."""
    _CACHE_CLEARERS.append(getattr(cache, "cache_clear", None) or cache.clear_cache)
    return cache


def clear_compiled_forms() -> None:
    """Forget every compiled program kda_lib keeps (a patched module constant is read again)."""
    for clear in (_compiled.clear_cache, chunked_core.clear_cache, recurrent_core.clear_cache,
                  *_CACHE_CLEARERS):  # fmt: skip
        clear()


# ------------------------------------------------------------------ "auto" (DESIGN section 4)
RECURRENT_MAX_AUTO_T = 16  # up to it the scan (decode steps)
CPU_CHUNKED_FORWARD_MIN_STATE = 65536  # B * HV * K * V from which the CPU forward is chunked


def portable_forms(seq_len: int, state_size: int | None = None, platform: str | None = None):
    """``(forward, training)``: kda_lib's forms for ``seq_len``, state ``B HV K V``, platform."""
    if seq_len <= RECURRENT_MAX_AUTO_T:
        return "recurrent", "recurrent"
    if (platform or jax.default_backend()) != "cpu":
        return "chunked", "chunked"
    large = state_size is not None and state_size >= CPU_CHUNKED_FORWARD_MIN_STATE
    return ("chunked" if large else "recurrent"), "chunked"


def auto_forms(o: KDAOptions) -> tuple[str, str]:
    """``(forward, training)`` that ``"auto"`` runs: the first row serving the call of tokamax
    Mosaic (a real TPU v6+) and, above :data:`RECURRENT_MAX_AUTO_T` tokens on a TPU,
    ``"pallas_tpu"``; then :func:`portable_forms`' pick, the training form, ``"recurrent"``."""
    d = o.dims
    forward, training = portable_forms(d.seq_len, d.batch * d.num_heads * d.key_dim * d.value_dim)
    kernel = ("pallas_tpu",) if d.seq_len > RECURRENT_MAX_AUTO_T else ()
    first = ("tokamax_mosaic", *kernel) if tpu_generation() else ()
    pick = lambda *names: next(
        (n for n in (*first, *names) if not REGISTRY[n].refuses(o)), "recurrent")  # fmt: skip
    return pick(forward, training), pick(training)


def context_parallel_route(implementation: str, seq_len: int):
    """``(name, route)``: the CP route of ``implementation`` (``"auto"``: kda_lib's training
    form for ``seq_len``), :data:`STATE_PASSING` or a function; ValueError if it has none."""
    row = implementation_row(implementation)
    row = REGISTRY[portable_forms(seq_len)[1]] if row is AUTO else row
    if row.variant is not None:
        adapter.require_tokamax(f"implementation={row.name!r}")
    if row.context_parallel is None:  # tokamax's XLA kernels' carries do not vary over the mesh
        raise ValueError(f"kda_context_parallel runs kda_lib's kernels ('chunked' or 'recurrent'); "
                         f"{row.name!r} cannot run inside shard_map here")  # fmt: skip
    return row.name, row.context_parallel


# ------------------------------------------------------------------ a call's options
# KDAOptions' fields a caller sets, as kda()'s keywords or a question's -> rule(name, value)
_RULES = {
    **dict.fromkeys(("output_final_state", "use_qk_l2norm", "output_chunk_states", "has_segments",
                     "output_token_states", "fused_gate", "allow_neg_eigval"), check_flag),
    "max_num_segments": functools.partial(check_int, optional=True),  # with ids or without
    "chunk_size": lambda _, value: contract.check_chunk_size(value),
    "precision": lambda _, value: contract.check_precision(value),
    "lower_bound": lambda _, value: check_lower_bound(value) or value and float(value),
    "dtype": check_float_dtype,
}  # fmt: skip
_SIZES = ("batch", "seq_len", "num_heads", "key_dim", "value_dim")  # a question's own fields


def kda_options(owner: str, dims: Dims | None, /, **fields) -> KDAOptions:
    """``KDAOptions(dims, **fields)``, each field with a rule checked by name; ``dims`` None: for
    ``owner``'s question, sizes among ``fields`` (default 1, ``value_dim``: ``key_dim``)."""
    if dims is None:
        if unknown := sorted(set(fields) - {*_RULES, *_SIZES}):
            raise ValueError(f"{owner} got unknown arguments {unknown}; it takes "
                             f"{sorted({*_RULES, *_SIZES})}")  # fmt: skip
        b, t, h, k = (check_int(n, fields.pop(n, 1)) for n in _SIZES[:4])
        v = check_int("value_dim", fields.pop("value_dim", None), optional=True) or k
        dims = Dims(b, t, h, k, v, h)
    return KDAOptions(dims, **{n: _RULES[n](n, x) if n in _RULES else x for n, x in fields.items()})


def select_implementation(*, differentiated: bool = True, **config) -> str:
    """The name ``"auto"`` runs for a (``differentiated``) call of ``config``: sizes (default 1,
    ``value_dim``: ``key_dim``) and :class:`KDAOptions` fields, each checked by name."""
    differentiated = check_flag("differentiated", differentiated)
    return auto_forms(kda_options("select_implementation", None, **config))[differentiated]


def refusals(implementation: str, *, here: bool = True, **config) -> list[str]:
    """Why ``implementation`` cannot serve a call of ``config`` (``here``: on this machine)."""
    options, here = kda_options("refusals", None, **config), check_flag("here", here)
    return implementation_row(implementation).refuses(options, here)


# ------------------------------------------------------------------ one check per call
def check_call(q, k, v, g, beta, prechecked=False, segments_per_row=None, refused="", **kw):
    """Each argument of a :func:`kda` call checked once, by name, before any work (values unless
    ``prechecked``): ``(row, arrays, options)``; ``refused`` prefixes a refusal's message."""
    row = implementation_row(kw["implementation"])  # a misspelt name: no shape checks, no reads
    fused = check_gate_switch(kw["use_gate_in_kernel"], kw["a_log"], kw["dt_bias"],
                              kw["lower_bound"])  # fmt: skip
    ids = kw["segment_ids"]
    dims = contract.check_kda_inputs(q, k, v, g, beta, raw_gate=fused, values=not prechecked, **{
        n: kw[n] for n in ("initial_state", "allow_neg_eigval", "lower_bound", "a_log", "dt_bias")
    })  # fmt: skip
    if ids is not None and not prechecked:
        segments_per_row = contract.check_segment_ids(ids, *dims[:2])
    kw["lower_bound"] = kw["lower_bound"] if fused else None  # the options: the gate's bound only
    o = kda_options("kda", dims, **{n: kw[n] for n in _RULES if n in kw}, dtype=q.dtype,
                    fused_gate=fused, scale=contract.resolve_scale(kw["scale"], dims.key_dim),
                    has_segments=ids is not None, segments_per_row=segments_per_row)  # fmt: skip
    interior = [(flag, what, count) for flag, what, count in (
        ("output_token_states", "token_states [B, T, HV, K, V]", dims.seq_len),
        ("output_chunk_states", f"at chunk_size={o.chunk_size}, chunk_states [B, T // "
         "chunk_size, HV, K, V]", dims.seq_len // o.chunk_size)) if getattr(o, flag)]
    if interior:  # one size check: the interior states asked for, together, past memory by name
        contract.check_states_fit(" and ".join(f for f, _, _ in interior), True, " plus ".join(
            w for _, w, _ in interior), sum(c for _, _, c in interior), dims, o.dtype)  # fmt: skip
    if row.variant is not None:
        adapter.require_tokamax(f"implementation={row.name!r}")
    slots = {"slots_checked": prechecked} if row.variant is not None else {}  # the layer's
    if problems := row.refuses(o, True, **slots):
        raise ValueError(refused + "; ".join(problems))
    impl = _route(*auto_forms(o)) if row is AUTO else row
    return impl, _arrays(q, k, v, g, beta, kw, fused, canonical=prechecked), o


def _arrays(q, k, v, g, beta, kw, fused: bool, canonical: bool) -> KDAArrays:
    """The checked arrays as jax arrays, ``dt_bias`` flat, ids canonical, padding zeroed."""
    q, k, v, g, beta, state, a_log, dt_bias = (
        None if x is None else jnp.asarray(x)
        for x in (q, k, v, g, beta, kw["initial_state"], kw["a_log"], kw["dt_bias"])
    )
    ids = kw["segment_ids"]
    if ids is not None:  # one rule everywhere: a new segment wherever a real token's id changes
        ids = ids if canonical else canonical_segment_ids(ids)
        gate = NEUTRAL_RAW_GATE if fused else 0.0
        q, k, v, g, beta = zero_padding(ids, q, k, v, g, beta, neutral_gate=gate)
    dt_bias = None if dt_bias is None else dt_bias.reshape(-1)
    return KDAArrays(q, k, v, g, beta, state, ids, a_log, dt_bias)
