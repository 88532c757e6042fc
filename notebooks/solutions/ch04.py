"""Worked solutions of notebook 04's exercises (checked by ``tests/teaching/test_exercises.py``)."""

from __future__ import annotations


def gdn_parameters(d, H, K, V, r, w):
    """1: section 3's count, part by part, with one decay per head. Only two parts have one
    entry per key channel: ``f_proj``'s up factor (``r x H K`` becomes ``r x H``) and
    ``dt_bias`` (``H K`` becomes ``H``); everything else is unchanged."""
    q_k, v_proj, conv = 2 * d * H * K, d * H * V, w * H * (2 * K + V)
    f_proj = d * r + r * H  # was d r + r H K
    b_proj, g_proj = d * H, d * r + r * H * V + H * V  # g_proj's up factor and its bias
    a_log, dt_bias = H, H  # dt_bias was H K
    return q_k + v_proj + conv + f_proj + b_proj + g_proj + a_log + dt_bias + V + H * V * d


def gdn_parameters_by_difference(d, H, K, V, r, w):
    """1, written differently: KDA's count (section 3) minus what per-channel decay adds,
    ``(K - 1) H`` in ``f_proj``'s up factor per rank and ``(K - 1) H`` in ``dt_bias``."""
    kda = (2 * d * H * K + d * H * V + w * H * (2 * K + V) + d * r + r * H * K + d * H
           + d * r + r * H * V + H * V + H + H * K + V + H * V * d)
    return kda - (K - 1) * H * (r + 1)


def cache_floats(H, K, V, w):
    """2: the state ``[H, K, V]`` and, for each short convolution (q, k, v), the last ``w - 1``
    inputs of its ``H K``, ``H K`` and ``H V`` channels: ``H K V + (w - 1) H (2K + V)``. At
    ``H = 16, K = V = 128, w = 4``: 262,144 + 18,432 (7% more than the state alone)."""
    return H * K * V + (w - 1) * H * (2 * K + V)


def cases():
    def per_channel(d, H, K, V, r, w):  # KDA's count: the gate still per channel
        return gdn_parameters_by_difference(d, H, K, V, r, w) + (K - 1) * H * (r + 1)

    return [
        ("04.1", gdn_parameters, {}, per_channel),
        ("04.1", gdn_parameters_by_difference, {}, per_channel),
        ("04.2", cache_floats, {}, lambda H, K, V, w: H * K * V),
        ("04.2", lambda H, K, V, w: H * (K * V + (w - 1) * (K + K + V)), {},
         lambda H, K, V, w: H * K * V + w * H * (2 * K + V)),
    ]
