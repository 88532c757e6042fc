"""The Pallas TPU kernels (kda_lib/ops/pallas_tpu.py) against the float64 recurrence: outputs,
final states and gradients, in Pallas's interpret mode on a CPU and compiled on a TPU (the
tests marked ``tpu``: ``make test-tpu``). The kernels' float32 matmuls are bfloat16 pieces in
both places, so one tolerance serves both: float32 inputs as every float32 form (1e-5 of the
largest value), bfloat16 inputs the bfloat16 table's 2e-2."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from kda_lib import kda
from kda_lib.ops import api, pallas_tpu
from kda_lib.ops.api import select_implementation
from kda_lib.testing import random_kda_inputs

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _relative(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all()
    return float(np.abs(got - want).max() / np.abs(want).max())


@functools.partial(jax.jit, static_argnames=("implementation", "chunk_size"))
def _run(inputs, cotangent, implementation, chunk_size=64):
    """``(o, final_state, gradients of <o, cotangent> + |final|^2)`` by ``implementation``
    (``"kernels"``: :func:`pallas_tpu.kda_pallas` without its non-finite fallback)."""

    def loss(x):
        if implementation == "kernels":  # alone: no non-finite fallback to hide a NaN
            o, s = pallas_tpu.kda_pallas(**x, scale=x["q"].shape[-1] ** -0.5,
                                         chunk_size=chunk_size,
                                         non_finite_fallback=False)  # fmt: skip
        else:
            o, s = kda(**x, output_final_state=True, chunk_size=chunk_size,
                       implementation=implementation)  # fmt: skip
        return jnp.sum(o.astype(cotangent.dtype) * cotangent) + jnp.sum(s * s), (o, s)

    (_, (o, s)), grads = jax.value_and_grad(loss, has_aux=True)(inputs)
    return o, s, grads


def _inputs(dtype, seq_len, qk_heads, heads, key_dim, value_dim, key=None, batch=2):
    """Inputs (``batch`` rows; q, k with ``qk_heads`` heads, v, g, beta with ``heads``, a state)
    and a cotangent."""
    key = jax.random.key(seq_len) if key is None else key
    x = random_kda_inputs(key, batch, seq_len, heads, key_dim, value_dim, with_state=True)
    x["q"], x["k"] = x["q"][:, :, :qk_heads], x["k"][:, :, :qk_heads]
    x = {n: a.astype(dtype) if n in ("q", "k", "v") else a for n, a in x.items()}
    return x, jax.random.normal(jax.random.key(1), x["v"].shape)


# computed once per worker for each shape (the chunk sizes share theirs; the tests that use it,
# one xdist group, read it only)
@functools.cache
def _case(dtype, seq_len, qk_heads, heads, key_dim, value_dim, batch=2):
    """:func:`_inputs` and the oracle's result in float64."""
    x, cotangent = _inputs(dtype, seq_len, qk_heads, heads, key_dim, value_dim, batch=batch)
    with jax.enable_x64(True):
        x64 = {n: jnp.asarray(np.asarray(a, np.float64)) for n, a in x.items()}
        want = _run(x64, jnp.asarray(np.asarray(cotangent, np.float64)), "recurrent")
        want = jax.tree.map(np.asarray, want)
    return x, cotangent, want


# float32: four value heads on one q/k head (a program's heads share it), T past one block and
# not a chunk multiple, K = V = 128; bfloat16: two q/k heads, two value heads each (a forward
# program reads both q/k heads), T within one block, K = 64 and V = 192 (padded to lane multiples)
CASES = {"float32": (jnp.float32, 300, 1, 4, 128, 128, 1e-5),
         "bfloat16": (jnp.bfloat16, 200, 2, 4, 64, 192, 2e-2)}  # fmt: skip
ON_TPU = jax.default_backend() == "tpu"
# the chunk size of each case: 64 (the default) on the chip; on a CPU the two ends of
# test_every_chunk_size_matches_the_oracle's range (see there): float32 16, bfloat16 256
CASE_CHUNK = {"float32": 64 if ON_TPU else 16, "bfloat16": 64 if ON_TPU else 256}
# rows: two on the chip; on a CPU, where interpreting the kernels and the float64 oracle's
# gradients take the time (the bfloat16 case's second row: 4 s), one (here and in
# test_every_chunk_size_...): the grid's batch axis is indexed there by the four rows of
# test_bfloat16_with_correlated_keys_matches_the_oracle (outputs, final state, gradients; no
# initial state: with one, test_more_rows_than_a_call_holds_split_into_calls)
BATCH = {"float32": 2 if ON_TPU else 1, "bfloat16": 2 if ON_TPU else 1}


# the tests below share compiled programs (the kernels' float32 program of CASES["float32"] with
# test_any_gate_at_most_zero_stays_finite_and_exact), _case's oracles and _kernel_run's runs:
# one worker runs them
KERNEL_PROGRAMS = pytest.mark.xdist_group("pallas_kernel_programs")


@functools.cache
def _kernel_run(shape, batch, chunk):
    """The kernels' ``(o, final state, gradients)`` on :func:`_case`'s inputs at ``chunk``
    (once per worker: on a CPU test_every_chunk_size_matches_the_oracle[16] reads the run of
    test_kernels_match_the_float64_oracle[float32])."""
    x, cotangent, _ = _case(*shape, batch)
    return _run(x, cotangent, "kernels", chunk)


@pytest.mark.tpu
@pytest.mark.slow
@KERNEL_PROGRAMS
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_match_the_float64_oracle(case):
    dtype, seq_len, qk_heads, heads, key_dim, value_dim, tol = CASES[case]
    shape = (dtype, seq_len, qk_heads, heads, key_dim, value_dim)
    x, _, (o_ref, s_ref, g_ref) = _case(*shape, BATCH[case])
    o, s, grads = _kernel_run(shape, BATCH[case], CASE_CHUNK[case])
    assert o.dtype == dtype and s.dtype == jnp.float32
    assert _relative(o, o_ref) < tol, "o"
    assert _relative(s, s_ref) < tol, "final state"
    for name in NAMES:
        assert grads[name].dtype == x[name].dtype, name
        assert _relative(grads[name], g_ref[name]) < tol, f"d{name}"


# every chunk size on the chip (make test-tpu), where each lowers to Mosaic tiles of its own.
# In interpret mode on a CPU the sizes run the same code, differing only in trip counts (chunks
# per 256-token block 16, 8, 4, 2, 1; log2(C) + 1 levels of decay sums, log2(C) - 1 merges in
# the inverse; _fill's two branches, h < 8 and h >= 8, at every size from 16): the two ends run
# there, as the chunk sizes of test_kernels_match_the_float64_oracle's cases (CASE_CHUNK): 16
# (the smallest served: the most chunks per block, the fewest merges) the float32 case's, whose
# run this test reads (the float32 case at 64 and this test's own shape at 16 were two kernel
# programs, 8 s and 5 s to compile), and 256 (one chunk per block, the most merges) the
# bfloat16 case's; 64, between them, is the other tests' default chunk size (with gradients:
# test_bfloat16_with_correlated_keys_matches_the_oracle, in bfloat16).
CHUNK_SIZES = [16, 32, 128, 256] if ON_TPU else [16]
# the chip: T within one block, a whole call of float32 (8 value heads, pallas_tpu.ROW_BYTES,
# each its own q/k head: VMEM at every chunk size); a CPU: the float32 case's shape (and run)
CHUNK_CASE = (jnp.float32, 200, 8, 8, 128, 128) if ON_TPU else CASES["float32"][:6]


@pytest.mark.tpu
@KERNEL_PROGRAMS
@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_every_chunk_size_matches_the_oracle(chunk):
    """chunk_size 16 (the smallest served: three merges in the inverse) to 256 (one chunk per
    grid step), float32, T within one block (on a CPU the float32 case's: two blocks, four value
    heads): outputs, final state and gradients."""
    _, _, want = _case(*CHUNK_CASE, BATCH["float32"])
    got = _kernel_run(CHUNK_CASE, BATCH["float32"], chunk)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert _relative(a, b) < 1e-5


def _correlated(noise: float, beta: float, gate: float):
    """bfloat16 keys ``base + noise * N(0, 1)``, normalised (one shared direction: ``I + A``
    far from the identity), one beta and one gate for every token (T = 64, H = 2, K = 128)."""
    rng = np.random.default_rng(0)
    shape = (1, 64, 2, 128)
    keys = rng.standard_normal(128) + noise * rng.standard_normal(shape)
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    bf16 = lambda a: jnp.asarray(a, jnp.bfloat16)  # noqa: E731
    return dict(q=bf16(rng.standard_normal(shape)), k=bf16(keys),
                v=bf16(rng.standard_normal(shape)), g=jnp.full(shape, gate, jnp.float32),
                beta=jnp.full(shape[:3], beta, jnp.float32))  # fmt: skip


@pytest.mark.tpu
def test_bfloat16_with_correlated_keys_matches_the_oracle():
    """Keys along one direction, beta near 1, no decay (``I + A`` far from the identity): the
    bfloat16 passes (:data:`pallas_tpu.LOW_PASSES`) keep every case within the bfloat16
    tolerance, outputs, final state and gradients (four cases, one program), and the final state
    within 1e-3 (one pass for the scores, the inverse or the state's products fails one of the
    two bounds: DESIGN section 4). The cases are the rows of one batch (rows are independent:
    each row's outputs, state and gradients are its case's alone), each held to its bounds."""
    cases = [(0.0, 1.0, 0.0), (0.05, 1.0, 0.0), (0.3, 0.9, 0.0), (0.1, 1.0, -0.2)]
    rows = [_correlated(*case) for case in cases]
    x = {n: jnp.concatenate([row[n] for row in rows]) for n in rows[0]}
    one = jax.random.normal(jax.random.key(1), rows[0]["v"].shape)  # each case's, as alone
    cotangent = jnp.tile(one, (len(cases), 1, 1, 1))
    with jax.enable_x64(True):
        x64 = {n: jnp.asarray(np.asarray(a, np.float64)) for n, a in x.items()}
        want = jax.tree.map(np.asarray, _run(
            x64, jnp.asarray(np.asarray(cotangent, np.float64)), "recurrent"))  # fmt: skip
    o, s, grads = _run(x, cotangent, "kernels")
    for i, (noise, beta, gate) in enumerate(cases):
        case = f"noise {noise}, beta {beta}, gate {gate}"
        assert _relative(o[i], want[0][i]) < 2e-2, f"o, {case}"
        assert _relative(s[i], want[1][i]) < 1e-3, f"final state, {case}"
        for name in ("q", "k", "v", "g", "beta"):
            assert _relative(grads[name][i], want[2][name][i]) < 2e-2, f"d{name}, {case}"


@pytest.mark.tpu
@KERNEL_PROGRAMS
def test_any_gate_at_most_zero_stays_finite_and_exact():
    """Gates of -1e4 and -inf on some tokens, -80 everywhere on one head (the kernels alone: the
    recurrence's fallback would hide an overflow): finite, and the recurrence's values. The
    shapes of CASES["float32"] (two blocks, four value heads on one q/k head), so the kernels'
    program is the one test_kernels_match_the_float64_oracle compiles."""
    _, seq_len, qk_heads, heads, key_dim, value_dim, _ = CASES["float32"]
    x, cotangent = _inputs(jnp.float32, seq_len, qk_heads, heads, key_dim, value_dim,
                           key=jax.random.key(5), batch=BATCH["float32"])  # fmt: skip
    g = np.array(x["g"])
    g[0, ::7, 0], g[0, 3::11, 0], g[0, :, 1] = -1e4, -np.inf, -80.0
    x["g"] = jnp.asarray(g)
    o, s, grads = _run(x, cotangent, "kernels", CASE_CHUNK["float32"])  # as the test above
    # the recurrence's outputs and final state (no gradients: only the kernels' are read)
    o_ref, s_ref = jax.jit(functools.partial(kda, output_final_state=True,
                                             implementation="recurrent"))(**x)  # fmt: skip
    assert _relative(o, o_ref) < 1e-5 and _relative(s, s_ref) < 1e-5
    assert all(np.isfinite(a).all() for a in jax.tree.leaves(grads))


@pytest.mark.parametrize("size", [16, 64, 256])
def test_unit_lower_inverse_holds_where_keys_share_a_direction(size):
    """``(I + A)^-1`` for ``A = tril(beta K K^T, -1)``, keys ``base + 0.05 N(0, 1)`` normalised and
    beta in [0.9, 1] (a Neumann series' worst case: its terms grow far above the result),
    against NumPy's float64 inverse: within 1e-4 of the largest entry at three passes and 2e-6
    at six (DESIGN section 4)."""
    rng = np.random.default_rng(size)
    keys = rng.standard_normal(128) + 0.05 * rng.standard_normal((4, size, 128))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    attn = np.tril(rng.uniform(0.9, 1.0, (4, size, 1)) * keys @ np.swapaxes(keys, -1, -2), -1)
    want = np.linalg.inv(np.eye(size) + attn)
    for passes, bound in ((3, 1e-4), (6, 2e-6)):
        got = jax.jit(pallas_tpu._unit_lower_inverse, static_argnums=1)(
            jnp.asarray(attn, jnp.float32), passes)  # fmt: skip
        assert _relative(got, want) < bound, passes


@pytest.mark.parametrize("size", [16, 64, 256])
def test_level_sums_are_the_segment_sums(size):
    """``_level_sums``: at every level h, from the h-segment's start through row i and from
    after row j to the segment's end, against float64 sums (the rotations' spill dropped)."""
    from jax.experimental import pallas as pl

    g = -np.random.default_rng(size).exponential(size=(2, size, 128)).astype(np.float32)
    levels = int(np.log2(size)) + 1

    def kernel(g_ref, out_ref):  # pltpu.roll runs inside a kernel only
        for i, (_, inclusive, exclusive) in enumerate(pallas_tpu._level_sums(g_ref[...])):
            out_ref[i, 0] = inclusive
            out_ref[i, 1] = jnp.zeros_like(inclusive) if exclusive is None else exclusive

    sums = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((levels, 2, *g.shape),
                                                                 jnp.float32),
                          interpret=True)(jnp.asarray(g))  # fmt: skip
    for (inclusive, exclusive), h in zip(np.asarray(sums), 2 ** np.arange(levels), strict=True):
        rows = np.arange(size)
        start, end = rows // h * h, rows // h * h + h
        want_in = np.stack([g[:, s : i + 1].astype(np.float64).sum(1)
                            for s, i in zip(start, rows, strict=True)], 1)  # fmt: skip
        want_out = np.stack([g[:, i + 1 : e].astype(np.float64).sum(1)
                             for i, e in zip(rows, end, strict=True)], 1)  # fmt: skip
        np.testing.assert_allclose(inclusive, want_in, rtol=1e-6, err_msg=f"h = {h}")
        np.testing.assert_allclose(exclusive, want_out, rtol=1e-6, atol=1e-6, err_msg=f"h = {h}")


def test_bfloat16_queries_stay_bfloat16_after_the_l2_norm():
    """The layer's path (use_qk_l2norm, bfloat16): the kernel reads q and k in bfloat16 and
    takes the bfloat16 passes, not float32's."""
    x = random_kda_inputs(jax.random.key(8), 1, 64, 2, 128, dtype=jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda x: kda(**x, use_qk_l2norm=True, implementation="pallas_tpu"))(x)
    calls = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    assert calls and all(e.invars[0].aval.dtype == jnp.bfloat16 for e in calls)


# the forward program's shape of the two tests below: on a CPU one (test_outputs_before_a_change_
# are_bitwise_unchanged's; interpreted, compiling a kernel program takes the time), on the chip
# each test's own
NON_FINITE_T = 100 if ON_TPU else 300
FORWARD_PROGRAM = pytest.mark.xdist_group("pallas_forward_program")


@pytest.mark.tpu
@FORWARD_PROGRAM
def test_non_finite_inputs_give_the_recurrences_result():
    """A NaN value at token 50 of one head: NaN exactly where the recurrence has it (the
    kernels would spread it over its chunk), the rest equal to the recurrence's."""
    x = random_kda_inputs(jax.random.key(3), 1, NON_FINITE_T, 2, 128)
    x["v"] = x["v"].at[0, 50, 1, 3].set(jnp.nan)
    o, s = kda(**x, output_final_state=True, implementation="pallas_tpu")
    o_ref, s_ref = kda(**x, output_final_state=True, implementation="recurrent")
    for got, want in ((o, o_ref), (s, s_ref)):
        assert (np.isnan(got) == np.isnan(want)).all()
        np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), atol=1e-6)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(chunk_size=512), "chunk_size <= 256"),
        (dict(chunk_size=8), "16 <= chunk_size"),
        (dict(dtype=jnp.float16), "float32 or bfloat16"),
        (dict(has_segments=True), "segment_ids"),
        (dict(key_dim=256), "key_dim <= 128"),
        (dict(value_dim=384), "value_dim <= 256"),
        (dict(output_chunk_states=True), "output_chunk_states"),
        (dict(output_token_states=True), "output_token_states"),
    ],
)
def test_refusals_name_the_constraint(change, message):
    config = dict(seq_len=256, num_heads=2, key_dim=128, value_dim=128) | change
    (problem,) = api.refusals("pallas_tpu", **config)
    assert message in problem and "pallas_tpu" in problem
    assert not api.refusals("pallas_tpu", seq_len=256, key_dim=96)


def test_a_gpu_is_refused_here_not_in_principle(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    (problem,) = api.refusals("pallas_tpu", seq_len=256, key_dim=128)
    assert "not on gpu" in problem
    assert not api.refusals("pallas_tpu", here=False, seq_len=256, key_dim=128)


@pytest.mark.tpu
@FORWARD_PROGRAM
def test_outputs_before_a_change_are_bitwise_unchanged():
    """Changing every input from token 100 on (mid-chunk) leaves the outputs before it equal
    bit for bit."""
    x = random_kda_inputs(jax.random.key(4), 1, 300, 2, 128)
    y = random_kda_inputs(jax.random.key(5), 1, 300, 2, 128)
    edited = {n: a.at[:, 100:].set(y[n][:, 100:]) for n, a in x.items()}
    # kda's own compiled program, the call of test_non_finite_inputs_give_the_recurrences_result
    run = lambda x: kda(**x, output_final_state=True, implementation="pallas_tpu")[0]  # noqa: E731
    before, after = np.asarray(run(x)), np.asarray(run(edited))
    assert (before[:, :100] == after[:, :100]).all()
    assert (before[:, 100:] != after[:, 100:]).any()


def test_auto_runs_the_kernels_on_a_tpu_where_they_serve(monkeypatch):
    config = dict(seq_len=1024, num_heads=2, key_dim=128, dtype=jnp.bfloat16)
    assert select_implementation(**config) == "chunked"  # the CPU
    monkeypatch.setattr(api, "tpu_generation", lambda: 5)
    assert select_implementation(**config) == "pallas_tpu"
    assert select_implementation(differentiated=False, **config) == "pallas_tpu"
    assert select_implementation(**config | dict(seq_len=16)) == "recurrent"  # decode steps
    assert select_implementation(**config | dict(output_chunk_states=True)) == "chunked"
    assert select_implementation(**config | dict(has_segments=True)) == "chunked"


def _shapes(seq_len, dtype=jnp.bfloat16, heads=2, value_dim=128):
    sd = jax.ShapeDtypeStruct
    big = (1, seq_len, heads, 128)
    return (sd(big, dtype), sd(big, dtype), sd((1, seq_len, heads, value_dim), dtype),
            sd(big, jnp.float32), sd((1, seq_len, heads), jnp.float32))  # fmt: skip


def _kernels(seq_len, grad: bool, **shape):
    def forward(q, k, v, g, beta):
        return pallas_tpu.kda_pallas(q, k, v, g, beta, scale=0.1, interpret=False)

    def loss(*xs):
        o, s = forward(*xs)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(s)

    return jax.jit(jax.grad(loss, argnums=range(5)) if grad else forward), _shapes(seq_len,
                                                                                 **shape)


# (grad, shape): bfloat16 rows in pairs; values of two 128-lane parts (V = 256); an odd bfloat16
# head count (widened to float32); 48 heads, three calls of 16 (pallas_tpu.ROW_BYTES)
LOWERED = {"fwd": (False, {}), "fwd+bwd": (True, {}), "V256": (True, dict(value_dim=256)),
           "odd_bf16": (True, dict(heads=3)), "48_heads": (False, dict(heads=48))}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LOWERED))
def test_kernels_lower_for_the_tpu_without_one(case):
    """Mosaic's lowering (block shapes, strided loads, no 64-bit constants under x64) runs on a
    CPU (the chip's compiler then decides what it takes: a dynamic start crashed it)."""
    grad, shape = LOWERED[case]
    f, shapes = _kernels(512, grad, **shape)
    with jax.enable_x64(True):
        text = f.trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == (2 if grad else 1)


def _pallas_grids(jaxpr):
    """The grid of every ``pallas_call`` in ``jaxpr`` and the jaxprs nested in it."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn.params["grid_mapping"].grid
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _pallas_grids(inner)


# (dtype, value heads, q/k heads, V): calls of the forward (its grid's batch axis, B = 1) at
# pallas_tpu.ROW_BYTES = 32 a token and lane: 16 bfloat16 rows, 8 float32 rows; V = 256 two
# rows a head; an odd count of bfloat16 rows read as float32 (here one head a call)
CALLS = {(jnp.bfloat16, 16, 16, 128): 1, (jnp.bfloat16, 48, 48, 128): 3,
         (jnp.bfloat16, 32, 8, 128): 2, (jnp.float32, 8, 8, 128): 1, (jnp.float32, 16, 16, 128): 2,
         (jnp.bfloat16, 16, 16, 256): 2, (jnp.float32, 8, 8, 256): 2,
         (jnp.bfloat16, 13, 13, 128): 13}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(CALLS, key=str),
                         ids=lambda s: f"{jnp.dtype(s[0]).name}-H{s[1]}-qk{s[2]}-V{s[3]}")
def test_calls_hold_at_most_row_bytes_a_token(shape):
    """How many kernel calls kda_pallas makes (VMEM holds every head of a call's block: review
    91 of the kernels; each whole call compiled on the v5e at every chunk size, data/benchmarks/
    tpu-v5e/2026-12-07-pallas-chunks.json)."""
    dtype, heads, qk_heads, value_dim = shape
    sd = jax.ShapeDtypeStruct
    qk, v = sd((1, 512, qk_heads, 128), dtype), sd((1, 512, heads, value_dim), dtype)
    gates = sd((1, 512, heads, 128), jnp.float32), sd((1, 512, heads), jnp.float32)

    def forward(q, k, v, g, beta):
        return pallas_tpu.kda_pallas(q, k, v, g, beta, scale=0.1, interpret=False)

    (grid,) = _pallas_grids(jax.make_jaxpr(forward)(qk, qk, v, *gates).jaxpr)
    assert grid[0] == CALLS[shape]


def _kernel_values(x, interpret, **options):
    """:func:`pallas_tpu.kda_pallas`'s outputs and gradients (of a fixed scalar) on ``x``."""
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"])

    def loss(*a):
        o, s = pallas_tpu.kda_pallas(*a[:5], scale=0.2, initial_state=a[5], interpret=interpret,
                                     **options)  # fmt: skip
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s * s), (o, s)

    values = jax.jit(jax.value_and_grad(loss, argnums=range(6), has_aux=True))
    (_, outputs), grads = values(*args)
    return jax.tree.map(np.asarray, (outputs, grads))


def _qk_heads(x, heads):
    return x | {n: x[n][:, :, :heads] for n in ("q", "k")}


def test_compiled_branches_equal_the_reshapes_under_the_tpu_interpreter():
    """The kernels' strided loads and stores (the branches compiled on a TPU) under Pallas's TPU
    interpreter give the values of the reshapes the HLO interpreter runs: outputs and gradients,
    to float32 rounding (two XLA programs; a wrong row is off by the values themselves). Two q/k
    heads, each read by two value heads of two 128-lane parts (V = 256). float32 (that
    interpreter has no 16-bit ref bitcast: the pairs, and strides of every head count, are
    tested below on a numpy ref)."""
    from jax.experimental.pallas import tpu as pltpu

    x = _qk_heads(random_kda_inputs(jax.random.key(3), 1, 40, 4, 128, 256, with_state=True), 2)
    jax.tree.map(_same, _kernel_values(x, pltpu.InterpretParams()), _kernel_values(x, True))


def _same(got, want):
    """Equal to float32 rounding: 1e-6 of the largest value."""
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * float(np.abs(want).max()))


def _recurrent_call(q, k, v, g, beta_rows, s0, scale, chunk, groups, low, interpret, fallback):
    """``pallas_tpu._kda``'s contract (its padded, per-call arrays in, ``(o, final state)``
    out) by the recurrence: the split into calls tested on its own, without compiling the
    kernels for each split."""
    assert q.shape[2] * groups == v.shape[2]
    beta = jnp.moveaxis(beta_rows[:, :, 0, :], 1, 2)  # [B, HV, 1, T] -> [B, T, HV]
    return kda(q, k, v, g, beta, scale=scale, initial_state=s0, output_final_state=True,
               implementation="recurrent")  # fmt: skip


def test_more_rows_than_a_call_holds_split_into_calls(monkeypatch):
    """Value heads past pallas_tpu.ROW_BYTES a token and lane run as calls over a batch axis
    (two rows, an initial state: its reshape and the final state's), whole q/k heads to a call
    (8 bytes: 2 float32 rows) or, a call of fewer value heads than share one, that head repeated
    (4 bytes): the kernels' values in one call, to 1e-5 of the largest; the split calls each by
    the recurrence (:func:`_recurrent_call`: the kernels once, not once a split). The one call
    is the only CPU run of the kernels with two rows and an initial state (the state arrays'
    batch index) and, with pallas_tpu.HEADS at (2, 2), two head groups in the forward (its grid's
    head axis: each group's states, outputs and packing); without the non-finite fallback,
    which would repair a forward that leaves NaN (engineer reviews 94 and 95)."""
    x = random_kda_inputs(jax.random.key(4), 2, 40, 4, 128, 128, with_state=True)
    x = _qk_heads(x, 2)
    monkeypatch.setattr(pallas_tpu, "HEADS", (2, 2))
    want = _kernel_values(x, True, non_finite_fallback=False)
    monkeypatch.setattr(pallas_tpu, "_kda", _recurrent_call)
    for row_bytes in (8, 4):
        monkeypatch.setattr(pallas_tpu, "ROW_BYTES", row_bytes)
        for got, one_call in zip(jax.tree.leaves(_kernel_values(x, True)),
                                 jax.tree.leaves(want), strict=True):  # fmt: skip
            assert _relative(got, one_call) < 1e-5


def test_16_bit_rows_pair_up_as_pltpu_bitcast_packs_them():
    """``_word`` packs two bfloat16 rows as :func:`pltpu.bitcast` does (the even row low) and
    ``_half`` takes each back exactly."""
    from jax.experimental.pallas import tpu as pltpu

    rows = jax.random.normal(jax.random.key(5), (2, 8, 128)).astype(jnp.bfloat16)
    interleaved = jnp.stack([rows[0], rows[1]], axis=1).reshape(16, 128)  # rows 2a, 2a + 1
    words = jax.jit(pltpu.bitcast, static_argnums=1)(interleaved, jnp.uint32)  # [8, 128]
    np.testing.assert_array_equal(pallas_tpu._word(rows[0], rows[1]), words)
    for odd in (0, 1):
        np.testing.assert_array_equal(pallas_tpu._half(words, odd), rows[odd].astype(jnp.float32))


class _Ref:
    """A numpy stand-in for a kernel's VMEM ref: ``[1, rows, 128]``, strided ``pl.ds`` reads and
    writes, and ``bitcast(uint32)`` as a view of row pairs (the even row in the low half)."""

    def __init__(self, a, parent=None):
        self.a, self.parent = a, parent

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: jnp.dtype(self.a.dtype))

    @staticmethod
    def _index(key):
        return tuple(slice(k.start, k.start + k.size * k.stride, k.stride)
                     if isinstance(k, pl.Slice) else k
                     for k in (key if isinstance(key, tuple) else (key,)))  # fmt: skip

    def __getitem__(self, key):
        return self.a[self._index(key)]

    def __setitem__(self, key, value):
        self.a[self._index(key)] = np.asarray(value).astype(self.a.dtype)
        if self.parent is not None:  # words back into the 16-bit rows
            half = self.parent.a.view(np.uint16)
            half[:, 0::2], half[:, 1::2] = self.a & 0xFFFF, self.a >> 16

    def bitcast(self, dtype):
        assert jnp.dtype(dtype) == jnp.uint32 and self.a.dtype.itemsize == 2
        half = self.a.view(np.uint16).astype(np.uint32)
        return _Ref(half[:, 0::2] | (half[:, 1::2] << 16), parent=self)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_strided_rows_are_each_heads_rows(dtype):
    """``_rows_of`` and ``_pack``'s compiled branches (strided loads and stores; 16-bit rows two
    to a word) on a numpy ref equal the reshapes of their interpreted branches, for every head
    count and parts (1, 2) with an even row count in 16 bits."""
    rng = np.random.default_rng(0)
    for heads, parts in [(h, p) for h in (1, 2, 3, 4, 6, 16) for p in (1, 2)]:
        rows = heads * parts
        if np.dtype(dtype).itemsize == 2 and rows % 2:
            continue  # kda_pallas widens these to float32
        block = _Ref(rng.standard_normal((1, pallas_tpu.BLOCK_T * rows, 128)).astype(dtype))
        for h in range(heads):
            np.testing.assert_array_equal(pallas_tpu._rows_of(block, h, heads, False),
                                          pallas_tpu._rows_of(block, h, heads, True))
        scratch = rng.standard_normal((heads, pallas_tpu.BLOCK_T, parts * 128), np.float32)
        strided, reshaped = (_Ref(np.zeros_like(block.a)) for _ in range(2))
        pallas_tpu._pack(scratch, strided, False)
        pallas_tpu._pack(scratch, reshaped, True)
        np.testing.assert_array_equal(strided.a, reshaped.a)


def _inner_jaxprs(eqn):
    for param in eqn.params.values():
        for value in param if isinstance(param, tuple | list) else (param,):  # cond branches
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield inner


def _dot_precisions(jaxpr, in_kernel=False):
    """The ``precision`` of every dot_general inside a pallas_call of ``jaxpr`` (at any depth)."""
    for eqn in jaxpr.eqns:
        if in_kernel and eqn.primitive.name == "dot_general":
            yield eqn.params["precision"]
        for inner in _inner_jaxprs(eqn):
            yield from _dot_precisions(inner, in_kernel or eqn.primitive.name == "pallas_call")


@pytest.mark.parametrize("grad", [False, True])
def test_a_callers_highest_precision_leaves_the_kernels_passes(grad):
    """Under jax.default_matmul_precision("highest") (make test-tpu's setting) the kernels'
    matmuls stay one bfloat16 pass each (Mosaic refuses float32 precision on bfloat16
    operands)."""
    f, shapes = _kernels(64, grad)
    with jax.default_matmul_precision("highest"):
        jaxpr = jax.make_jaxpr(f)(*shapes).jaxpr
    precisions = list(_dot_precisions(jaxpr))
    assert str(jaxpr).count("pallas_call[") == (2 if grad else 1)  # the backward's kernel too
    assert precisions and all(p == (jax.lax.Precision.DEFAULT,) * 2 for p in precisions)


def test_the_forward_reads_and_writes_each_array_once():
    """HBM traffic from the forward kernel's BlockSpecs (grid steps x block bytes) at most 1.1x
    the inputs' and output's bytes: no intermediate goes through HBM."""
    seq_len, heads = 1024, 4
    jaxpr = jax.make_jaxpr(_kernels(seq_len, False)[0])(*_shapes(seq_len, heads=heads))
    (call,) = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    mapping = call.params["grid_mapping"]
    moved = 0
    for m in mapping.block_mappings:  # a block is copied when its index changes between steps
        closed = m.index_map_jaxpr
        visits = [tuple(int(i) for i in jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *step))
                  for step in np.ndindex(*mapping.grid)]  # fmt: skip
        copies = 1 + sum(a != b for a, b in zip(visits, visits[1:]))  # noqa: B905
        moved += copies * np.prod(m.transformed_block_aval.shape) * m.array_aval.dtype.itemsize
    ideal = sum(np.prod(s.shape) * s.dtype.itemsize for s in _shapes(seq_len, heads=heads))
    ideal += seq_len * heads * 128 * 2  # o
    assert moved <= 1.1 * ideal, moved / ideal


def _equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs in its equations' parameters."""
    for e in jaxpr.eqns:
        yield e
        for value in e.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


def test_the_gradient_keeps_no_per_token_states():
    """The compiled gradient's temporaries grow by at most 10x the inputs' growth from T = 1024
    to 2048: no per-token states (64 KiB a token and head) are kept for the backward."""

    def temporaries(seq_len):
        x = random_kda_inputs(jax.random.key(0), 1, seq_len, 2, 128)

        def loss(x):
            o, s = kda(**x, output_final_state=True, implementation="pallas_tpu")
            return jnp.sum(o) + jnp.sum(s)

        memory = jax.jit(jax.grad(loss)).lower(x).compile().memory_analysis()
        return memory.temp_size_in_bytes, sum(a.size * a.dtype.itemsize for a in x.values())

    (short, short_inputs), (long, long_inputs) = temporaries(1024), temporaries(2048)
    assert long - short <= 10 * (long_inputs - short_inputs), (long - short) / short_inputs
