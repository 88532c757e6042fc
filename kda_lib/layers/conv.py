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


def causal_conv(x, kernel, history=None, window_ids=None) -> jax.Array:
    """The conv itself, unchecked: x ``[B, T, C]``, kernel ``[W, C]``, history ``[B, W-1, C]``
    (zeros if None), window_ids ``[B, W-1+T]`` from :func:`window_segment_ids` (None: no
    segments) -> ``[B, T, C]`` in the promoted dtype of x and kernel."""
    width = kernel.shape[0]
    batch, seq_len, channels = x.shape
    if history is None:
        history = jnp.zeros((batch, width - 1, channels), x.dtype)
    dtype = jnp.promote_types(x.dtype, kernel.dtype)
    padded = jnp.concatenate([history.astype(x.dtype), x], axis=1).astype(dtype)
    # inside shard_map the kernel must vary over the same mesh axes as the inputs, so that its
    # gradient (a sum over this rank's tokens) is summed over the ranks
    kernel = kernel.astype(dtype) + jnp.zeros_like(padded[0, :1])
    out = jnp.zeros((batch, seq_len, channels), dtype)
    for w in range(width):  # shifted taps, not lax.conv: its gradient is ~4x slower on CPU
        tap = padded[:, w : w + seq_len]
        if window_ids is not None and w < width - 1:  # the current token's tap is never masked
            same = window_ids[:, w : w + seq_len] == window_ids[:, width - 1 :]
            tap = jnp.where(same[..., None], tap, 0)
        out = out + tap * kernel[w]
    return out


def window_segment_ids(segment_ids, history_segment_ids, width: int) -> jax.Array:
    """Canonical ids ``[B, W-1+T]`` of the ``W - 1`` history tokens and x's ``[B, T]``
    tokens, numbered together (default history: each row's first segment). Equal ids mean one
    segment and a real token never reads padding (:mod:`kda_lib.ops.segments`)."""
    if history_segment_ids is None:
        ids = canonical_segment_ids(segment_ids)
        history = jnp.repeat(first_segment_id(ids)[:, None], width - 1, axis=1)
        return jnp.concatenate([history, ids], axis=1)
    both = (history_segment_ids, segment_ids)
    if any(isinstance(a, jax.Array) for a in both):
        return canonical_segment_ids(jnp.concatenate([jnp.asarray(a) for a in both], axis=1))
    # host ids numbered on the host, before any conversion could wrap int64 ids
    return canonical_segment_ids(np.concatenate(both, axis=1))


def depthwise_causal_conv(
    x: jax.Array,
    kernel: jax.Array,
    *,
    history: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    history_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Depthwise causal conv, no activation: x ``[B, T, C]``, kernel ``[W, C]`` -> ``[B, T, C]``
    in the promoted dtype of x and kernel; every argument checked.

    Args:
      history: ``[B, W-1, C]`` inputs just before x (decode conv state, CP halo); zeros if None.
      segment_ids: ``[B, T]`` int, 0 = padding: taps only combine tokens of one segment.
      history_segment_ids: ``[B, W-1]`` ids of ``history``, numbered together with segment_ids
        (default: the history belongs to each row's first segment).
    """
    width = kernel.shape[0]
    batch, seq_len, channels = x.shape
    if kernel.shape != (width, channels):
        raise ValueError(f"kernel must have shape [W, C]=(W, {channels}), got {kernel.shape}")
    if history is not None and history.shape != (batch, width - 1, channels):
        raise ValueError(
            f"history must have shape [B, W-1, C]={(batch, width - 1, channels)}, "
            f"got {history.shape}"
        )
    window = None
    if segment_ids is not None:
        check_array("segment_ids", segment_ids)
        check_segment_ids(segment_ids, batch, seq_len)
        if history_segment_ids is not None and width > 1:
            check_array("history_segment_ids", history_segment_ids)
            want = (batch, width - 1)
            if history_segment_ids.shape != want or not jnp.issubdtype(
                history_segment_ids.dtype, jnp.integer
            ):
                raise ValueError(
                    f"history_segment_ids must be an integer array of shape [B, W-1]={want}, "
                    f"got {history_segment_ids.dtype} {tuple(history_segment_ids.shape)}"
                )
        if width > 1:
            window = window_segment_ids(segment_ids, history_segment_ids, width)
    return causal_conv(x, kernel, history, window)


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
    kernel's (float32). Init: PyTorch ``Conv1d``'s U(-1/sqrt(W), 1/sqrt(W))."""

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
        bound = 1.0 / np.sqrt(conv_size)
        self.kernel = nnx.Param(
            jax.random.uniform(rngs.params(), (conv_size, channels), param_dtype, -bound, bound)
        )

    def __call__(self, x, *, segment_ids=None, conv_state=None, history_segment_ids=None):
        """x ``[B, T, C]`` -> ``(y [B, T, C], new_conv_state [B, W-1, C])``: ``conv_state`` the
        ``W - 1`` inputs before x (zeros when None), the new state the last ``W - 1``; the
        arguments as in :func:`depthwise_causal_conv`, checked."""
        if x.ndim != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"x must have shape [B, T, {self.channels}], got {x.shape}")
        dtype = self.dtype or x.dtype
        y = depthwise_causal_conv(
            x.astype(dtype),
            self.kernel[...].astype(dtype),
            history=conv_state,
            segment_ids=segment_ids,
            history_segment_ids=history_segment_ids,
        )
        return jax.nn.silu(y), self._next_state(x.astype(dtype), conv_state)

    def mix(self, x, conv_state=None, window_ids=None):
        """:meth:`__call__` on checked inputs, with the window ids of
        :func:`window_segment_ids` (the KDA layer computes them once for its three convs)."""
        dtype = self.dtype or x.dtype
        x = x.astype(dtype)
        y = causal_conv(x, self.kernel[...].astype(dtype), conv_state, window_ids)
        return jax.nn.silu(y), self._next_state(x, conv_state)

    def _next_state(self, x, conv_state):
        if conv_state is None:
            conv_state = jnp.zeros((x.shape[0], self.conv_size - 1, self.channels), x.dtype)
        return jnp.concatenate([conv_state.astype(x.dtype), x], axis=1)[:, x.shape[1] :]


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
    for q and k, ``value_channels`` (HV * V) for v."""
    conv = dict(conv_size=conv_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    return (
        ShortConvolution(key_channels, **conv),
        ShortConvolution(key_channels, **conv),
        ShortConvolution(value_channels, **conv),
    )
