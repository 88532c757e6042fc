"""Packed batches cannot leak: non-finite inputs and padding, for every implementation and CP.

Property tests (hypothesis) on packed batches of random segments with padding runs:

* a NaN or inf injected at real tokens makes exactly the outputs non-finite that the
  token-by-token recurrence makes non-finite (that token's segment, from that token on; one
  channel for a value channel, one token for a query), in every implementation and in context
  parallelism, where a chunk's matmuls would otherwise spread it (``0 * NaN = NaN``);
* whatever sits at padding positions (NaN, inf, 1e30) changes no output, no final state and no
  gradient of a real token, padding outputs are 0 and padding gets zero gradients.

Huge finite values at real tokens are left out of the first property on purpose: whether
``1e30 * 1e30`` overflows depends on the order of operations, which differs between forms.
Shapes are fixed so that each implementation compiles once (ids and values are arguments).
kda_lib's forms (and CP) compile one program, outputs, final state and gradients, for all three
properties (its forward is the forward alone: the chunked form's hand-written derivatives keep
their pieces' forward); tokamax's forms are checked forward alone as well.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

from kda_lib import kda
from kda_lib.parallel.context_parallel import kda_context_parallel, shard_as
from kda_lib.testing import random_kda_inputs

B, T, H, K, V = 2, 40, 2, 8, 8
CHUNK = 16  # several chunks, and T not a multiple of the chunk
RANKS = 4
LOWER_BOUND = -5.0  # the fused safe gate: tokamax_xla_chunked needs it
IMPLEMENTATIONS = ("chunked", "tokamax_xla", "tokamax_xla_chunked")
ARRAYS = ("q", "k", "v", "g", "beta")
BAD_REAL = (np.nan, np.inf, -np.inf)
BAD_PADDING = (np.nan, np.inf, -np.inf, 1e30, -1e30)

# the properties share each implementation's compiled programs (and the recurrence's, their
# reference): one worker compiles each once
pytestmark = pytest.mark.xdist_group("non_finite_programs")

INPUTS = random_kda_inputs(jax.random.key(0), B, T, H, K, V, gate="raw", with_state=True)
GATE = dict(a_log=INPUTS["a_log"], dt_bias=INPUTS["dt_bias"], lower_bound=LOWER_BOUND)
GATE.update(use_gate_in_kernel=True)


@functools.cache
def _kernel(implementation):
    # runs are >= 3 tokens long: at most 14 segments per row
    extra = {"max_num_segments": 14} if implementation.startswith("tokamax") else {}

    @jax.jit
    def run(q, k, v, g, beta, initial_state, segment_ids):
        return kda(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            output_final_state=True,
            segment_ids=segment_ids,
            chunk_size=64 if implementation.startswith("tokamax") else CHUNK,
            implementation=implementation,
            **GATE,
            **extra,
        )

    return run


@functools.cache
def _context_parallel():
    mesh = jax.make_mesh((RANKS,), ("context",), devices=jax.devices()[:RANKS])
    seq = P(None, "context")

    def local(q, k, v, g, beta, initial_state, segment_ids):
        return kda_context_parallel(
            q,
            k,
            v,
            g,
            beta,
            axis_name="context",
            segment_ids=segment_ids,
            implementation="chunked",
            chunk_size=CHUNK // 4,
            initial_state=initial_state,
            output_final_state=True,
            **GATE,
        )

    specs = (seq,) * 5 + (P(), seq)
    fn = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(seq, P()))
    return jax.jit(lambda *a: fn(*(shard_as(x, mesh, s) for x, s in zip(a, specs, strict=True))))


@st.composite
def packed_ids(draw):
    """``[B, T]`` ids: runs of documents (fresh ids) and padding, in random lengths."""
    rows = []
    for _ in range(B):
        row, next_id = [], 1
        while len(row) < T:
            length = draw(st.integers(3, 12))
            padding = draw(st.booleans()) and draw(st.booleans())  # a quarter are padding
            row += [0 if padding else next_id] * length
            next_id += 0 if padding else 1
        rows.append(row[:T])
    return np.asarray(rows, np.int32)


@st.composite
def injections(draw, ids, *, at_padding: bool):
    """A few ``(array, b, t, h, channel, value)``: positions of the given kind."""
    positions = np.argwhere(ids == 0) if at_padding else np.argwhere(ids != 0)
    if len(positions) == 0:
        return []
    values = BAD_PADDING if at_padding else BAD_REAL
    found = []
    for _ in range(draw(st.integers(1, 4))):
        b, t = positions[draw(st.integers(0, len(positions) - 1))]
        name = draw(st.sampled_from(ARRAYS))
        h = draw(st.integers(0, H - 1))
        channel = draw(st.integers(0, (V if name == "v" else K) - 1))
        found.append((name, int(b), int(t), h, channel, draw(st.sampled_from(values))))
    return found


def _inject(found):
    arrays = {n: np.array(INPUTS[n]) for n in ARRAYS}
    for name, b, t, h, channel, value in found:
        if name == "beta":
            arrays[name][b, t, h] = value
        else:
            arrays[name][b, t, h, channel] = value
    return [jnp.asarray(arrays[n]) for n in ARRAYS]


def _run(implementation, arrays, ids):
    args = (*arrays, INPUTS["initial_state"], ids)
    if implementation == "context_parallel":
        return _context_parallel()(*args)
    return _kernel(implementation)(*args)


@functools.cache
def _loss_and_grads(implementation):
    """Jitted ``(arrays, ids) -> (o, final_state, grads of sum(o^2) + sum(s^2))``."""

    def loss(arrays, ids):
        o, s = _run(implementation, arrays, ids)
        return jnp.sum(o * o) + jnp.sum(s * s), (o, s)

    def run(arrays, ids):
        (_, (o, s)), grads = jax.value_and_grad(loss, has_aux=True)(arrays, ids)
        return o, s, grads

    return jax.jit(run)


def _values(implementation, arrays, ids):
    """``(o, final_state)``: tokamax's forward alone; kda_lib's from :func:`_loss_and_grads`'
    program (its gradients unused), which the padding property compiles anyway."""
    if implementation.startswith("tokamax"):
        return _run(implementation, arrays, ids)
    o, s, _ = _loss_and_grads(implementation)(arrays, ids)
    return o, s


@pytest.mark.slow
@pytest.mark.parametrize("implementation", (*IMPLEMENTATIONS, "context_parallel"))
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_non_finite_footprint_equals_the_recurrence(implementation, data):
    ids = data.draw(packed_ids())
    found = data.draw(injections(ids, at_padding=False))
    arrays = _inject(found)
    o_ref, s_ref = _values("recurrent", arrays, jnp.asarray(ids))
    o, s = _values(implementation, arrays, jnp.asarray(ids))
    np.testing.assert_array_equal(~np.isfinite(o), ~np.isfinite(o_ref), err_msg=str(found))
    # the final state: the same columns non-finite
    bad_columns = lambda x: ~np.isfinite(np.asarray(x)).all(-2)  # noqa: E731
    np.testing.assert_array_equal(bad_columns(s), bad_columns(s_ref), err_msg=str(found))
    finite = np.isfinite(o_ref)
    np.testing.assert_allclose(np.asarray(o)[finite], np.asarray(o_ref)[finite], atol=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ("recurrent", *IMPLEMENTATIONS, "context_parallel"))
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_padding_values_change_nothing(implementation, data):
    ids = data.draw(packed_ids())
    found = data.draw(injections(ids, at_padding=True))
    clean = _loss_and_grads(implementation)(_inject([]), jnp.asarray(ids))
    dirty = _loss_and_grads(implementation)(_inject(found), jnp.asarray(ids))
    real = ids != 0
    o_clean, s_clean, g_clean = clean
    o, s, grads = dirty
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_clean), err_msg=str(found))
    np.testing.assert_array_equal(np.asarray(o)[~real], 0.0)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(s_clean))
    for name, grad, grad_clean in zip(ARRAYS, grads, g_clean, strict=True):
        grad, grad_clean = np.asarray(grad), np.asarray(grad_clean)
        assert np.isfinite(grad).all(), (name, found)
        np.testing.assert_array_equal(grad[~real], 0.0, err_msg=f"{name} {found}")
        np.testing.assert_array_equal(grad[real], grad_clean[real], err_msg=f"{name} {found}")


@pytest.mark.tpu
def test_the_layer_keeps_a_bad_token_in_its_segment_under_jit():
    from flax import nnx

    from kda_lib import KDAConfig, KimiDeltaAttention

    ids = jnp.asarray([[1] * 40 + [2] * 30 + [1] * 30])  # the reused id is a third segment
    x = jax.random.normal(jax.random.key(1), (1, 100, 16)).at[0, 5, 3].set(jnp.nan)
    outputs = {}
    for implementation in ("recurrent", "chunked"):
        config = KDAConfig(hidden_size=16, num_heads=2, head_dim=8, implementation=implementation)
        layer = KimiDeltaAttention(config, rngs=nnx.Rngs(0))
        outputs[implementation] = np.asarray(
            nnx.jit(lambda m, x, ids: m(x, segment_ids=ids))(layer, x, ids)
        )
    bad = ~np.isfinite(outputs["chunked"]).all(-1)[0]
    np.testing.assert_array_equal(np.nonzero(bad)[0], np.arange(5, 40))  # its segment, from t=5
    np.testing.assert_array_equal(bad, ~np.isfinite(outputs["recurrent"]).all(-1)[0])
    finite = ~bad
    np.testing.assert_allclose(
        outputs["chunked"][0, finite], outputs["recurrent"][0, finite], atol=2e-5
    )


# issue 30: a huge finite key (its squared norm overflows float32) at a real token. The
# recurrence is non-finite from that token on in its segment; the chunked forms spread the
# overflow through their matmuls (0 * inf) to every token of the chunk, earlier tokens and
# other segments included, unless the key is isolated like a NaN one.
HUGE_KEYS = (1e20, -1e20, 1e25, 3e38)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", (*IMPLEMENTATIONS, "context_parallel"))
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_huge_key_stays_in_its_segment_from_its_token_on(implementation, data):
    ids = data.draw(packed_ids())
    real = np.argwhere(ids != 0)
    b, t = (int(i) for i in real[data.draw(st.integers(0, len(real) - 1))])
    h = data.draw(st.integers(0, H - 1))
    scale = data.draw(st.sampled_from(HUGE_KEYS))
    clean = [jnp.asarray(INPUTS[n]) for n in ARRAYS]
    arrays = list(clean)
    arrays[1] = arrays[1].at[b, t, h].multiply(scale)  # the whole key vector
    o_clean, s_clean = (np.asarray(x) for x in _values(implementation, clean, jnp.asarray(ids)))
    o, s = (np.asarray(x) for x in _values(implementation, arrays, jnp.asarray(ids)))
    # its segment from t on (the segment runs until the id changes; padding inside a document
    # does not end it, but padding outputs are 0) is non-finite (NaN; the recurrence has inf or
    # NaN there, in some channels), everything else is exactly as without the huge key
    segment = np.zeros(T, bool)
    end = t
    while end < T and ids[b, end] in (ids[b, t], 0):
        end += 1
    segment[t:end] = ids[b, t:end] != 0
    affected = np.zeros(o.shape, bool)
    affected[b, segment, h] = True
    where = (implementation, b, t, h, scale, ids[b].tolist())
    assert np.isfinite(o[~affected]).all(), where
    # kda_lib's forms are exact; tokamax's kernel is not bit-for-bit causal: the adapter's
    # finite stand-in for the key changes the rounding of a few other outputs by an ulp
    exact = functools.partial(np.testing.assert_array_equal, err_msg=str(where))
    if implementation.startswith("tokamax"):
        exact = functools.partial(np.testing.assert_allclose, rtol=0, atol=1e-6, err_msg=str(where))
    exact(o[~affected], o_clean[~affected])
    assert not np.isfinite(o[affected]).any(), where
    last = not np.any(ids[b, end:] != 0)  # t's segment is the row's last: its state too
    if not last:
        exact(s, s_clean)
    else:
        keep = np.ones(s.shape, bool)
        keep[b, h] = False
        exact(s[keep], s_clean[keep])
        assert not np.isfinite(s[b, h]).all(), where
