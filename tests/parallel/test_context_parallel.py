"""Context parallelism on simulated CPU devices (8, configured in conftest) equals one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from kda_lib import KDAConfig, KimiDeltaAttention, kda, kda_chunked
from kda_lib.lab.measure import hlo_collectives
from kda_lib.parallel.context_parallel import halo_exchange, kda_context_parallel, shard_as
from kda_lib.testing import random_kda_inputs, random_normal, relative_l2

NAMES = ("q", "k", "v", "g", "beta")
SEQ = P(None, "context")
# the one-device reference of every float32 comparison below: the recurrence, which compiles
# fastest (a third of the chunked form's time) and agrees with the CP forms to about 1e-7
ONE = "recurrent"


def _mesh(ranks, axis_type=jax.sharding.AxisType.Auto):
    if len(jax.devices()) < ranks:
        pytest.fail(f"need {ranks} devices; conftest sets XLA_FLAGS before jax is imported")
    return jax.make_mesh(
        (ranks,), ("context",), axis_types=(axis_type,), devices=jax.devices()[:ranks]
    )


def _cp_kernel(mesh, with_segments, **kwargs):
    specs = (SEQ,) * 5 + ((SEQ,) if with_segments else ())

    def local(*args):
        segment_ids = args[5] if with_segments else None
        return kda_context_parallel(
            *args[:5], axis_name="context", segment_ids=segment_ids, **kwargs
        )[0]

    fn = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=SEQ)
    return jax.jit(lambda *args: fn(*(shard_as(a, mesh, SEQ) for a in args)))


def _per_rank_errors(got, want, ranks):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    pieces = zip(np.split(got, ranks, axis=1), np.split(want, ranks, axis=1), strict=True)
    return [relative_l2(a, b) for a, b in pieces]


def _segments(seq_len, ranks):
    local = seq_len // ranks
    ids = np.ones((2, seq_len), np.int32)
    ids[0, local // 2 : local * ranks // 2] = 2  # spans several ranks
    ids[0, local * ranks // 2 :] = 3  # boundary exactly at a rank split
    ids[0, -local // 2 :] = 0  # trailing padding
    ids[1, : local // 3] = 0  # leading padding
    ids[1, local // 3 : local + 5] = 7
    ids[1, local + 5 : local + 9] = 0  # padding inside
    ids[1, local + 9 :] = 8
    return jnp.asarray(ids)


def test_kernel_cp_equals_one_device():
    """2 ranks without segments (one upstream summary), chunks of 32: two chunks per rank. The
    outputs, the final state and the chunk states equal one device's (with an initial state),
    and so do the gradients of all six differentiable inputs through the three of them. With
    segments (and 8 ranks): test_kernel_cp_states_with_segments."""
    ranks, seq_len, chunk = 2, 128, 32
    inputs = random_kda_inputs(jax.random.key(ranks), 2, seq_len, 2, 16, 8)
    h0 = random_normal(jax.random.key(12), (2, 2, 16, 8))
    mesh = _mesh(ranks)
    specs = (SEQ,) * 5 + (P(),)
    kw = dict(output_final_state=True, output_chunk_states=True, chunk_size=chunk,
              implementation="chunked")  # fmt: skip

    def local(q, k, v, g, beta, h0):
        return tuple(kda_context_parallel(q, k, v, g, beta, initial_state=h0, **kw)[:3])

    fn = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(SEQ, P(), SEQ))
    cp = jax.jit(lambda *a: fn(*(shard_as(x, mesh, s) for x, s in zip(a, specs, strict=True))))

    def single(q, k, v, g, beta, h0):  # the recurrence: compiles fastest
        return tuple(kda(q, k, v, g, beta, initial_state=h0, **dict(kw, implementation=ONE))[:3])

    args = tuple(inputs[n] for n in NAMES) + (h0,)
    cot = random_normal(jax.random.key(99), inputs["v"].shape)
    cot_s = random_normal(jax.random.key(98), (2, seq_len // chunk, 2, 16, 8))

    def run(f):  # one program: the values and the gradients of all six differentiable inputs
        def loss(*a):
            values = f(*a)
            states = jnp.sum(values[2] * cot_s)
            return jnp.sum(values[0] * cot) + jnp.sum(jnp.sin(values[1])) + states, values

        return jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))(*args)

    (grads_cp, values_cp), (grads_one, values_one) = run(cp), run(single)
    errors = _per_rank_errors(values_cp[0], values_one[0], ranks)
    assert max(errors) < 1e-5, errors
    assert relative_l2(values_cp[1], values_one[1]) < 1e-5
    assert values_cp[2].shape == (2, seq_len // chunk, 2, 16, 8)
    assert max(_per_rank_errors(values_cp[2], values_one[2], ranks)) < 1e-5
    for name, a, b in zip((*NAMES, "initial_state"), grads_cp, grads_one, strict=True):
        errors = _per_rank_errors(a, b, ranks) if name != "initial_state" else [relative_l2(a, b)]
        assert max(errors) < 1e-5, (name, errors)


def test_kernel_cp_with_fused_gate_and_recurrent_backend():
    """The in-kernel gate under CP, each kda_lib form, with packed segments (those of
    :func:`_segments`) and 16 tokens per rank: less than a chunk."""
    ranks, seq_len = 4, 64
    inputs = random_kda_inputs(jax.random.key(3), 2, seq_len, 2, 16, 16)
    ids = _segments(seq_len, ranks)
    raw = random_normal(jax.random.key(4), inputs["g"].shape)
    gate = dict(
        a_log=jnp.array([0.0, 1.0]),
        dt_bias=jnp.zeros(32),
        lower_bound=-5.0,
        use_qk_l2norm=True,
        use_gate_in_kernel=True,
    )
    args = (inputs["q"], inputs["k"], inputs["v"], raw, inputs["beta"])

    one = jax.jit(lambda *a: kda(*a[:5], **gate, segment_ids=a[5], implementation=ONE)[0])
    want = one(*args, ids)  # one program (eager, each small op would compile on its own)
    for impl in ("recurrent", "chunked", "auto"):
        got = _cp_kernel(_mesh(ranks), True, implementation=impl, **gate)(*args, ids)
        assert relative_l2(got, want) < 1e-5, impl


def test_bf16_cp_close_to_one_device_bf16():
    ranks, seq_len = 4, 256
    inputs = {
        n: x.astype(jnp.bfloat16)
        for n, x in random_kda_inputs(jax.random.key(5), 1, seq_len, 2, 16, 16).items()
    }
    args = tuple(inputs[n] for n in NAMES)
    got = _cp_kernel(_mesh(ranks), False, implementation="chunked")(*args)
    want = jax.jit(lambda *a: kda_chunked(*a)[0])(*args)
    assert got.dtype == jnp.bfloat16
    assert relative_l2(got, want) < 1e-2


@pytest.mark.parametrize("ranks,halo", [(4, 3), (8, 3), (8, 5)])
def test_halo_exchange(ranks, halo):
    seq_len = 16  # 2 tokens per rank with 8 ranks: the halo spans several ranks
    x = jnp.arange(2 * seq_len * 3, dtype=jnp.float32).reshape(2, seq_len, 3) + 1
    mesh = _mesh(ranks)
    exchange = jax.shard_map(
        lambda z: halo_exchange(z, axis_name="context", halo_size=halo),
        mesh=mesh,
        in_specs=SEQ,
        out_specs=SEQ,
    )
    fn = jax.jit(lambda z: exchange(shard_as(z, mesh, SEQ)))
    local = seq_len // ranks
    got = np.asarray(fn(x)).reshape(2, ranks, local + halo, 3)
    padded = np.concatenate([np.zeros((2, halo, 3)), np.asarray(x)], axis=1)
    for rank in range(ranks):
        np.testing.assert_array_equal(
            got[:, rank], padded[:, rank * local : rank * local + local + halo]
        )


# the layer tests check the CP wiring (halo, summaries, gradients); the recurrent backend
# compiles fastest, and the kernel tests above cover the chunked one
CFG = KDAConfig(
    hidden_size=32, num_heads=2, head_dim=16, value_head_dim=8, implementation="recurrent"
)


@nnx.jit
def _apply_and_grads(layer, x, segment_ids=None):
    """``layer(x)`` and the parameter gradients of ``sum(sin(layer(x)))``, one program."""

    def loss(m):
        y = m(x, segment_ids=segment_ids)
        return jnp.sum(jnp.sin(y)), y

    grads, y = nnx.grad(loss, has_aux=True)(layer)
    return y, grads


@nnx.jit
def _apply(layer, x, segment_ids=None):
    return layer(x, segment_ids=segment_ids)


# the options of the published models' layers (issue 27), each under CP in one case below
LAYER_OPTIONS = {
    "full_rank_output": dict(forget_gate_rank=4, output_gate_rank=None),
    "fused_qkv_conv": dict(fused_qkv_conv=True),  # the halo of the one fused conv
    # activated before the kernel
    "clamped_softplus": dict(gate_form="clamped_softplus", lower_bound=-5.0),
    # HV = 4 value heads on 2 q/k heads, the safe gate without A_log: HV-headed summaries
    "no_a_log_grouped": dict(
        gate_form="safe_sigmoid", lower_bound=-5.0, use_a_log=False, num_v_heads=4
    ),
}


@pytest.mark.parametrize(
    "ranks,seq_len,impl,segments,sharded,options",
    [
        (
            2,
            64,
            "recurrent",
            True,
            False,
            ("fused_qkv_conv", "full_rank_output", "clamped_softplus"),
        ),
        (8, 16, "recurrent", True, True, ("no_a_log_grouped",)),
        (4, 50, "chunked", False, False, ()),  # the softplus gate in the kernel
    ],
    ids=[
        "2-64-recurrent-segments-fused-full_rank_output-clamped_softplus",
        "8-16-recurrent-segments-sharded_x-no_a_log_grouped",
        "4-50-chunked",
    ],
)
def test_layer_cp_equals_one_device(ranks, seq_len, impl, segments, sharded, options):
    """Outputs and every parameter's gradient equal one device's (the recurrence). Includes 2
    tokens per rank (halo > slice; the halo from several ranks without segments:
    test_halo_exchange), with and without segments, segments with a halo from one rank, x
    replicated or already sharded along T, T not divisible by the ranks, and each of the
    published models' options (issue 27) with packed segments."""
    mesh = _mesh(ranks, jax.sharding.AxisType.Explicit)  # the layer accepts either axis type
    changes = {k: v for option in options for k, v in LAYER_OPTIONS[option].items()}
    cfg = dataclasses.replace(CFG, implementation=impl, **changes)
    single = KimiDeltaAttention(dataclasses.replace(cfg, implementation=ONE), rngs=nnx.Rngs(0))
    cp = KimiDeltaAttention(cfg, rngs=nnx.Rngs(0), mesh=mesh)
    x = random_normal(jax.random.key(1), (2, seq_len, 32))
    ids = np.ones((2, seq_len), np.int32)
    ids[0, seq_len // 2 :] = 2
    ids[0, 7 : seq_len // 2] = 3  # a boundary inside rank 1's slice (3 tokens per rank and up)
    ids[1, 3 : seq_len - 3] = 5
    ids[1, seq_len - 3 :] = 0
    ids[1, :2] = 0  # leading padding
    segment_ids = jnp.asarray(ids) if segments else None
    want, g_one = _apply_and_grads(single, x, segment_ids)
    if sharded:
        x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P(None, "context")))
    y_cp, g_cp = _apply_and_grads(cp, x, segment_ids)
    assert relative_l2(y_cp, want) < 1e-5, options
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(g_cp), jax.tree_util.tree_leaves(g_one), strict=True
    ):
        assert relative_l2(a, b) < 1e-5, (options, path)


def _assert_no_sequence_sized_collective(hlo, ranks, bound, seq_lens):
    collectives = hlo_collectives(hlo, ranks)
    assert collectives, "expected all-gathers of the chunk summaries"
    for c in collectives:
        assert c["elements"] <= bound, c
        assert not set(c["shape"]) & set(seq_lens), c


def test_traffic_does_not_grow_with_sequence_length():
    """The compiled CP kernel's collectives (forward at two lengths, backward at one) are the
    chunk summaries, whatever T. They are the same for every kda_lib form (the kernel runs
    rank-locally inside shard_map): the recurrence compiles fastest."""
    ranks, batch, heads, key_dim, value_dim = 4, 1, 2, 16, 16
    bound = ranks * batch * heads * key_dim * (key_dim + value_dim)
    sent = {}
    for seq_len in (256, 2048):
        inputs = random_kda_inputs(jax.random.key(0), batch, seq_len, heads, key_dim, value_dim)
        args = tuple(inputs[n] for n in NAMES)
        fwd = _cp_kernel(_mesh(ranks), False, implementation=ONE)
        hlo = fwd.lower(*args).compile().as_text()
        _assert_no_sequence_sized_collective(hlo, ranks, bound, {seq_len, seq_len // ranks})
        sent[seq_len] = sum(c["sent_bytes"] for c in hlo_collectives(hlo, ranks))
        if seq_len == 256:  # the backward's collectives: all-gathers and their transposes
            bwd = jax.jit(jax.grad(lambda *a, f=fwd: jnp.sum(f(*a) ** 2), argnums=tuple(range(5))))
            hlo = bwd.lower(*args).compile().as_text()
            _assert_no_sequence_sized_collective(hlo, ranks, bound, {seq_len, seq_len // ranks})
    assert sent[256] == sent[2048] > 0


def test_layer_traffic_is_halo_plus_summaries():
    ranks, seq_len = 4, 256
    layer = KimiDeltaAttention(CFG, rngs=nnx.Rngs(0), mesh=_mesh(ranks))
    x = random_normal(jax.random.key(1), (2, seq_len, 32))
    graphdef, state = nnx.split(layer)
    hlo = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, x).compile().as_text()
    bound = ranks * 2 * 2 * 16 * (16 + 8)
    _assert_no_sequence_sized_collective(hlo, ranks, bound, {seq_len, seq_len // ranks})


def test_cp_errors():
    with pytest.raises(ValueError, match="context_axis='seq' is not one of them"):
        KimiDeltaAttention(CFG, rngs=nnx.Rngs(0), mesh=_mesh(2), context_axis="seq")
    layer = KimiDeltaAttention(CFG, rngs=nnx.Rngs(0), mesh=_mesh(2))
    with pytest.raises(ValueError, match="does not decode"):
        layer(jnp.zeros((1, 4, 32)), cache=layer.init_cache(1))
    for impl in ("tokamax_mosaic", "tokamax_xla"):
        with pytest.raises(ValueError, match="cannot run inside shard_map"):
            kda_context_parallel(
                *(jnp.zeros((1, 4, 1, 4)),) * 4,
                jnp.zeros((1, 4, 1)),
                axis_name="context",
                implementation=impl,
            )


def test_replace_config_keeps_mesh():
    layer = KimiDeltaAttention(
        dataclasses.replace(CFG, conv_size=0), rngs=nnx.Rngs(0), mesh=_mesh(2)
    )
    single = KimiDeltaAttention(dataclasses.replace(CFG, conv_size=0), rngs=nnx.Rngs(0))
    x = random_normal(jax.random.key(2), (1, 8, 32))
    assert relative_l2(_apply(layer, x), _apply(single, x)) < 1e-5


# the eager CP layer of CFG on 2 ranks at x [1, 8, 32]: one kept program for both tests (one
# worker), which test_clear_compiled_forms_... clears at its end
EAGER_CP_LAYER = pytest.mark.xdist_group("cp_eager_layer")


@EAGER_CP_LAYER
def test_eager_cp_layer_compiles_once(caplog):
    """kda_lib's CP program is kept per structure, config and mesh: a second eager call with
    new values compiles nothing (each call compiled it again, about 3 s, before)."""
    layer = KimiDeltaAttention(CFG, rngs=nnx.Rngs(0), mesh=_mesh(2))
    x = random_normal(jax.random.key(3), (1, 8, 32))
    first, x_new = layer(x), x + 1.0
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        second = layer(x_new)
        jax.block_until_ready(second)
    compiled = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.message]
    assert compiled == [], compiled
    assert relative_l2(first, second) > 1e-3  # it did compute the new values


def test_kernel_cp_state_arguments_are_checked():
    mesh = _mesh(2)

    def run(**kwargs):
        def local(q, beta):
            return kda_context_parallel(q, q, q, -jnp.abs(q), beta, **kwargs)[0]

        fn = jax.shard_map(local, mesh=mesh, in_specs=(SEQ, SEQ), out_specs=SEQ)
        return jax.jit(fn).trace(
            shard_as(jnp.zeros((1, 8, 1, 4)), mesh, SEQ), shard_as(jnp.zeros((1, 8, 1)), mesh, SEQ)
        )

    with pytest.raises(ValueError, match=r"initial_state must have shape \[B, HV, K, V\]"):
        run(initial_state=jnp.zeros((1, 4, 4)))
    with pytest.raises(ValueError, match="output_final_state must be a bool"):
        run(output_final_state="yes")


@EAGER_CP_LAYER
def test_clear_compiled_forms_clears_the_cp_layer_and_the_generation_steps(monkeypatch):
    """After a module global the kernels read is patched, clear_compiled_forms() makes a CP
    layer change as a one-device layer does (its cached CP program was kept before), and it
    empties the generation steps' cache too."""
    import kda_lib.lab.generate
    import kda_lib.ops.api as registry

    layer = KimiDeltaAttention(CFG, rngs=nnx.Rngs(0), mesh=_mesh(2))
    single = KimiDeltaAttention(CFG, rngs=nnx.Rngs(0))
    x = random_normal(jax.random.key(5), (1, 8, 32))
    before = layer(x)
    real = registry.l2_normalize  # the layer normalises q and k in the kernel

    def doubled(x, **kw):
        return 2 * real(x, **kw)

    monkeypatch.setattr(registry, "l2_normalize", doubled)
    try:
        registry.clear_compiled_forms()
        # the one-device layer in one program (a new closure: traced with the patch; eager, each
        # small op would compile on its own), the CP layer eagerly (its own kept program)
        one_device = nnx.jit(lambda m, x: m(x))(single, x)
        cp = layer(x)
        assert relative_l2(one_device, before) > 1e-3  # the patch is seen
        assert relative_l2(cp, one_device) < 1e-5  # by the CP layer as well
        assert kda_lib.lab.generate._steps.cache_info().currsize == 0
    finally:
        monkeypatch.undo()
        registry.clear_compiled_forms()  # no patched trace stays for later tests


def _chunk_state_segments():
    """8 ranks of 16 tokens, chunks of 8 (boundaries every 8 tokens), T = 128. Rows 0-1:
    :func:`_segments` (seven summaries folded, a document passing through whole ranks, one
    starting exactly at a rank split, leading, inner and trailing padding). Row 2: rank 2
    starts with padding over boundary 40 and then a new document (the boundary holds document
    2's state, arriving from upstream, not the zeros the new document starts from); padding over
    boundary 64, then a document from the split of ranks 3 and 4 to that of ranks 5 and 6;
    ranks 6 and 7 hold only padding. Row 3: leading padding over boundary 8 (the initial
    state), a document starting exactly at the split of ranks 1 and 2, an all-padding rank 3,
    two more documents, the second ending inside rank 6; rank 7 holds only padding."""
    ids = np.zeros((4, 128), np.int32)
    ids[:2] = _segments(128, 8)
    ids[2, :12], ids[2, 12:32], ids[2, 42:56], ids[2, 56:60], ids[2, 64:96] = 1, 2, 3, 4, 11
    ids[3, 10:32], ids[3, 32:44], ids[3, 64:84], ids[3, 84:104] = 5, 6, 11, 12
    return jnp.asarray(ids)


def test_kernel_cp_chunk_states_refused_where_not_served():
    mesh = _mesh(2)

    def trace(**kwargs):
        def local(q, beta):
            return kda_context_parallel(q, q, q, -jnp.abs(q), beta, **kwargs)[0]

        fn = jax.shard_map(local, mesh=mesh, in_specs=(SEQ, SEQ), out_specs=SEQ)
        return jax.jit(fn).trace(
            shard_as(jnp.zeros((1, 24, 1, 4)), mesh, SEQ),
            shard_as(jnp.zeros((1, 24, 1)), mesh, SEQ),
        )

    with pytest.raises(ValueError, match=r"multiple of chunk_size=8, got T_local=12"):
        trace(output_chunk_states=True, chunk_size=8)
    with pytest.raises(ValueError, match="output_chunk_states must be a bool"):
        trace(output_chunk_states=1, chunk_size=4)
    with pytest.raises(ValueError, match="output_token_states is not served under context"):
        trace(output_token_states=True)


def test_kernel_cp_states_with_segments():
    """Under CP with segments and an initial state: the outputs, the final state (the state
    after the last token) and ``output_chunk_states`` (each rank's boundaries, the state from
    earlier ranks applied) equal one device's, and so do the gradients through the outputs and
    the final state and through the chunk states; rows: :func:`_chunk_state_segments`. The
    trailing ranks of rows 2-3 hold only padding: the final state and the chunk states over them
    are the state after the last real token, which the outputs alone do not show (a mutant
    taking the state from the wrong rank kept them)."""
    ranks, seq_len, chunk = 8, 128, 8
    inputs = random_kda_inputs(jax.random.key(21), 4, seq_len, 2, 8, 8)
    ids = _chunk_state_segments()
    h0 = random_normal(jax.random.key(22), (4, 2, 8, 8))
    mesh = _mesh(ranks)
    specs = (SEQ,) * 5 + (P(), SEQ)
    kw = dict(output_final_state=True, output_chunk_states=True, chunk_size=chunk,
              implementation="chunked")  # fmt: skip

    def local(q, k, v, g, beta, h0, ids):
        result = kda_context_parallel(q, k, v, g, beta, initial_state=h0, segment_ids=ids, **kw)
        return result.output, result.final_state, result.chunk_states

    fn = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(SEQ, P(), SEQ))
    cp = jax.jit(lambda *a: fn(*(shard_as(x, mesh, s) for x, s in zip(a, specs, strict=True))))

    def single(q, k, v, g, beta, h0, ids):
        kw_one = dict(kw, implementation=ONE)
        result = kda(q, k, v, g, beta, initial_state=h0, segment_ids=ids, **kw_one)
        return result.output, result.final_state, result.chunk_states

    args = tuple(inputs[n] for n in NAMES) + (h0, ids)
    cot_o = random_normal(jax.random.key(23), inputs["v"].shape)
    cot_f = random_normal(jax.random.key(25), h0.shape)
    cot_s = random_normal(jax.random.key(24), (4, seq_len // chunk, 2, 8, 8))

    def run(f):  # one program: the values, the pullbacks of outputs + final state and of states
        def both(*a):
            values, pullback = jax.vjp(lambda *d: f(*d, a[-1]), *a[:-1])
            o, f_, s = (jnp.zeros_like(x) for x in values)
            return values, pullback((cot_o, cot_f, s)), pullback((o, f_, cot_s))

        return jax.jit(both)(*args)

    (out_cp, final_cp, states_cp), *grads_cp = run(cp)
    (out_one, final_one, states_one), *grads_one = run(single)
    assert states_cp.shape == (4, seq_len // chunk, 2, 8, 8)
    assert max(_per_rank_errors(out_cp, out_one, ranks)) < 1e-5
    assert relative_l2(final_cp, final_one) < 1e-5
    assert relative_l2(final_cp[2:], final_one[2:]) < 1e-5  # the all-padding trailing ranks
    assert max(_per_rank_errors(states_cp, states_one, ranks)) < 1e-5
    for through, g_cp, g_one in zip(("outputs", "states"), grads_cp, grads_one, strict=True):
        for name, a, b in zip((*NAMES, "initial_state"), g_cp, g_one, strict=True):
            assert relative_l2(a, b) < 1e-5, (through, name)


def test_return_is_a_pair_whatever_the_flags():
    """``o, state = kda_context_parallel(...)`` unpacks as kda()'s result does: the state is
    None without output_final_state (a bare output would unpack its batch rows silently)."""
    mesh = _mesh(2)
    q = random_normal(jax.random.key(3), (2, 8, 1, 4))
    beta = jnp.full((2, 8, 1), 0.5)

    def local(q, beta):
        o, state = kda_context_parallel(q, q, q, -jnp.abs(q), beta, axis_name="context")
        assert state is None
        return o

    fn = jax.shard_map(local, mesh=mesh, in_specs=(SEQ, SEQ), out_specs=SEQ)
    o = jax.jit(fn)(shard_as(q, mesh, SEQ), shard_as(beta, mesh, SEQ))
    want, _ = jax.jit(lambda q, beta: kda(q, q, q, -jnp.abs(q), beta))(q, beta)
    assert o.shape == (2, 8, 1, 4) and relative_l2(o, want) < 1e-5
