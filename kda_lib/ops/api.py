"""``kda(...)``: one entry point for every KDA implementation, and :data:`REGISTRY`, one row
per implementation: ``call(arrays, options)`` and ``refuses(options, here)``, the one place that
says what it cannot serve. ``"auto"`` takes the first row that serves the call (DESIGN section
4); a named implementation never falls back (ValueError naming why)."""

from __future__ import annotations

import functools
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np

from kda_lib.checks import check_flag, check_float_dtype, check_int
from kda_lib.ops import contract
from kda_lib.ops.chunked import Precision, chunked_core
from kda_lib.ops.contract import Dims, KDAOptions, KDAResult
from kda_lib.ops.gating import check_gate_switch, check_lower_bound, kda_gate
from kda_lib.ops.norms import l2_normalize
from kda_lib.ops.reference import recurrent_core
from kda_lib.ops.segments import NEUTRAL_RAW_GATE, canonical_segment_ids, zero_padding
from kda_lib.ops.tokamax import adapter
from kda_lib.ops.tokamax.adapter import TOKAMAX_VARIANTS, tokamax_kda, tpu_generation

segment_slots_problem = adapter.segment_slots_problem  # the layer asks it here
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
      q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; beta: ``[B, T, HV]`` in [0, 1]; HV a
        positive multiple of H (value head j reads q/k head ``j // (HV // H)``).
      g: ``[B, T, HV, K]`` log-space decay (``<= 0``), or the raw gate input with
        ``use_gate_in_kernel``.
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, HV, K, V]`` (float32), the state entering a row's first segment.
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
      use_gate_in_kernel: activate the raw ``g`` inside, by :func:`kda_lib.kda_gate` (default
        False).
      use_qk_l2norm: L2-normalise q and k (eps 1e-6) first.
      allow_neg_eigval: accept beta in [0, 2].
      chunk_size: the chunked form's chunk length, a power of two (default 64; tokamax: 64).
      implementation: one of :data:`IMPLEMENTATIONS` or ``"auto"`` (default).
      precision: the chunked form's matmul policy ``"highest"``, ``"input"`` or None (default;
        :func:`kda_lib.kda_chunked`); ``"recurrent"`` honours ``"highest"`` only, tokamax none.
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
    return contract.kda_result(*result, asked=options.output_chunk_states or
                               options.output_token_states)  # fmt: skip


# ------------------------------------------------------------------ the implementations

STATE_PASSING = "state_passing"  # kda_lib's CP route (kda_lib.parallel.context_parallel)
# one checked call's arrays, shapes as in kda() (None: absent; ids canonical, padding zeroed,
# dt_bias flat [HV * K])
KDAArrays = namedtuple("KDAArrays", "q k v g beta initial_state segment_ids a_log dt_bias")
# one row of REGISTRY: call(arrays, options) -> (o, final_state, chunk_states, token_states);
# refuses(options, here) -> [why it cannot serve them] (here: this machine's reasons too);
# context_parallel: STATE_PASSING, its own function or None; variant: tokamax's kernel or None
Implementation = namedtuple("Implementation", "name call refuses context_parallel variant")


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


def _recurrent_refuses(o: KDAOptions, here: bool = True) -> list[str]:
    return [f"precision={o.precision!r} applies to the 'chunked' implementation; 'recurrent' "
            "computes in float32 throughout (pass precision=None or 'highest')"
            ] if o.precision not in (None, "highest") else []  # fmt: skip


def _chunked(arrays: KDAArrays, o: KDAOptions):
    q, k, g = _activated(arrays, o)
    out, final, chunk_states = chunked_core(
        q, k, arrays.v, g, arrays.beta, dims=o.dims, scale=o.scale,
        initial_state=arrays.initial_state, output_final_state=o.output_final_state,
        segment_ids=arrays.segment_ids, chunk_size=o.chunk_size, precision=o.precision,
        output_chunk_states=o.output_chunk_states,
    )  # fmt: skip
    return out.astype(o.dtype), final, chunk_states, None


def _chunked_refuses(o: KDAOptions, here: bool = True) -> list[str]:
    return ["output_token_states needs implementation='recurrent' (or 'auto'): the chunked "
            "form keeps states at chunk boundaries only (output_chunk_states)"
            ] if o.output_token_states else []  # fmt: skip


REGISTRY: dict[str, Implementation] = {
    "recurrent": Implementation("recurrent", _recurrent, _recurrent_refuses, STATE_PASSING, None),
    "chunked": Implementation("chunked", _chunked, _chunked_refuses, STATE_PASSING, None),
    **{name: Implementation(name, lambda arrays, o, v=v: (*tokamax_kda(v, arrays, o), None, None),
                            functools.partial(adapter.tokamax_problems, v),
                            adapter.tokamax_mosaic_context_parallel if v.mosaic else None, v)
       for name, v in TOKAMAX_VARIANTS.items()},
}  # fmt: skip
IMPLEMENTATIONS = tuple(REGISTRY)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 3))
def _routed(forward, training, arrays: KDAArrays, options: KDAOptions):
    """``forward``'s result; its JVP is ``training``'s VJP transposed, so ``jax.jvp`` works
    through a form with hand-written gradients and ``jax.grad`` runs ``training``'s backward."""
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
    """One row per pair of forms (:func:`run` traces per row): ``forward``'s result with
    ``training``'s derivatives (:func:`_routed`)."""
    if forward == training:
        return REGISTRY[forward]
    calls = {"recurrent": _recurrent, "chunked": _chunked}
    return REGISTRY[training]._replace(call=functools.partial(_routed, calls[forward],
                                                              calls[training]))  # fmt: skip


def run(impl: Implementation, arrays: KDAArrays, options: KDAOptions):
    """``impl.call(arrays, options)`` as one compiled program per row, options and shapes;
    Mosaic as it is (its trace depends on the emulated chip, no part of jit's key)."""
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
    """``(forward, training)``: kda_lib's forms for an undifferentiated and a differentiated
    call of ``seq_len`` tokens, state ``B * HV * K * V`` (None: small), on ``platform``."""
    if seq_len <= RECURRENT_MAX_AUTO_T:
        return "recurrent", "recurrent"
    if (platform or jax.default_backend()) != "cpu":
        return "chunked", "chunked"
    large = state_size is not None and state_size >= CPU_CHUNKED_FORWARD_MIN_STATE
    return ("chunked" if large else "recurrent"), "chunked"


def auto_forms(o: KDAOptions) -> tuple[str, str]:
    """``(forward, training)`` that ``"auto"`` runs: the first row that serves the call of
    tokamax Mosaic (on a real TPU v6+), :func:`portable_forms`' pick, the training form and
    ``"recurrent"`` (which also takes what none serves)."""
    d = o.dims
    forward, training = portable_forms(d.seq_len, d.batch * d.num_heads * d.key_dim * d.value_dim)
    first = ("tokamax_mosaic",) if tpu_generation() else ()
    pick = lambda *names: next(
        (n for n in (*first, *names) if not REGISTRY[n].refuses(o)), "recurrent")  # fmt: skip
    return pick(forward, training), pick(training)


# ------------------------------------------------------------------ questions asked before a call


# kda()'s keywords that are KDAOptions' fields as they are -> rule(name, value) -> the value
_OPTIONS = {
    **dict.fromkeys(("output_final_state", "use_qk_l2norm", "output_chunk_states",
                     "output_token_states"), check_flag),
    "max_num_segments": functools.partial(check_int, optional=True),  # with ids or without
    "chunk_size": lambda _, value: contract.check_chunk_size(value),
    "precision": lambda _, value: contract.check_precision(value),
    "implementation": lambda name, value: check_implementation(value, name),
}  # fmt: skip
_SIZES = ("batch", "seq_len", "num_heads", "key_dim")
# the fields of a call known in part (the sizes, KDAOptions') -> rule(name, value) -> value
_FIELDS = {
    **_OPTIONS, **dict.fromkeys(_SIZES, check_int), "dtype": check_float_dtype,
    "value_dim": functools.partial(check_int, optional=True),
    "lower_bound": lambda _, value: check_lower_bound(value) or value,
    **dict.fromkeys(("fused_gate", "allow_neg_eigval", "has_initial_state", "has_segments"),
                    check_flag),
}  # fmt: skip


def _request(owner: str, config: dict) -> KDAOptions:
    """The options of a call known in part, each field checked by name (the rest: defaults)."""
    if unknown := sorted(set(config) - set(_FIELDS)):
        raise ValueError(f"{owner} got unknown arguments {unknown}; it takes {sorted(_FIELDS)}")
    fields = {name: _FIELDS[name](name, value) for name, value in config.items()}
    sizes = [fields.pop(name, 1) for name in _SIZES]
    value_dim = fields.pop("value_dim", None) or sizes[3]
    return KDAOptions(Dims(*sizes, value_dim, sizes[2]), **fields)


def select_implementation(*, differentiated: bool = True, **config) -> str:
    """The name ``"auto"`` runs for a (``differentiated``) call of ``config``: the sizes
    (``value_dim`` default ``key_dim``, others 1) and :class:`KDAOptions` fields (defaults as
    in :func:`kda`). A bad or unknown field: ValueError naming it."""
    differentiated = check_flag("differentiated", differentiated)
    return auto_forms(_request("select_implementation", config))[differentiated]


def refusals(implementation: str, *, here: bool = True, **config) -> list[str]:
    """Why ``implementation`` cannot serve a call of ``config`` (as for
    :func:`select_implementation`); ``here``: on this machine too (none for ``"auto"``)."""
    options, here = _request("refusals", config), check_flag("here", here)
    if check_implementation(implementation) == "auto":
        return []
    return REGISTRY[implementation].refuses(options, here)


def option_problems(implementation: str, **config) -> list[str]:
    """:func:`refusals` on any machine (for a layer's config)."""
    return refusals(implementation, here=False, **config)


def needs_segment_bound(implementation: str) -> bool:
    """Whether ``implementation``'s row needs ``max_num_segments`` with segment ids (tokamax)."""
    return getattr(REGISTRY.get(implementation), "variant", None) is not None


def uses_own_context_parallel(implementation: str) -> bool:
    """Whether ``implementation``'s CP route is its own (tokamax Mosaic), not state passing."""
    return callable(getattr(REGISTRY.get(implementation), "context_parallel", None))


def check_implementation(implementation, owner: str = "implementation") -> str:
    """``implementation`` must be ``"auto"`` or a registered name."""
    if not isinstance(implementation, str) or implementation not in ("auto", *REGISTRY):
        raise ValueError(f"{owner} must be 'auto' or one of {IMPLEMENTATIONS}, got "
                         f"{implementation!r}")  # fmt: skip
    return implementation


def _required(implementation: str) -> Implementation:
    """A named row; tokamax's only where installed (else ModuleNotFoundError)."""
    if REGISTRY[implementation].variant is not None:
        adapter.require_tokamax(f"implementation={implementation!r}")
    return REGISTRY[implementation]


def context_parallel_route(implementation: str, seq_len: int):
    """``(name, route)``: the CP route of ``implementation`` (``"auto"``: kda_lib's training
    form for ``seq_len``), :data:`STATE_PASSING` or a function; ValueError if it has none."""
    if check_implementation(implementation) == "auto":
        implementation = portable_forms(seq_len)[1]
    route = _required(implementation).context_parallel
    if route is None:  # tokamax's XLA kernels' loop carries do not vary over the mesh axis
        raise ValueError(f"kda_context_parallel runs kda_lib's kernels ('chunked' or "
                         f"'recurrent'); {implementation!r} cannot run inside shard_map here")
    return implementation, route


# ------------------------------------------------------------------ one check per call


# segment ids [B, T] the KDA layer checked at its entry (canonical), with the count that
# contract.check_segment_ids returned: kda() does not check them again
CheckedSegmentIds = namedtuple("CheckedSegmentIds", "ids segments_per_row")


def check_call(q, k, v, g, beta, **kw) -> tuple[Implementation, KDAArrays, KDAOptions]:
    """Each argument of a :func:`kda` call checked once, by name, before any work: ``(row,
    arrays, options)``."""
    fused = check_gate_switch(kw["use_gate_in_kernel"], kw["a_log"], kw["dt_bias"],
                              kw["lower_bound"])  # and a_log, dt_bias present, lower_bound
    dims = contract.check_kda_inputs(q, k, v, g, beta, raw_gate=fused, **{
        n: kw[n] for n in ("initial_state", "allow_neg_eigval", "lower_bound", "a_log", "dt_bias")
    })  # fmt: skip
    ids, bound, per_row = kw["segment_ids"], kw["lower_bound"], None
    if isinstance(ids, CheckedSegmentIds):  # the KDA layer checked them at its entry
        ids, per_row = ids
        kw["segment_ids"] = ids
    elif ids is not None:
        per_row = contract.check_segment_ids(ids, *dims[:2])
    o = KDAOptions(
        dims, np.dtype(q.dtype), contract.resolve_scale(kw["scale"], dims.key_dim),
        has_initial_state=kw["initial_state"] is not None, has_segments=ids is not None,
        segments_per_row=per_row,
        fused_gate=fused, allow_neg_eigval=bool(kw["allow_neg_eigval"]),
        lower_bound=None if bound is None or not fused else float(bound),  # else: g's promise
        **{name: rule(name, kw[name]) for name, rule in _OPTIONS.items()},
    )  # fmt: skip
    for name, count in (("token", o.dims.seq_len), ("chunk", o.dims.seq_len // o.chunk_size)):
        if getattr(o, f"output_{name}_states"):  # interior states past memory, by name
            what = "token_states [B, T, HV, K, V]" if name == "token" else (
                f"at chunk_size={o.chunk_size}, chunk_states [B, T // chunk_size, HV, K, V]")
            contract.check_states_fit(f"output_{name}_states", True, what, count, dims, o.dtype)
    if o.implementation == "auto":
        impl = _route(*auto_forms(o))
    elif problems := _required(o.implementation).refuses(o, True):
        raise ValueError("; ".join(problems))
    else:
        impl = REGISTRY[o.implementation]
    return impl, _arrays(q, k, v, g, beta, kw, fused), o


def _arrays(q, k, v, g, beta, kw, fused: bool) -> KDAArrays:
    """The checked arrays as jax arrays, ``dt_bias`` flat, ids canonical, padding zeroed."""
    q, k, v, g, beta, state, a_log, dt_bias = (
        None if x is None else jnp.asarray(x)
        for x in (q, k, v, g, beta, kw["initial_state"], kw["a_log"], kw["dt_bias"])
    )
    ids = kw["segment_ids"]
    if ids is not None:  # one rule everywhere: a new segment wherever a real token's id changes
        ids = canonical_segment_ids(ids)
        gate = NEUTRAL_RAW_GATE if fused else 0.0
        q, k, v, g, beta = zero_padding(ids, q, k, v, g, beta, neutral_gate=gate)
    dt_bias = None if dt_bias is None else dt_bias.reshape(-1)
    return KDAArrays(q, k, v, g, beta, state, ids, a_log, dt_bias)
