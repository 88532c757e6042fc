"""Decode-time model of notebook 10 beyond one chip's mixer layers: the MoE weights a batch
reads (the routed experts it touches) and head-parallel tensor parallelism, in which every rank
reads the whole MLA latent.

Built on :mod:`kda_lib.lab.at_scale`: with ``tp = 1`` :func:`tp_decode_time` is
:func:`kda_lib.lab.at_scale.model_decode_time`.
"""

from __future__ import annotations

from kda_lib.lab import at_scale
from kda_lib.models.presets import ModelPreset


def expected_distinct_experts(batch: int, experts: int, top_k: int) -> float:
    """Expected number of distinct routed experts a step of ``batch`` tokens touches when each
    token picks ``top_k`` of ``experts`` uniformly at random, without repeats (a model of the
    router, not a measurement): an expert is missed by one token with probability
    ``1 - k / E``, so ``E (1 - (1 - k / E)^B)``."""
    if not 0 < top_k <= experts or batch < 1:
        raise ValueError(f"need 0 < top_k <= experts and batch >= 1, got {top_k}, {experts}, "
                         f"{batch}")
    return experts * (1 - (1 - top_k / experts) ** batch)


def moe_weight_bytes(
    batch: int,
    total_params: float,
    active_params: float,
    experts: int,
    top_k: int,
    mixer_params: float,
    weight_bytes: int = at_scale.BF16,
) -> float:
    """Bytes of the weights outside the mixer layers that a decode step of ``batch`` tokens
    reads: the weights every token uses ``N`` and the routed experts' ``R``, split from the
    reported totals by ``total = N + R`` and ``active = N + (k / E) R``, of which the step reads
    ``N`` and the expected distinct experts' share of ``R``; less ``mixer_params`` (counted
    per layer elsewhere). ``batch = 1`` reads ``active_params - mixer_params``."""
    routed = (total_params - active_params) / (1 - top_k / experts)
    shared = total_params - routed
    read = shared + routed * expected_distinct_experts(batch, experts, top_k) / experts
    return (read - mixer_params) * weight_bytes


def tp_decode_time(
    preset: ModelPreset,
    chip: at_scale.Chip,
    context: int,
    batch: int,
    tp: int,
    *,
    hybrid: bool = True,
    other_weight_bytes: float = 0.0,
) -> float:
    """Roofline time of one decode step on each of ``tp`` ranks under head-parallel tensor
    parallelism: a rank holds ``H / tp`` heads, so its share of every weight, of the flops, of
    the KDA states and of ``other_weight_bytes`` is ``1 / tp``; but all of an MLA layer's heads
    read the same latent cache, so every rank reads the whole of it (replicated, not split)."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    latents = batch * context * at_scale.mla_cache_numbers(preset) * at_scale.BF16
    mla = at_scale.step_time(
        batch * at_scale.mla_flops_per_token(preset, context, "decode") / tp,
        preset.mla_parameter_count() * at_scale.BF16 / tp + latents,
        chip,
    )
    kda = at_scale.step_time(
        batch * at_scale.kda_flops_per_token(preset, "decode") / tp,
        batch * at_scale.kda_decode_bytes(preset, batch) / tp,
        chip,
    )
    n_global = len(preset.global_layers) if hybrid else preset.num_layers
    mixers = n_global * mla + (preset.num_layers - n_global) * kda
    return mixers + other_weight_bytes / tp / chip.hbm_bandwidth
