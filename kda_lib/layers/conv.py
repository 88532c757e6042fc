"""ShortConvolution: the depthwise causal convolution KDA applies to q, k and v.

    y[t, c] = silu( sum_w kernel[w, c] * x[t - (W - 1) + w, c] )

``kernel [W, C]``, ``kernel[W - 1]`` on the current token (PyTorch ``Conv1d``'s tap order:
:func:`kernel_from_torch`). Taps never cross a segment boundary; the ``W - 1`` inputs before x
are the decode conv state or a context-parallel rank's halo. Why shifted taps: docs/DESIGN.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import check_array
from kda_lib.ops.contract import check_segment_ids
from kda_lib.ops.segments import canonical_segment_ids, first_segment_id, varying_like


def causal_conv(x, kernel, history=None, window_ids=None):
    """:func:`depthwise_causal_conv` unchecked, of window ids (or None): ``(y, new_history)``."""
    width, (batch, seq_len, channels) = kernel.shape[0], x.shape
    if history is None:
        history = jnp.zeros((batch, width - 1, channels), x.dtype)
    dtype = jnp.promote_types(x.dtype, kernel.dtype)
    padded = jnp.concatenate([history.astype(x.dtype), x], axis=1).astype(dtype)
    kernel = varying_like(kernel.astype(dtype), padded[0, :1])
    out = jnp.zeros((batch, seq_len, channels), dtype)
    for w in range(width):
        tap = padded[:, w : w + seq_len]
        if window_ids is not None and w < width - 1:  # the current token's tap is never masked
            same = window_ids[:, w : w + seq_len] == window_ids[:, width - 1 :]
            tap = jnp.where(same[..., None], tap, 0)
        out = out + tap * kernel[w]
    return out, padded[:, seq_len:]


def window_segment_ids(segment_ids, history_segment_ids, width: int) -> jax.Array:
    """Canonical ids ``[B, W-1+T]`` of history (default: row's first segment) and x, together."""
    if history_segment_ids is None:
        ids = canonical_segment_ids(segment_ids)
        history = jnp.repeat(first_segment_id(ids)[:, None], width - 1, axis=1)
        return jnp.concatenate([history, ids], axis=1)
    both = (history_segment_ids, segment_ids)
    if any(isinstance(a, jax.Array) for a in both):
        return canonical_segment_ids(jnp.concatenate([jnp.asarray(a) for a in both], axis=1))
    # host ids numbered on the host, before any conversion could wrap int64 ids
    return canonical_segment_ids(np.concatenate(both, axis=1))


def _checked_window(x_shape, width, history, segment_ids, history_segment_ids=None):
    """The window ids (or None) of checked optional arguments for x of ``x_shape``."""
    batch, seq_len, channels = x_shape
    if history is not None and history.shape != (batch, width - 1, channels):
        raise ValueError(f"history must have shape [B, W-1, C]={(batch, width - 1, channels)}, "
                         f"got {history.shape}")  # fmt: skip
    if segment_ids is None:
        return None
    check_segment_ids(segment_ids, batch, seq_len)
    if width == 1:  # no taps before the current token
        return None
    if (ids := history_segment_ids) is not None:
        check_array("history_segment_ids", ids)
        if ids.shape != (batch, width - 1) or not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"history_segment_ids must be an integer array of shape [B, W-1]"
                             f"={(batch, width - 1)}, got {ids.dtype} {ids.shape}")  # fmt: skip
    return window_segment_ids(segment_ids, ids, width)


def depthwise_causal_conv(
    x, kernel, *, history=None, segment_ids=None, history_segment_ids=None
) -> jax.Array:
    """Depthwise causal conv, checked, no activation: x ``[B, T, C]``, kernel ``[W, C]``, the
    inputs before x ``history [B, W-1, C]`` (zeros), ``segment_ids [B, T]``,
    ``history_segment_ids [B, W-1]`` (each row's first segment) -> ``[B, T, C]``."""
    if kernel.shape != (kernel.shape[0], x.shape[-1]):
        raise ValueError(f"kernel must have shape [W, C]=(W, {x.shape[-1]}), got {kernel.shape}")
    window = _checked_window(x.shape, kernel.shape[0], history, segment_ids, history_segment_ids)
    return causal_conv(x, kernel, history, window)[0]


def kernel_from_torch(weight) -> np.ndarray:
    """PyTorch depthwise ``Conv1d`` weight ``[C, 1, W]`` -> kda_lib kernel ``[W, C]``."""
    weight = np.asarray(weight)
    if weight.ndim != 3 or weight.shape[1] != 1:
        raise ValueError(f"expected a depthwise Conv1d weight [C, 1, W], got {weight.shape}")
    return weight[:, 0, :].T


class ShortConvolution(nnx.Module):
    """Depthwise causal conv + SiLU over ``[B, T, C]``, no bias: ``channels`` C, ``conv_size`` W
    (4), ``dtype`` (None: the input's), ``param_dtype`` (float32); PyTorch ``Conv1d``'s init."""

    def __init__(self, channels: int, conv_size: int = 4, *, dtype=None,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):  # fmt: skip
        if conv_size < 1:
            raise ValueError(f"ShortConvolution needs conv_size >= 1, got {conv_size}")
        self.channels, self.conv_size, self.dtype = channels, conv_size, dtype
        bound, shape = 1.0 / np.sqrt(conv_size), (conv_size, channels)
        key = rngs.params()
        self.kernel = nnx.Param(jax.random.uniform(key, shape, param_dtype, -bound, bound))

    def __call__(self, x, *, segment_ids=None, conv_state=None):
        """x ``[B, T, C]`` from ``conv_state [B, W-1, C]`` (zeros) -> ``(y, new_conv_state)``."""
        if x.ndim != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"x must have shape [B, T, {self.channels}], got {x.shape}")
        return self.mix(x, conv_state, _checked_window(x.shape, self.conv_size, conv_state,
                                                       segment_ids))  # fmt: skip

    def mix(self, x, conv_state=None, window_ids=None):
        """:meth:`__call__` on checked inputs, given the :func:`window_segment_ids`."""
        dtype = self.dtype or x.dtype
        kernel = self.kernel[...].astype(dtype)
        y, state = causal_conv(x.astype(dtype), kernel, conv_state, window_ids)
        return jax.nn.silu(y), state
