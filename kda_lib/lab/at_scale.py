"""What the KDA, MLA and full-attention layers cost at the size of the published models
(notebook 10): parameters, flops per token, bytes per decoded token, cache memory, context
parallel traffic, and a roofline model of named chips.

Every function reads a :class:`kda_lib.models.presets.ModelPreset` (its numbers, never a built
layer), so a layer is costed even where this repository cannot build it (Kimi K3's output-gated
MLA).

Conventions (checked against the compiled programs in ``tests/lab/test_at_scale.py``):

* flops are matrix-product flops, 2 per multiply-add, as :func:`kda_lib.lab.costs.matmul_flops`
  counts them in a traced program; the depthwise short conv adds ``2 w`` per channel and token.
  Elementwise work (gates, norms, softmax) is left out: XLA's own count
  (``cost_analysis()["flops"]``) is within a few percent of these at ``d = 512``, ``d_k = 128``.
* ``keys``: the keys each query is scored against. A decode step at context T has T; a prefill
  of T tokens that computes the full causal square (this repository's programs) has T per query,
  one that skips the masked half (a flash kernel) about ``(T + 1) / 2``.
* training = forward + backward = 3 x forward (the backward of a matrix product is two products
  of the same size); the compiled gradients of the KDA and MLA layers come within 5% of it.
* a decode step reads every weight once per step, whatever the batch, and per sequence its cache;
  the KDA state is read and written (float32, as kda_lib and fla keep it), a KV cache is read.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
from typing import NamedTuple

from kda_lib.checks import check_int, check_number, shared_fields
from kda_lib.lab import costs
from kda_lib.lab.measure import xla_cost
from kda_lib.models.presets import ModelPreset

BF16 = 2  # bytes per number
F32 = 4


@dataclasses.dataclass(frozen=True)
class Chip:
    """A chip's published peak numbers.

    Attributes:
      name: the chip.
      hbm_bandwidth: HBM bytes per second.
      peak_flops: dense bf16 flop/s of the matrix units.
      hbm_bytes: HBM capacity in bytes.
      link_bandwidth: chip-to-chip bytes per second, one direction (NVLink, ICI).
      source: where the numbers are published.
    """

    name: str
    hbm_bandwidth: float
    peak_flops: float
    hbm_bytes: float
    link_bandwidth: float
    source: str

    @property
    def ridge(self) -> float:
        """Flops per byte of HBM traffic above which the matrix units, not memory, limit."""
        return self.peak_flops / self.hbm_bandwidth


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip(
            "H100 SXM",
            3.35e12,
            989e12,
            80e9,
            450e9,
            "NVIDIA H100 product page, https://www.nvidia.com/en-us/data-center/h100/ (SXM: "
            "3.35 TB/s, BF16 1,979 TFLOPS listed with sparsity, dense is half; NVLink 900 GB/s "
            "both directions)",
        ),
        Chip(
            "H200 SXM",
            4.8e12,
            989e12,
            141e9,
            450e9,
            "NVIDIA H200 product page, https://www.nvidia.com/en-us/data-center/h200/ (4.8 TB/s, "
            "141 GB, BF16 1,979 TFLOPS listed with sparsity, dense is half; NVLink 900 GB/s)",
        ),
        Chip(
            "TPU v5e",
            819e9,
            197e12,
            16e9,
            200e9,
            "Google Cloud, https://cloud.google.com/tpu/docs/v5e (197 TFLOPs bf16, 16 GB, "
            "819 GBps HBM2, ICI 400 GBps bidirectional)",
        ),
        Chip(
            "TPU v6e",
            1638e9,
            918e12,
            32e9,
            400e9,
            "Google Cloud, https://cloud.google.com/tpu/docs/v6e (918 TFLOPs bf16, 32 GB, "
            "1638 GBps HBM, ICI 800 GBps bidirectional)",
        ),
    )
}


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def _check_mode(mode: str, allowed=("prefill", "train", "decode")) -> None:
    if mode not in allowed:
        raise ValueError(f"mode must be one of {allowed}, got {mode!r}")


# ---------------------------------------------------------------------------------- KDA
def kda_matmul_params(preset: ModelPreset) -> int:
    """Weights of the KDA layer's matrix products (the kernels of every ``*_proj``; not the
    conv, ``A_log``, ``dt_bias``, biases or ``o_norm``): each costs 2 flops per token."""
    return sum(
        math.prod(shape)
        for name, shape in preset.kda_parameter_shapes().items()
        if "_proj" in name and name.endswith(".kernel")
    )


def kda_conv_channels(preset: ModelPreset) -> int:
    """Channels of the short convolutions: ``2 H d_k + H_v d_v``."""
    return 2 * preset.num_heads * preset.head_dim + preset.num_v_heads * preset.head_dim


def kda_kernel_flops_per_token(preset: ModelPreset, chunk_size: int = 64, value_dim=None) -> float:
    """The chunked kernel (sequential scan, :func:`kda_lib.lab.costs.chunked_flops`) per token, all
    heads; ``value_dim``: value columns per head (default ``d_v``; the context-parallel summary
    pass runs ``d_k + d_v``)."""
    _check_positive(chunk_size=chunk_size)
    v = preset.head_dim if value_dim is None else value_dim
    return (
        preset.num_v_heads
        * costs.chunked_flops(chunk_size, chunk_size, preset.head_dim, v)
        / chunk_size
    )


def kda_decode_kernel_flops(preset: ModelPreset, matmul_only: bool = False) -> int:
    """The recurrent step per token and value head (:func:`kda_lib.lab.costs.recurrent_flops`):
    the decay (``d_k d_v``), ``k^T S`` (``2 d_k d_v``), the rank-one write (``2 d_k d_v``) and
    ``S^T q`` (``2 d_k d_v``). ``matmul_only``: the two products ``k^T S`` and ``S^T q``, the
    part a traced program runs as ``dot_general`` (the write is a broadcast product)."""
    per_entry = 4 if matmul_only else 7
    return preset.num_v_heads * per_entry * preset.head_dim * preset.head_dim


def kda_conv_flops_per_token(preset: ModelPreset) -> int:
    """The depthwise short convolutions: ``2 w`` flops per channel and token."""
    return 2 * preset.conv_size * kda_conv_channels(preset)


def kda_flops_per_token(preset: ModelPreset, mode: str = "prefill", chunk_size: int = 64) -> float:
    """Flops per token of one KDA layer: ``2 P_mm + 2 w C_conv +`` the kernel (chunked for
    prefill and training, the recurrent step for decode); training is 3x prefill. Independent
    of the context: the reason for the layer."""
    _check_mode(mode)
    base = 2 * kda_matmul_params(preset) + kda_conv_flops_per_token(preset)
    if mode == "decode":
        return base + kda_decode_kernel_flops(preset)
    forward = base + kda_kernel_flops_per_token(preset, chunk_size)
    return 3 * forward if mode == "train" else forward


def kda_state_bytes(preset: ModelPreset, state_bytes: int = F32, conv_bytes: int = BF16) -> int:
    """One sequence's decode cache in one KDA layer: ``H_v d_k d_v`` state numbers plus the
    ``w - 1`` last conv inputs of every conv channel."""
    state = preset.num_v_heads * preset.head_dim * preset.head_dim * state_bytes
    return state + (preset.conv_size - 1) * kda_conv_channels(preset) * conv_bytes


# ---------------------------------------------------------------------------------- MLA
def _mla(preset: ModelPreset):
    if preset.mla is None:
        raise ValueError(f"{preset.name}: the preset gives no MLA widths ({preset.notes})")
    return preset.mla


def mla_cache_numbers(preset: ModelPreset) -> int:
    """Numbers an MLA layer caches per token: the latent ``d_c`` and the shared key ``d_R``."""
    m = _mla(preset)
    return m.kv_lora_rank + m.shared_key_dim


def mla_matmul_params(preset: ModelPreset) -> int:
    """Weights of the MLA layer's matrix products (its parameters less the RMSNorm weights)."""
    m = _mla(preset)
    norms = m.kv_lora_rank + (m.q_lora_rank or 0) + (m.value_head_dim if m.output_gate else 0)
    return preset.mla_parameter_count() - norms


def mla_flops_per_token(preset: ModelPreset, keys: float, mode: str = "prefill") -> float:
    """Flops per token of one MLA layer that scores each query against ``keys`` keys.

    Prefill and training expand the latents into per-head keys and values (``kv_b_proj`` on
    every token) and attend over ``d_qk + d_R`` score and ``d_v`` value columns per head. Decode
    absorbs ``kv_b_proj`` into the query and the output (the same weights, used once per token)
    and attends over the cached latents: ``2 d_c + d_R`` columns per head and key.
    """
    _check_mode(mode)
    _check_positive(keys=keys)
    m = _mla(preset)
    base = 2 * mla_matmul_params(preset)
    if mode == "decode":
        return base + 2 * m.num_heads * keys * (2 * m.kv_lora_rank + m.shared_key_dim)
    columns = m.head_dim + m.shared_key_dim + m.value_head_dim
    forward = base + 2 * m.num_heads * keys * columns
    return 3 * forward if mode == "train" else forward


# ------------------------------------------------------------------- full attention (MHA/GQA)
def attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Weights of a softmax attention layer: ``W_q``, ``W_o`` (``d H d_h`` each) and ``W_k``,
    ``W_v`` (``d G d_h`` each; G = H for multi-head attention)."""
    _check_positive(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    return 2 * hidden * head_dim * (heads + kv_heads)


def attention_cache_numbers(kv_heads: int, head_dim: int) -> int:
    """Numbers cached per token: a key and a value per key/value head."""
    return 2 * kv_heads * head_dim


def attention_flops_per_token(
    hidden: int, heads: int, kv_heads: int, head_dim: int, keys: float, mode: str = "prefill"
) -> float:
    """Flops per token: the projections, then ``2 d_h`` per head and key for the scores and as
    many for the weighted values; training is 3x prefill."""
    _check_mode(mode)
    _check_positive(keys=keys)
    forward = 2 * attention_params(hidden, heads, kv_heads, head_dim) + 4 * heads * keys * head_dim
    return 3 * forward if mode == "train" else forward


def full_attention_shape(preset: ModelPreset, kv_heads: int | None = None) -> dict:
    """The softmax attention layer compared with the preset's KDA layer: the same width, heads
    and head size (``kv_heads`` None: multi-head attention, else grouped-query)."""
    return dict(
        hidden=preset.hidden_size,
        heads=preset.num_heads,
        kv_heads=preset.num_heads if kv_heads is None else kv_heads,
        head_dim=preset.head_dim,
    )


# ---------------------------------------------------------------------- decode, per token
def decode_bytes_per_token(
    weights: int,
    batch: int,
    *,
    cache_read: float = 0.0,
    state: float = 0.0,
    weight_bytes: int = BF16,
) -> float:
    """HBM bytes one decoded token costs in one layer: the weights read once per step and shared
    by the ``batch`` sequences, a cache of ``cache_read`` bytes read, a state of ``state`` bytes
    read and written back."""
    _check_positive(batch=batch)
    return weights * weight_bytes / batch + cache_read + 2 * state


def kda_decode_bytes(preset: ModelPreset, batch: int = 1, weight_bytes: int = BF16) -> float:
    """Bytes per decoded token of a KDA layer (float32 state, bf16 conv history)."""
    return decode_bytes_per_token(
        preset.kda_parameter_count(),
        batch,
        state=kda_state_bytes(preset),
        weight_bytes=weight_bytes,
    )


def mla_decode_bytes(
    preset: ModelPreset,
    context: int,
    batch: int = 1,
    cache_bytes: int = BF16,
    weight_bytes: int = BF16,
) -> float:
    """Bytes per decoded token of an MLA layer over ``context`` cached latents."""
    return decode_bytes_per_token(
        preset.mla_parameter_count(),
        batch,
        cache_read=context * mla_cache_numbers(preset) * cache_bytes,
        weight_bytes=weight_bytes,
    )


def attention_decode_bytes(
    shape: dict, context: int, batch: int = 1, cache_bytes: int = BF16, weight_bytes: int = BF16
) -> float:
    """Bytes per decoded token of a softmax attention layer over ``context`` cached tokens."""
    return decode_bytes_per_token(
        attention_params(**shape),
        batch,
        cache_read=context
        * attention_cache_numbers(shape["kv_heads"], shape["head_dim"])
        * cache_bytes,
        weight_bytes=weight_bytes,
    )


def step_time(flops: float, hbm_bytes: float, chip: Chip) -> float:
    """Roofline time of a step: the slower of its flops at peak and its bytes at full bandwidth
    (the two overlap perfectly, nothing else costs)."""
    return max(flops / chip.peak_flops, hbm_bytes / chip.hbm_bandwidth)


# ---------------------------------------------------------------------- the whole model
def model_cache_bytes(
    preset: ModelPreset, context: int, *, hybrid: bool = True, cache_bytes: int = BF16
) -> float:
    """One sequence's decode memory over all mixer layers at ``context`` tokens: the hybrid
    (KDA states in its KDA layers, MLA latents in its global layers) or the same depth of MLA
    layers only (``hybrid=False``)."""
    mla = context * mla_cache_numbers(preset) * cache_bytes
    if not hybrid:
        return preset.num_layers * mla
    return len(preset.global_layers) * mla + len(preset.kda_layers) * kda_state_bytes(preset)


def model_decode_time(
    preset: ModelPreset,
    chip: Chip,
    context: int,
    batch: int,
    *,
    hybrid: bool = True,
    other_weight_bytes: float = 0.0,
) -> float:
    """Roofline time of one decode step of the model (``batch`` sequences at ``context``):
    per layer the slower of flops and bytes, plus ``other_weight_bytes`` (the MoE/MLP weights
    the step reads, the same for both models) at full bandwidth."""
    mla = step_time(
        batch * mla_flops_per_token(preset, context, "decode"),
        batch * mla_decode_bytes(preset, context, batch),
        chip,
    )
    kda = step_time(
        batch * kda_flops_per_token(preset, "decode"), batch * kda_decode_bytes(preset, batch), chip
    )
    n_global = len(preset.global_layers) if hybrid else preset.num_layers
    mixers = n_global * mla + (preset.num_layers - n_global) * kda
    return mixers + other_weight_bytes / chip.hbm_bandwidth


def decode_speedup_bound(preset: ModelPreset) -> float:
    """The most a hybrid can gain over the same depth of global layers when the global layers'
    per-token work grows with the context: layers over global layers."""
    return preset.num_layers / len(preset.global_layers)


# ---------------------------------------------------------------------- context parallelism
def cp_summary_bytes(
    preset: ModelPreset, ranks: int, batch: int = 1, state_bytes: int = F32
) -> float:
    """Bytes each rank receives in the all-gather of the slice summaries ``(M, E)``:
    ``(R - 1) B H_v d_k (d_k + d_v)`` numbers (notebook 05, measured there)."""
    _check_positive(ranks=ranks, batch=batch)
    return (
        (ranks - 1)
        * batch
        * preset.num_v_heads
        * preset.head_dim
        * 2
        * preset.head_dim
        * state_bytes
    )


def cp_halo_bytes(preset: ModelPreset, batch: int = 1, conv_bytes: int = BF16) -> float:
    """Bytes each rank receives for its conv halo: ``w - 1`` inputs of every conv channel."""
    return (preset.conv_size - 1) * batch * kda_conv_channels(preset) * conv_bytes


def ring_attention_bytes(
    numbers_per_token: int, seq_len: int, ranks: int, batch: int = 1, cache_bytes: int = BF16
) -> float:
    """Bytes each rank receives in ring attention: every other rank's keys and values (for MLA
    its latents), ``(R - 1) / R`` of the sequence's cache."""
    _check_positive(ranks=ranks, seq_len=seq_len, batch=batch)
    return (ranks - 1) / ranks * batch * seq_len * numbers_per_token * cache_bytes


def cp_compute_per_rank(
    preset: ModelPreset, seq_len: int, ranks: int, chunk_size: int = 64
) -> dict:
    """Flops one rank spends on one KDA layer's forward under context parallelism, per sequence:
    ``layer``: its slice's ordinary forward (projections, conv, kernel); ``summary``: the extra
    kernel pass over ``[0 | v]`` (``d_k + d_v`` value columns); ``fold``: ``R`` maps
    ``S -> M S + E`` (``2 d_k^2 d_v`` each, per value head)."""
    _check_positive(seq_len=seq_len, ranks=ranks)
    local = seq_len / ranks
    width = 2 * preset.head_dim
    return {
        "layer": local * kda_flops_per_token(preset, "prefill", chunk_size),
        "summary": local * kda_kernel_flops_per_token(preset, chunk_size, value_dim=width),
        "fold": ranks * preset.num_v_heads * 2 * preset.head_dim**2 * preset.head_dim,
    }


# ---------------------------------------------------------------------- checks at a small size
def scaled_down(
    preset: ModelPreset,
    *,
    hidden: int,
    heads: int,
    head_dim: int,
    rank: int,
    kv_lora_rank: int,
    shared_key_dim: int,
) -> ModelPreset:
    """``preset`` at a size a CPU compiles in seconds (same structure: gates, layer pattern, MLA
    without output gate), for checking the formulas against the compiled programs."""
    mla = dataclasses.replace(
        _mla(preset),
        num_heads=heads,
        kv_lora_rank=kv_lora_rank,
        head_dim=head_dim,
        shared_key_dim=shared_key_dim,
        value_head_dim=head_dim,
    )
    ranks = {
        "forget_gate_rank": None if preset.forget_gate_rank is None else rank,
        "output_gate_rank": None if preset.output_gate_rank is None else rank,
    }
    return dataclasses.replace(
        preset,
        name=f"{preset.name} (scaled down)",
        hidden_size=hidden,
        num_heads=heads,
        num_v_heads=heads,
        head_dim=head_dim,
        mla=mla,
        **ranks,
    )


def compiled_cost(fn, *args, compile: bool = True) -> dict:
    """XLA's cost analysis of ``jax.jit(fn)`` for ``args``: ``{"flops", "bytes accessed"}``
    (a loop's body is counted once) of the compiled program, or with ``compile=False`` of the
    lowered one (before XLA's optimisations and much faster to get)."""
    import jax

    lowered = jax.jit(fn).lower(*args)
    return xla_cost(lowered.compile() if compile else lowered)


def _split_call(module, **kwargs):
    """``(fn(state, x, *rest), state)`` calling ``module`` as a pure function."""
    from flax import nnx

    graph, state = nnx.split(module)
    if kwargs.get("cached"):
        return (lambda s, x, c: nnx.merge(graph, s)(x, cache=c)), state
    return (lambda s, x: nnx.merge(graph, s)(x)), state


def program_costs(
    preset: ModelPreset,
    seq_len: int,
    context: int,
    train: bool = False,
    compile: bool = True,
    chunk_size: int = 64,
) -> dict:
    """Each formula beside the real program's count, for the layers of the (small) ``preset``
    built here: the KDA layer (chunked prefill of ``seq_len`` tokens in chunks of
    ``min(chunk_size, seq_len)``, which must divide ``seq_len``; recurrent decode step), the MLA
    layer (prefill; absorbed decode step over a cache of ``context`` slots) and multi-head
    attention
    (:class:`kda_lib.layers.attention.CausalSelfAttention` without RoPE, same heads as the KDA
    layer).

    Returns ``{program: {"formula_matmul", "traced_matmul", "formula_flops", "xla_flops",
    "formula_bytes", "xla_bytes"}}`` (flops for all ``seq_len`` tokens, or the one decoded
    token; bytes only for decode steps, float32 weights, state and cache as built). The traced
    count multiplies a ``scan``'s body by its length; XLA's counts a loop's body once, so its
    KDA prefill row covers one chunk only unless ``seq_len <= chunk_size``. ``train``
    adds ``"<layer> train"`` rows: value and gradient (parameters and input) of a sum of squares.
    ``compile``: XLA's count of the compiled program (else of the lowered one).
    """
    import jax.numpy as jnp

    _check_positive(seq_len=seq_len, context=context, chunk_size=chunk_size)
    if seq_len % min(chunk_size, seq_len):
        raise ValueError(f"seq_len must be a multiple of chunk_size {chunk_size}, got {seq_len}")
    rows = {}

    def add(name, fn, args, matmul, flops, hbm=None):
        cost = compiled_cost(fn, *args, compile=compile)
        rows[name] = dict(
            formula_matmul=matmul,
            traced_matmul=costs.matmul_flops(fn, *args),
            formula_flops=flops,
            xla_flops=cost["flops"],
            formula_bytes=hbm,
            xla_bytes=cost["bytes accessed"] if hbm is not None else None,
        )

    inputs = _ProgramInputs(
        x=jnp.zeros((1, seq_len, preset.hidden_size)),
        x1=jnp.zeros((1, 1, preset.hidden_size)),
        length=jnp.asarray(context - 1, jnp.int32),
        seq_len=seq_len,
        context=context,
        train=train,
        chunk_size=min(chunk_size, seq_len),
    )
    _kda_program_rows(preset, inputs, add)
    _mla_program_rows(preset, inputs, add)
    _mha_program_rows(preset, inputs, add)
    return rows


class _ProgramInputs(NamedTuple):
    x: object  # [1, seq_len, d]: a prefill's input
    x1: object  # [1, 1, d]: a decode step's input
    length: object  # the decode caches' filled length, context - 1
    seq_len: int
    context: int
    train: bool
    chunk_size: int  # the KDA prefill's chunk C, dividing seq_len


def _gradient_of_sum_of_squares(fn):
    import jax
    import jax.numpy as jnp

    return jax.grad(lambda s, x: jnp.sum(fn(s, x) ** 2), argnums=(0, 1))


def _kda_program_rows(preset: ModelPreset, inputs: _ProgramInputs, add) -> None:
    """The KDA layer: chunked prefill, its training step, a recurrent decode step."""
    from flax import nnx

    from kda_lib.layers.kda_layer import KimiDeltaAttention

    seq_len, conv, chunk = inputs.seq_len, kda_conv_flops_per_token(preset), inputs.chunk_size
    layer = KimiDeltaAttention(
        preset.kda_config(implementation="chunked", chunk_size=chunk), rngs=nnx.Rngs(0)
    )
    fn, state = _split_call(layer)
    total = seq_len * kda_flops_per_token(preset, "prefill", chunk)
    add("KDA prefill", fn, (state, inputs.x), total - seq_len * conv, total)
    if inputs.train:
        grad = _gradient_of_sum_of_squares(fn)
        add("KDA train", grad, (state, inputs.x), 3 * (total - seq_len * conv), 3 * total)
    step = KimiDeltaAttention(preset.kda_config(implementation="recurrent"), rngs=nnx.Rngs(0))
    fn, state = _split_call(step, cached=True)
    decode = kda_flops_per_token(preset, "decode")
    matmul = decode - conv - kda_decode_kernel_flops(preset) + kda_decode_kernel_flops(preset, True)
    hbm = (
        kda_decode_bytes(preset, weight_bytes=F32)
        - 2 * kda_state_bytes(preset)
        + 2 * kda_state_bytes(preset, conv_bytes=F32)
    )
    add("KDA decode step", fn, (state, inputs.x1, step.init_cache(1)), matmul, decode, hbm)


def _mla_program_rows(preset: ModelPreset, inputs: _ProgramInputs, add) -> None:
    """The MLA layer: prefill, its training step, an absorbed decode step over ``context``."""
    from flax import nnx

    from kda_lib.layers.mla import MultiHeadLatentAttention

    mla = MultiHeadLatentAttention(preset.mla_config(), rngs=nnx.Rngs(0))
    fn, state = _split_call(mla)
    total = inputs.seq_len * mla_flops_per_token(preset, inputs.seq_len)
    add("MLA prefill", fn, (state, inputs.x), total, total)
    if inputs.train:
        grad = _gradient_of_sum_of_squares(fn)
        add("MLA train", grad, (state, inputs.x), 3 * total, 3 * total)
    fn, state = _split_call(mla, cached=True)
    cache = mla.init_cache(1, max_len=inputs.context)._replace(length=inputs.length)
    decode = mla_flops_per_token(preset, inputs.context, "decode")
    hbm = mla_decode_bytes(preset, inputs.context, cache_bytes=F32, weight_bytes=F32)
    add("MLA decode step", fn, (state, inputs.x1, cache), decode, decode, hbm)


def _mha_program_rows(preset: ModelPreset, inputs: _ProgramInputs, add) -> None:
    """Multi-head attention with the KDA layer's heads, without RoPE: prefill and decode."""
    from flax import nnx

    from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention

    config = AttentionConfig(**shared_fields(preset.kda_config(), AttentionConfig), rope=False)
    mha = CausalSelfAttention(config, rngs=nnx.Rngs(0))
    shape = full_attention_shape(preset)
    fn, state = _split_call(mha)
    total = inputs.seq_len * attention_flops_per_token(**shape, keys=inputs.seq_len)
    add("MHA prefill", fn, (state, inputs.x), total, total)
    fn, state = _split_call(mha, cached=True)
    cache = mha.init_cache(1, max_len=inputs.context)._replace(length=inputs.length)
    decode = attention_flops_per_token(**shape, keys=inputs.context, mode="decode")
    hbm = attention_decode_bytes(shape, inputs.context, cache_bytes=F32, weight_bytes=F32)
    add("MHA decode step", fn, (state, inputs.x1, cache), decode, decode, hbm)


MIXERS = ("KDA", "MLA", "GQA", "MHA")


def operating_point(
    preset: ModelPreset, kind: str, mode: str, context: int, batch: int = 1, kv_heads: int = 8
) -> tuple[float, float]:
    """``(flops, HBM bytes)`` of one step of one layer of kind ``kind`` (one of
    :data:`MIXERS`; GQA with ``kv_heads`` key/value heads), bf16 weights and cache.

    ``"prefill"``: ``batch`` sequences of ``context`` tokens in one step, causal half of the
    scores (a flash kernel), bytes = the weights once + every token's bf16 input and output
    (``2 d`` numbers) + the cache written. ``"decode"``: one token for each of ``batch``
    sequences at ``context``, bytes from the ``*_decode_bytes`` functions.
    """
    if kind not in MIXERS:
        raise ValueError(f"kind must be one of {MIXERS}, got {kind!r}")
    _check_mode(mode, ("prefill", "decode"))
    _check_positive(context=context, batch=batch)
    shape = full_attention_shape(preset, kv_heads if kind == "GQA" else None)
    if mode == "decode":
        if kind == "KDA":
            per = (kda_flops_per_token(preset, "decode"), kda_decode_bytes(preset, batch))
        elif kind == "MLA":
            per = (
                mla_flops_per_token(preset, context, "decode"),
                mla_decode_bytes(preset, context, batch),
            )
        else:
            per = (
                attention_flops_per_token(**shape, keys=context, mode="decode"),
                attention_decode_bytes(shape, context, batch),
            )
        return batch * per[0], batch * per[1]
    tokens, keys = batch * context, (context + 1) / 2
    if kind == "KDA":
        flops, weights, cached = kda_flops_per_token(preset), preset.kda_parameter_count(), 0
    elif kind == "MLA":
        flops, weights = mla_flops_per_token(preset, keys), preset.mla_parameter_count()
        cached = mla_cache_numbers(preset)
    else:
        flops, weights = attention_flops_per_token(**shape, keys=keys), attention_params(**shape)
        cached = attention_cache_numbers(shape["kv_heads"], shape["head_dim"])
    hbm = weights * BF16 + tokens * (2 * preset.hidden_size + cached) * BF16
    return tokens * flops, hbm


def cp_ring_crossover(
    preset: ModelPreset, seq_len: int, cache_bytes: int = BF16, state_bytes: int = F32
) -> float:
    """``R*``: the ranks at which the summaries' all-gather (growing with R) receives as many bytes
    per rank as ring attention over the MLA latents (growing with T), halo left out:
    ``T (d_c + d_R) cache_bytes / (H_v d_k (d_k + d_v) state_bytes)``."""
    _check_positive(seq_len=seq_len)
    summary = preset.num_v_heads * preset.head_dim * 2 * preset.head_dim * state_bytes
    return seq_len * mla_cache_numbers(preset) * cache_bytes / summary


# ------------------------------------------------------------------ arguments, checked by name
# Every public function of this module checks its arguments by name before any work (a size
# such as 0.5, True or -1 would otherwise return a number): sizes are ints (numpy ints count,
# bools do not), amounts are finite real numbers >= 0, flags are bools, presets and chips their
# classes. Names not listed (fn, args, shape, mode, kind) are checked by the function itself.
_POSITIVE_INT_ARGUMENTS = frozenset(
    {"batch", "chunk_size", "head_dim", "heads", "hidden", "kv_heads", "kv_lora_rank", "rank"}
    | {"ranks", "seq_len", "numbers_per_token", "value_dim"}
    | {"state_bytes", "conv_bytes", "cache_bytes", "weight_bytes"}
)
_NON_NEGATIVE_INT_ARGUMENTS = frozenset({"shared_key_dim"})
_AMOUNT_ARGUMENTS = frozenset(
    {"cache_read", "state", "flops", "hbm_bytes", "other_weight_bytes", "weights", "keys"}
    | {"context"}
)
_BOOL_ARGUMENTS = frozenset({"compile", "hybrid", "matmul_only", "train"})
_TYPED_ARGUMENTS = {"preset": ModelPreset, "chip": Chip}


def _check_argument(function: str, name: str, value) -> None:
    """One argument of ``function`` against the rule its name implies (above)."""
    where = f"{function}: {name}"
    if value is None:
        return  # an optional argument left out (a required one has no None default)
    if name in _POSITIVE_INT_ARGUMENTS:
        check_int(where, value, 1)
    elif name in _NON_NEGATIVE_INT_ARGUMENTS:
        check_int(where, value, 0)
    elif name in _AMOUNT_ARGUMENTS:
        check_number(where, value, minimum=0)
    elif name in _BOOL_ARGUMENTS and not isinstance(value, bool):
        raise TypeError(f"{where} must be True or False, got {value!r}")
    elif name in _TYPED_ARGUMENTS and not isinstance(value, _TYPED_ARGUMENTS[name]):
        kind = _TYPED_ARGUMENTS[name].__name__
        raise TypeError(f"{where} must be a {kind}, got {type(value).__name__}")


def _checking_arguments(function):
    """``function`` with every argument checked by :func:`_check_argument` first."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def checked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            _check_argument(function.__name__, name, value)
        return function(*args, **kwargs)

    return checked


for _name, _function in list(globals().items()):
    if (
        inspect.isfunction(_function)
        and _function.__module__ == __name__
        and not _name.startswith("_")
    ):
        globals()[_name] = _checking_arguments(_function)
