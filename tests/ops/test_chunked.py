"""kda_chunked against the float64 recurrence: outputs, final states and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kda_lib import kda_chunked, kda_recurrent
from kda_lib.ops.chunked import unit_lower_inverse
from kda_lib.testing import assert_close, cast_inputs, random_kda_inputs, relative_l2

NAMES = ("q", "k", "v", "g", "beta")
SHAPES = [  # (B, H, K, V)
    (1, 1, 16, 16),
    (2, 3, 32, 8),
    (1, 2, 8, 24),
]


def _on_host(inputs, dtype):
    """Every array of ``inputs`` cast to ``dtype`` on the host (eagerly: a compiled cast per
    array shape; float64 needs x64 on)."""
    return {n: jnp.asarray(np.asarray(x).astype(dtype)) for n, x in inputs.items()}


@jax.jit  # one program per shape (eagerly: three)
def _cotangents(key, inputs):
    b, t, h, k = inputs["q"].shape
    v = inputs["v"].shape[-1]
    k1, k2 = jax.random.split(key)
    dtype = inputs["q"].dtype
    return {
        "o": jax.random.normal(k1, (b, t, h, v), dtype),
        "s": jax.random.normal(k2, (b, h, k, v), dtype),
    }


FORMS = {
    "recurrent": kda_recurrent,
    "streaming": functools.partial(kda_chunked, scan="streaming"),
    "associative": functools.partial(kda_chunked, scan="associative"),
}
SCANS = ("streaming", "associative")


@functools.partial(jax.jit, static_argnames=("grads", "forward"))
def _every_form(inputs, cotangents, segment_ids=None, grads=tuple(FORMS), forward=()):
    """``{form: (o, final_state, grads or None)}`` for the oracle and the chunked scans, in one
    program (one compilation; eager calls would compile every op separately): the forms of
    ``grads`` with the gradients of ``<o, cot_o> + <s, cot_s>`` with respect to every array of
    ``inputs``, those of ``forward`` without."""

    def run(fn, with_grads):
        def loss(x):
            o, s = fn(**x, segment_ids=segment_ids, output_final_state=True)
            return jnp.sum(o * cotangents["o"]) + jnp.sum(s * cotangents["s"]), (o, s)

        if not with_grads:
            return (*loss(inputs)[1], None)
        (_, (o, s)), g = jax.value_and_grad(loss, has_aux=True)(inputs)
        return o, s, g

    return {name: run(FORMS[name], name in grads) for name in (*grads, *forward)}


def _check_against_oracle(forms):
    """Every scan of ``forms`` against the oracle's outputs, final state and, where both have
    them, gradients."""
    o_ref, s_ref, g_ref = forms["recurrent"]
    for scan in set(forms) & set(SCANS):
        o, s, got = forms[scan]
        assert o.dtype == o_ref.dtype
        assert_close(o, o_ref, atol=1e-11, rtol=1e-9, name=f"o ({scan})")
        assert_close(s, s_ref, atol=1e-11, rtol=1e-9, name=f"state ({scan})")
        if got is not None and g_ref is not None:
            assert set(got) == set(g_ref)
            for name in got:
                assert_close(
                    got[name], g_ref[name], atol=1e-10, rtol=1e-8, name=f"d{name} ({scan})"
                )


# T = 1; within one chunk; exactly one chunk; one chunk and one token; several chunks, the last
# one partial; an initial state at odd T. A covering design: T = 1, 63, 64 forward checks, one
# scan each (the padding is shared), in one program; gradients: at 65 (a state, a one-token last
# chunk) the streaming scan's (also plain autodiff for the rematerialised test), at 200 (no
# state, four chunks) both scans', with segments and a state the associative scan's
# (test_chunked_segments_match_oracle; the streaming scan's: test_interior_states.py).
FORWARD_SCANS = {1: "associative", 63: "streaming", 64: "associative"}
GRADIENT_SCANS = {65: ("streaming",), 200: SCANS}
GATES = ("softplus", "safe")
ORACLE_PROGRAMS = pytest.mark.xdist_group("chunked_float64_oracle")  # compiled once, shared


@functools.cache
def _float64_case(seq_len, gate):
    """float64 inputs (shape ``SHAPES[seq_len % 3]``, a state at odd T) and cotangents."""
    batch, heads, key_dim, value_dim = SHAPES[seq_len % len(SHAPES)]
    with jax.enable_x64(True):
        inputs = _on_host(
            random_kda_inputs(
                jax.random.key(seq_len), batch, seq_len, heads, key_dim, value_dim,
                gate=gate, with_state=seq_len % 2 == 1,
            ),
            jnp.float64,
        )  # fmt: skip
        return inputs, _cotangents(jax.random.key(8), inputs)


@jax.jit
def _forward_forms(cases):
    return [
        _every_form(x, cot, grads=(), forward=("recurrent", FORWARD_SCANS[t]))
        for t, (x, cot) in zip(FORWARD_SCANS, cases, strict=True)
    ]


@functools.cache
def _oracle_runs(seq_len, gate):
    """_every_form's runs of one case of test_chunked_matches_float64_oracle (once per worker:
    the tests of ORACLE_PROGRAMS share them)."""
    with jax.enable_x64(True):
        if seq_len in FORWARD_SCANS:
            runs = _forward_forms([_float64_case(t, gate) for t in FORWARD_SCANS])
            return runs[list(FORWARD_SCANS).index(seq_len)]
        grads = ("recurrent", *GRADIENT_SCANS[seq_len])
        return _every_form(*_float64_case(seq_len, gate), grads=grads)


@ORACLE_PROGRAMS
@pytest.mark.parametrize("seq_len", [*FORWARD_SCANS, *GRADIENT_SCANS])
def test_chunked_matches_float64_oracle(x64, seq_len):
    """Outputs, final states and (at 65 and 200) the gradients of every input, both gates
    (same shapes: one compilation)."""
    for gate in GATES:
        forms = _oracle_runs(seq_len, gate)
        assert len(forms) > 1 and forms["recurrent"][0].dtype == jnp.float64
        assert forms["recurrent"][2] is None or set(forms["recurrent"][2]) == set(
            _float64_case(seq_len, gate)[0]
        )
        _check_against_oracle(forms)


def test_a_state_that_survives_the_chunks_matches_the_oracle(x64):
    """T == 3C at the default chunk size (three whole chunks; the first is T == C's: the
    initial state in, one chunk's state out), gates of -0.02 a token on average (a state keeps
    about a quarter of itself over a chunk, asserted: the tests above decay it within one, so a
    mistake at a chunk boundary would not show there), an initial state: both scans against the
    float64 recurrence, outputs, final state and every gradient; and the test sees a boundary
    mistake: the last chunk run without the state before it moves its outputs by far more than
    the tolerance. (T == C alone was a row here: the same programs, one chunk; T == C's
    associative scan forward in test_chunked_matches_float64_oracle[64].)"""
    seq_len = 192
    x = random_kda_inputs(jax.random.key(seq_len), 1, seq_len, 2, 16, 16, with_state=True)
    x["g"] = -0.02 * jnp.abs(x["g"]) / jnp.abs(x["g"]).mean()  # mean -0.02 a token
    x = _on_host(x, jnp.float64)
    forms = _every_form(x, _cotangents(jax.random.key(2), x))
    kept = float(jnp.exp(x["g"][:, :64].sum(1)).mean())  # the state kept over the first chunk
    assert 0.1 < kept < 0.5, kept
    _check_against_oracle(forms)
    last = {n: a[:, seq_len - 64 :] for n, a in x.items() if n != "initial_state"}
    dropped = jax.jit(kda_recurrent)(**last)[0]  # the last chunk without the state before it
    assert float(jnp.abs(dropped - forms["recurrent"][0][:, seq_len - 64 :]).max()) > 1e-3


def _saved_bytes(fn, *args):
    """The bytes of the residuals that autodiff of ``fn`` saves for the backward."""
    import contextlib
    import io
    import math
    import re

    import jax.ad_checkpoint

    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):  # one line a residual: "f64[1,65,2,8] ..."
        jax.ad_checkpoint.print_saved_residuals(fn, *args)
    found = re.findall(r"^([a-z]+)(\d*)\[([\d,]*)\]", listing.getvalue(), re.M)
    assert found, listing.getvalue()
    return sum(
        max(int(bits or 8) // 8, 1) * math.prod(int(d) for d in shape.split(",") if d)
        for _, bits, shape in found
    )


@ORACLE_PROGRAMS
def test_rematerialised_streaming_step_matches_the_oracle_and_plain_autodiff(x64, monkeypatch):
    """Above REMAT_MIN_BYTES of saved blocks the streaming scan recomputes each step in the
    backward (jax.checkpoint): forced here at a small shape (T = 65: two chunks, a state, a
    one-token last chunk), autodiff saves less and its gradients equal the float64 oracle's
    and plain autodiff's (both: test_chunked_matches_float64_oracle[65]'s run)."""
    import kda_lib.ops.chunked as chunked
    from kda_lib.ops.api import clear_compiled_forms

    inputs, cot = _float64_case(65, "safe")
    runs = _oracle_runs(65, "safe")
    want, plain = runs["recurrent"][2], runs["streaming"][2]

    def streaming(x):
        o, s = kda_chunked(**x, scan="streaming", output_final_state=True)
        return jnp.sum(o * cot["o"]) + jnp.sum(s * cot["s"])

    plain_bytes = _saved_bytes(streaming, inputs)
    monkeypatch.setattr(chunked, "REMAT_MIN_BYTES", -1)
    clear_compiled_forms()  # chunked_core reads the constant when traced: trace it anew
    try:
        remat_bytes = _saved_bytes(streaming, inputs)
        remat = jax.jit(jax.grad(streaming))(inputs)
    finally:
        monkeypatch.undo()
        clear_compiled_forms()
    print(f"saved for the backward: plain {plain_bytes} B, rematerialised {remat_bytes} B")
    assert remat_bytes < plain_bytes / 2, "the step was not rematerialised"
    assert set(remat) == set(want) == set(NAMES + ("initial_state",))
    for name in want:
        assert_close(remat[name], want[name], atol=1e-10, rtol=1e-8, name=f"d{name} (remat)")
        assert_close(remat[name], plain[name], atol=1e-12, rtol=1e-10, name=f"d{name} (plain)")


def test_remat_threshold_splits_the_reference_shape_from_the_tests_shapes():
    """The rule's two sides: the benchmark's reference shape (B*H = 4, T = 4096, C = 64,
    K = V = 64), where remat measured no slower and half the memory, is rematerialised; a
    test-sized program (B*H = 6, T = 256) keeps plain autodiff, which compiles faster."""
    from kda_lib.ops.chunked import REMAT_MIN_BYTES, stream_saved_bytes

    def chunks(n, bh, c, k, v):
        qk = jax.ShapeDtypeStruct((n, 1, bh, c, k), jnp.float32)
        return (qk, qk, jax.ShapeDtypeStruct((n, 1, bh, c, v), jnp.float32))

    assert stream_saved_bytes(chunks(64, 4, 64, 64, 64)) > REMAT_MIN_BYTES
    assert stream_saved_bytes(chunks(4, 6, 64, 32, 32)) < REMAT_MIN_BYTES / 8


def _segment_cases(seq_len):
    ids = np.ones((2, seq_len), np.int32)
    # row 0: boundaries inside a chunk, exactly at chunk edges (64, 128), padding in between
    ids[0, 40:64] = 2
    ids[0, 64:128] = 3
    ids[0, 128:131] = 0
    ids[0, 131:190] = 5
    ids[0, 190:] = 0
    # row 1: leading padding, one long document, a short one at the end
    ids[1, :7] = 0
    ids[1, 7:180] = 9
    ids[1, 180:] = 4
    return jnp.asarray(ids)


def test_chunked_segments_match_oracle(x64):
    """Segments with a state: both scans' outputs and final states, the associative scan's
    gradients (the streaming scan's with segments and a state: test_interior_states.py's
    float64 test, through the outputs and the chunk states)."""
    seq_len = 200
    inputs = _on_host(
        random_kda_inputs(jax.random.key(3), 2, seq_len, 2, 16, 8, with_state=True), jnp.float64
    )
    ids = _segment_cases(seq_len)
    cot = _cotangents(jax.random.key(4), inputs)
    forms = _every_form(
        inputs, cot, ids, grads=("recurrent", "associative"), forward=("streaming",)
    )
    assert set(forms["recurrent"][2]) == set(NAMES + ("initial_state",))
    _check_against_oracle(forms)
    for scan in SCANS:
        assert np.all(np.asarray(forms[scan][0])[np.asarray(ids) == 0] == 0)


@pytest.mark.tpu
def test_packed_documents_equal_separate_runs():
    """Two documents packed in one row give exactly what each gives alone."""
    # two documents of 75 tokens (the boundary inside the second chunk; each alone ends in a
    # partial chunk); alone, they are the two rows of one batch (rows are independent): one
    # program for the packed and the separate runs
    inputs = random_kda_inputs(jax.random.key(5), 1, 150, 2, 16, 16)
    ids = jnp.asarray(np.r_[np.full(75, 1), np.full(75, 2)][None], jnp.int32)
    alone = {n: np.concatenate([x[:, :75], x[:, 75:]]) for n, x in inputs.items()}  # host

    @jax.jit
    def run(inputs, ids, alone):
        return (
            kda_chunked(**inputs, segment_ids=ids, output_final_state=True),
            kda_chunked(**alone, output_final_state=True),
        )

    (o_packed, s_packed), (o_alone, s_alone) = run(inputs, ids, alone)
    assert_close(o_packed[:, :75], o_alone[:1], atol=2e-6, rtol=1e-5)
    assert_close(o_packed[:, 75:], o_alone[1:], atol=2e-6, rtol=1e-5)
    assert_close(s_packed, s_alone[1:], atol=2e-6, rtol=1e-5)


# T = 300 (several chunks, the last partial), an initial state: the float32 shapes of
# test_saturated_gates_are_finite_and_exact (its programs), in the default mode
SATURATION_CASES = ("at_lower_bound", "huge_a_log")
_oracle_with_state = jax.jit(functools.partial(kda_recurrent, output_final_state=True))


@jax.jit
def _outputs_and_state_grads(x):
    """kda_chunked's ``(o, s)`` and the gradients of ``sum(s)``, in one program."""

    def loss(x):
        o, s = kda_chunked(**x, output_final_state=True)
        return jnp.sum(s), (o, s)

    return jax.value_and_grad(loss, has_aux=True)(x)


def _saturated(g, case):  # on the host (float64 numpy)
    if case == "at_lower_bound":
        return jnp.asarray(np.full_like(g, -5.0))
    return jnp.asarray(np.asarray(g) * np.exp(20.0))  # "huge_a_log": A = exp(20), gates ~ -1e8


@functools.cache
def _gate_case(case):
    """float64 inputs ``[1, 300, 2, 16, 16]`` with a state, their gates normal or saturated,
    and the oracle's ``(o, s)``."""
    with jax.enable_x64(True):
        base = _on_host(
            random_kda_inputs(jax.random.key(13), 1, 300, 2, 16, 16, with_state=True),
            jnp.float64,
        )
        inputs = base if case == "normal" else {**base, "g": _saturated(base["g"], case)}
        return inputs, _oracle_with_state(**inputs)


@pytest.mark.tpu
@ORACLE_PROGRAMS
@pytest.mark.parametrize("seq_len", [64, 300])
def test_float32_chunked_close_to_float64_oracle(seq_len):
    """T = 64 (exactly one chunk, no state): the inputs and oracle run of
    test_chunked_matches_float64_oracle[64]; T = 300: those of the saturated-gate test."""
    if seq_len == 64:
        with jax.enable_x64(True):
            inputs = _float64_case(64, "softplus")[0]
            o_ref, s_ref, _ = _oracle_runs(64, "softplus")["recurrent"]
        o, s = jax.jit(functools.partial(kda_chunked, output_final_state=True))(
            **_on_host(inputs, jnp.float32)
        )
    else:
        inputs, (o_ref, s_ref) = _gate_case("normal")
        (_, (o, s)), _ = _outputs_and_state_grads(_on_host(inputs, jnp.float32))
    assert o.dtype == jnp.float32 and s.dtype == jnp.float32
    assert_close(o, o_ref, atol=1e-5, rtol=1e-4)
    assert_close(s, s_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.tpu
def test_bf16_inputs_float32_accumulation():
    inputs = random_kda_inputs(jax.random.key(12), 1, 256, 2, 32, 32, with_state=True)
    bf16 = {n: x if n == "initial_state" else _on_host({n: x}, jnp.bfloat16)[n]
            for n, x in inputs.items()}  # fmt: skip

    @jax.jit  # the forward, its reference and the gradients in one program
    def run(bf16):
        # "highest": every matmul in float32, the point here (the default, "input", feeds bf16
        # operands to the matmuls: tests/contracts/test_precision.py)
        o, s = kda_chunked(**bf16, output_final_state=True, precision="highest")
        # reference: the same bf16-rounded inputs, computed in float32
        ref = kda_recurrent(**cast_inputs(bf16, jnp.float32), output_final_state=True)
        grads = jax.grad(lambda x: jnp.sum(kda_chunked(**{**bf16, **x})[0].astype(jnp.float32)))(
            {n: bf16[n] for n in NAMES}
        )
        return (o, s), ref, grads

    (o, s), (o_ref, s_ref), grads = run(bf16)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    assert relative_l2(o, o_ref) < 1e-2
    assert_close(s, s_ref, atol=1e-4, rtol=1e-4)
    for name, grad in grads.items():
        assert grad.dtype == jnp.bfloat16 and np.isfinite(np.asarray(grad, np.float32)).all(), name


@pytest.mark.tpu
@ORACLE_PROGRAMS
def test_saturated_gates_are_finite_and_exact():
    """Gates at the lower bound, and softplus gates of order -1e8 (A = exp(20)): outputs and
    final states as the float64 oracle's, finite gradients. float64: the case and program of
    test_chunked_matches_float64_oracle[65] (a state; the streaming scan with gradients);
    float32 (default mode): those of test_float32_chunked_close_to_float64_oracle[300]."""

    def check(o, s, grads, o_ref, s_ref, tol, case):
        assert_close(o, o_ref, atol=tol, rtol=tol * 10, name=case)
        assert_close(s, s_ref, atol=tol, rtol=tol * 10, name=case)
        assert set(grads) == set(NAMES + ("initial_state",))
        for name, grad in grads.items():
            assert np.isfinite(np.asarray(grad)).all(), (case, name)

    for case in SATURATION_CASES:
        with jax.enable_x64(True):
            x, cot = _float64_case(65, "softplus")
            x = {**x, "g": _saturated(x["g"], case)}
            forms = _every_form(x, cot, grads=("recurrent", *GRADIENT_SCANS[65]))
        (o_ref, s_ref, _), (o, s, grads) = forms["recurrent"], forms["streaming"]
        assert o.dtype == jnp.float64
        check(o, s, grads, o_ref, s_ref, 1e-10, case)
        inputs, (o_ref, s_ref) = _gate_case(case)
        (_, (o, s)), grads = _outputs_and_state_grads(_on_host(inputs, jnp.float32))
        assert o.dtype == jnp.float32
        check(o, s, grads, o_ref, s_ref, 1e-5, case)


_PREFIX_INPUTS = random_kda_inputs(jax.random.key(21), 1, 160, 2, 16, 16)
_prefix_fn = jax.jit(lambda x: kda_chunked(**x)[0])


def _edit_from(base, prefix, seed, which):
    """``base`` with input ``which`` replaced by noise at t >= prefix (on the host: no
    compiled program per input)."""
    noise = np.random.default_rng(seed).uniform(size=base[which].shape).astype(np.float32)
    changed = {
        "g": -noise * 5.0,
        "beta": noise,
        "q": noise - 0.5,
        "k": noise - 0.5,
        "v": 10 * noise,
    }[which]
    edited = np.array(base[which])
    edited[:, prefix:] = changed[:, prefix:]
    return {**base, which: jnp.asarray(edited)}


@pytest.mark.tpu
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.integers(1, 159), seed=st.integers(0, 2**16), which=st.sampled_from(NAMES))
def test_prefix_invariance(prefix, seed, which):
    """Changing any input at t >= P leaves every output at t < P unchanged."""
    before = _prefix_fn(_PREFIX_INPUTS)
    after = _prefix_fn(_edit_from(_PREFIX_INPUTS, prefix, seed, which))
    assert_close(after[:, :prefix], before[:, :prefix], atol=1e-6, rtol=1e-6)


def test_unit_lower_inverse_exact(x64):
    a = jnp.tril(jax.random.normal(jax.random.key(0), (3, 64, 64), jnp.float64) * 0.3, -1)
    inv = jax.jit(unit_lower_inverse)(a)
    eye = np.eye(64)
    assert_close(
        np.asarray(inv) @ (eye + np.asarray(a)),
        np.broadcast_to(eye, (3, 64, 64)),
        atol=1e-10,
        rtol=0,
    )
    assert_close(
        jax.jit(unit_lower_inverse)(a[:, :8, :8]) @ (eye[:8][:, :8] + a[:, :8, :8]),
        np.broadcast_to(eye[:8, :8], (3, 8, 8)),
        atol=1e-12,
        rtol=0,
    )
    # a size the blocked product cannot serve is refused by name (engineer review: C = 12 gave
    # entries wrong by up to 1.3 with no error)
    for bad in (a[:, :12, :12], a[:, :8, :12], a[0, 0]):
        with pytest.raises(ValueError, match="unit_lower_inverse needs a"):
            unit_lower_inverse(bad)



@pytest.mark.parametrize("size", [16, 64, 256])
def test_unit_lower_inverse_holds_where_keys_share_a_direction(size):
    """Float32 ``(I + A)^-1`` for ``A = tril(beta K K^T, -1)``, keys ``base + 0.05 N(0, 1)``
    normalised, beta in [0.9, 1] (a Neumann series' worst case), within 1e-6 of the largest entry
    of NumPy's float64 inverse (measured 1.3 / 2.1 / 5.5e-7; 16-row Neumann blocks: 1.6 / 4.2 /
    5.8e-4, DESIGN section 4)."""
    rng = np.random.default_rng(size)
    keys = rng.standard_normal(128) + 0.05 * rng.standard_normal((4, size, 128))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    attn = np.tril(rng.uniform(0.9, 1.0, (4, size, 1)) * keys @ np.swapaxes(keys, -1, -2), -1)
    want = np.linalg.inv(np.eye(size) + attn)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(jax.jit(unit_lower_inverse)(jnp.asarray(attn, jnp.float32)), np.float64)
    assert np.abs(got - want).max() < 1e-6 * np.abs(want).max()

@ORACLE_PROGRAMS
def test_chunk_size_variants(x64):
    """The inputs and oracle run of test_chunked_matches_float64_oracle[200] (no state); every
    chunk size in one program."""
    inputs = _float64_case(200, "softplus")[0]
    o_ref = _oracle_runs(200, "softplus")["recurrent"][0]
    # C = 1 and 2 (one diagonal block, no merge), 16 (three merges of blocks), 32 (four,
    # several chunks), 128 (six, one padded chunk)
    sizes = (1, 2, 16, 32, 128)
    outputs = jax.jit(lambda x: [kda_chunked(**x, chunk_size=c)[0] for c in sizes])(inputs)
    for chunk_size, o in zip(sizes, outputs, strict=True):
        assert_close(o, o_ref, atol=1e-11, rtol=1e-9, name=f"chunk_size={chunk_size}")


@pytest.mark.parametrize("fn", [kda_chunked, kda_recurrent])
def test_bad_inputs_name_the_argument(fn):
    ok = random_kda_inputs(jax.random.key(0), 2, 10, 3, 4, 5)

    def call(**changes):
        return fn(**{**ok, **changes})

    with pytest.raises(ValueError, match=r"q must have shape \[B, T, H, K\]"):
        call(q=ok["q"][0])
    with pytest.raises(ValueError, match=r"k must have shape"):
        call(k=ok["k"][:, :, :2])
    with pytest.raises(ValueError, match=r"v must have shape \[B, T, HV, V\]"):
        call(v=ok["v"][:, :9])
    with pytest.raises(ValueError, match=r"g must have shape"):
        call(g=ok["g"][:1])
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\]"):
        call(beta=ok["beta"][..., None])
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        call(beta=ok["beta"] + 1.0)
    with pytest.raises(ValueError, match=r"g is a log-space decay and must be <= 0"):
        call(g=-ok["g"])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[B, HV, K, V\]"):
        call(initial_state=jnp.zeros((2, 3, 5, 4)))
    with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\]"):
        call(segment_ids=jnp.ones((2, 9), jnp.int32))
    with pytest.raises(ValueError, match="uses id 1 for two separate runs"):
        call(segment_ids=jnp.asarray([[1] * 4 + [2] * 3 + [1] * 3] * 2, jnp.int32))
    with pytest.raises(ValueError, match="uses id 3 for two separate runs"):
        call(segment_ids=jnp.asarray([[3] * 4 + [0] * 3 + [3] * 3] * 2, jnp.int32))
    with pytest.raises(ValueError, match="segment_ids must be an integer array"):
        call(segment_ids=jnp.ones((2, 10)))
    # allow_neg_eigval widens the beta range to [0, 2] (an eager call, as the value check needs;
    # kda_chunked at chunk_size=1, the fewest eager ops)
    call(
        beta=ok["beta"] * 2,
        allow_neg_eigval=True,
        **({"chunk_size": 1} if fn is kda_chunked else {}),
    )
    if fn is kda_chunked:
        with pytest.raises(ValueError, match="chunk_size must be a power of two"):
            call(chunk_size=48)
        with pytest.raises(ValueError, match="scan must be one of"):
            call(scan="parallel")  # checked with the arguments, before any chunk work


@functools.cache
def _isolation_values_and_grads(shortcut: bool):
    """Jitted ``(*arrays, ids) -> ((total, (arrays, flags)), grads)`` of kda_chunked's
    cond-guarded isolation (``shortcut``) or of isolate_non_finite; built once per worker, so
    the cases below share two compilations."""
    from kda_lib.ops.chunked import isolate_non_finite_if_any
    from kda_lib.ops.segments import isolate_non_finite

    fn = isolate_non_finite_if_any if shortcut else isolate_non_finite

    def total(*a):
        *arrays, flags = fn(*a)
        finite = [jnp.where(jnp.isfinite(y), y, 0.0) for y in arrays]
        return sum(jnp.sum(y * (i + 1.0)) for i, y in enumerate(finite)), (arrays, flags)

    return jax.jit(jax.value_and_grad(total, (0, 1, 2, 3, 4, 5), has_aux=True))


@pytest.mark.parametrize("bad", ["none", "nan_beta", "inf_v", "nan_q", "neg_inf_g", "inf_state"])
def test_isolate_non_finite_shortcut_equals_segments(bad):
    """kda_chunked's cond-guarded isolation gives isolate_non_finite's values, flags, gradients."""
    x = random_kda_inputs(jax.random.key(41), 2, 12, 2, 4, 3, with_state=True)
    x["k"] = x["k"].at[0, 3, 1, 2].set(0.0)  # an exact zero at a token that is replaced
    where = {
        "nan_beta": ("beta", (0, 3, 1), jnp.nan),
        "inf_v": ("v", (1, 5, 0, 2), jnp.inf),
        "nan_q": ("q", (0, 7, 1, 0), jnp.nan),
        "neg_inf_g": ("g", (1, 2, 0, 1), -jnp.inf),
        "inf_state": ("initial_state", (0, 1, 2, 1), jnp.inf),
    }.get(bad)
    if where is not None:
        name, index, value = where
        x[name] = x[name].at[index].set(value)
    ids = jnp.asarray(np.r_[np.full(5, 1), np.full(7, 2)][None].repeat(2, 0), jnp.int32)
    args = tuple(x[n] for n in NAMES + ("initial_state",)) + (ids,)
    (_, got), got_grads = _isolation_values_and_grads(True)(*args)
    (_, want), want_grads = _isolation_values_and_grads(False)(*args)
    got, want = (got, got_grads), (want, want_grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_custom_vjp_calling_itself_in_its_forward_rule_breaks_grad_of_grad_under_scan():
    """Why unit_lower_inverse's and _decayed_scores' forward rules call ``.fun``: in JAX 0.12 a
    custom_vjp whose forward rule calls the function itself and saves its inputs, inside a
    lax.scan differentiated twice, gets other values as its residuals (wrong values, no
    error; DESIGN section 4). The plain body (``.fun``) gives plain autodiff's values; the
    self-call's failure is asserted so that a JAX release fixing it is noticed."""

    def loss_with(forward_rule_calls_itself: bool):
        @jax.custom_vjp
        def f(x):
            return jnp.sin(x) * jnp.ones(x.shape)  # an input-free constant in the body

        call = f if forward_rule_calls_itself else f.fun
        f.defvjp(lambda x: (call(x), (x,)), lambda r, d: (d * jnp.cos(r[0]),))
        return _scanned_loss(f)

    x = jnp.linspace(0.1, 0.5, 6).reshape(3, 2)
    grad_of_grad = lambda loss: jax.grad(lambda x: jax.grad(loss)(x).sum())(x)  # noqa: E731
    want = grad_of_grad(_scanned_loss(jnp.sin))
    assert_close(grad_of_grad(loss_with(False)), want, atol=1e-6, rtol=1e-6)
    assert not jnp.allclose(grad_of_grad(loss_with(True)), want, atol=1e-3)


def _scanned_loss(f):
    def loss(x):
        def step(c, xi):
            y = f(xi * c)
            return c + y.sum(), y

        c, ys = jax.lax.scan(step, 1.0, x)
        return c + ys.sum()

    return loss
