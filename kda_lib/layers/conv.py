"""ShortConvolution: the depthwise causal convolution KDA applies to q, k and v.

    y[t, c] = silu( sum_w kernel[w, c] * x[t - (W - 1) + w, c] )

``kernel [W, C]``, ``kernel[W - 1]`` multiplying the current token: PyTorch ``Conv1d``'s tap
order (:func:`kernel_from_torch` converts its ``[C, 1, W]`` weight, no flip). Taps never cross
a segment boundary; the ``W - 1`` inputs before x are the decode conv state, or the halo a
context-parallel rank receives from its predecessors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import check_array
from kda_lib.ops.contract import check_segment_ids
from kda_lib.ops.segments import canonical_segment_ids, first_segment_id


def depthwise_causal_conv(
    x: jax.Array,
    kernel: jax.Array,
    *,
    history: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    history_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Depthwise causal conv, no activation: x ``[B, T, C]``, kernel ``[W, C]`` -> ``[B, T, C]``
    in the promoted dtype of x and kernel.

    Args:
      history: ``[B, W-1, C]`` inputs just before x (decode conv state, CP halo); zeros if None.
      segment_ids: ``[B, T]`` int, 0 = padding: taps only combine tokens of one segment (the
        rule of :mod:`kda_lib.ops.segments`).
      history_segment_ids: ``[B, W-1]`` ids of ``history``, numbered together with segment_ids
        (default: the history belongs to each row's first segment).
    """
    width = kernel.shape[0]
    batch, seq_len, channels = x.shape
    if kernel.shape != (width, channels):
        raise ValueError(f"kernel must have shape [W, C]=(W, {channels}), got {kernel.shape}")
    if history is None:
        history = jnp.zeros((batch, width - 1, channels), x.dtype)
    elif history.shape != (batch, width - 1, channels):
        raise ValueError(
            f"history must have shape [B, W-1, C]={(batch, width - 1, channels)}, "
            f"got {history.shape}"
        )
    if segment_ids is not None:
        check_array("segment_ids", segment_ids)
        check_segment_ids(segment_ids, batch, seq_len)
    dtype = jnp.promote_types(x.dtype, kernel.dtype)
    padded = jnp.concatenate([history.astype(x.dtype), x], axis=1).astype(dtype)
    # inside shard_map the kernel must vary over the same mesh axes as the inputs, so that its
    # gradient (a sum over this rank's tokens) is summed over the ranks
    kernel = kernel.astype(dtype) + jnp.zeros_like(padded[0, :1])
    # canonical ids: equal ids mean one segment, and a real token never reads padding
    ids = None
    if segment_ids is not None and width > 1:
        ids = _window_ids(segment_ids, history_segment_ids, width)
    out = jnp.zeros((batch, seq_len, channels), dtype)
    for w in range(width):  # shifted taps, not lax.conv: its gradient is ~4x slower on CPU
        tap = padded[:, w : w + seq_len]
        if ids is not None and w < width - 1:  # (the current token's own tap is never masked)
            tap = jnp.where((ids[:, w : w + seq_len] == ids[:, width - 1 :])[..., None], tap, 0)
        out = out + tap * kernel[w]
    return out


def _window_ids(segment_ids, history_segment_ids, width: int) -> jax.Array:
    """Canonical ids ``[B, W-1+T]`` of the history and x's tokens, numbered together (host ids
    on the host, before any conversion could wrap int64 ids)."""
    if history_segment_ids is None:
        ids = canonical_segment_ids(segment_ids)
        history = jnp.repeat(first_segment_id(ids)[:, None], width - 1, axis=1)
        return jnp.concatenate([history, ids], axis=1)
    check_array("history_segment_ids", history_segment_ids)
    want = (segment_ids.shape[0], width - 1)
    if history_segment_ids.shape != want or not jnp.issubdtype(
        history_segment_ids.dtype, jnp.integer
    ):
        raise ValueError(
            f"history_segment_ids must be an integer array of shape [B, W-1]={want}, got "
            f"{history_segment_ids.dtype} {tuple(history_segment_ids.shape)}"
        )
    both = (history_segment_ids, segment_ids)
    if any(isinstance(a, jax.Array) for a in both):
        return canonical_segment_ids(jnp.concatenate([jnp.asarray(a) for a in both], axis=1))
    return canonical_segment_ids(np.concatenate(both, axis=1))


def kernel_from_torch(weight) -> np.ndarray:
    """PyTorch depthwise ``Conv1d`` weight ``[C, 1, W]`` -> kda_lib kernel ``[W, C]``."""
    weight = np.asarray(weight)
    if weight.ndim != 3 or weight.shape[1] != 1:
        raise ValueError(
            f"expected a depthwise Conv1d weight of shape [C, 1, W], got {weight.shape}"
        )
    return weight[:, 0, :].T


class ShortConvolution(nnx.Module):
    """Depthwise causal conv + SiLU over ``[B, T, C]``, no bias: ``channels`` C, ``conv_size``
    W (default 4), ``dtype`` the compute dtype (None: the input's), ``param_dtype`` the
    kernel's (float32)."""

    def __init__(
        self,
        channels: int,
        conv_size: int = 4,
        *,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        if conv_size < 1:
            raise ValueError(f"conv_size must be >= 1, got {conv_size}")
        self.channels = channels
        self.conv_size = conv_size
        self.dtype = dtype
        # PyTorch's Conv1d default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = W
        bound = 1.0 / np.sqrt(conv_size)
        self.kernel = nnx.Param(
            jax.random.uniform(rngs.params(), (conv_size, channels), param_dtype, -bound, bound)
        )

    def __call__(self, x, *, segment_ids=None, conv_state=None, history_segment_ids=None):
        """x ``[B, T, C]`` -> ``(y [B, T, C], new_conv_state [B, W-1, C])``: ``conv_state`` the
        ``W - 1`` inputs before x (zeros when None), the new state the last ``W - 1``."""
        if x.ndim != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"x must have shape [B, T, {self.channels}], got {x.shape}")
        dtype = self.dtype or x.dtype
        x = x.astype(dtype)
        y = depthwise_causal_conv(
            x,
            self.kernel[...].astype(dtype),
            history=conv_state,
            segment_ids=segment_ids,
            history_segment_ids=history_segment_ids,
        )
        if conv_state is None:
            conv_state = jnp.zeros((x.shape[0], self.conv_size - 1, self.channels), dtype)
        new_state = jnp.concatenate([conv_state.astype(dtype), x], axis=1)[:, x.shape[1] :]
        return jax.nn.silu(y), new_state


def qkv_convolutions(
    key_channels: int,
    value_channels: int,
    conv_size: int,
    *,
    dtype=None,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
) -> tuple[ShortConvolution, ShortConvolution, ShortConvolution]:
    """The q, k and v convolutions of a mixer, built in that order: ``key_channels`` (H * K)
    for q and k, ``value_channels`` (H * V) for v."""
    conv = dict(conv_size=conv_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    return (
        ShortConvolution(key_channels, **conv),
        ShortConvolution(key_channels, **conv),
        ShortConvolution(value_channels, **conv),
    )
