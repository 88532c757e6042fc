"""ShortConvolution: the depthwise causal convolution KDA applies to q, k and v.

Tap order (same as PyTorch's ``Conv1d``): ``kernel [W, C]`` with ``kernel[w]`` multiplying the
input ``W - 1 - w`` steps back, so ``kernel[W - 1]`` is the current token:

    y[t, c] = silu( sum_w kernel[w, c] * x[t - (W - 1) + w, c] )

A PyTorch ``Conv1d(C, C, W, groups=C)`` weight ``[C, 1, W]`` converts with
:func:`kernel_from_torch` (a transpose, no flip). Taps never reach across a segment boundary,
and the last ``W - 1`` inputs are the conv state carried between decode steps (or the halo a
context-parallel rank receives from its predecessors).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kda_lib.checks import check_array
from kda_lib.ops.contract import check_segment_ids
from kda_lib.ops.segments import canonical_segment_ids, first_segment_id


def kernel_from_torch(weight) -> np.ndarray:
    """PyTorch depthwise ``Conv1d`` weight ``[C, 1, W]`` -> kda_lib kernel ``[W, C]``."""
    weight = np.asarray(weight)
    if weight.ndim != 3 or weight.shape[1] != 1:
        raise ValueError(
            f"expected a depthwise Conv1d weight of shape [C, 1, W], got {weight.shape}"
        )
    return weight[:, 0, :].T


def depthwise_causal_conv(
    x: jax.Array,
    kernel: jax.Array,
    *,
    history: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    history_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Depthwise causal conv (no activation).

    Args:
      x: ``[B, T, C]``.
      kernel: ``[W, C]``, ``kernel[W-1]`` = current token.
      history: ``[B, W-1, C]`` inputs just before x (decode conv state, CP halo); zeros if None.
      segment_ids: ``[B, T]`` int, 0 = padding; taps only combine tokens of the same segment
        (the one rule of :mod:`kda_lib.ops.segments`: a reused id starts a new segment,
        padding is read as 0).
      history_segment_ids: ``[B, W-1]`` segment ids of ``history``, numbered together with
        segment_ids (default: with segment_ids given, the history belongs to each row's first
        segment).

    Returns:
      ``[B, T, C]`` in the promoted dtype of x and kernel.

    Differentiable in reverse mode (``jax.grad``/``jax.vjp``, a hand-written backward, see
    :func:`_causal_taps_bwd`); forward mode (``jax.jvp``) is not supported, as through
    :func:`kda_lib.kda_chunked`.
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
    padded = jnp.concatenate([history.astype(x.dtype), x], axis=1)  # [B, W-1+T, C]
    masks = None
    if segment_ids is not None:
        check_array("segment_ids", segment_ids)
        check_segment_ids(segment_ids, batch, seq_len)
    if segment_ids is not None and width > 1:
        padded_ids = _window_ids(segment_ids, history_segment_ids, width)
        ids = padded_ids[:, width - 1 :]
        # [B, T, W-1]: tap w of token t reads a token of t's own segment (the last tap always);
        # canonical ids, so equal ids mean one segment and a real token never reads padding
        masks = jnp.stack(
            [padded_ids[:, w : w + seq_len] == ids for w in range(width - 1)], axis=-1
        )
    # inside shard_map the kernel must vary over the same mesh axes as the inputs, so that its
    # gradient (a sum over this rank's tokens) is summed over the ranks outside the custom VJP
    kernel = kernel + jnp.zeros_like(padded[0, :1], dtype=kernel.dtype)
    return _causal_taps(padded, kernel, masks)


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


@jax.custom_vjp
def _causal_taps(padded, kernel, masks):
    """``y[:, t] = sum_w kernel[w] * padded[:, t + w]`` (tap w masked to 0 where ``masks`` is
    False). padded ``[B, W-1+T, C]``, kernel ``[W, C]``, masks None or ``[B, T, W-1]`` bool."""
    width = kernel.shape[0]
    seq_len = padded.shape[1] - (width - 1)
    out = jnp.zeros(
        (padded.shape[0], seq_len, padded.shape[2]), jnp.promote_types(padded.dtype, kernel.dtype)
    )
    for w in range(width):
        out = out + _tap(padded, masks, w, seq_len) * kernel[w]
    return out


def _tap(padded, masks, w, seq_len):
    """What tap w reads, ``[B, T, C]``: the inputs it reaches, 0 across a segment boundary."""
    return _masked(padded[:, w : w + seq_len], masks, w)


def _masked(x, masks, w):
    """``x [B, T, C]`` with 0 where tap w of a token would cross a segment boundary."""
    if masks is None or w >= masks.shape[-1]:  # no segments, or the current token's own tap
        return x
    return jnp.where(masks[..., w, None], x, 0)


def _causal_taps_fwd(padded, kernel, masks):
    return _causal_taps(padded, kernel, masks), (padded, kernel, masks)


def _causal_taps_bwd(residuals, d_out):
    """Each tap's cotangent shifted back into place and summed, then materialised.

    The barrier matters on CPU: left to itself XLA fuses this shifted sum into the transposed
    copy the projection's weight gradient wants, a strided loop that took 13 ms for a
    ``[4, 1024, 128]`` input, about twice the rest of the projection and conv's backward.
    """
    padded, kernel, masks = residuals
    width = kernel.shape[0]
    seq_len = d_out.shape[1]
    d_kernel = jnp.stack(
        [jnp.sum(_tap(padded, masks, w, seq_len) * d_out, axis=(0, 1)) for w in range(width)]
    )
    d_padded = jnp.zeros(padded.shape, d_out.dtype)
    for w in range(width):
        term = _masked(d_out * kernel[w], masks, w)
        d_padded = d_padded + jnp.pad(term, ((0, 0), (w, width - 1 - w), (0, 0)))
    d_padded = jax.lax.optimization_barrier(d_padded)
    return d_padded.astype(padded.dtype), d_kernel.astype(kernel.dtype), None


_causal_taps.defvjp(_causal_taps_fwd, _causal_taps_bwd)


class ShortConvolution(nnx.Module):
    """Depthwise causal conv + SiLU over ``[B, T, C]``; no bias.

    Args:
      channels: C.
      conv_size: W (default 4).
      dtype: compute dtype (None: inputs' dtype); param_dtype: kernel dtype (float32).
    """

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
        """x ``[B, T, C]`` -> ``(y [B, T, C], new_conv_state [B, W-1, C])``.

        ``conv_state`` holds the ``W - 1`` inputs before x (zeros when None). The new state is
        the last ``W - 1`` inputs, so decoding can continue from it.
        """
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
        width = self.conv_size
        if conv_state is None:
            conv_state = jnp.zeros((x.shape[0], width - 1, self.channels), dtype)
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
    """The q, k and v short convolutions of a mixer (KDA's layer, softmax attention with
    ``short_conv``), built in that order: ``key_channels`` (H * K) for q and k,
    ``value_channels`` (H * V) for v."""
    conv = dict(conv_size=conv_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    return (
        ShortConvolution(key_channels, **conv),
        ShortConvolution(key_channels, **conv),
        ShortConvolution(value_channels, **conv),
    )
