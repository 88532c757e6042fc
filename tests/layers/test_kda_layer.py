"""KimiDeltaAttention: fla parity, implementations, packing, decoding, errors."""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted_call, load_fla_layer_fixture
from flax import nnx

from kda_lib import KDAConfig, KimiDeltaAttention
from kda_lib.layers.params import weight_decay_mask
from kda_lib.testing import assert_close, float32_tolerance, random_normal, relative_l2

HAS_TOKAMAX = importlib.util.find_spec("tokamax") is not None

BASE = KDAConfig(hidden_size=32, num_heads=2, head_dim=16, value_head_dim=8)


def _layer(**changes):
    # gate_form=None: the form follows the changed lower_bound unless a change names it
    config = dataclasses.replace(BASE, **{"gate_form": None, **changes})
    return KimiDeltaAttention(config, rngs=nnx.Rngs(0))


def _x(batch=2, seq_len=70, hidden=32, seed=1):
    return random_normal(jax.random.key(seed), (batch, seq_len, hidden))


def _name(path):
    """'f_proj.layers.0.kernel' from a pytree path over nnx.state (drops the trailing .value)."""
    keys = [str(p.key) for p in path if hasattr(p, "key")]
    return ".".join(keys)


def _with_impl(layer, implementation):
    layer.config = dataclasses.replace(layer.config, implementation=implementation)
    return layer


def _per_implementation(layer, impls, fn):
    """``{impl: fn(layer on impl)}`` for each of ``impls``, as one jitted program of the
    layer's parameters (one compilation instead of one per implementation)."""
    graphdef, state = nnx.split(layer)

    def run(state):
        return {impl: fn(_with_impl(nnx.merge(graphdef, state), impl)) for impl in impls}

    return jax.jit(run)(state)


@pytest.mark.tpu
@pytest.mark.parametrize("fixture", ["default", "safe_gate"])
def test_fla_layer_parity(fixture):
    config, state_dict, x, y_fla = load_fla_layer_fixture(fixture)
    layer = KimiDeltaAttention.from_fla_state_dict(state_dict, config, rngs=nnx.Rngs(0))
    # tokamax where it installs (its releases need Python >= 3.12: a TPU image's 3.11 has none)
    impls = ("auto", "recurrent", "chunked", *(("tokamax_xla",) * HAS_TOKAMAX))
    # one program for the implementations (shared projections compile once)
    outputs = _per_implementation(layer, impls, lambda m: m(jnp.asarray(x)))
    for impl, y in outputs.items():
        err = assert_close(y, y_fla, **float32_tolerance(5e-6, 1e-5), name=f"{fixture} {impl}")
        print(f"fla layer parity {fixture} {impl}: max abs err {err:.2e}")


def test_fla_state_dict_mismatch_is_reported():
    layer_sd = {"q_proj.weight": np.zeros((32, 32))}
    with pytest.raises(ValueError, match="missing .*'A_log'"):
        KimiDeltaAttention.from_fla_state_dict(layer_sd, BASE, rngs=nnx.Rngs(0))


# both gates and both gate projections: the two flags select independent parts of the layer
# (the gate function; the gate projection's layers), so two cases cover all four values. That
# every parameter gets a finite, non-zero gradient is checked on every case of
# test_options_match_the_float64_oracle_and_implementations_agree (both gates, both forms of
# both gate projections).
@pytest.mark.parametrize("lower_bound,gate_rank", [(None, None), (-5.0, 8)])
def test_forward_float32_and_bf16_close(lower_bound, gate_rank):
    ranks = dict(forget_gate_rank=gate_rank, output_gate_rank=gate_rank)
    layer = _layer(lower_bound=lower_bound, **ranks)
    x = _x()
    bf16 = _layer(lower_bound=lower_bound, **ranks, dtype=jnp.bfloat16)
    assert bf16.A_log[...].dtype == jnp.float32 and bf16.q_proj.kernel[...].dtype == jnp.float32
    y, y16, (y16_cached, cache16) = nnx.jit(  # one program
        lambda m, m16: (m(x), m16(x), m16(x, cache=m16.init_cache(len(x))))
    )(layer, bf16)
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert y16.dtype == y16_cached.dtype == cache16.q_conv.dtype == jnp.bfloat16
    assert cache16.state.dtype == jnp.float32  # the decode state stays float32
    assert relative_l2(y16, y) < 3e-2 and relative_l2(y16_cached, y) < 3e-2


@pytest.mark.tpu
def test_packed_documents_are_isolated():
    layer = _layer()
    x = _x(batch=1, seq_len=90)
    ids = jnp.asarray([[1] * 40 + [2] * 40 + [0] * 10], jnp.int32)  # equal lengths: one program
    # one program: the packed call and each document alone
    run = nnx.jit(lambda m, x, ids: (m(x, segment_ids=ids), m(x[:, :40]), m(x[:, 40:80])))
    y, alone_1, alone_2 = run(layer, x, ids)
    assert_close(y[:, :40], alone_1, **float32_tolerance(2e-6, 1e-5), name="document 1")
    assert_close(y[:, 40:80], alone_2, **float32_tolerance(2e-6, 1e-5), name="document 2")
    assert np.all(np.asarray(y[:, 80:]) == 0)


# prefill of one token, of T not a multiple of the chunk and of one whole chunk; the safe gate
# (lower_bound) changes the gate, not the cache: it runs in
# test_options_prefill_then_decode_equals_full_forward[no_a_log_grouped] (prefill of 9 tokens)
@pytest.mark.tpu
@pytest.mark.parametrize("lower_bound,prefill", [(None, 1), (None, 37), (None, 64)])
def test_prefill_then_decode_equals_full_forward(prefill, lower_bound):
    layer = _layer(lower_bound=lower_bound)
    x = _x(batch=2, seq_len=66)  # decoding past the first chunk's end from each prefill
    full = jitted_call(layer, x)
    cache = layer.init_cache(2)
    y, cache = jitted_call(layer, x[:, :prefill], cache=cache)
    outs = [y]
    for t in range(prefill, 66):
        y, cache = jitted_call(layer, x[:, t : t + 1], cache=cache)
        outs.append(y)
    err = assert_close(jnp.concatenate(outs, 1), full, **float32_tolerance(1e-5, 1e-5))
    print(f"prefill {prefill} + decode vs full forward: max abs err {err:.2e}")
    assert cache.state.shape == (2, 2, 16, 8) and cache.state.dtype == jnp.float32


@nnx.jit
def _full_and_in_two_halves(layer, x):
    """``layer(x)`` and the same from a prefill of the first half of ``x`` then the second
    half, the cache carried (one program)."""
    split = x.shape[1] // 2
    y1, cache = layer(x[:, :split], cache=layer.init_cache(len(x)))
    y2, _ = layer(x[:, split:], cache=cache)
    return layer(x), jnp.concatenate([y1, y2], 1)


def test_no_conv_and_neg_eigval_variants():
    for changes in (dict(conv_size=0), dict(allow_neg_eigval=True)):
        y_full, y_pieces = _full_and_in_two_halves(_layer(**changes), _x(seq_len=20))
        assert_close(y_pieces, y_full, atol=1e-5, rtol=1e-5)


def test_parameter_names_dtypes_and_decay_mask():
    layer = _layer(forget_gate_rank=8, output_gate_rank=8)
    params = nnx.state(layer, nnx.Param)
    names = {_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
    for expected in (
        "q_proj.kernel",
        "q_conv1d.kernel",
        "f_proj.layers.0.kernel",
        "g_proj.layers.1.bias",
        "b_proj.kernel",
        "A_log",
        "dt_bias",
        "o_norm",
        "o_proj.kernel",
    ):
        assert expected in names, (expected, sorted(names))
    assert layer.A_log[...].dtype == jnp.float32 and layer.dt_bias[...].dtype == jnp.float32
    mask = {
        _name(path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(weight_decay_mask(layer))
    }
    assert not mask["A_log"] and not mask["dt_bias"] and not mask["o_norm"]
    assert not mask["g_proj.layers.1.bias"]
    assert mask["q_proj.kernel"] and mask["q_conv1d.kernel"]


def test_errors_are_clear():
    layer = _layer()
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, hidden_size=32\]"):
        layer(jnp.zeros((1, 5, 31)))
    with pytest.raises(ValueError, match=r"cache.state has shape .* for batch size 3"):
        layer(jnp.zeros((3, 1, 32)), cache=layer.init_cache(2))
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\]"):
        layer(jnp.zeros((2, 5, 32)), segment_ids=jnp.ones((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="tokamax_mosaic needs a TPU v6 or newer"):
        _layer(lower_bound=-5.0, implementation="tokamax_mosaic")(jnp.zeros((1, 64, 32)))
    with pytest.raises(ValueError, match="lower_bound must be a float in"):
        KDAConfig(hidden_size=8, num_heads=1, head_dim=8, lower_bound=0.5)
    with pytest.raises(ValueError, match="conv_size must be an int >= 0"):
        KDAConfig(hidden_size=8, num_heads=1, head_dim=8, conv_size=-1)
    with pytest.raises(ValueError, match="needs the safe gate"):
        KDAConfig(hidden_size=8, num_heads=1, head_dim=8, implementation="tokamax_xla_chunked")
    with pytest.raises(ValueError, match="implementation must be 'auto' or one of"):
        KDAConfig(hidden_size=8, num_heads=1, head_dim=8, implementation="cuda")


def test_per_head_decay_is_gated_deltanet():
    """per_head_decay: one gate value per head, shared by its K channels; decoding still works."""
    from kda_lib import kda_gate

    # the layer broadcasts the gate over K before the kernel: the recurrence compiles fastest
    layer = _layer(per_head_decay=True, implementation="recurrent")
    assert layer.dt_bias[...].shape == (2,) and layer.f_proj.kernel[...].shape == (32, 2)
    x = _x(seq_len=20)

    def loss(m):
        y = m(x)
        return jnp.sum(y**2), y

    @nnx.jit
    def gate_output_grads_and_decoded(m):  # one program
        kw = m.kernel_kwargs()
        g = kda_gate(m.project(x).f, kw["a_log"], kw["dt_bias"])
        grads, y = nnx.grad(loss, has_aux=True)(m)
        y1, cache = m(x[:, :10], cache=m.init_cache(2))
        y2, _ = m(x[:, 10:], cache=cache)
        return g, y, grads, jnp.concatenate([y1, y2], 1)

    g, y, grads, decoded = gate_output_grads_and_decoded(layer)
    np.testing.assert_array_equal(g, jnp.broadcast_to(g[..., :1], g.shape))
    assert_close(decoded, y, atol=1e-5, rtol=1e-5)
    assert np.abs(np.asarray(grads["dt_bias"][...])).max() > 0


def test_tokamax_segment_bound_counted_configured_or_asked_for(monkeypatch):
    """tokamax's static segment bound: counted on the host in an eager call, configured, or
    asked for under jit. The eager call reads the ids to the host once (issue 53: the layer,
    its three convs and kda() each read them, five reads; now the layer's segment rule reads
    them once and hands them on, with the segment count)."""
    import kda_lib.checks
    from kda_lib.layers import kda_layer as layer_module
    from kda_lib.layers.kda_layer import max_segments_bound

    ids = jnp.asarray([[1] * 40 + [2] * 45 + [0] * 5, [0] * 10 + [3] * 80], jnp.int32)
    cfg = dataclasses.replace(
        BASE, gate_form="safe_sigmoid", lower_bound=-5.0, implementation="tokamax_xla"
    )
    assert max_segments_bound((ids, 2), cfg) == 2  # row 0: runs 1, 2
    assert max_segments_bound((ids, 0), cfg) == 1  # all padding: one slot
    assert max_segments_bound((ids, 2), dataclasses.replace(cfg, max_num_segments=5)) == 5
    assert max_segments_bound((ids, 2), dataclasses.replace(cfg, implementation="chunked")) is None
    assert max_segments_bound((ids, 2), cfg, ranks=2) == 3  # + the one leading padding continues
    seen, reads = [], []
    original = layer_module.kda_prechecked
    monkeypatch.setattr(
        layer_module,
        "kda_prechecked",
        lambda *a, **kw: seen.append(kw["max_num_segments"]) or original(*a, **kw),
    )

    def counting(original):
        def host_values(x, *args):
            if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.integer):
                reads.append(x.shape)
            return original(x, *args)

        return host_values

    checks = kda_lib.checks
    monkeypatch.setattr(checks, "host_values", counting(checks.host_values))
    x = _x(batch=2, seq_len=90)
    jitted = nnx.jit(lambda m, x, ids: m(x, segment_ids=ids))
    want = jitted(_layer(lower_bound=-5.0), x, ids)  # reference: auto, kda_lib on CPU
    reads.clear()
    got = KimiDeltaAttention(cfg, rngs=nnx.Rngs(0))(x, segment_ids=ids)  # eager: counted
    assert reads == [(2, 90)]
    assert seen[-1] == 2
    assert_close(got, want, atol=2e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="under jit needs KDAConfig.max_num_segments"):
        jitted(KimiDeltaAttention(cfg, rngs=nnx.Rngs(0)), x, ids)
    bounded = KimiDeltaAttention(dataclasses.replace(cfg, max_num_segments=4), rngs=nnx.Rngs(0))
    assert_close(jitted(bounded, x, ids), want, atol=2e-6, rtol=1e-5)
    assert seen[-1] == 4
    with pytest.raises(ValueError, match="KDAConfig.max_num_segments must be None or a positive"):
        dataclasses.replace(cfg, max_num_segments=0)


# ------------------------------------------------- the published models' options (issue 27)
# each option on the small layer (CASES below combines them); (B)ASE has K = 16, V = 8, H = 2
OPTIONS = {
    # MaxText's Kimi K3 layer: low-rank forget gate, one full-rank output-gate projection
    "full_rank_output": dict(forget_gate_rank=4, output_gate_rank=None),
    # the mirror image: a full-rank forget gate beside a low-rank output gate
    "full_rank_forget": dict(forget_gate_rank=None, output_gate_rank=4),
    # GLM-5.3-Flash: one depthwise conv over concat(q, k, v)
    "fused_qkv_conv": dict(fused_qkv_conv=True),
    # MaxText's Kimi K3 layer: max(-A softplus(f + dt_bias), -5)
    "clamped_softplus": dict(gate_form="clamped_softplus", lower_bound=-5.0),
    # fla's num_v_heads: 4 value heads on 2 q/k heads
    "grouped_value_heads": dict(num_v_heads=4),
    # fla's safe gate without A_log (A = 1), with grouped value heads
    "no_a_log_grouped": dict(lower_bound=-5.0, use_a_log=False, num_v_heads=4),
}


def _fast_implementations(config):
    """The implementations besides the oracle that serve ``config`` on CPU."""
    fused_safe = config.gate_form == "safe_sigmoid"
    return ["chunked", "tokamax_xla"] + (["tokamax_xla_chunked"] if fused_safe else [])


def _sin_loss_grads(layer, x, impls):
    """``{impl: (layer(x), the parameter gradients of sum(sin(layer(x))))}`` on each of
    ``impls``, one program."""

    def loss(m):
        y = m(x)
        return jnp.sum(jnp.sin(y)), y

    results = _per_implementation(layer, impls, nnx.grad(loss, has_aux=True))
    return {
        impl: (np.asarray(y), {_name(p): np.asarray(g) for p, g in jax.tree.leaves_with_path(g)})
        for impl, (g, y) in results.items()
    }


def _oracle_f64(layer, x):
    """:func:`_sin_loss_grads` of the same layer in float64 with the recurrent (oracle) kernel:
    projections, convs and the recurrence in float64 (the layer keeps its elementwise gate, beta
    and output norm in float32)."""
    with jax.enable_x64(True):
        config = dataclasses.replace(
            layer.config, dtype=jnp.float64, param_dtype=jnp.float64, implementation="recurrent"
        )
        # abstract (eagerly: a compile per float64 initialiser), then the layer's parameters
        oracle = nnx.eval_shape(lambda: KimiDeltaAttention(config, rngs=nnx.Rngs(0)))
        params = nnx.state(layer, nnx.Param)
        nnx.update(oracle, jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params))
        return _sin_loss_grads(oracle, jnp.asarray(x, jnp.float64), ["recurrent"])["recurrent"]


# a covering design instead of every option on every implementation: each case combines options
# that can live in one layer, each option is in at least one case, each implementation runs at
# least one case, and every case is checked against the float64 oracle on outputs and parameter
# gradients at T = 70 (past one 64-token chunk). Where a case also runs "recurrent", every other
# implementation must agree with it in float32 on outputs and gradients as well.
CASES = {
    # softplus gate; grouped value heads, one fused qkv conv, full-rank output gate
    "grouped_fused_full_rank_output": (
        {
            **OPTIONS["grouped_value_heads"],
            **OPTIONS["fused_qkv_conv"],
            **OPTIONS["full_rank_output"],
        },
        ["recurrent", "chunked", "tokamax_xla"],
    ),
    "clamped_softplus_full_rank_forget": (
        {**OPTIONS["clamped_softplus"], **OPTIONS["full_rank_forget"]},
        ["tokamax_xla"],
    ),
    "no_a_log_grouped": (OPTIONS["no_a_log_grouped"], ["tokamax_xla_chunked"]),
    # the default safe gate (with A_log) in the layer, on the recurrence. Its other kernels:
    # the layer's forward against fla on auto, recurrent, chunked and tokamax_xla in
    # test_fla_layer_parity[safe_gate]; outputs and gradients (a_log's too) of chunked,
    # tokamax_xla and tokamax_xla_chunked against the recurrence in tests/ops/test_api.py::
    # test_adapter_gradients_agree, and tokamax_xla_chunked's with a_log against float64 in
    # tests/contracts/test_grouped_heads.py; tokamax_xla_chunked in this layer: no_a_log_grouped
    "safe_gate": (dict(lower_bound=-5.0), ["recurrent"]),
}
assert set().union(
    *(set(k for k in OPTIONS if OPTIONS[k].items() <= c.items()) for c, _ in CASES.values())
) == set(OPTIONS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_options_match_the_float64_oracle_and_implementations_agree(case):
    options, impls = CASES[case]
    layer = _layer(**options)
    assert set(impls) <= {"recurrent", *_fast_implementations(layer.config)}
    x = _x(seq_len=70)
    y64, g64 = _oracle_f64(layer, x)
    results = _sin_loss_grads(layer, x, impls)  # every implementation in one program
    for impl, (y, g) in results.items():
        assert relative_l2(y, y64) < 2e-6, (case, impl, relative_l2(y, y64))
        assert set(g) == set(g64)
        for name in g64:
            assert relative_l2(g[name], g64[name]) < 2e-5, (case, impl, name)
            assert np.isfinite(g[name]).all() and np.abs(g[name]).max() > 0, (case, impl, name)
        worst = max(relative_l2(g[name], g64[name]) for name in g64)
        print(f"{case} {impl}: rel-L2 vs float64 oracle {relative_l2(y, y64):.1e} (output), ")
        print(f"  {worst:.1e} (worst parameter gradient)")
    if "recurrent" in results:  # float32 agreement with the recurrence
        y_ref, g_ref = results["recurrent"]
        for impl, (y, g) in results.items():
            assert_close(y, y_ref, atol=2e-6, rtol=1e-5, name=impl)
            for name in g_ref:
                assert relative_l2(g[name], g_ref[name]) < 1e-5, (case, impl, name)


@pytest.mark.parametrize("case", sorted(c for c in CASES if c != "safe_gate"))
def test_options_prefill_then_decode_equals_full_forward(case):
    layer = _layer(**CASES[case][0])
    x = _x(batch=2, seq_len=24)
    full, (y, cache) = nnx.jit(lambda m: (m(x), m(x[:, :9], cache=m.init_cache(2))))(layer)
    outs = [y]
    for t in range(9, 24):
        y, cache = jitted_call(layer, x[:, t : t + 1], cache=cache)
        outs.append(y)
    assert_close(jnp.concatenate(outs, 1), full, atol=1e-5, rtol=1e-5, name=case)
    assert cache.state.shape == (2, layer.config.value_heads, 16, 8)


def test_fused_qkv_conv_is_three_convs_in_one_tensor():
    separate, fused = _layer(), _layer(fused_qkv_conv=True)
    assert fused.q_conv1d is None and separate.qkv_conv1d is None
    kernels = [getattr(separate, f"{s}_conv1d").kernel[...] for s in "qkv"]
    assert fused.qkv_conv1d.kernel[...].shape == (4, 16 * 2 + 16 * 2 + 8 * 2)
    # the same weights in the fused layout give the same function
    params = nnx.state(separate, nnx.Param)
    for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
        del params[name]
    nnx.update(fused, params)
    fused.qkv_conv1d.kernel.set_value(jnp.concatenate(kernels, axis=1))
    x = _x(seq_len=30)
    ids = jnp.asarray([[1] * 12 + [2] * 18, [0] * 3 + [4] * 27], jnp.int32)
    both = nnx.jit(lambda a, b: (a(x, segment_ids=ids), b(x, segment_ids=ids)))  # one program
    assert_close(*both(fused, separate), atol=1e-6, rtol=1e-6)
    fused.qkv_conv1d.kernel.set_value(jnp.concatenate(kernels[::-1], axis=1))  # wrong order
    assert relative_l2(*both(fused, separate)) > 1e-2


def test_each_gate_projection_takes_its_own_rank():
    layer = _layer(**OPTIONS["full_rank_output"])
    assert isinstance(layer.f_proj, nnx.Sequential)
    assert layer.g_proj.kernel[...].shape == (32, 2 * 8)  # d x H V, one matmul
    low = _layer(forget_gate_rank=4, output_gate_rank=4)
    count = lambda m: sum(a.size for a in jax.tree.leaves(nnx.state(m, nnx.Param)))  # noqa: E731
    # d V H (+ H V bias) instead of d r + r H V (+ H V bias)
    assert count(layer) - count(low) == 32 * 16 - (32 * 4 + 4 * 16)
    mirror = _layer(**OPTIONS["full_rank_forget"])
    assert mirror.f_proj.kernel[...].shape == (32, 2 * 16)  # d x H K, one matmul
    assert [m.kernel[...].shape for m in mirror.g_proj.layers] == [(32, 4), (4, 2 * 8)]
    # d K H instead of d r + r H K (the forget gate's)
    assert count(mirror) - count(low) == 32 * 32 - (32 * 4 + 4 * 32)


def test_clamped_softplus_gate_form():
    from kda_lib import GateForm, kda_gate

    layer = _layer(**OPTIONS["clamped_softplus"])
    assert layer.config.gate_form is GateForm.CLAMPED_SOFTPLUS  # the string, stored as the enum
    assert layer.kernel_kwargs() == dict(use_qk_l2norm=True, allow_neg_eigval=False)
    x = 3.0 * _x(seq_len=20)  # large inputs: some channels reach the bound
    g = layer.project(x).f
    raw = layer.f_proj(x).reshape(g.shape)
    softplus = kda_gate(raw, layer.A_log[...], layer.dt_bias[...])
    np.testing.assert_allclose(g, np.maximum(softplus, -5.0), rtol=1e-6)
    clamped = np.asarray(softplus < -5.0)
    assert 0 < clamped.mean() < 1, clamped.mean()  # both sides of the clamp are exercised
    # A_log starts at log U(1, 16) as the softplus gate's (not the safe gate's zeros)
    assert np.all(np.asarray(layer.A_log[...]) > 0)


def test_option_errors_name_the_field():
    with pytest.raises(ValueError, match="num_v_heads must be a multiple of num_heads=2"):
        dataclasses.replace(BASE, num_v_heads=3)
    with pytest.raises(ValueError, match="KDAConfig.gate_form='clamped_softplus' does not fit"):
        dataclasses.replace(BASE, gate_form="clamped_softplus")  # no lower_bound to clamp at
    with pytest.raises(ValueError, match="KDAConfig.gate_form='softplus' does not fit"):
        dataclasses.replace(BASE, lower_bound=-5.0)  # replace keeps the derived softplus form
    assert dataclasses.replace(BASE, lower_bound=-5.0, gate_form=None).gate_form == "safe_sigmoid"
    allowed = r"KDAConfig.gate_form must be one of \('softplus', 'safe_sigmoid', 'clamped_softp"
    for bad in ("sigmoid", 1, True):
        with pytest.raises(ValueError, match=allowed):
            dataclasses.replace(BASE, gate_form=bad)
    unfused = "tokamax_xla_chunked needs the fused safe gate.*gate_form='clamped_softplus'"
    with pytest.raises(ValueError, match=unfused):
        dataclasses.replace(
            BASE,
            gate_form="clamped_softplus",
            lower_bound=-5.0,
            implementation="tokamax_xla_chunked",
        )
    with pytest.raises(ValueError, match="fused_qkv_conv needs a conv"):
        dataclasses.replace(BASE, fused_qkv_conv=True, conv_size=0)
    for name in ("use_a_log", "fused_qkv_conv", "output_gate_bias"):
        with pytest.raises(ValueError, match=f"KDAConfig.{name} must be a bool"):
            dataclasses.replace(BASE, **{name: 1})


def test_grouped_value_heads_share_q_and_k_by_groups():
    """A layer with HV = 4 value heads on H = 2 q/k heads is the H = 4 layer whose q/k heads
    come in equal pairs (value head j reads q/k head j // 2), fla's num_v_heads."""
    grouped = _layer(num_v_heads=4)
    expanded = _layer(num_heads=4)
    assert grouped.q_proj.kernel[...].shape == (32, 2 * 16)
    assert grouped.v_proj.kernel[...].shape == (32, 4 * 8) and grouped.A_log[...].shape == (4,)
    assert grouped.f_proj.kernel[...].shape == (32, 4 * 16) and grouped.dt_bias[...].shape == (64,)
    assert grouped.b_proj.kernel[...].shape == (32, 4)
    assert grouped.g_proj.kernel[...].shape == (32, 4 * 8)

    def by_group(kernel):  # [.., 2 * 16] -> [.., 4 * 16], head j <- head j // 2
        heads = kernel.reshape(*kernel.shape[:-1], 2, 16)
        return jnp.repeat(heads, 2, axis=-2).reshape(*kernel.shape[:-1], 64)

    nnx.update(expanded, nnx.state(grouped, nnx.Param))  # every value-head parameter as it is
    for name in ("q_proj", "k_proj", "q_conv1d", "k_conv1d"):
        getattr(expanded, name).kernel.set_value(by_group(getattr(grouped, name).kernel[...]))
    x = _x(seq_len=30)
    both = nnx.jit(lambda a, b: (a(x), b(x)))  # one program
    err = assert_close(*both(grouped, expanded), atol=2e-6, rtol=1e-5)
    print(f"grouped value heads vs the expanded layer: max abs err {err:.1e}")
    # a wrong grouping (value head j on q/k head j % 2) is a different layer
    for name in ("q_proj", "k_proj", "q_conv1d", "k_conv1d"):
        kernel = getattr(grouped, name).kernel[...]
        getattr(expanded, name).kernel.set_value(jnp.concatenate([kernel, kernel], axis=-1))
    assert relative_l2(*both(grouped, expanded)) > 1e-2


def test_safe_gate_without_a_log_has_no_rate_parameter():
    from kda_lib import kda_gate

    layer = _layer(lower_bound=-5.0, use_a_log=False)
    names = {_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(layer, nnx.Param))}
    assert "A_log" not in names and "dt_bias" in names
    assert layer.kernel_kwargs()["a_log"] is None
    # the gate the kernel applies: -5 sigmoid(f + dt_bias), i.e. the safe gate at A = 1
    with_rate = _layer(lower_bound=-5.0)
    nnx.update(with_rate, nnx.state(layer, nnx.Param))
    with_rate.A_log.set_value(jnp.zeros(2))
    x = _x(seq_len=20)
    both = nnx.jit(lambda a, b: (a(x), b(x)))  # one program
    assert_close(*both(layer, with_rate), atol=1e-6, rtol=1e-6)
    f = layer.project(x).f
    np.testing.assert_allclose(
        kda_gate(f, None, layer.dt_bias[...], lower_bound=-5.0),
        -5.0 * jax.nn.sigmoid(f + layer.dt_bias[...].reshape(2, 16)),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="use_a_log=False is the safe gate without A_log"):
        dataclasses.replace(BASE, use_a_log=False)


# jax.hessian (forward over reverse) through the default layer, w.r.t. two scalings of its
# input, at T = 16, 17 and 1024 (auto on the recurrence; on the chunked form, whose backward is
# hand-written, one partial chunk and sixteen whole ones): tests/ops/test_api.py::
# test_hessian_and_jvp_through_the_layer_match_float64_finite_differences, against float64
# finite differences of the recurrence's gradient. float32 forward over the chunked backward:
# test_api.py::test_jit_around_a_hessian_vector_product_runs_through_the_chunked_backward.


def test_forward_mode_autodiff_through_the_layer():
    """jax.jvp through the default layer (auto, conv, packed documents), in x and in the
    parameters, equals the JVP of the same layer on the recurrence (plain autodiff)."""
    x = _x(batch=1, seq_len=40)  # above 16 tokens: auto's differentiated route is the chunked form
    ids = jnp.asarray([[1] * 25 + [2] * 12 + [0] * 3], jnp.int32)
    graphdef, params = nnx.split(_layer())
    x_dot = random_normal(jax.random.key(7), x.shape)
    p_dot = jax.tree.map(lambda p: 0.1 * random_normal(jax.random.key(8), p.shape), params)

    def tangents(params, x):  # both implementations in one program
        def run(params, x, implementation):
            layer = _with_impl(nnx.merge(graphdef, params), implementation)
            return layer(x, segment_ids=ids)

        return [
            jax.jvp(lambda p, x, i=impl: run(p, x, i), (params, x), (p_dot, x_dot))
            for impl in ("auto", "recurrent")
        ]

    (y, y_dot), (y_ref, y_dot_ref) = jax.jit(tangents)(params, x)
    assert_close(y, y_ref, atol=2e-6, rtol=1e-5, name="y")
    assert_close(y_dot, y_dot_ref, atol=2e-5, rtol=1e-4, name="tangent")
    assert float(jnp.abs(y_dot[:, :37]).max()) > 0 and not np.any(np.asarray(y_dot[:, 37:]))
