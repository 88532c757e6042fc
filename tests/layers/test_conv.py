import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kda_lib.layers.conv import ShortConvolution, depthwise_causal_conv, kernel_from_torch
from kda_lib.testing import assert_close


def _numpy_conv(x, kernel, ids=None):
    batch, seq_len, _ = x.shape
    width = kernel.shape[0]
    out = np.zeros_like(x, dtype=np.float64)
    for b in range(batch):
        for t in range(seq_len):
            for w in range(width):
                src = t - (width - 1) + w
                if src < 0 or (ids is not None and ids[b, src] != ids[b, t]):
                    continue
                out[b, t] += kernel[w] * x[b, src]
    return out


def test_conv_matches_definition_and_torch_tap_order():
    x = np.random.default_rng(0).normal(size=(2, 9, 3))
    torch_weight = np.random.default_rng(1).normal(size=(3, 1, 4))  # [C, 1, W]
    kernel = kernel_from_torch(torch_weight)
    assert kernel.shape == (4, 3)
    np.testing.assert_array_equal(kernel[-1], torch_weight[:, 0, -1])  # last tap = current token
    got = depthwise_causal_conv(jnp.asarray(x), jnp.asarray(kernel))
    assert_close(got, _numpy_conv(x, kernel), atol=1e-5, rtol=1e-5)


def test_conv_taps_stop_at_segment_boundaries():
    x = np.random.default_rng(2).normal(size=(1, 10, 2))
    kernel = np.random.default_rng(3).normal(size=(4, 2))
    ids = np.array([[1, 1, 1, 2, 2, 0, 0, 3, 3, 3]])
    conv = jax.jit(lambda x, k, ids: depthwise_causal_conv(x, k, segment_ids=ids))  # one program
    got = conv(jnp.asarray(x), jnp.asarray(kernel), jnp.asarray(ids))
    assert_close(got, _numpy_conv(x, kernel, ids), atol=1e-5, rtol=1e-5)


def test_conv_state_continues_a_sequence():
    conv = ShortConvolution(6, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 11, 6))
    run = nnx.jit(lambda m, x, state=None: m(x, conv_state=state))  # one program per shape
    full, _ = run(conv, x)
    first, state = run(conv, x[:, :5])
    assert state.shape == (2, 3, 6)
    pieces = [first]
    for t in range(5, 11):
        y, state = run(conv, x[:, t : t + 1], state)
        pieces.append(y)
    assert_close(jnp.concatenate(pieces, 1), full, atol=1e-6, rtol=1e-6)
    # silu after the conv
    raw = jax.jit(depthwise_causal_conv)(x, conv.kernel[...])
    assert_close(full, jax.nn.silu(raw), atol=1e-6, rtol=1e-6)


def test_conv_errors():
    conv = ShortConvolution(4, 3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, 4\]"):
        conv(jnp.zeros((1, 5, 3)))
    with pytest.raises(ValueError, match=r"history must have shape \[B, W-1, C\]"):
        conv(jnp.zeros((1, 5, 4)), conv_state=jnp.zeros((1, 3, 4)))
    with pytest.raises(ValueError, match=r"\[C, 1, W\]"):
        kernel_from_torch(np.zeros((4, 2, 3)))


def _taps_by_autodiff(x, kernel, history, ids, history_ids):
    """The conv's definition as plain shifted products, for JAX to differentiate."""
    width, seq_len = kernel.shape[0], x.shape[1]
    padded = jnp.concatenate([history, x], axis=1)
    padded_ids = jnp.concatenate([history_ids, ids], axis=1)
    out = 0.0
    for w in range(width):
        same = padded_ids[:, w : w + seq_len] == ids
        out = out + jnp.where(same[..., None], padded[:, w : w + seq_len], 0) * kernel[w]
    return out


# width 1: no taps before the current token (no history); 4: the layers' width, its history of
# 3 taps the code every width > 1 runs (2, one tap, was a third row of the same code)
@pytest.mark.parametrize("width", [1, 4])
def test_conv_gradient_matches_autodiff_with_history_and_segments(width):
    # the conv's gradient against JAX's derivative of the definition: inputs, kernel and the
    # history (the CP halo) all get gradients, and no gradient crosses a segment boundary
    keys = jax.random.split(jax.random.key(4), 5)
    x = jax.random.normal(keys[0], (2, 13, 5))
    kernel = jax.random.normal(keys[1], (width, 5))
    history = jax.random.normal(keys[2], (2, width - 1, 5))
    ids = jnp.array([[1] * 5 + [2] * 4 + [0] * 2 + [3] * 2, [2] * 13])
    history_ids = jnp.array([[1] * (width - 1), [1] * (width - 1)])  # row 2 starts a segment
    cotangent = jax.random.normal(keys[3], x.shape)

    def loss(conv, *args):
        return jnp.sum(conv(*args) * cotangent)

    def ours(x, kernel, history):
        return depthwise_causal_conv(
            x, kernel, history=history, segment_ids=ids, history_segment_ids=history_ids
        )

    def reference(x, kernel, history):
        return _taps_by_autodiff(x, kernel, history, ids, history_ids)

    # jitted: op by op, each small op would compile on its own at these shapes
    got, want = (
        jax.jit(jax.grad(functools.partial(loss, conv), argnums=(0, 1, 2)))(x, kernel, history)
        for conv in (ours, reference)
    )
    for name, a, b in zip(("d_x", "d_kernel", "d_history"), got, want, strict=True):
        assert_close(a, b, atol=1e-5, rtol=1e-5, name=name)
    if width > 1:  # row 2's history is another segment: it gets no gradient
        assert float(jnp.max(jnp.abs(got[2][1]))) == 0.0
        assert float(jnp.max(jnp.abs(got[2][0]))) > 0.0
    # and without segments, as the jitted layer calls it
    plain = jax.jit(jax.grad(lambda x, k: jnp.sum(depthwise_causal_conv(x, k) * cotangent)))
    ones = jnp.ones_like(ids)
    no_history = jnp.zeros_like(history)

    def plain_reference(x, k):
        return jnp.sum(_taps_by_autodiff(x, k, no_history, ones, ones[:, : width - 1]) * cotangent)

    want_plain = jax.jit(jax.grad(plain_reference))(x, kernel)
    assert_close(plain(x, kernel), want_plain, atol=1e-5, rtol=1e-5, name="d_x without segments")


def test_conv_gradient_keeps_low_precision_dtypes():
    x = jax.random.normal(jax.random.key(0), (1, 8, 4)).astype(jnp.bfloat16)
    kernel = jax.random.normal(jax.random.key(1), (4, 4))
    grad = jax.grad(lambda x, k: jnp.sum(depthwise_causal_conv(x, k)), argnums=(0, 1))
    d_x, d_kernel = jax.jit(grad)(x, kernel)  # one program
    assert d_x.dtype == jnp.bfloat16 and d_kernel.dtype == jnp.float32


def test_conv_supports_forward_mode_autodiff():
    # linear in x: the tangent of the output is the conv of the tangent (with segments too)
    x, t = (jax.random.normal(jax.random.key(i), (1, 10, 2)) for i in (5, 6))
    kernel = jax.random.normal(jax.random.key(7), (4, 2))
    ids = jnp.asarray([[1, 1, 1, 2, 2, 0, 0, 3, 3, 3]])
    conv = functools.partial(depthwise_causal_conv, kernel=kernel, segment_ids=ids)
    _, tangent = jax.jit(lambda x, t: jax.jvp(conv, (x,), (t,)))(x, t)  # one program
    assert_close(tangent, jax.jit(conv)(t), atol=1e-6, rtol=1e-6)
