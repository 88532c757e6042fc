"""Grouped value heads (HV = 2 H, fla's num_v_heads) and the safe gate without a rate
(``a_log=None`` with ``lower_bound``, fla's ``A_log=None``): every implementation and context
parallelism against the float64 oracle, outputs and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from kda_lib import kda, kda_chunked, kda_gate, kda_recurrent
from kda_lib.parallel.context_parallel import kda_context_parallel, shard_as
from kda_lib.testing import random_normal, relative_l2

# T: not a multiple of 64 (tokamax pads) nor of 16; a multiple of the CP tests' 4 ranks
B, T, H, HV, K, V = 2, 72, 2, 4, 16, 8
LOWER_BOUND = -5.0
DIFF = ("q", "k", "v", "g", "beta", "initial_state", "dt_bias", "a_log")


def _inputs(seed=0, *, a_log=True, key_dim=K, value_dim=V, seq_len=T, heads=H, value_heads=HV):
    ks = jax.random.split(jax.random.key(seed), 8)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    qk = (B, seq_len, heads, key_dim)
    x = dict(
        q=unit(random_normal(ks[0], qk)),
        k=unit(random_normal(ks[1], qk)),
        v=random_normal(ks[2], (B, seq_len, value_heads, value_dim)),
        g=random_normal(ks[3], (B, seq_len, value_heads, key_dim)),  # raw gate input
        beta=jax.nn.sigmoid(random_normal(ks[4], (B, seq_len, value_heads))),
        initial_state=0.3 * random_normal(ks[5], (B, value_heads, key_dim, value_dim)),
        dt_bias=0.5 * random_normal(ks[6], (value_heads * key_dim,)),
    )
    if a_log:
        x["a_log"] = jnp.log(jnp.linspace(1.0, 4.0, value_heads))
    return x


def _segments(seq_len=T):
    ids = np.ones((B, seq_len), np.int32)
    ids[0, 20:30], ids[0, 30:] = 0, 2  # padding between documents
    ids[1, 50:] = 3
    return jnp.asarray(ids)


def _oracle(x, segment_ids, lower_bound=LOWER_BOUND):
    """The float64 recurrence on the activated gate (its own head mapping)."""
    g = kda_gate(x["g"], x.get("a_log"), x["dt_bias"], lower_bound=lower_bound)
    return kda_recurrent(
        x["q"],
        x["k"],
        x["v"],
        g,
        x["beta"],
        initial_state=x["initial_state"],
        segment_ids=segment_ids,
        output_final_state=True,
    )


def _value_and_grads(fn, x, segment_ids):
    """``fn``'s (output, final state) and the gradients of a fixed random projection of both,
    in one jitted program."""
    dtype = x["v"].dtype  # the same draws (float32) cast to the inputs' dtype
    cot_o = random_normal(jax.random.key(7), x["v"].shape, jnp.float32).astype(dtype)
    cot_s = random_normal(jax.random.key(8), x["initial_state"].shape, jnp.float32)
    cot_s = cot_s.astype(dtype)

    def loss(x):
        o, s = fn(x, segment_ids)
        return jnp.sum(o * cot_o) + jnp.sum(s * cot_s), (o, s)

    (_, outs), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(x)
    return outs, grads


def _expected(x, segment_ids, lower_bound=LOWER_BOUND):
    with jax.enable_x64(True):
        x64 = {n: a.astype(jnp.float64) for n, a in x.items()}
        outs, grads = _value_and_grads(
            functools.partial(_oracle, lower_bound=lower_bound), x64, segment_ids
        )
        return jax.tree.map(np.asarray, (outs, grads))


def _kda_fn(implementation, lower_bound=LOWER_BOUND, **kw):
    def fn(x, segment_ids):
        return kda(
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            a_log=x.get("a_log"),
            dt_bias=x["dt_bias"],
            lower_bound=lower_bound,
            use_gate_in_kernel=True,
            initial_state=x["initial_state"],
            output_final_state=True,
            segment_ids=segment_ids,
            implementation=implementation,
            **kw,
        )

    return fn


def _assert_matches(got, want, tol, label):
    (o, s), grads = got
    (o_ref, s_ref), grads_ref = want
    assert o.shape == (B, o.shape[1], HV, V) and s.shape == (B, HV, K, V), label
    assert relative_l2(o, o_ref) < tol, (label, "output", relative_l2(o, o_ref))
    assert relative_l2(s, s_ref) < tol, (label, "final state", relative_l2(s, s_ref))
    for name in grads_ref:
        err = relative_l2(grads[name], grads_ref[name])
        assert err < tol, (label, f"d{name}", err)


@pytest.mark.xdist_group("grouped_oracles")  # the grouped oracle of the case below, reused
def test_oracle_maps_value_head_j_to_qk_head_j_and_sums_gradients_over_groups():
    """The grouped oracle equals the ungrouped one run on q/k heads picked by hand (numpy
    indexing, nothing from kda_lib): value head j reads q/k head j // (HV // H); and dq of a q
    head is the sum of what its value heads send it (the ungrouped oracle's dq on the spread
    heads, summed over each group). The grouped oracle's program: the tests' float64 case with
    a_log and segments; one more compiled program, the ungrouped oracle's."""
    x, ids, (grouped, grads) = _oracle_case(True, True)
    picked = np.array([j // (HV // H) for j in range(HV)])
    spread = dict(x, q=jnp.asarray(np.asarray(x["q"])[:, :, picked]))
    spread["k"] = jnp.asarray(np.asarray(x["k"])[:, :, picked])
    assert spread["q"].shape == x["v"].shape[:3] + (K,)
    plain, spread_grads = _expected(spread, ids)
    for a, b in zip(grouped, plain, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
    for name in ("q", "k"):
        summed = np.asarray(spread_grads[name]).reshape(B, T, H, HV // H, K).sum(3)
        np.testing.assert_allclose(np.asarray(grads[name]), summed, rtol=1e-10, atol=1e-12)


# a covering design: each implementation once, with or without a_log, and each option value on
# several; the softplus gate (lower_bound=None) on "auto" (the gate is computed before the form:
# any form would do). On CPU "auto" runs the recurrence forward and the chunked form's
# derivatives (chunks of 16: several, the last partial); the chunked form forward and backward
# with grouped heads: the associative and the CP tests below (a_log=None, the safe gate) and
# tests/ops/test_interior_states.py (implementation="chunked", float64 oracle, gradients).
# tokamax_xla_chunked with a_log=None (grouped heads, gradients, float64 oracle):
# tests/layers/test_kda_layer.py's no_a_log_grouped case.
CASES = [  # implementation, options, with a_log, lower bound
    ("recurrent", {}, False, LOWER_BOUND),
    ("auto", dict(chunk_size=16), True, None),  # sequential scan (CPU default), softplus
    ("tokamax_xla", {}, True, LOWER_BOUND),
    ("tokamax_xla", {}, False, LOWER_BOUND),
    ("tokamax_xla_chunked", {}, True, LOWER_BOUND),
]


@functools.cache
def _oracle_case(with_a_log: bool, with_segments: bool, lower_bound=LOWER_BOUND):
    """Inputs (seed 3), segment ids or None, and their float64 expectation: computed once per
    worker for the tests below (one xdist group), four cases for ten tests."""
    x = _inputs(3, a_log=with_a_log)
    ids = _segments() if with_segments else None
    return x, ids, _expected(x, ids, lower_bound)


def _case_id(case):
    implementation, _, with_a_log, lower_bound = case
    gate = "-softplus" if lower_bound is None else ""
    return f"{implementation}-{'a_log' if with_a_log else 'a_log=None'}{gate}"


@pytest.mark.xdist_group("grouped_oracles")
@pytest.mark.parametrize(
    "implementation,kw,with_a_log,lower_bound", CASES, ids=map(_case_id, CASES)
)
def test_every_implementation_matches_the_oracle(implementation, kw, with_a_log, lower_bound):
    with_segments = implementation != "tokamax_xla_chunked"
    x, ids, want = _oracle_case(with_a_log, with_segments, lower_bound)
    if implementation.startswith("tokamax") and ids is not None:
        kw = dict(kw, max_num_segments=2)
    got = _value_and_grads(_kda_fn(implementation, lower_bound, **kw), x, ids)
    _assert_matches(got, want, 2e-5, _case_id((implementation, kw, with_a_log, lower_bound)))


@pytest.mark.xdist_group("grouped_oracles")
def test_associative_scan_chunked_matches_the_oracle():
    x, ids, want = _oracle_case(False, True)  # the a_log=None case above, its oracle reused

    def fn(x, segment_ids):
        g = kda_gate(x["g"], None, x["dt_bias"], lower_bound=LOWER_BOUND)
        return kda_chunked(
            x["q"],
            x["k"],
            x["v"],
            g,
            x["beta"],
            initial_state=x["initial_state"],
            output_final_state=True,
            segment_ids=segment_ids,
            chunk_size=16,
            scan="associative",
        )

    _assert_matches(_value_and_grads(fn, x, ids), want, 2e-5, "associative")


def test_rate_free_safe_gate_formula():
    """a_log=None: g = lower_bound * sigmoid(f + dt_bias), exactly a_log = 0."""
    x = _inputs(6, a_log=False)
    f, bias = x["g"], x["dt_bias"]
    got = kda_gate(f, None, bias, lower_bound=-3.0)
    formula = -3.0 * jax.nn.sigmoid(f + bias.reshape(HV, K))
    np.testing.assert_allclose(np.asarray(got), np.asarray(formula), rtol=1e-6, atol=1e-7)
    zero_rate = kda_gate(f, jnp.zeros(HV), bias, lower_bound=-3.0)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(zero_rate))


def test_refusals_name_the_argument():
    x = _inputs(7, a_log=False)
    args = (x["q"], x["k"], x["v"], -jnp.abs(x["g"]), x["beta"])
    with pytest.raises(ValueError, match="a_log=None needs lower_bound"):
        kda_gate(x["g"], None, x["dt_bias"])
    with pytest.raises(ValueError, match="dt_bias is a parameter of the in-kernel gate"):
        kda(*args, dt_bias=x["dt_bias"])  # no use_gate_in_kernel
    with pytest.raises(ValueError, match=r"v must have shape \[B, T, HV, V\].*multiple of q's H"):
        kda(*args[:2], x["v"][:, :, :3], *args[3:])
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV, K\]"):
        kda(*args[:3], args[3][:, :, :2], args[4])
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\]"):
        kda(*args[:4], x["beta"][:, :, :2])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[B, HV, K, V\]"):
        kda(*args, initial_state=jnp.zeros((B, H, K, V)))
    with pytest.raises(ValueError, match=r"a_log must have shape \[HV\]=\(4,\)"):
        kda(*args, a_log=jnp.zeros(H), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"dt_bias must have shape \[H\*K\]=\(64,\)"):
        kda(*args, lower_bound=-5.0, dt_bias=jnp.zeros(H * K), use_gate_in_kernel=True)


# ------------------------------------------------------------------ context parallelism
# tokamax Mosaic with both options: tests/ops/test_emulation.py (the adapter test: grouped
# heads and a_log=None; the CP test: grouped heads)

SEQ = P(None, "context")


def _cp_fn(mesh, implementation, **kw):
    """kda_context_parallel over ``mesh`` as ``fn(x, segment_ids)``."""

    def fn(x, segment_ids):
        gate = {n: x[n] for n in ("dt_bias", "a_log") if n in x}

        def local(q, k, v, g, beta, ids, state, gate):
            return kda_context_parallel(
                q,
                k,
                v,
                g,
                beta,
                segment_ids=ids,
                initial_state=state,
                output_final_state=True,
                lower_bound=LOWER_BOUND,
                use_gate_in_kernel=True,
                implementation=implementation,
                **gate,
                **kw,
            )

        specs = (SEQ,) * 6 + (P(), P())
        cp = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(SEQ, P()))
        seq = tuple(shard_as(x[n], mesh, SEQ) for n in ("q", "k", "v", "g", "beta"))
        return cp(*seq, shard_as(segment_ids, mesh, SEQ), x["initial_state"], gate)

    return fn


# each implementation with one option value (chunked CP with a_log: its outputs by
# tests/parallel/test_context_parallel.py's fused-gate test, its gradients by the 4-50-chunked
# layer case there)
@pytest.mark.xdist_group("grouped_oracles")  # the cases above, their oracles reused
@pytest.mark.parametrize(
    "implementation,with_a_log",
    [("chunked", False), ("recurrent", True)],
    ids=["chunked-a_log=None", "recurrent-a_log"],
)
def test_context_parallel_matches_the_oracle(implementation, with_a_log):
    ranks = 4
    mesh = jax.make_mesh((ranks,), ("context",), devices=jax.devices()[:ranks])
    x, ids, want = _oracle_case(with_a_log, True)
    kw = dict(chunk_size=8) if implementation == "chunked" else {}
    got = _value_and_grads(_cp_fn(mesh, implementation, **kw), x, ids)
    _assert_matches(got, want, 2e-5, f"cp {implementation}")


@pytest.mark.slow
def test_mosaic_context_parallel_with_grouped_heads_and_the_rate_free_gate():
    """tokamax's own CP for its Mosaic kernel (Pallas interpret mode), the in-kernel gate without
    a rate (a_log=None, switched on by use_gate_in_kernel) and grouped value heads, equals the
    recurrence on one device (the gate switch once read a_log; docs/DESIGN.md section 4)."""
    from kda_lib import emulate_tpu

    x = _inputs(9, a_log=False, key_dim=128, value_dim=128, seq_len=64, heads=1, value_heads=2)
    kw = dict(dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND, use_gate_in_kernel=True)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    want = jax.jit(lambda *a: kda(*a, **kw, implementation="recurrent")[0])(*args)
    mesh = jax.make_mesh((2,), ("context",), devices=jax.devices()[:2])

    def local(*a):
        return kda_context_parallel(*a, **kw, implementation="tokamax_mosaic", mesh=mesh)[0]

    cp = jax.shard_map(local, mesh=mesh, in_specs=(SEQ,) * 5, out_specs=SEQ, check_vma=False)
    with emulate_tpu():
        got = jax.jit(lambda *a: cp(*(shard_as(z, mesh, SEQ) for z in a)))(*args)
    assert relative_l2(got, want) < 1e-5
