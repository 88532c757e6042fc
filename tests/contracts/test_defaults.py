"""Every default of every public entry point exercised at its default (issue 75.7): each name of
``kda_lib.__all__`` and the layer's methods called with its required arguments only, its result
against the float64 oracle (kda_lib's recurrence run in float64) given every default spelled out
as the value the docstrings promise. The inputs let a wrong default show: K != V (the default
scale is K's), q and k not of unit norm (use_qk_l2norm off), T = 192, three chunks of the default
64, with gates that keep over a quarter of the state across each chunk (the differentiated
default runs the chunked form at the default chunk size), a gate below any lower bound (the
default promises none). :func:`test_every_default_has_a_row` fails on a parameter with a
default that no row here exercises, so a new keyword is not done until it has one."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_call, load_fla_layer_fixture
from flax import nnx

import kda_lib
from kda_lib import (
    KDAConfig,
    KimiDeltaAttention,
    init_a_log,
    init_dt_bias,
    kda,
    kda_chunked,
    kda_gate,
    kda_pool_step,
    kda_pool_verify,
    kda_recurrent,
    kda_step,
)
from kda_lib.ops.contract import KDAResult
from kda_lib.testing import assert_close, float32_tolerance, random_kda_inputs, relative_l2

B, T, H, K, V = 2, 192, 2, 8, 4
C = 64  # the default chunk size, never passed here
NAMES = ("q", "k", "v", "g", "beta")

# the parameters each row below leaves at their defaults (the layer's rows: its constructor's and
# methods'; KDAConfig's fields by the default layer); a comment says where a default has no
# effect on values
COVERED = {
    "kda": {
        "scale", "initial_state", "output_final_state", "segment_ids", "a_log", "dt_bias",
        "lower_bound", "use_gate_in_kernel", "use_qk_l2norm", "allow_neg_eigval", "chunk_size",
        "implementation", "precision", "output_chunk_states", "output_token_states",
        "max_num_segments",  # tokamax's static bound: no effect on kda_lib's forms
    },
    "kda_chunked": {
        "scale", "initial_state", "output_final_state", "segment_ids", "allow_neg_eigval",
        "chunk_size", "scan", "precision", "output_chunk_states",
    },
    "kda_recurrent": {
        "scale", "initial_state", "output_final_state", "segment_ids", "allow_neg_eigval",
        "output_token_states",
    },
    "kda_step": {"scale"},
    "kda_pool_step": {"scale"},
    "kda_pool_verify": {"scale"},
    "kda_gate": {"lower_bound"},
    "init_a_log": {"safe_gate", "low", "high"},
    "init_dt_bias": {"dt_min", "dt_max", "dt_floor"},
    # every field but the three required ones: the default layer
    "KDAConfig": {f.name for f in dataclasses.fields(KDAConfig)}
    - {"hidden_size", "num_heads", "head_dim"},
    # mesh=None: one device; context_axis names a mesh axis, read only with a mesh
    "KimiDeltaAttention.__init__": {"mesh", "context_axis"},
    "KimiDeltaAttention.__call__": {"segment_ids", "cache"},
    "KimiDeltaAttention.prefill": {"cache"},
    "KimiDeltaAttention.project": {"segment_ids", "cache", "halo", "history_segment_ids"},
}  # fmt: skip
# public names whose defaults are exercised elsewhere, or that have none
ELSEWHERE = {
    "GateForm": "an enum: no defaults",
    # lab/, loaded on first use: called with no arguments there (chip "v6e", memory "zero")
    "emulate_tpu": "tests/ops/test_emulation.py::"
    "test_context_manager_sets_and_restores_the_environment",
}
LAYER_METHODS = ("__init__", "__call__", "init_cache", "prefill", "draft", "accept_draft",
                 "project", "project_output", "kernel_kwargs", "from_fla_state_dict")  # fmt: skip


def _defaults(fn) -> set[str]:
    """The names of ``fn``'s parameters that have a default."""
    return {n for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def test_every_default_has_a_row():
    """Each public name's and each layer method's parameters with a default are all left at it
    by a row of this file (or the name is listed with the test that does)."""
    targets = {n: getattr(kda_lib, n) for n in kda_lib.__all__ if n not in ELSEWHERE}
    targets.pop("KimiDeltaAttention")  # nnx's metaclass hides the signature: its methods'
    targets.update({f"KimiDeltaAttention.{m}": getattr(KimiDeltaAttention, m)
                    for m in LAYER_METHODS})  # fmt: skip
    missing = {n: sorted(_defaults(fn) - COVERED.get(n, set())) for n, fn in targets.items()}
    missing = {n: m for n, m in missing.items() if m}
    assert not missing, f"parameters with a default no test exercises at it: {missing}"
    stale = {n: sorted(c - _defaults(targets[n])) for n, c in COVERED.items()}
    assert not any(stale.values()), f"rows naming no such default: {stale}"


# ------------------------------------------------------------------ the ops


def _float64(x: dict) -> dict:
    """``x``'s arrays as float64 (cast on the host; use under x64)."""
    return {n: jnp.asarray(np.asarray(a).astype(np.float64)) for n, a in x.items()}


def _sequence():
    """float64 ``q .. beta [B, T, ...]`` (K != V), q and k off unit norm, gates that keep over
    a quarter of the state across each default chunk, one gate entry of -6 (below every lower
    bound) at the first token; and a float64 state."""
    x = random_kda_inputs(jax.random.key(75), B, T, H, K, V, gate_scale=1e-3, with_state=True)
    x = _float64(x)
    state = x.pop("initial_state")
    x["q"], x["k"] = 2.0 * x["q"], 0.7 * x["k"]
    kept = np.exp(np.asarray(x["g"]).reshape(B, -1, C, H, K).sum(axis=2))
    assert kept.min() > 0.25, kept.min()  # the state survives each chunk
    x["g"] = x["g"].at[0, 0, 0, 0].set(-6.0)  # the first token: one channel's start erased
    return x, state


def _oracle(x, state=None, **kw):
    """The float64 recurrence with every default of kda's spelled out as its docstring gives it
    (scale K ** -0.5, a zero state, the log-space gate, no normalisation, no segments)."""
    state = jnp.zeros((len(x["q"]), x["v"].shape[2], K, V), jnp.float64) if state is None else state
    spelled = dict(
        scale=K**-0.5, initial_state=state, output_final_state=False, segment_ids=None,
        max_num_segments=None, a_log=None, dt_bias=None, lower_bound=None,
        use_gate_in_kernel=False, use_qk_l2norm=False, allow_neg_eigval=False, precision=None,
        output_chunk_states=False, output_token_states=False,
    )  # fmt: skip
    return kda(**x, **{**spelled, **kw}, implementation="recurrent")


def test_kda_at_its_defaults(x64):
    """``kda(q, k, v, g, beta)``: a pair (o, None), o the oracle's; under grad (auto's training
    form: the chunked one at chunk size 64, here three chunks) the outputs and every gradient
    the oracle's too; beta above 1 refused (allow_neg_eigval off)."""
    x, _ = _sequence()
    out = kda(**x)
    assert type(out) is tuple and not isinstance(out, KDAResult) and len(out) == 2
    o, final = out
    assert final is None and o.dtype == jnp.float64
    cotangent = jax.random.normal(jax.random.key(1), o.shape, jnp.float64)

    @jax.jit  # the oracle and both gradients: one program
    def runs(x):
        def loss(x, f):
            o = f(x)[0]
            return jnp.vdot(o, cotangent), o

        return [jax.value_and_grad(loss, has_aux=True)(x, f) for f in (lambda x: kda(**x), _oracle)]

    got, ref = runs(x)
    assert_close(o, ref[0][1], name="o")
    assert_close(got[0][1], ref[0][1], name="o under grad")
    for n in NAMES:
        assert_close(got[1][n], ref[1][n], name=f"d{n}")
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        kda(**{**x, "beta": x["beta"] * 1.5 + 0.01})


@pytest.mark.parametrize("fn", [kda_chunked, kda_recurrent], ids=lambda f: f.__name__)
def test_the_named_forms_at_their_defaults(x64, fn):
    """``kda_chunked`` (the streaming scan, three chunks of 64) and ``kda_recurrent`` with the
    five arrays only: a pair (o, None), o the oracle's."""
    x, _ = _sequence()
    out = fn(**x)
    assert type(out) is tuple and len(out) == 2 and out[1] is None
    assert_close(out[0], _oracle(x)[0], name=fn.__name__)


def test_the_decoding_steps_at_their_defaults(x64):
    """``kda_step``, ``kda_pool_step`` and ``kda_pool_verify`` without ``scale``: the oracle's
    outputs and states from the given state (the pool's slots; untouched slots unchanged)."""
    x, state = _sequence()
    draft = {n: x[n][:, :4] for n in NAMES}  # kda's order
    token = tuple(a[:, 0] for a in draft.values())
    o_ref, state_ref = _oracle({n: a[:, :1] for n, a in draft.items()}, state,
                               output_final_state=True)  # fmt: skip
    new_state, o = kda_step(state, *token)
    assert_close(o, o_ref[:, 0], name="kda_step o")
    assert_close(new_state, state_ref, name="kda_step state")
    slots = jnp.asarray([3, 1], jnp.int32)  # rows in reverse order, slots 0 and 2 untouched
    pool = jnp.full((4, H, K, V), 1e30, jnp.float64).at[slots].set(state)
    new_pool, o = kda_pool_step(jnp.array(pool), slots, *token)
    assert_close(o, o_ref[:, 0], name="kda_pool_step o")
    assert_close(new_pool[slots], state_ref, name="kda_pool_step states")
    np.testing.assert_array_equal(new_pool[jnp.asarray([0, 2])], pool[jnp.asarray([0, 2])])
    accepted = jnp.asarray([3, 1], jnp.int32)
    ref = _oracle(draft, state, output_token_states=True)
    new_pool, o = kda_pool_verify(jnp.array(pool), slots, *draft.values(), accepted)
    assert_close(o, ref.output, name="kda_pool_verify o")
    kept = ref.token_states[jnp.arange(B), accepted - 1]
    assert_close(new_pool[slots], kept, name="kda_pool_verify states")


def test_the_gate_and_its_initialisers_at_their_defaults(x64):
    """``kda_gate(f, a_log, dt_bias)``: the softplus gate ``-exp(a_log) softplus(f + dt_bias)``
    (no lower bound). ``init_a_log(key, H)``: A = exp(a_log) uniform over [1, 16] (the softplus
    gate's, not the safe gate's zeros). ``init_dt_bias(key, H, K)``: softplus(dt_bias) log-uniform
    over [1e-3, 0.1]; with a range below it, floored at 1e-4."""
    f = 3.0 * jax.random.normal(jax.random.key(2), (2, 5, H, K), jnp.float64)
    a_log = jnp.asarray([0.3, 2.0])
    dt_bias = jax.random.normal(jax.random.key(3), (H * K,), jnp.float64)
    pre = np.asarray(f) + np.asarray(dt_bias).reshape(H, K)
    want = -np.exp(np.asarray(a_log))[:, None] * np.logaddexp(0.0, pre)
    assert_close(kda_gate(f, a_log, dt_bias), want, name="kda_gate")
    a = np.exp(np.asarray(init_a_log(jax.random.key(4), 4096), np.float64))
    assert 1.0 <= a.min() < 1.05 and 15.95 < a.max() <= 16.0, (a.min(), a.max())
    assert abs(a.mean() - 8.5) < 0.3, a.mean()  # uniform over [1, 16]: mean 8.5
    dt = np.logaddexp(0.0, np.asarray(init_dt_bias(jax.random.key(5), 64, 64), np.float64))
    assert 1e-3 * 0.999 <= dt.min() < 1.1e-3 and 0.09 < dt.max() <= 0.1 * 1.001
    assert 8e-3 < np.median(dt) < 1.25e-2  # log-uniform: the geometric mean 1e-2
    low = init_dt_bias(jax.random.key(6), 2, 8, dt_min=1e-6, dt_max=1e-5)
    np.testing.assert_allclose(np.logaddexp(0.0, np.asarray(low, np.float64)), 1e-4, rtol=1e-3)


# ------------------------------------------------------------------ the layer

# three required fields; everything else at its default (V = K, HV = H, conv 4, the softplus
# gate with A_log, full-rank gate projections, auto, chunks of 64, float32)
CONFIG = KDAConfig(hidden_size=32, num_heads=2, head_dim=8)
LAYER_T = 3 * C


def _layer():
    return KimiDeltaAttention(CONFIG, rngs=nnx.Rngs(0))


def _layer_x():
    return jax.random.normal(jax.random.key(7), (2, LAYER_T, 32))


def _float64_layer(layer):
    """The same layer in float64 on the recurrence (use under x64): projections, convs and the
    recurrence in float64 (the layer keeps its elementwise gate, beta and norm in float32)."""
    config = dataclasses.replace(layer.config, dtype=jnp.float64, param_dtype=jnp.float64,
                                 implementation="recurrent")  # fmt: skip
    oracle = nnx.eval_shape(lambda: KimiDeltaAttention(config, rngs=nnx.Rngs(0)))
    params = nnx.state(layer, nnx.Param)
    nnx.update(oracle, jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params))
    return oracle


@nnx.jit
def _serving(layer, x):
    """The layer's serving calls at their defaults, one program."""
    empty = layer.init_cache(len(x))
    pieces = layer.project(x)
    o, _ = kda(*pieces[:5], **layer.kernel_kwargs())
    gate = kda_gate(pieces.f, layer.A_log[...], layer.dt_bias[...])
    return (layer(x), empty, layer(x, cache=empty), layer.prefill(x),
            layer.project_output(x, o), gate)  # fmt: skip


def test_the_default_layer_matches_the_float64_oracle():
    """``KimiDeltaAttention(KDAConfig(hidden_size, num_heads, head_dim))`` over three default
    chunks, its gates keeping more than a tenth of the state across each chunk in some channels
    of every row: ``layer(x)``, ``init_cache(B)`` (zeros; the state float32, the conv histories
    in the layer's dtype), ``layer(x, cache=...)``, ``prefill(x)`` with no cache (three
    boundaries) and ``project`` -> ``kda`` -> ``project_output`` at their defaults, against the
    same layer in float64 on the recurrence called chunk by chunk with its cache (not
    prefill's code): its outputs, and its caches after 64, 128 and 192 tokens. (The
    layer's training form at these defaults is kda's, whose gradients test_kda_at_its_defaults
    checks over three default chunks.)"""
    layer, x = _layer(), _layer_x()
    y, empty, (y_cached, cache), (y_prefill, final, boundaries), y_pieces, g = _serving(layer, x)
    kept = np.exp(np.asarray(g).reshape(2, 3, C, H, K).sum(axis=2))  # [B, chunk, H, K]
    assert (kept.max(axis=(2, 3)) > 0.1).all(), kept.max(axis=(2, 3))
    assert empty.state.dtype == jnp.float32 and empty.q_conv.dtype == CONFIG.dtype
    assert empty.state.shape == (2, H, K, K) and empty.q_conv.shape == (2, 3, H * K)
    assert not any(np.any(np.asarray(a)) for a in empty)
    with jax.enable_x64(True):  # chunk by chunk, the cache carried: one program, three calls
        oracle, x64, runs = _float64_layer(layer), jnp.asarray(x, jnp.float64), []
        cache64 = oracle.init_cache(2)
        for start in range(0, LAYER_T, C):
            y64, cache64 = jitted_call(oracle, x64[:, start : start + C], cache=cache64)
            runs.append(jax.tree.map(np.asarray, (y64, cache64)))
    y64, final64 = np.concatenate([y for y, _ in runs], axis=1), runs[-1][1]
    assert boundaries.state.shape == (2, 3, H, K, K)
    for name, got in (("y", y), ("y with a cache", y_cached), ("prefill y", y_prefill),
                      ("project, kda, project_output", y_pieces)):  # fmt: skip
        assert relative_l2(got, y64) < 2e-6, (name, relative_l2(got, y64))
    kept = [(f"boundary {i}", jax.tree.map(lambda a, i=i: a[:, i], boundaries), runs[i][1])
            for i in range(3)]  # fmt: skip
    for what, got, want in (("cache", cache, final64), ("prefill cache", final, final64), *kept):
        for field, a, b in zip(got._fields, got, want, strict=True):
            assert a.dtype == (jnp.float32 if field == "state" else CONFIG.dtype)
            assert_close(a, b, **float32_tolerance(1e-5, 1e-5), name=f"{what}.{field}")


def test_the_default_config_is_fla_s_default_layer():
    """What the defaults mean: fla's default layer (its recorded output; conv 4, the softplus
    gate, V = K, HV = H, norm eps 1e-5, an output-gate bias) is KDAConfig's defaults with the
    three required fields and fla's low-rank gate projections (rank = head_dim) given, nothing
    else. Every default as the docstring states it."""
    fla_config, state_dict, x, y_fla = load_fla_layer_fixture("default")
    config = KDAConfig(hidden_size=64, num_heads=2, head_dim=16, forget_gate_rank=16,
                       output_gate_rank=16)  # fmt: skip
    assert config == fla_config  # the fixture's loader spells fla's values out
    layer = KimiDeltaAttention.from_fla_state_dict(state_dict, config, rngs=nnx.Rngs(0))
    assert_close(jitted_call(layer, jnp.asarray(x)), y_fla, **float32_tolerance(5e-6, 1e-5))
    spelled = dict(num_v_heads=None, value_head_dim=None, conv_size=4, fused_qkv_conv=False,
                   gate_form="softplus", lower_bound=None, use_a_log=True, per_head_decay=False,
                   forget_gate_rank=None, allow_neg_eigval=False, output_gate_rank=None,
                   output_gate_bias=True, norm_eps=1e-5, implementation="auto", chunk_size=64,
                   max_num_segments=None, dtype=jnp.float32, param_dtype=jnp.float32)  # fmt: skip
    assert CONFIG == KDAConfig(hidden_size=32, num_heads=2, head_dim=8, **spelled)
    assert (CONFIG.value_dim, CONFIG.value_heads) == (8, 2)  # V = K, HV = H
