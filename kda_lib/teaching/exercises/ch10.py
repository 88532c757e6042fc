"""Checkers for notebook 10 (Kimi Linear at scale); worked solutions in
``notebooks/solutions/ch10.py``. Each recomputes the answer from :mod:`kda_lib.lab.at_scale` and
returns
None (right) or a hint that does not give the answer away."""

from __future__ import annotations

import math

import numpy as np

from kda_lib.teaching.exercises import checker, refuse_degenerate


def _preset(name):
    from kda_lib.models import presets

    return presets.PRESETS[name]


def _is_int(answer) -> bool:
    """A whole number of tokens: a Python or numpy int, or a whole float (``np.ceil``'s)."""
    if isinstance(answer, (bool, np.bool_)):
        return False
    if isinstance(answer, (float, np.floating)):
        return bool(np.isfinite(answer)) and float(answer).is_integer()
    return isinstance(answer, (int, np.integer))


@checker("10.1")
def cache_reduction(answer, *, preset: str, context: int):
    """answer: ``1 - hybrid / all-MLA`` decode memory of one sequence at ``context`` tokens."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    hint = refuse_degenerate(answer, shape=(), what="the reduction")
    if hint:
        return hint
    answer = float(answer)
    expected = 1 - at_scale.model_cache_bytes(p, context) / at_scale.model_cache_bytes(
        p, context, hybrid=False
    )
    if answer > 1:
        return "a fraction (at most 1), not a percentage"
    if not math.isclose(answer, expected, rel_tol=1e-6):
        return (
            "count every layer: the global layers cache T (d_c + d_R) bf16 numbers, the KDA "
            "layers keep their float32 state and conv history (at_scale.kda_state_bytes)"
        )
    return None


@checker("10.2")
def ring_crossover(answer, *, preset: str, ranks: int):
    """answer: the smallest T (a multiple of nothing in particular, an int) at which ring
    attention over the MLA latents moves more bytes per rank than the KDA summaries + halo."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    hint = refuse_degenerate(answer, shape=(), integer=True, what="T")
    if hint:
        return hint
    if not _is_int(answer):
        return "answer with an int (tokens)"
    answer = int(answer)
    if answer < 2:
        return "T is a context length: a positive number of tokens, at least 2"
    flat = at_scale.cp_summary_bytes(p, ranks) + at_scale.cp_halo_bytes(p)

    def ring(t):
        return at_scale.ring_attention_bytes(at_scale.mla_cache_numbers(p), t, ranks)

    if not (ring(answer) > flat >= ring(answer - 1)):
        return (
            "solve (R - 1)/R T (d_c + d_R) b_KV > (R - 1) H d_k (d_k + d_v) b_S + halo for the "
            "smallest whole T"
        )
    return None


@checker("10.3")
def decode_crossover(answer, *, preset: str):
    """answer: the smallest context T at which one MLA layer's decode step reads at least as
    many cache bytes as one KDA layer's state traffic (read and written, conv history too)."""
    from kda_lib.lab import at_scale

    p = _preset(preset)
    hint = refuse_degenerate(answer, shape=(), integer=True, what="T")
    if hint:
        return hint
    if not _is_int(answer):
        return "answer with an int (tokens)"
    answer = int(answer)
    state = 2 * at_scale.kda_state_bytes(p)
    per_token = at_scale.mla_cache_numbers(p) * at_scale.BF16
    if not (answer * per_token >= state > (answer - 1) * per_token):
        return "the KDA state is read and written (2x), the bf16 latents only read: T >= ..."
    return None
