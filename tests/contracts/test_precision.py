"""The chunked form's matmul precision policy (``precision=``): "input" (bfloat16 operands,
float32 accumulation) and "highest" against the float64 oracle, and what each policy runs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda, kda_chunked, kda_recurrent
from kda_lib.testing import (
    CHIP_FLOAT32_ATOL,
    assert_close,
    float32_tolerance,
    random_kda_inputs,
    relative_l2,
)

NAMES = ("q", "k", "v", "g", "beta", "initial_state")
QUANTITIES = ("o", "s") + tuple("d" + n for n in NAMES)

# Relative L2 errors against the float64 recurrence on the same bf16-rounded inputs, measured
# on CPU (B=2, H=2, K=V=64, softplus gate, initial state; T256, T200 and T256_segments agreed
# to within 15%). Outputs and input gradients are bf16, so rounding them alone costs ~1.6e-3.
# Largest over the three cases:
# "highest": o 1.66e-3, s 5.5e-8, dq 2.38e-3, dk 1.63e-3, dv 1.70e-3, dg 1.87e-3, dbeta 1.98e-3,
#   dinitial_state 1.73e-3.
# "input": o 3.32e-3, s 2.73e-3, dq 3.28e-3, dk 3.27e-3, dv 3.18e-3, dg 3.76e-3 (T200),
#   dbeta 3.83e-3 (T200), dinitial_state 2.46e-3 (fla's bf16 Triton kernel: ~2e-3 on outputs).
#   The associative scan measured the same to within 0.1e-3.
# Bounds: the largest measured value times 1.4 to 1.8.
# ("input" was measured under the earlier policy, every group but scores_bwd in bf16; the
# scores-only policy of issue 30 is closer to "highest", and these bounds still hold.)
PRECISIONS = ("highest", "input")
BOUNDS = {
    "highest": dict(
        o=2.5e-3,
        s=1e-7,
        dq=3.5e-3,
        dk=2.5e-3,
        dv=2.5e-3,
        dg=3e-3,
        dbeta=3e-3,
        dinitial_state=2.5e-3,
    ),
    "input": dict(
        o=5e-3, s=4e-3, dq=5e-3, dk=5e-3, dv=5e-3, dg=5.5e-3, dbeta=5.5e-3, dinitial_state=4e-3
    ),
}
CASES = {  # name: (T, segments). T256 without segments was measured too; it ran no branch
    # these two do not (no segments: T200; T a multiple of the chunk size: T256_segments)
    "T200": (200, False),  # not a multiple of the chunk size
    "T256_segments": (256, True),
}


@jax.jit  # one program (eagerly: some ten)
def _bf16_and_cotangents(x):
    x = {n: a if n == "initial_state" else a.astype(jnp.bfloat16) for n, a in x.items()}
    ct_o, ct_s = jax.random.split(jax.random.key(100))
    cot = (
        jax.random.normal(ct_o, x["v"].shape, jnp.float32),
        jax.random.normal(ct_s, x["initial_state"].shape, jnp.float32),
    )
    return x, cot


def _case(seq_len, segments):
    x = random_kda_inputs(jax.random.key(0), 2, seq_len, 2, 64, 64, with_state=True)
    x, cot = _bf16_and_cotangents(x)
    ids = None
    if segments:  # several documents per row, and leading padding
        ids = np.ones((2, seq_len), np.int32)
        ids[0, 100:], ids[0, 180:], ids[1, :30], ids[1, 150:] = 2, 3, 0, 2
        ids = jnp.asarray(ids)
    return x, ids, cot


def _float64(tree):
    """``tree``'s arrays as float64 numpy arrays (cast on the host: no compiled casts)."""
    return jax.tree.map(lambda a: np.asarray(a).astype(np.float64), tree)


def _outputs_and_grads(fn, x, ids, cot):
    def loss(inputs):
        o, s = fn(**inputs, segment_ids=ids, output_final_state=True)
        dtype = cot[0].dtype
        total = jnp.sum(o.astype(dtype) * cot[0]) + jnp.sum(s.astype(dtype) * cot[1])
        return total, (o, s)

    (_, (o, s)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(x)
    return {"o": o, "s": s, **{"d" + n: grads[n] for n in NAMES}}


@pytest.mark.parametrize("case", CASES)
def test_both_policies_close_to_float64_oracle(case):
    x, ids, cot = _case(*CASES[case])
    with jax.enable_x64(True):
        want = _outputs_and_grads(kda_recurrent, _float64(x), ids, _float64(cot))
        want = jax.tree.map(np.asarray, want)
    for precision, bounds in BOUNDS.items():
        got = _outputs_and_grads(functools.partial(kda_chunked, precision=precision), x, ids, cot)
        assert got["o"].dtype == jnp.bfloat16 and got["s"].dtype == jnp.float32
        errors = {name: relative_l2(got[name], want[name]) for name in QUANTITIES}
        bad = {n: f"{e:.2e}" for n, e in errors.items() if not e <= bounds[n]}
        assert not bad, (precision, bad)


def test_highest_is_the_float32_computation_bit_for_bit():
    # "highest" on bf16 inputs is what the chunked form always did: the inputs upcast to
    # float32, every matmul at Precision.HIGHEST. A small case (T 72 over chunks of 16: four
    # full chunks and a partial one, three documents and padding) runs the same code paths.
    x = random_kda_inputs(jax.random.key(0), 2, 72, 1, 16, 16, with_state=True)
    x = {n: a if n == "initial_state" else a.astype(jnp.bfloat16) for n, a in x.items()}
    ids = np.ones((2, 72), np.int32)
    ids[0, 20:], ids[0, 50:], ids[1, :10], ids[1, 40:] = 2, 3, 0, 2
    ids = jnp.asarray(ids)

    @functools.partial(jax.jit, static_argnames="precision")
    def run(x, precision):
        return kda_chunked(
            **x, segment_ids=ids, output_final_state=True, precision=precision, chunk_size=16
        )

    o, s = run(x, "highest")
    o32, s32 = run(jax.tree.map(lambda a: np.asarray(a, np.float32), x), None)
    np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(o32.astype(o.dtype)))
    np.testing.assert_array_equal(np.asarray(s), np.asarray(s32))
    # and the default for bf16 inputs is the "input" policy (the same program), not "highest"
    o_input, _ = run(x, "input")
    assert not np.array_equal(np.asarray(o_input, np.float32), np.asarray(o, np.float32))
    assert _same_program(run, (x, None), (x, "input"))


def _same_program(jitted, args, other_args, other_jitted=None):
    """Whether ``jitted(*args)`` and ``other_jitted(*other_args)`` (default: ``jitted`` again)
    lower to the same program text."""
    other_jitted = other_jitted or jitted
    return jitted.lower(*args).as_text() == other_jitted.lower(*other_args).as_text()


@pytest.mark.parametrize("scan", ["streaming", "associative"])
def test_float32_inputs_identical_under_every_policy(scan):
    x = random_kda_inputs(jax.random.key(1), 1, 100, 2, 16, 16, with_state=True)

    @functools.partial(jax.jit, static_argnames="precision")
    def run(x, precision):
        def loss(inputs):
            o, s = kda_chunked(**inputs, output_final_state=True, scan=scan, precision=precision)
            return jnp.sum(jnp.sin(o)) + jnp.sum(s**2), (o, s)

        return jax.value_and_grad(loss, has_aux=True)(x)

    highest = run.lower(x, "highest").as_text()
    for precision in (None, "input"):
        # the claim: with no low-precision input the policy changes nothing in the program
        # (the same program text: the same results, so nothing needs to be compiled and run)
        assert run.lower(x, precision).as_text() == highest, precision


def _dots(jaxpr):
    """Every dot_general equation of ``jaxpr`` and of the jaxprs nested in it."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    yield from _dots(sub)


def _flops(eqn):
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[i] for i in contract])


def _low_precision_dots(fn, *args):
    dots = list(_dots(jax.make_jaxpr(fn)(*args).jaxpr))
    assert dots
    low = [
        eqn
        for eqn in dots
        if all(var.aval.dtype == jnp.bfloat16 for var in eqn.invars)
        and eqn.params["preferred_element_type"] == jnp.float32
        and eqn.outvars[0].aval.dtype == jnp.float32
    ]
    return low, dots


@pytest.mark.parametrize("scan", ["streaming", "associative"])
def test_input_policy_runs_bf16_dots_with_float32_accumulation(scan):
    x, ids, _ = _case(128, True)
    args = tuple(x[n] for n in NAMES)

    def forward(q, k, v, g, beta, state, precision):
        return kda_chunked(
            q, k, v, g, beta, initial_state=state, segment_ids=ids, scan=scan, precision=precision
        )[0]

    def backward(*args, precision):
        return jax.grad(
            lambda *a: jnp.sum(forward(*a, precision).astype(jnp.float32)), argnums=range(6)
        )(*args)

    for fn in (forward, backward):
        low, dots = _low_precision_dots(lambda *a, fn=fn: fn(*a, precision="input"), *args)
        # only the decayed scores' cross blocks (operands: inputs times decays <= 1) are bf16;
        # W/U, the maps, the state carry, the outputs and the triangular inverse stay float32
        share = sum(map(_flops, low)) / sum(map(_flops, dots))
        assert 0.02 < share < 0.3, (fn.__name__, share)  # measured: 0.148 fwd, 0.043 bwd
        if fn is forward:  # each a [..., w, w] cross block, w <= C / 2
            shapes = [eqn.outvars[0].aval.shape[-2:] for eqn in low]
            assert all(a == b <= 32 for a, b in shapes), shapes
        low, _ = _low_precision_dots(lambda *a, fn=fn: fn(*a, precision="highest"), *args)
        assert not low, fn.__name__
    # kda() hands the policy on (default None: "input" for bf16)
    low, _ = _low_precision_dots(
        lambda *a: kda(*a[:5], initial_state=a[5], implementation="chunked")[0], *args
    )
    assert low


@pytest.mark.parametrize("bad", ["low", "HIGHEST", "float32", 1, jax.lax.Precision.HIGHEST])
def test_bad_precision_is_a_value_error(bad):
    x = random_kda_inputs(jax.random.key(2), 1, 32, 1, 8, 8)
    with pytest.raises(ValueError, match=r"precision must be 'highest', 'input' or None"):
        kda_chunked(**x, precision=bad)
    for implementation in ("auto", "chunked", "recurrent", "tokamax_xla"):
        with pytest.raises(ValueError, match=r"precision must be 'highest', 'input' or None"):
            kda(**x, precision=bad, implementation=implementation)


def test_kda_rejects_a_precision_an_implementation_cannot_honour():
    x = random_kda_inputs(jax.random.key(3), 1, 32, 1, 8, 8, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="'recurrent' computes in float32"):
        kda(**x, implementation="recurrent", precision="input")
    for precision in ("highest", "input"):
        with pytest.raises(ValueError, match="chooses its own matmul precision"):
            kda(**x, implementation="tokamax_xla", precision=precision)

    # "highest" is what the recurrence does anyway; None leaves every implementation as it is.
    # "auto" with a precision stays on kda_lib's forms: chunked for T > 16
    @jax.jit  # one program for the six calls
    def forwards(x):
        pairs = {
            p: (kda(**x, precision=p)[0], kda_chunked(**x, precision=p)[0]) for p in PRECISIONS
        }
        recurrent = functools.partial(kda, **x, implementation="recurrent")
        return {"recurrent": (recurrent(precision="highest")[0], recurrent()[0]), **pairs}

    for precision, (got, want) in forwards(x).items():
        np.testing.assert_array_equal(
            np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=precision
        )


# fla's context-parallel KDA test (flash-linear-attention tests/context_parallel/test_cp_kda.py),
# scaled down: T 10240 -> 512 in three documents (3000/4000/3240 -> 150/200/162), H 12 -> 2
# (H = 4 measured the same errors to within 10%), K = V = 128, bf16, q = N(1, 1),
# k = N(-50, 10^2) before L2 normalisation, fused safe gate (lower bound -5, a_log from
# log linspace(1, 8), dt_bias from fla's dt initialisation). After normalisation the keys are
# nearly parallel and the decay weak: each chunk's triangular system is badly conditioned.
# fla's bar: relative RMS error (its assert_close ratio) 8e-3 on o, dq, dk, dv, dg (db warns).
FLA_RATIO = 8e-3
FLA_LOWER_BOUND = -5.0
FLA_LENGTHS = (150, 200, 162)
# Measured (H = 4, relative RMS against the float64 oracle; issue 30): every implementation and
# CP now 1.6e-3 to 1.9e-3 on every quantity; the earlier default (every group but scores_bwd in
# bf16) 4.7e-3 to 1.13e-2; tokamax_xla_chunked computing in bf16 up to 1.13e-2. Bound: half of
# fla's ratio.
FLA_BOUND = FLA_RATIO / 2
FLA_NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


@functools.partial(jax.jit, static_argnames=("heads", "dim"))  # one program, not thirty
def _fla_cp_draws(heads, dim):
    from kda_lib.ops.gating import init_dt_bias

    ks = jax.random.split(jax.random.key(42), 6)
    shape = (1, sum(FLA_LENGTHS), heads, dim)
    normal = functools.partial(jax.random.normal, shape=shape)
    args = (
        (normal(ks[0]) + 1).astype(jnp.bfloat16),  # q
        (10 * normal(ks[1]) - 50).astype(jnp.bfloat16),  # k
        normal(ks[2]).astype(jnp.bfloat16),  # v
        normal(ks[3]).astype(jnp.bfloat16),  # raw gate input
        jax.nn.sigmoid(jax.random.normal(ks[4], shape[:3])).astype(jnp.bfloat16),  # beta
    )
    gate = dict(
        a_log=jnp.log(jnp.linspace(1.0, 8.0, heads)),
        dt_bias=init_dt_bias(jax.random.key(7), heads, dim),
    )
    return args, gate, normal(ks[5]).astype(jnp.bfloat16)


def _fla_cp_case(heads=2, dim=128):
    args, gate, cot = _fla_cp_draws(heads, dim)
    ids = jnp.asarray(np.repeat(np.arange(1, 4), FLA_LENGTHS)[None].astype(np.int32))
    return args, dict(gate, lower_bound=FLA_LOWER_BOUND), ids, cot


def _fla_oracle(args, gate, ids, cot):
    with jax.enable_x64(True):
        a_log, dt_bias = (np.asarray(gate[n], np.float64) for n in ("a_log", "dt_bias"))
        heads, dim = args[0].shape[2:]

        def fn(q, k, v, f, beta):
            def unit(x):
                return x / jnp.sqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6)

            rate = np.exp(a_log)[:, None]
            g = FLA_LOWER_BOUND * jax.nn.sigmoid(rate * (f + dt_bias.reshape(heads, dim)))
            return kda_recurrent(unit(q), unit(k), v, g, beta, segment_ids=ids)[0]

        @jax.jit  # one program (eagerly: some eighty small ones)
        def run(*wide):
            o, pullback = jax.vjp(fn, *wide[:5])
            return (o, *pullback(wide[5]))

        wide = [jnp.asarray(np.asarray(x, np.float32), jnp.float64) for x in (*args, cot)]
        return [np.asarray(x) for x in run(*wide)]


def _fla_errors(fn, args, cot, want):
    @jax.jit
    def run(*a):
        o, pullback = jax.vjp(fn, *a)
        return (o, *pullback(cot.astype(o.dtype)))

    got = run(*args)
    assert got[0].dtype == jnp.bfloat16
    return {n: relative_l2(g, w) for n, g, w in zip(FLA_NAMES, got, want, strict=True)}


def _fla_paths(gate, ids):
    """Every path that runs on CPU, as ``fn(q, k, v, raw_gate, beta) -> o``."""
    from jax.sharding import PartitionSpec as P

    from kda_lib.ops.gating import kda_gate
    from kda_lib.ops.norms import l2_normalize
    from kda_lib.parallel.context_parallel import kda_context_parallel, shard_as

    common = dict(gate, use_qk_l2norm=True, use_gate_in_kernel=True)

    def through_kda(implementation, **extra):
        def fn(q, k, v, f, beta):
            return kda(
                q, k, v, f, beta, **common, segment_ids=ids, implementation=implementation, **extra
            )[0]

        return fn

    def raw_kernel(scan):  # kda_chunked itself: normalised q/k and the activated gate
        def fn(q, k, v, f, beta):
            g = kda_gate(f, gate["a_log"], gate["dt_bias"], lower_bound=FLA_LOWER_BOUND)
            q, k = (l2_normalize(x, keep_float32=True) for x in (q, k))
            return kda_chunked(q, k, v, g, beta, segment_ids=ids, scan=scan)[0].astype(v.dtype)

        return fn

    ranks = 8
    mesh = jax.make_mesh((ranks,), ("context",), devices=jax.devices()[:ranks])
    seq = P(None, "context")

    def local(q, k, v, f, beta, ids):
        return kda_context_parallel(
            q, k, v, f, beta, segment_ids=ids, implementation="chunked", **common
        )[0]

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(seq,) * 6, out_specs=seq)
    return {
        "chunked": through_kda("chunked"),
        "chunked_associative": raw_kernel("associative"),
        "recurrent": through_kda("recurrent"),
        "tokamax_xla": through_kda("tokamax_xla", max_num_segments=3),
        "tokamax_xla_chunked": through_kda("tokamax_xla_chunked", max_num_segments=3),
        "cp_8_ranks": lambda *a: sharded(*(shard_as(x, mesh, seq) for x in (*a, ids))),
    }


@functools.cache
def _fla_case_and_oracle():
    """fla's CP case and its float64 oracle, computed once per worker for the two tests below
    (one xdist group); numpy results, so no test can change them."""
    args, gate, ids, cot = _fla_cp_case()
    return args, gate, ids, cot, _fla_oracle(args, gate, ids, cot)


FLA_CASE = pytest.mark.xdist_group("fla_cp_case")


@FLA_CASE
def test_fla_cp_inputs_pass_fla_tolerance_on_every_path():
    args, gate, ids, cot, want = _fla_case_and_oracle()
    bad = {}
    for path, fn in _fla_paths(gate, ids).items():
        errors = _fla_errors(fn, args, cot, want)
        bad.update({(path, n): f"{e:.2e}" for n, e in errors.items() if not e <= FLA_BOUND})
    assert not bad, bad


@FLA_CASE
def test_fla_cp_inputs_fail_with_every_matmul_in_bf16(monkeypatch):
    # the case is hard: with every two-operand matmul of the chunked form in bf16 it misses
    # fla's tolerance, so the test above can fail. The output alone shows it (measured: o 3.1e-2,
    # the gradients 3.1e-2 to 5.3e-2), so only the forward is compiled
    import kda_lib.ops.chunked as chunked
    from kda_lib.ops.api import clear_compiled_forms

    mm = chunked._mm

    def bf16_mm(subscripts, *operands, low=None):
        return mm(subscripts, *operands, low=jnp.bfloat16 if len(operands) == 2 else None)

    monkeypatch.setattr(chunked, "_mm", bf16_mm)
    clear_compiled_forms()  # the forms are traced once per options and shapes: trace anew
    try:
        args, gate, ids, cot, want = _fla_case_and_oracle()
        o = jax.jit(_fla_paths(gate, ids)["chunked"])(*args)
    finally:
        monkeypatch.undo()
        clear_compiled_forms()
    assert relative_l2(o, want[0]) > FLA_RATIO, relative_l2(o, want[0])


@pytest.mark.parametrize("scan", ["streaming", "associative"])
def test_float16_large_values_stay_finite_and_match_the_recurrence(scan):
    # issue 30: float16 inputs all in range (|v| <= 15000 * 4 < 65504), but the state, W/U and
    # the corrected values exceed float16's range; the earlier default rounded them to float16
    # (inf/NaN on half the tokens). No computed quantity may be rounded to the input dtype.
    x = _float16_large_values()
    assert all(np.isfinite(np.asarray(a)).all() for a in x.values())
    # each side one compiled program (eagerly: some hundred small ones)
    o, s = jax.jit(functools.partial(kda_chunked, output_final_state=True, scan=scan))(**x)
    want_o, want_s = _float32_recurrence(jax.tree.map(lambda a: np.asarray(a, np.float32), x))
    assert o.dtype == jnp.float16
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(s)).all()
    # measured: o 2.1e-4 (the float16 rounding of o), s 3.8e-7; earlier policy: all 256 tokens
    # non-finite at 15000 (fine at 8000: o 1.1e-3, s 6e-4)
    assert relative_l2(o, want_o) < 1e-3 and relative_l2(s, want_s) < 1e-5


@jax.jit  # one program (eagerly: some twenty small ones)
def _float16_large_values():
    key_q, key_k, key_v = jax.random.split(jax.random.key(30), 3)
    shape = (1, 256, 2, 32)
    unit = functools.partial(jax.random.normal, shape=shape)
    q = 1e-3 * unit(key_q) / jnp.linalg.norm(unit(key_q), axis=-1, keepdims=True)
    k = unit(key_k) / jnp.linalg.norm(unit(key_k), axis=-1, keepdims=True)
    v = 15000 * jnp.clip(jax.random.normal(key_v, shape), -4, 4)
    x = dict(q=q, k=k, v=v, g=jnp.zeros(shape), beta=jnp.ones(shape[:3]))
    return {n: a.astype(jnp.float16) for n, a in x.items()}


_float32_recurrence = jax.jit(lambda x: kda_recurrent(**x, output_final_state=True))


def _l2_normalize_f64(x, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


SCALES = (1e-30, 1e-3, 1.0, 1e18, 1e19, 1e20, 1e30)


def test_l2_normalize_is_scale_safe():
    # issue 30: the sum of squares overflowed float32 from 1e19 on (norms 0). Every scale in one
    # batch (l2_normalize and its gradient act on each vector alone), checked scale by scale.
    from kda_lib.ops.norms import l2_normalize

    unit = jax.random.normal(jax.random.key(4), (3, 5, 128))
    x = jnp.stack([scale * unit for scale in SCALES])
    want = _l2_normalize_f64(x)  # for tiny vectors not unit: eps dominates, as in the formula
    # gradients against the float64 formula's (d rsqrt(s) = s^-1.5 underflowed near s = 1e38);
    # each side one compiled program (eagerly: some sixty small ones)
    cot = jax.random.normal(jax.random.key(5), unit.shape)

    @jax.jit
    def got_and_grad(x, cot):
        return l2_normalize(x), jax.grad(lambda x: jnp.sum(l2_normalize(x) * cot))(x)

    got, grad = (np.asarray(a) for a in got_and_grad(x, cot))
    with jax.enable_x64(True):
        x64, cot64 = (jnp.asarray(np.asarray(a), jnp.float64) for a in (x, cot))
        want_grad = jax.jit(jax.grad(lambda x, c: jnp.sum(_l2_formula(x) * c)))(x64, cot64)
    for i, scale in enumerate(SCALES):
        assert relative_l2(got[i], want[i]) < 1e-6, scale
        if scale >= 1:
            norms = np.linalg.norm(np.asarray(got[i], np.float64), axis=-1)
            np.testing.assert_allclose(norms, 1, 1e-6, err_msg=str(scale))
        assert np.isfinite(grad[i]).all(), scale
        assert relative_l2(grad[i], want_grad[i]) < 1e-5, scale


def _l2_formula(x, eps=1e-6):
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def test_l2_normalize_unchanged_bit_for_bit_below_one_and_for_powers_of_two_above():
    from kda_lib.ops.norms import l2_normalize

    def unscaled(x, eps=1e-6):  # the formula as written before issue 30
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)

    x = jax.random.uniform(jax.random.key(6), (64, 128), minval=-1, maxval=1)

    @jax.jit  # one program (eagerly: some twenty small ones)
    def both(x):
        bf16 = (3 * x).astype(jnp.bfloat16)
        dtypes = (l2_normalize(bf16), l2_normalize(bf16, keep_float32=True))
        return [(l2_normalize(a), unscaled(a)) for a in (x, 4 * x)], dtypes

    pairs, (low, kept) = both(x)
    for got, want in pairs:
        np.testing.assert_array_equal(got, want)
    assert low.dtype == jnp.bfloat16 and kept.dtype == jnp.float32


def test_float32_tolerance_raises_only_atol_and_only_on_a_tpu(monkeypatch):
    """The chip's floor (shared by make test-tpu and the notebooks) leaves a CPU's tolerance and
    every rtol as given."""
    assert float32_tolerance(1e-5, 2e-5) == dict(atol=1e-5, rtol=2e-5)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert float32_tolerance(1e-5, 2e-5) == dict(atol=CHIP_FLOAT32_ATOL, rtol=2e-5)
    assert float32_tolerance(1e-3, 2e-5) == dict(atol=1e-3, rtol=2e-5)
    bad_rows = (((-1e-5, 1e-5), "atol"), ((1e-5, "x"), "rtol"), ((float("nan"), 0.0), "atol"))
    for bad, name in bad_rows:
        with pytest.raises(ValueError, match=name):
            float32_tolerance(*bad)


def test_assert_close_defaults_follow_the_dtype_given():
    """A float64 array keeps float64's default tolerance outside jax's x64 mode (jax's canonical
    dtype, float32 there, made the notebooks' float64 checks pass a 1e-7 relative difference)."""
    assert not jax.config.jax_enable_x64
    with pytest.raises(AssertionError):
        assert_close(np.float64(1.0), np.float64(1 + 1e-7), atol=1e-12)
    with pytest.raises(AssertionError):
        assert_close(np.ones(3), np.full(3, 1 + 1e-7))
    assert_close(np.float32(1.0), np.float32(1 + 1e-6))  # float32's own tolerance
    assert_close(jnp.ones(3, jnp.bfloat16), jnp.full(3, 1.01))  # bfloat16's
