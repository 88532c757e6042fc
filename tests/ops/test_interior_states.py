"""Interior states: ``output_chunk_states`` (prefix caching) and ``output_token_states``
(speculative decoding) against the recurrence's final state on every prefix.

The oracle for the state after token ``e - 1`` is :func:`kda_recurrent`'s final state on the
first ``e`` tokens (same initial state, same segment ids, the tokens from ``e`` on padding):
one vmapped scan for all prefixes, in one compiled program. Shapes are small (B = 2, T = 72,
chunk 16: four full chunks and a partial one; H = 2 q/k heads, HV = 4 value heads; K = 16, V = 8).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib import kda, kda_chunked, kda_recurrent
from kda_lib.ops.contract import KDAResult
from kda_lib.testing import assert_close, relative_l2

B, T, H, HV, K, V, C = 2, 72, 2, 4, 16, 8, 16  # K != V: the default scale is K's
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
ENDS = tuple(range(C, T + 1, C))  # prefix lengths of the full chunks: 16, 32, 48, 64


def _inputs(seed=0):
    """Grouped value heads (HV = 2 H), a log-space gate, an initial state; float32 numpy."""
    rng = np.random.default_rng(seed)
    qk = rng.normal(size=(2, B, T, H, K))
    qk /= np.linalg.norm(qk, axis=-1, keepdims=True)
    return dict(
        q=qk[0].astype(np.float32),
        k=qk[1].astype(np.float32),
        v=rng.normal(size=(B, T, HV, V)).astype(np.float32),
        g=(-0.3 * rng.uniform(size=(B, T, HV, K))).astype(np.float32),
        beta=(1 / (1 + np.exp(-rng.normal(size=(B, T, HV))))).astype(np.float32),
        initial_state=(0.5 * rng.normal(size=(B, HV, K, V))).astype(np.float32),
    )


def _float64(x):
    """``x``'s arrays as float64 (cast on the host: no compiled casts; use under x64)."""
    return {n: jnp.asarray(np.asarray(a).astype(np.float64)) for n, a in x.items()}


def _segment_ids():
    """Row 0: a document starting inside chunk 1 (token 20), one starting exactly at the
    boundary of chunks 1 and 2 (token 32), padding over the boundary at 48 (44..51), a fourth
    after it. Row 1: leading padding through the first boundary, then one document."""
    ids = np.ones((B, T), np.int32)
    ids[0, 20:32] = 2
    ids[0, 32:44] = 3
    ids[0, 44:52] = 0
    ids[0, 52:] = 4
    ids[1, :18] = 0
    ids[1, 18:] = 7
    return ids


FORMS = {
    "chunked": functools.partial(kda, implementation="chunked", chunk_size=C),
    "associative": functools.partial(kda_chunked, scan="associative", chunk_size=C),
    "recurrent": functools.partial(kda, implementation="recurrent", chunk_size=C),
}


def _prefix_finals(x, segment_ids, ends):
    """``[B, len(ends), HV, K, V]``: the recurrence's final state on each prefix ``[:e]``, as its
    final state with every token from ``e`` on made padding (id 0: no decay, no write), one
    scan for all prefixes (vmapped over ``ends``)."""
    ids = jnp.ones((B, T), jnp.int32) if segment_ids is None else segment_ids
    cut = jnp.stack([jnp.where(jnp.arange(T) < e, ids, 0) for e in ends])

    def final(ids):
        return kda_recurrent(**x, segment_ids=ids, output_final_state=True)[1]

    return jnp.moveaxis(jax.vmap(final)(cut), 0, 1)


def _loss_parts(form, x, segment_ids, cot):
    """``(loss, (o, chunk_states))`` of a form, loss = <o, cot_o> + <chunk_states, cot_s>."""
    if form == "oracle":
        o, _ = kda_recurrent(**x, segment_ids=segment_ids)
        states = _prefix_finals(x, segment_ids, ENDS)
    else:
        result = FORMS[form](**x, segment_ids=segment_ids, output_chunk_states=True)
        assert isinstance(result, KDAResult) and result.token_states is None
        o, states = result.output, result.chunk_states
    loss = jnp.sum(o.astype(cot["o"].dtype) * cot["o"]) + jnp.sum(states * cot["s"])
    return loss, (o, states)


@functools.partial(jax.jit, static_argnames=("forms",))
def _values_and_grads(x, segment_ids, cot, forms):
    return {
        f: jax.value_and_grad(functools.partial(_loss_parts, f), has_aux=True)(x, segment_ids, cot)
        for f in forms
    }


def _cotangents(dtype):
    rng = np.random.default_rng(5)
    return dict(
        o=jnp.asarray(rng.normal(size=(B, T, HV, V)), dtype),
        s=jnp.asarray(rng.normal(size=(B, len(ENDS), HV, K, V)), dtype),
    )


ALL = ("oracle", *FORMS)  # one program per dtype, shared by the tests below
SHARED_PROGRAMS = pytest.mark.xdist_group("interior_states_programs")  # compiled once


@SHARED_PROGRAMS
@pytest.mark.parametrize("segments", [False, True], ids=["one-document", "segments"])
def test_chunk_states_equal_the_recurrence_on_each_prefix_float64(x64, segments):
    """Every form's chunk state i is the final state of the prefix (i + 1) * C, with an
    initial state and grouped value heads; outputs and every input's gradient through the
    chunk states (and the outputs) agree with the float64 oracle. Every form (chunked, the
    associative scan, recurrent), with segments and without (the segment-free path; T not a
    multiple of the chunk)."""
    x = _float64(_inputs())
    ids = jnp.asarray(_segment_ids()) if segments else None
    forms = ALL
    runs = _values_and_grads(x, ids, _cotangents(jnp.float64), forms)
    (_, (o_ref, s_ref)), g_ref = runs["oracle"]
    assert s_ref.shape == (B, T // C, HV, K, V)
    for form in forms[1:]:
        (_, (o, s)), grads = runs[form]
        assert_close(o, o_ref, atol=1e-11, rtol=1e-9, name=f"o ({form})")
        assert_close(s, s_ref, atol=1e-11, rtol=1e-9, name=f"chunk_states ({form})")
        for n in NAMES:
            assert_close(grads[n], g_ref[n], atol=1e-10, rtol=1e-8, name=f"d{n} ({form})")


@SHARED_PROGRAMS
def test_chunk_states_float32_and_bf16_close_to_the_oracle():
    """float32 inputs: chunk states and gradients against the float64 oracle. bf16 inputs:
    chunk states (float32) and gradients against the float64 oracle on the same bf16-rounded
    inputs. The oracle is the float64 test's program."""

    def oracle(x):
        with jax.enable_x64(True):
            return _values_and_grads(_float64(x), ids, _cotangents(jnp.float64), ALL)["oracle"]

    x = {n: jnp.asarray(a) for n, a in _inputs(1).items()}
    ids = jnp.asarray(_segment_ids())
    runs = _values_and_grads(x, ids, _cotangents(jnp.float32), tuple(FORMS))
    (_, (_, s_ref)), g_ref = oracle(x)
    for form in FORMS:
        (_, (_, s)), grads = runs[form]
        assert s.dtype == jnp.float32
        assert_close(s, s_ref, atol=1e-5, rtol=1e-4, name=f"chunk_states ({form})")
        for n in NAMES:
            assert relative_l2(grads[n], g_ref[n]) < 1e-5, (form, n)

    bf16 = {n: a if n == "initial_state" else a.astype(jnp.bfloat16) for n, a in _inputs(2).items()}
    (_, (_, s)), grads = _values_and_grads(bf16, ids, _cotangents(jnp.float32), ("chunked",))[
        "chunked"
    ]
    (_, (_, s_ref)), g_ref = oracle(bf16)
    assert s.dtype == jnp.float32
    assert relative_l2(s, s_ref) < 1e-2
    for n in NAMES:
        assert relative_l2(np.asarray(grads[n], np.float32), g_ref[n]) < 2e-2, n


@jax.jit
def _boundary_cases(x, ids, x_alone):
    return (
        kda(**x, segment_ids=ids, chunk_size=C, output_chunk_states=True).chunk_states,
        kda(**x_alone, chunk_size=C, output_final_state=True)[1],
    )


def test_boundary_state_is_the_state_of_the_segment_running_there():
    """Row 0 of :func:`_segment_ids`: the state at boundary 32 is document 2's own (tokens
    20..31 from zero: the initial state belongs to the first document only), not zero though
    document 3 starts right after it; at boundary 48 (inside padding) it is document 3's state
    after its last token 43; a document starting inside a chunk does not see the one before."""
    x = _inputs(3)  # numpy: slices and changes on the host (eagerly: a program each)
    ids = jnp.asarray(_segment_ids())
    doc2 = {n: x[n][:, 20:32] for n in NAMES if n != "initial_state"}
    doc3 = {n: x[n][:, 32:44] for n in NAMES if n != "initial_state"}
    states, alone2 = _boundary_cases(x, ids, doc2)
    _, alone3 = _boundary_cases(x, ids, doc3)
    assert_close(states[0, 1], alone2[0], atol=1e-5, rtol=1e-4, name="boundary 32")
    assert_close(states[0, 2], alone3[0], atol=1e-5, rtol=1e-4, name="boundary 48")
    # changing document 1 changes boundary 16 only
    x2 = dict(x, v=x["v"].copy())
    x2["v"][0, :20] += 1.0
    states2, _ = _boundary_cases(x2, ids, doc2)
    assert not np.allclose(states2[0, 0], states[0, 0])
    np.testing.assert_array_equal(states2[0, 1:], states[0, 1:])
    # row 1 starts with padding through boundary 16: the initial state stands there
    np.testing.assert_array_equal(states[1, 0], x["initial_state"][1])


@SHARED_PROGRAMS
def test_chunk_states_non_finite_where_the_recurrence_is():
    """A NaN column of the initial state: the chunked forms' chunk states are NaN exactly where
    the recurrence's are (that column, while the first document runs). The float32 program of
    the test above (its gradients unused)."""
    x = _inputs(4)  # numpy
    x["initial_state"][:, 1, :, 3] = np.nan
    ids = jnp.asarray(_segment_ids())
    runs = _values_and_grads(x, ids, _cotangents(jnp.float32), tuple(FORMS))
    ref = np.asarray(runs["recurrent"][0][1][1])
    nan = np.isnan(ref)
    assert nan.any() and not nan.all()
    for form in ("chunked", "associative"):
        got = np.asarray(runs[form][0][1][1])
        np.testing.assert_array_equal(np.isnan(got), nan, err_msg=form)
        np.testing.assert_allclose(got[~nan], ref[~nan], atol=1e-5, err_msg=form)


def test_short_inputs_have_no_chunk_states_and_the_pair_is_unchanged():
    x = {n: jnp.asarray(a)[:, :10] if n != "initial_state" else jnp.asarray(a)
         for n, a in _inputs().items()}  # fmt: skip
    result = kda(**x, chunk_size=C, output_chunk_states=True)
    assert result.chunk_states.shape == (B, 0, HV, K, V) and result.final_state is None
    plain = kda(**x, chunk_size=C)
    assert isinstance(plain, tuple) and not isinstance(plain, KDAResult) and len(plain) == 2


def test_implementations_without_interior_states_refuse_them_by_name():
    x = {n: jnp.asarray(a) for n, a in _inputs().items()}
    for name in ("tokamax_xla", "tokamax_xla_chunked"):
        with pytest.raises(ValueError, match=f"{name} returns no interior states"):
            kda(**x, implementation=name, output_chunk_states=True)
    with pytest.raises(ValueError, match="output_token_states needs implementation='recurrent'"):
        kda(**x, implementation="chunked", output_token_states=True)
    with pytest.raises(ValueError, match="output_chunk_states must be a bool, got 1"):
        kda(**x, output_chunk_states=1)
    with pytest.raises(ValueError, match="output_chunk_states must be a bool"):
        kda_chunked(**x, output_chunk_states="yes")
    with pytest.raises(ValueError, match="output_token_states must be a bool"):
        kda_recurrent(**x, output_token_states=None)


def test_token_states_too_large_for_memory_are_refused_by_name():
    """kda_recurrent(output_token_states=True) estimates the token states before any work
    (here ~1 TiB from abstract inputs: nothing is allocated or compiled)."""
    b, t, h, k = 1, 2**20, 16, 128
    x = {n: jax.ShapeDtypeStruct((b, t, h, k), jnp.float32) for n in ("q", "k", "v", "g")}
    x["beta"] = jax.ShapeDtypeStruct((b, t, h), jnp.float32)
    says = (
        r"^output_token_states=True: token_states \[B, T, HV, K, V\] = "
        r"\[1, 1048576, 16, 128, 128\] would take ~1\.0"
    )
    with pytest.raises(ValueError, match=says):
        jax.eval_shape(functools.partial(kda_recurrent, output_token_states=True), **x)


@jax.jit
def _token_runs(x, ids):
    ends = (1, 7, 20, 21, 32, 48, 50, T)

    def loss(x, oracle):
        if oracle:
            states = _prefix_finals(x, ids, ends)
        else:
            result = kda(**x, segment_ids=ids, output_token_states=True)
            states = result.token_states[:, jnp.asarray(ends) - 1]
        return jnp.sum(states * jnp.arange(states.size).reshape(states.shape) % 7), states

    return [jax.value_and_grad(loss, has_aux=True)(x, o) for o in (False, True)]


def test_token_states_equal_the_recurrence_on_each_prefix(x64):
    """``kda(output_token_states=True)`` (``"auto"`` picks the scan at any T): the state after
    token t is the final state of the prefix t + 1, across document starts and padding;
    gradients through the token states too."""
    x = _float64(_inputs(6))
    ((_, got), g_got), ((_, ref), g_ref) = _token_runs(x, jnp.asarray(_segment_ids()))
    assert_close(got, ref, atol=1e-12, rtol=1e-12, name="token_states")
    for n in NAMES:
        assert_close(g_got[n], g_ref[n], atol=1e-12, rtol=1e-10, name=f"d{n}")
