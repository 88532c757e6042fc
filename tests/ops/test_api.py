"""kda(...) dispatch, the tokamax adapter, and parity with tokamax called directly."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kda_lib import (
    KDAConfig,
    KimiDeltaAttention,
    emulate_tpu,
    kda,
    kda_chunked,
    kda_gate,
    kda_recurrent,
)
from kda_lib.ops import api
from kda_lib.ops.api import select_implementation
from kda_lib.ops.norms import l2_normalize
from kda_lib.ops.tokamax.adapter import tokamax_kda_api
from kda_lib.testing import assert_close, random_kda_inputs, random_normal

B, T, H, K, V = 2, 100, 2, 32, 16


@functools.partial(jax.jit, static_argnames="with_state")  # one program (eagerly: ten)
def _raw_inputs(seed=0, *, with_state=True):
    ks = jax.random.split(jax.random.key(seed), 8)
    return dict(
        q=jax.random.normal(ks[0], (B, T, H, K)),
        k=jax.random.normal(ks[1], (B, T, H, K)),
        v=jax.random.normal(ks[2], (B, T, H, V)),
        g=jax.random.normal(ks[3], (B, T, H, K)),  # raw gate input
        beta=jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H))),
        a_log=jnp.log(jnp.array([1.0, 8.0])),
        dt_bias=0.5 * jax.random.normal(ks[5], (H * K,)),
        initial_state=(0.1 * jax.random.normal(ks[6], (B, H, K, V))) if with_state else None,
    )


def _segments():
    ids = np.ones((B, T), np.int32)
    ids[0, 30:70] = 2
    ids[0, 70:80] = 0  # padding between documents
    ids[0, 80:] = 3
    ids[1, :] = 5  # first id is not 1
    ids[1, 90:] = 0  # trailing padding
    return jnp.asarray(ids)


def _head_first(x):
    return jnp.moveaxis(x, 2, 0)


@functools.partial(jax.jit, static_argnames="lower_bound")
def _kda_lib_forms(x, lower_bound):
    """kda_lib's recurrent and chunked forms on the activated inputs, and (with the safe gate,
    for tokamax's xla_chunked) the chunked form on the first T - T % 64 tokens: one program."""
    q, k = l2_normalize(x["q"]), l2_normalize(x["k"])
    g = kda_gate(x["g"], x["a_log"], x["dt_bias"], lower_bound=lower_bound)
    args = (q, k, x["v"], g, x["beta"])
    kw = dict(initial_state=x["initial_state"], output_final_state=True)
    seq = T - T % 64
    truncated = None if lower_bound is None else kda_chunked(*(a[:, :seq] for a in args), **kw)
    return kda_recurrent(*args, **kw), kda_chunked(*args, **kw), truncated


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_tokamax_direct_parity(lower_bound):
    """tokamax's own API (head-first, fused gate) against kda_lib's forms on the same inputs."""
    api = tokamax_kda_api()
    x = _raw_inputs(1)
    (o_rec, s_rec), (o_chk, s_chk), truncated = _kda_lib_forms(x, lower_bound)
    impls = ["xla"] + (["xla_chunked"] if lower_bound is not None else [])
    for impl in impls:
        seq = T - T % 64 if impl == "xla_chunked" else T  # fixed-length xla_chunked: T % 64 == 0

        @jax.jit  # the layout changes too: one program
        def tokamax(x, impl=impl, seq=seq):
            o, s = api.kimi_delta_attention(
                *(_head_first(x[n][:, :seq]) for n in ("q", "k", "v", "g", "beta")),
                a_log=x["a_log"],
                delta_time_bias=x["dt_bias"],
                initial_state=x["initial_state"][:, None],
                use_gate_in_kernel=True,
                lower_bound=lower_bound,
                use_qk_l2norm=True,
                output_final_state=True,
                implementation=impl,
            )
            return jnp.moveaxis(o, 0, 2), s

        o_tk, s_tk = tokamax(x)
        if seq == T:
            assert_close(o_tk, o_rec, atol=2e-6, rtol=1e-5, name=f"tokamax {impl} vs recurrent")
            assert_close(s_tk[:, 0], s_rec, atol=5e-6, rtol=1e-5)
            assert_close(o_tk, o_chk, atol=2e-6, rtol=1e-5, name=f"tokamax {impl} vs chunked")
            assert_close(s_tk[:, 0], s_chk, atol=5e-6, rtol=1e-5)
        else:
            o_ref, s_ref = truncated
            assert_close(o_tk, o_ref, atol=2e-6, rtol=1e-5, name=f"tokamax {impl} vs chunked")
            assert_close(s_tk[:, 0], s_ref, atol=5e-6, rtol=1e-5)


@functools.partial(jax.jit, static_argnames=("impls", "lower_bound"))
def _every_implementation(x, segment_ids, impls, lower_bound):
    """``{implementation: kda(...)}`` in one program (static shapes and options; the eager
    value checks are tested in test_errors_name_the_constraint and test_kernel_validation)."""
    kw = dict(use_qk_l2norm=True, output_final_state=True, lower_bound=lower_bound)
    kw.update(use_gate_in_kernel=True)
    if segment_ids is not None:
        kw.update(segment_ids=segment_ids, max_num_segments=3)
    return {impl: kda(**x, **kw, implementation=impl) for impl in impls}


# the safe gate with segments: test_adapter_gradients_agree (outputs and gradients); without:
# test_tokamax_direct_parity, and tests/contracts/test_grouped_heads.py (tokamax_xla_chunked,
# outputs and gradients against the float64 oracle)
@pytest.mark.parametrize("lower_bound, with_segments", [(None, False), (None, True)])
def test_every_implementation_agrees(lower_bound, with_segments):
    x = _raw_inputs(2)
    impls = ["chunked", "tokamax_xla"] + (["tokamax_xla_chunked"] if lower_bound else [])
    outputs = _every_implementation(
        x, _segments() if with_segments else None, ("recurrent", *impls), lower_bound
    )
    o_ref, s_ref = outputs["recurrent"]
    for impl in impls:
        o, s = outputs[impl]
        assert_close(o, o_ref, atol=2e-6, rtol=1e-5, name=impl)
        assert_close(s, s_ref, atol=5e-6, rtol=1e-5, name=f"{impl} state")
        if with_segments:
            assert np.all(np.asarray(o)[np.asarray(_segments()) == 0] == 0)


@pytest.mark.parametrize("implementation", ["recurrent", "chunked", "tokamax_xla",
                                            "tokamax_xla_chunked"])  # fmt: skip
def test_final_state_dtype_is_the_same_from_every_implementation(implementation):
    """One documented final-state dtype (kda's Returns): float32 for float32/bfloat16 inputs,
    float64 for float64 ones (under x64), from kda_lib's forms and tokamax's alike."""
    x = _raw_inputs(3, with_state=False)
    for dtype, want in [(jnp.float64, jnp.float64), (jnp.float32, jnp.float32),
                        (jnp.bfloat16, jnp.float32)]:  # fmt: skip
        x64 = dtype == jnp.float64
        if x64 and implementation == "tokamax_xla_chunked":
            continue  # tokamax's own segment loop fails under x64 (an int32/int64 carry)
        with jax.enable_x64(x64):
            args = [x[n].astype(dtype) for n in ("q", "k", "v", "g", "beta")]
            # traced, not run: dtypes are fixed when tracing (eagerly: hundreds of compiles)
            _, final = jax.eval_shape(
                functools.partial(kda, a_log=x["a_log"], dt_bias=x["dt_bias"], lower_bound=-5.0,
                                  use_gate_in_kernel=True, output_final_state=True,
                                  implementation=implementation), *args)  # fmt: skip
        assert final.dtype == want, (implementation, dtype, final.dtype)


def test_adapter_gradients_agree():
    """Outputs, final states and gradients of every implementation, safe gate, segments;
    padding outputs 0."""
    x = _raw_inputs(3)
    diff = ("q", "k", "v", "g", "beta", "a_log", "dt_bias", "initial_state")
    segment_ids = _segments()

    def outputs_and_grads(impl):
        def loss(p):
            o, s = kda(
                **{**x, **p},
                lower_bound=-5.0,
                use_gate_in_kernel=True,
                use_qk_l2norm=True,
                output_final_state=True,
                segment_ids=segment_ids,
                max_num_segments=3,
                implementation=impl,
            )
            return jnp.sum(o * jnp.cos(o)) + jnp.sum(s**2), (o, s)

        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))({n: x[n] for n in diff})
        return out, grads

    (o_ref, s_ref), ref = outputs_and_grads("recurrent")
    for impl in ("chunked", "tokamax_xla", "tokamax_xla_chunked"):
        (o, s), got = outputs_and_grads(impl)
        assert_close(o, o_ref, atol=2e-6, rtol=1e-5, name=impl)
        assert_close(s, s_ref, atol=5e-6, rtol=1e-5, name=f"{impl} state")
        assert np.all(np.asarray(o)[np.asarray(segment_ids) == 0] == 0)
        for name in diff:
            assert_close(got[name], ref[name], atol=1e-4, rtol=1e-4, name=f"{impl} d{name}")


def test_log_space_gate_path():
    inputs = random_kda_inputs(jax.random.key(4), 1, 70, 2, 16, 16)

    @jax.jit  # one program
    def run(inputs):
        impls = ("chunked", "tokamax_xla", "auto")
        return kda_recurrent(**inputs)[0], [kda(**inputs, implementation=i)[0] for i in impls]

    o_ref, outputs = run(inputs)
    for o in outputs:
        assert_close(o, o_ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("seq_len", [16, 70])  # the recurrence; the chunked VJP, two chunks
def test_forward_mode_autodiff_through_auto(seq_len):
    """jax.jvp through the default kda() equals the recurrence's JVP at every length (above 16
    tokens on CPU the auto route is a custom_jvp, not a custom_vjp); jacfwd runs too."""
    x = random_kda_inputs(jax.random.key(6), 1, seq_len, 1, 4, 4, with_state=True)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
    tangents = tuple(0.1 * random_normal(jax.random.key(i), a.shape) for i, a in enumerate(args))

    def fn(implementation):
        def run(q, k, v, g, beta, state):
            kw = dict(initial_state=state, output_final_state=True, implementation=implementation)
            return kda(q, k, v, g, beta, **kw)

        return run

    got = jax.jit(lambda p, t: jax.jvp(fn("auto"), p, t))(args, tangents)
    want = jax.jit(lambda p, t: jax.jvp(fn("recurrent"), p, t))(args, tangents)
    names = ("o", "final", "do", "dfinal")
    for name, a, b in zip(names, *map(jax.tree.leaves, (got, want)), strict=True):
        assert_close(a, b, atol=2e-5, rtol=1e-4, name=name)
    if seq_len == 16:
        return

    @jax.jit  # one program (eagerly: some hundred small ones)
    def jacobian(args):
        short = tuple(a[:, :20] for a in args)  # 20 tokens: above 16, past the custom_vjp of old
        return jax.jacfwd(lambda v: kda(short[0], short[1], v, *short[3:])[0])(short[2])

    assert jacobian(args[:5]).shape == (1, 20, 1, 4) * 2


def test_forward_mode_through_chunked_is_refused_by_name_and_served_by_auto():
    """jax.jvp through kda(implementation="chunked") names the implementation that works;
    "auto", where it runs the chunked form forward (B * HV * K * V >= 65536 on CPU), serves an
    eager jvp by the recurrence: the recurrence's JVP."""
    x = random_kda_inputs(jax.random.key(80), 1, 80, 1, 4, 4)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    with pytest.raises(TypeError, match="implementation='chunked'.*implementation='recurrent'"):
        jax.jvp(functools.partial(kda, implementation="chunked"), args, args)
    x = random_kda_inputs(jax.random.key(20), 1, 20, 4, 128, 128)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    # eagerly: under an outer jit JAX defers the jvp of kda's compiled call past the fallback
    run = lambda impl: jax.jvp(functools.partial(kda, implementation=impl), args, args)  # noqa: E731
    got, want = run("auto"), run("recurrent")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_jit_around_forward_mode_is_served_by_auto_and_refused_by_chunked():
    """jit around a jvp: auto, on the chunked form alone (B * HV * K * V >= 65536 on CPU), runs
    the recurrence, read from the tracers kda() receives (before, JAX's bare error at
    compilation); the chunked form named refuses by name. A jvp of a jitted kda() is applied
    after kda() has returned: JAX's own error stands (DESIGN section 4; this test notices when
    a JAX release changes that)."""
    big = random_kda_inputs(jax.random.key(4), 1, 20, 4, 128, 128)
    big = tuple(big[n] for n in ("q", "k", "v", "g", "beta"))
    run = lambda impl: jax.jit(lambda a: jax.jvp(  # noqa: E731
        functools.partial(kda, implementation=impl), a, a))(big)  # fmt: skip
    for a, b in zip(jax.tree.leaves(run("auto")), jax.tree.leaves(run("recurrent")), strict=True):
        assert_close(a, b, atol=2e-5, rtol=1e-4)
    small = tuple(a[:, :, :1, :4] for a in big[:4]) + (big[4][:, :, :1],)
    named = functools.partial(kda, implementation="chunked")
    with pytest.raises(TypeError, match="implementation='chunked'.*implementation='recurrent'"):
        jax.jit(lambda a: jax.jvp(named, a, a))(small)
    with pytest.raises(TypeError, match="implementation='chunked'.*implementation='recurrent'"):
        jax.jit(jax.vmap(lambda a: jax.jvp(named, a, a)))(tuple(a[None] for a in small))
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(jax.jit(named), small, small)


def test_jit_around_a_hessian_vector_product_runs_through_the_chunked_backward():
    """jit around a Hessian-vector product (jvp of grad) whose tangent moves every input: the
    outer jvp runs through the chunked form's hand-written backward, since the forward rules of
    its custom_vjps run their plain bodies (before, a tangent in k, g or beta met JAX's error at
    unit_lower_inverse's custom_vjp, DESIGN section 4). auto's (routed, T = 20) and chunked's
    equal the recurrence's. Chunks of 4 (five, one merge in the inverse; at 64, one partial
    chunk, the same programs but for sizes, 1.5 s more to compile)."""
    x = random_kda_inputs(jax.random.key(4), 1, 20, 1, 4, 4)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    run = functools.partial(kda, chunk_size=4)

    @jax.jit  # the three implementations in one program
    def hvps(args):
        def hvp(implementation):
            loss = lambda a: jnp.sum(run(*a, implementation=implementation)[0] ** 2)  # noqa: E731
            return jax.jvp(jax.grad(loss), (args,), (args,))[1]

        return [hvp(i) for i in ("auto", "chunked", "recurrent")]

    auto, chunked, want = hvps(args)
    for name, a, b, c in zip(("q", "k", "v", "g", "beta"), auto, chunked, want, strict=True):
        assert_close(a, c, atol=1e-6, rtol=1e-5, name=f"auto d{name}")
        assert_close(b, c, atol=1e-6, rtol=1e-5, name=f"chunked d{name}")


def test_grad_of_a_jvp_through_auto_equals_the_recurrences():
    """Reverse over forward (jax.grad of a jax.jvp of kda()'s output) through auto above 16
    tokens. Before, the chunked backward's custom_vjp got another computation's values as its
    residuals: numpy's 'Incompatible shapes for broadcasting' here (DESIGN section 4). Chunks of
    4: five, across boundaries (at 64, one partial chunk: the same programs but for sizes)."""
    x = random_kda_inputs(jax.random.key(3), 1, 20, 1, 4, 4)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))

    def grad_of_jvp(implementation):
        run = functools.partial(kda, implementation=implementation, chunk_size=4)
        return jax.grad(lambda q: jnp.sum(jax.jvp(run, (q, *args[1:]), args)[1][0] ** 2))(args[0])

    want = jax.jit(grad_of_jvp, static_argnums=0)("recurrent")  # one program (eagerly: twelve)
    assert_close(grad_of_jvp("auto"), want, atol=2e-5, rtol=1e-4)


def test_forward_mode_over_the_pallas_row_of_auto_runs_the_recurrence(monkeypatch):
    """On a TPU auto's row can be the Pallas kernels (here interpreted): forward mode at any
    depth (jax.hessian; jit around a jvp of a gradient, which before reached the backward
    kernels' pallas_call JVP rule after kda() had returned: a bare AssertionError) runs the
    recurrence, read from the tracers kda() receives."""
    monkeypatch.setattr(api, "tpu_generation", lambda: 5)
    x = random_kda_inputs(jax.random.key(5), 1, 24, 1, 128, 128)
    rest = tuple(x[n] for n in ("k", "v", "g", "beta"))
    assert select_implementation(seq_len=24, key_dim=128) == "pallas_tpu"

    def loss(implementation):
        return lambda s: jnp.sum(kda(x["q"] * s, *rest, implementation=implementation)[0] ** 2)

    # the recurrence's second derivative at 1.5, once (one program): what each mode gives
    want = jax.jit(jax.hessian(loss("recurrent")))(1.5)
    assert_close(jax.hessian(loss("auto"))(1.5), want, atol=1e-5, rtol=1e-5)
    hvp = jax.jit(lambda s: jax.jvp(jax.grad(loss("auto")), (s,), (1.0,))[1])(1.5)
    assert_close(hvp, want, atol=1e-5, rtol=1e-5)
    # a jvp of a jitted gradient reaches the kernels after kda() returned: JAX's custom_vjp
    # message (both kernels sit behind a reverse-only custom_vjp), not pallas_call's assertion
    jitted = jax.jit(jax.grad(loss("auto")))
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(jitted, (1.5,), (1.0,))
    # a gradient of a gradient runs the recurrence too; of a jitted one, the kernels named
    assert_close(jax.grad(jax.grad(loss("auto")))(1.5), want, atol=1e-5, rtol=1e-5)
    # traced: the refusal is the backward rule's, met while tracing the outer gradient (called,
    # the jitted gradient's forward kernels compile first, 3.4 s in interpret mode, then it)
    with pytest.raises(NotImplementedError, match="Pallas TPU kernels.*'recurrent'"):
        jax.make_jaxpr(jax.grad(jitted))(1.5)


def test_forward_mode_through_the_pallas_kernels_is_refused_by_name():
    """jvp, jit around it, forward over reverse (jax.hessian) and a gradient of a gradient
    through the Pallas kernels named: a TypeError naming them and the recurrence, before any
    kernel runs."""
    x = random_kda_inputs(jax.random.key(9), 1, 40, 1, 128)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    run = functools.partial(kda, implementation="pallas_tpu")
    refusal = "implementation='pallas_tpu'.*implementation='recurrent'"
    with pytest.raises(TypeError, match=refusal):
        jax.jvp(run, args, args)
    with pytest.raises(TypeError, match=refusal):
        jax.jit(lambda a: jax.jvp(run, a, a))(args)
    with pytest.raises(TypeError, match=refusal):
        jax.hessian(lambda s: jnp.sum(run(args[0] * s, *args[1:])[0]))(1.0)
    with pytest.raises(TypeError, match=refusal):  # before: the kernels' bare error
        jax.grad(jax.grad(lambda s: jnp.sum(run(args[0] * s, *args[1:])[0])))(1.0)


def _float64_inputs(seq_len):
    """kda()'s inputs (B = 1, H = 2, K = V = 4, an initial state) in float64, and weights for
    :func:`_scaled_loss`."""
    x = random_kda_inputs(jax.random.key(seq_len), 1, seq_len, 2, 4, 4, with_state=True)
    x = {n: jnp.asarray(np.asarray(a, np.float64)) for n, a in x.items()}
    return x, jnp.asarray(np.random.default_rng(0).normal(size=(1, seq_len, 2, 4)))


def _scaled_loss(x, weights, theta, implementation="auto", **kwargs):
    """A scalar of kda()'s output, a function of three scalings ``theta`` (of q, v, the gates)."""
    o, _ = kda(x["q"] * jnp.exp(theta[0]), x["k"], x["v"] * (1 + theta[1]),
               x["g"] * (1 + theta[2]), x["beta"], initial_state=x["initial_state"],
               implementation=implementation, **kwargs)  # fmt: skip
    return jnp.sum(weights * o) + 0.5 * jnp.sum(o * o)


def _central_slope(f, theta, h=1e-4):
    """``[len(theta), ...]``: the derivatives of ``f`` at ``theta`` by central differences."""
    return np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(len(theta))])


def _central_hessian(f, theta, h=1e-4):
    """The Hessian of a scalar ``f`` at ``theta`` by central differences."""
    eye, at = np.eye(len(theta)), lambda step: f(theta + h * step)
    return np.array([[(at(a + b) - at(a - b) - at(b - a) + at(-a - b)) / (4 * h * h) for b in eye]
                     for a in eye])  # fmt: skip


# numpy float64: jax converts them under the x64 fixture (a jnp array made here is float32)
THETA, DIRECTION = np.array([0.1, -0.2, 0.05]), np.array([1.0, 2.0, -1.0])


# T = 16: auto runs the recurrence; above, the chunked form's backward at the default chunk size
# (64): 17, one partial chunk; 70, across a chunk boundary into a partial chunk; 1024, sixteen
# whole chunks (issue 75's lengths)
@pytest.mark.parametrize("seq_len", [16, 17, 70, 1024])
def test_hessian_and_jvp_through_the_default_match_float64_finite_differences(seq_len, x64):
    """jax.hessian (forward over reverse) and jax.jvp of a scalar of the default kda()'s
    output, w.r.t. three scalings (of q, v and the gates): central differences in float64.
    Above 16 tokens "auto" differentiates by the chunked form, whose backward is hand-written:
    the Hessian is forward mode over that backward, the jvp auto's route (the chunked VJP
    transposed); the chunked form named refuses a jvp of itself by name."""
    loss = functools.partial(_scaled_loss, *_float64_inputs(seq_len))
    f = jax.jit(loss)
    slope, want = _central_slope(f, THETA), _central_hessian(f, THETA)
    derivatives = lambda t: (jax.hessian(loss)(t), jax.jvp(loss, (t,), (DIRECTION,))[1])  # noqa: E731
    hessian, along = jax.jit(derivatives)(THETA)  # one program
    np.testing.assert_allclose(hessian, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(along, slope @ DIRECTION, rtol=1e-6, atol=1e-7)
    if seq_len > 16:  # the chunked form named: forward mode over its forward refused by name
        with pytest.raises(TypeError, match="implementation='chunked'.*'recurrent'"):
            jax.jvp(functools.partial(loss, implementation="chunked"), (THETA,), (DIRECTION,))


# T past a whole number of chunks. Before, the chunked backward's custom_vjp was handed other
# values as its residuals (DESIGN section 4): at chunk size 1 a wrong value with no error, at
# the others numpy's 'Incompatible shapes for broadcasting'. Chunk size 1 (the inverse without
# a merge) and 4 (five chunks, the last of one token; one merge of the inverse's blocks): 16 and
# 64 run the same programs but for sizes (the merges are unrolled: 3 at 16, 5 at 64; 4 compiles
# in 2.5 s, 16 in 4.1 s). Second order at the default 64: jax.hessian and jvp in
# test_hessian_and_jvp_through_the_default_match_float64_finite_differences[17] and the
# layer's [17] (make test; their [70] and [1024] rows in make test-all, tests/extended.py)
SECOND_ORDER_CASES = [(17, 1), (17, 4)]  # (T, chunk size)
SECOND_ORDER_PROGRAMS = pytest.mark.xdist_group("second_order_oracles")  # one oracle a case


@functools.cache
def _recurrent_hessian(seq_len, chunk_size):
    """The Hessian of :func:`_scaled_loss` through the recurrence by central differences, in
    float64 (once per worker for each case: the tests below share it)."""
    with jax.enable_x64(True):
        loss = functools.partial(_scaled_loss, *_float64_inputs(seq_len), chunk_size=chunk_size,
                                 implementation="recurrent")  # fmt: skip
        return _central_hessian(jax.jit(loss), THETA)


def _second_order_setup(seq_len, chunk_size, implementation):
    """``(loss, want)``: :func:`_scaled_loss` at ``chunk_size`` on ``implementation``, and its
    Hessian by central differences of the recurrence, in float64."""
    loss = functools.partial(_scaled_loss, *_float64_inputs(seq_len), chunk_size=chunk_size)
    want = _recurrent_hessian(seq_len, chunk_size)
    return functools.partial(loss, implementation=implementation), want


@SECOND_ORDER_PROGRAMS
@pytest.mark.parametrize("seq_len, chunk_size", SECOND_ORDER_CASES)
@pytest.mark.parametrize("implementation", ["auto", "chunked"])
def test_grad_of_grad_through_the_chunked_form_matches_float64_finite_differences(
    implementation, seq_len, chunk_size, x64
):
    """Reverse over reverse (jax.grad of a gradient's projection: a Hessian-vector product)
    through the chunked form's hand-written backward."""
    loss, want = _second_order_setup(seq_len, chunk_size, implementation)
    hvp = jax.jit(jax.grad(lambda t: jnp.vdot(jax.grad(loss)(t), DIRECTION)))(THETA)
    np.testing.assert_allclose(hvp, want @ DIRECTION, rtol=1e-5, atol=1e-6)


@SECOND_ORDER_PROGRAMS
@pytest.mark.parametrize("seq_len, chunk_size", SECOND_ORDER_CASES)
def test_reverse_over_forward_through_auto_matches_float64_finite_differences(
    seq_len, chunk_size, x64
):
    """jax.grad of a jax.jvp, and (on the smallest case) jax.jacrev of jax.jacfwd, through auto,
    whose forward mode above 16 tokens on CPU is the chunked VJP transposed ("chunked" itself
    refuses forward mode by name)."""
    loss, want = _second_order_setup(seq_len, chunk_size, "auto")
    grad_of_jvp = jax.jit(jax.grad(lambda t: jax.jvp(loss, (t,), (DIRECTION,))[1]))(THETA)
    np.testing.assert_allclose(grad_of_jvp, want @ DIRECTION, rtol=1e-5, atol=1e-6)
    if chunk_size == 1:
        hessian = jax.jit(jax.jacrev(jax.jacfwd(loss)))(THETA)
        np.testing.assert_allclose(hessian, want, rtol=1e-5, atol=1e-6)


@SECOND_ORDER_PROGRAMS
@pytest.mark.parametrize("seq_len, chunk_size", [(17, 4)])
def test_forward_over_reverse_through_the_chunked_form_matches_float64_finite_differences(
    seq_len, chunk_size, x64
):
    """jax.hessian (jacfwd of jacrev) and a Hessian-vector product (jvp of grad) through
    kda(implementation="chunked"), under jit: forward mode over its hand-written backward, the
    tangent moving the gates, so unit_lower_inverse's input (before: refused by name eagerly,
    JAX's error under jit around the product; DESIGN section 4)."""
    loss, want = _second_order_setup(seq_len, chunk_size, "chunked")
    derivatives = lambda t: (jax.hessian(loss)(t), jax.jvp(jax.grad(loss), (t,), (DIRECTION,))[1])  # noqa: E731
    hessian, hvp = jax.jit(derivatives)(THETA)  # one program
    np.testing.assert_allclose(hessian, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hvp, want @ DIRECTION, rtol=1e-5, atol=1e-6)


@functools.cache  # one layer for the lengths (built eagerly: some hundred small programs)
def _float64_layer():
    """``(config, graphdef, params)`` of a float64 KimiDeltaAttention of hidden size 8."""
    with jax.enable_x64(True):
        config = KDAConfig(hidden_size=8, num_heads=1, head_dim=4, dtype=jnp.float64,
                           param_dtype=jnp.float64)  # fmt: skip
        return config, *nnx.split(KimiDeltaAttention(config, rngs=nnx.Rngs(0)))


# T = 17 (one partial chunk of the default 64) and 1024 (sixteen whole ones): the chunked form's
# backward. (T = 16, where auto runs the recurrence, was a row: the layer has no other branch on
# T, its own ops run here, and the recurrence's Hessian and jvp under auto are checked against
# float64 finite differences by test_hessian_and_jvp_through_the_default_match_float64_finite_
# differences[16].)
@pytest.mark.parametrize("seq_len", [17, 1024])
def test_hessian_and_jvp_through_the_layer_match_float64_finite_differences(seq_len, x64):
    """jax.hessian and jax.jvp of a scalar of the default layer's output (KimiDeltaAttention in
    float64, hidden size 8) w.r.t. two scalings of its input, against central differences (at h
    and h / 2, extrapolated) of the loss for the jvp and of the recurrence's gradient for the
    Hessian. The layer keeps beta and its output norm in float32 even in float64: that rounding
    spoils second differences of the loss itself (at T = 1024 no step from 3e-4 to 3e-2 came
    within 3% of every entry), not first ones (within 3e-5 here)."""
    config, graphdef, params = _float64_layer()
    x, x2, weights = (random_normal(jax.random.key(s), (1, seq_len, 8), jnp.float64)
                      for s in (1, 2, 3))  # fmt: skip

    def loss(theta, implementation="auto"):
        layer = nnx.merge(graphdef, params)
        layer.config = dataclasses.replace(config, implementation=implementation)
        y = layer(x * (1 + theta[0]) + theta[1] * x2)
        return jnp.sum(weights * y) + 0.5 * jnp.sum(y * y)

    theta, direction, h = jnp.asarray([0.1, -0.05]), jnp.asarray([1.0, 0.5]), 3e-3
    extrapolated = lambda f: (4 * _central_slope(f, theta, h / 2) - _central_slope(f, theta, h)) / 3  # noqa: E731
    slope = extrapolated(jax.jit(loss))
    want = extrapolated(jax.jit(jax.grad(functools.partial(loss, implementation="recurrent"))))
    derivatives = lambda t: (jax.hessian(loss)(t), jax.jvp(loss, (t,), (direction,))[1])  # noqa: E731
    hessian, along = jax.jit(derivatives)(theta)  # one program
    np.testing.assert_allclose(hessian, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
    np.testing.assert_allclose(along, slope @ direction, rtol=1e-3)


def test_l2_normalize_is_finite_up_to_float32s_largest_values():
    """Before, 2^-127 (the inverse of the scale at 1.8e38) was flushed to zero: NaN."""
    x = jnp.array([[1.8e38, 1.8e38], [-3.4e38, 1.0], [3.0, 4.0]], jnp.float32)
    want = np.array([[0.5**0.5, 0.5**0.5], [-1.0, 0.0], [0.6, 0.8]], np.float32)

    @jax.jit  # one program (eagerly: some forty small ones)
    def both_and_grad(x):
        grad = jax.grad(lambda x: l2_normalize(x).sum())(x)
        return [l2_normalize(x, keep_float32=keep) for keep in (False, True)], grad

    normalized, grad = both_and_grad(x)
    for got in normalized:
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-38)
    assert np.isfinite(np.asarray(grad)).all()


def test_auto_policy():
    assert (
        select_implementation(
            seq_len=1, key_dim=64, dtype=jnp.float32, lower_bound=None, fused_gate=False
        )
        == "recurrent"
    )
    assert (
        select_implementation(
            seq_len=65, key_dim=64, dtype=jnp.float32, lower_bound=None, fused_gate=False
        )
        == "chunked"
    )
    assert (
        select_implementation(
            seq_len=4096, key_dim=128, dtype=jnp.bfloat16, lower_bound=-5.0, fused_gate=True
        )
        == "chunked"
    )  # no TPU here


def test_errors_name_the_constraint():
    x = dict(_raw_inputs(5), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="tokamax_mosaic needs a TPU v6 or newer"):
        kda(**x, lower_bound=-5.0, implementation="tokamax_mosaic")
    with pytest.raises(ValueError, match="tokamax_xla_chunked needs the fused safe gate"):
        kda(**x, implementation="tokamax_xla_chunked")
    with pytest.raises(ValueError, match="needs max_num_segments"):
        kda(**x, segment_ids=_segments(), implementation="tokamax_xla")
    with pytest.raises(ValueError, match="max_num_segments=2"):
        kda(**x, segment_ids=_segments(), max_num_segments=2, implementation="tokamax_xla")
    with pytest.raises(ValueError, match="implementation must be 'auto' or one of"):
        kda(**x, implementation="triton")
    with pytest.raises(ValueError, match=r"a_log must have shape \[HV\]"):
        kda(**{**x, "a_log": jnp.zeros(3)})
    with pytest.raises(ValueError, match=r"dt_bias must have shape \[H\*K\]"):
        kda(**{**x, "dt_bias": jnp.zeros((H, K + 1))})
    plain = {n: x[n] for n in ("q", "k", "v", "beta")}
    with pytest.raises(ValueError, match="dt_bias is a parameter of the in-kernel gate"):
        kda(**plain, g=-jnp.abs(x["g"]), dt_bias=x["dt_bias"])
    with pytest.raises(ValueError, match="supports chunk_size=64 only"):
        kda(**x, lower_bound=-5.0, chunk_size=32, implementation="tokamax_xla_chunked")


def test_unserved_autodiff_is_read_from_the_tracers_of_each_transform():
    """api.unserved_autodiff on one array under each transform (the same tracers on the TPU
    image's JAX 0.10.2, checked on CPU 2026-12-07): one reverse pass (grad, vjp,
    value_and_grad, jit of grad) is served by every row; a jvp straight over the call is not,
    under jit and vmap too; jax.hessian's outer jvp and a gradient of a gradient only where
    the backward is served once ("any")."""
    seen = {}

    def probe(name):
        def f(x):
            seen[name] = (api.unserved_autodiff([x], "pure"), api.unserved_autodiff([x], "any"))
            return jnp.sin(x).sum()

        return f

    x = jnp.ones(3)
    jax.grad(probe("grad"))(x)
    jax.vjp(probe("vjp"), x)
    jax.value_and_grad(probe("value_and_grad"))(x)
    jax.jit(jax.grad(probe("jit(grad)")))(x)
    jax.grad(lambda x: jax.grad(probe("grad(grad)"))(x).sum())(x)
    jax.jvp(probe("jvp"), (x,), (x,))
    jax.jit(lambda x: jax.jvp(probe("jit(jvp)"), (x,), (x,)))(x)
    jax.vmap(lambda x: jax.jvp(probe("vmap(jvp)"), (x,), (x,)))(x[None])
    jax.jacfwd(probe("jacfwd"))(x)
    jax.hessian(probe("hessian"))(x)
    reverse = ("grad", "vjp", "value_and_grad", "jit(grad)")
    assert seen == {**dict.fromkeys(reverse, (False, False)),
                    **dict.fromkeys(("jvp", "jit(jvp)", "vmap(jvp)", "jacfwd"), (True, True)),
                    **dict.fromkeys(("hessian", "grad(grad)"), (False, True))}  # fmt: skip


def test_forward_mode_over_tokamax_is_refused_by_name_and_auto_runs_the_recurrence(monkeypatch):
    """tokamax's rows serve no forward mode (a jvp meets its custom_vjp, jax.hessian a vmap
    error) and no gradient of a gradient (JAX's 'Linearization failed'): named, they refuse by
    name; auto on a TPU v6 (emulated here), which picks tokamax's Mosaic kernel first, runs the
    recurrence for all three (before: the bare errors)."""
    x = random_kda_inputs(jax.random.key(12), 1, 64, 1, 128, 128)
    a = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    gate = dict(lower_bound=-5.0, use_gate_in_kernel=True, a_log=jnp.zeros(1),
                dt_bias=jnp.zeros(128))  # fmt: skip

    def loss(implementation):
        run = functools.partial(kda, **gate, implementation=implementation)
        return lambda s: jnp.sum(run(a[0] * s, *a[1:])[0] ** 2)

    for mode in (lambda f: jax.jvp(f, (1.5,), (1.0,)), lambda f: jax.hessian(f)(1.5),
                 lambda f: jax.grad(jax.grad(f))(1.5)):  # before: bare errors from tokamax
        with pytest.raises(TypeError, match="implementation='tokamax_xla'.*'recurrent'"):
            mode(loss("tokamax_xla"))
    monkeypatch.setattr(api, "tpu_generation", lambda: 6)
    with emulate_tpu():
        assert select_implementation(seq_len=64, key_dim=128, lower_bound=-5.0,
                                     fused_gate=True) == "tokamax_mosaic"  # fmt: skip
        # the recurrence's first and second derivatives at 1.5, in one program: what the jvp
        # (tangent 1) and the two second-order modes give
        first, second = jax.jit(lambda s: (jax.grad(loss("recurrent"))(s),
                                           jax.hessian(loss("recurrent"))(s)))(1.5)  # fmt: skip
        for mode, want in ((lambda f: jax.jvp(f, (1.5,), (1.0,))[1], first),
                           (lambda f: jax.hessian(f)(1.5), second),
                           (lambda f: jax.grad(jax.grad(f))(1.5), second)):  # fmt: skip
            assert_close(mode(loss("auto")), want, atol=1e-5, rtol=1e-5)


def test_forward_mode_with_a_tangent_in_v_or_the_state_runs_through_chunked():
    """A tangent only in v and the initial state meets no custom_vjp of the chunked form (they
    see q, k, g and beta): jax.jvp through "chunked" runs and equals the recurrence's."""
    x = random_kda_inputs(jax.random.key(13), 1, 40, 1, 4, 4, with_state=True)

    def run(implementation):
        f = lambda v, s: kda(x["q"], x["k"], v, x["g"], x["beta"], initial_state=s,  # noqa: E731
                             output_final_state=True, implementation=implementation)  # fmt: skip
        return jax.jit(lambda v, s: jax.jvp(f, (v, s), (v, s)))(x["v"], x["initial_state"])

    got, want = run("chunked"), run("recurrent")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert_close(a, b, atol=2e-5, rtol=1e-4)
