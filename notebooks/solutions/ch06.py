"""Worked solutions of notebook 06's exercises (``cases()`` feeds them to the checkers)."""

from __future__ import annotations

import itertools

import numpy as np


def blind_floor(probs) -> tuple[float, float]:
    """1: a model that cannot see the source token can only predict one distribution pred, the
    same whatever the source. The expected loss -sum_v probs[v] log pred[v] is smallest at
    pred = probs (Gibbs' inequality), where it is the entropy -sum_v probs[v] log probs[v] in nats
    (0 log 0 counts as 0); the best guess is always the likeliest token, right with probability
    max_v probs[v]. For uniform tokens these are the page's log |V| and 1 / |V|."""
    probs = np.asarray(probs, np.float64)
    seen = probs[probs > 0]
    return float(-(seen * np.log(seen)).sum()), float(probs.max())


def seen_positions(last: int, widths: list[int], dilations: list[int]) -> list[int]:
    """2: layer i's conv reads t - j d_i for j = 0 .. w_i - 1; stacked, an output at ``last``
    reads last - sum_i j_i d_i for every choice of the j_i. The reach is sum_i d_i (w_i - 1),
    as for the page's stack (d_i = 1), but with dilations the offsets can leave gaps: widths
    (2, 2) with dilations (1, 4) give offsets 0, 1, 4, 5 only. Nothing before position 0."""
    offsets = {sum(j * d for j, d in zip(js, dilations, strict=True))
               for js in itertools.product(*(range(w) for w in widths))}
    return sorted(last - o for o in offsets if o <= last)


def lost_positions(seq_len: int, delay: int, conv_size: int, period: int,
                   clear_upper_convs: bool = True) -> list[int]:
    """3: let p be the last clearing at or before t (0: none yet, nothing lost) and s = t - delay.
    Upper histories cleared too: at p every state and every conv history above layer 0 is
    emptied, so what crosses p is layer 0's history, the embeddings of tokens p - w + 1 .. p - 1
    (section 4's argument); an earlier clearing's survivors are wiped again at p, so only the
    last clearing matters: t loses its token when s < p - (w - 1).
    Upper histories kept: tokens from p - w + 1 on cross as before, older ones only through
    layer 1's kept history, layer 1's inputs at p - w + 1 .. p - 1. Those hold layer 0's outputs
    there, read from layer 0's state, which was itself emptied at the clearing p' at or before
    p - w + 1 (p' = p - period when w - 1 < period) and since then holds the tokens from
    p' - (w - 1) on (its own history at p', then the new tokens); layer 0's conv adds nothing
    older. So t loses its token when s < p' - (w - 1), p' > 0: the same rule applied at
    p - (w - 1). With one clearing p' = 0 and nothing is lost, as on the page; layer 1's state
    feeds nothing that crosses a clearing (no layer above it). The first clearing with the upper
    histories cleared can be checked in the notebook with ``accuracy_after(period, True, True)``."""
    lost = []
    for t in range(delay, seq_len):
        p = (t // period) * period  # the last clearing at or before t (0: none yet)
        p_cut = p if clear_upper_convs else (p - (conv_size - 1)) // period * period  # p or p'
        if p_cut > 0 and t - delay < p_cut - (conv_size - 1):
            lost.append(t)
    return lost


def cases():
    def uniform_floor(probs):  # the page's chance level, whatever the distribution
        return float(np.log(len(probs))), 1 / len(probs)

    def contiguous(last, widths, dilations):  # the reach right, the gaps missed
        span = sum(d * (w - 1) for w, d in zip(widths, dilations, strict=True))
        return list(range(max(0, last - span), last + 1))

    return [
        ("06.1", blind_floor, {}, uniform_floor),
        ("06.2", seen_positions, {}, contiguous),
        ("06.3", lost_positions, {},
         lambda s, d, w, period, upper: lost_positions(s, d, w, s // 2, upper)),
    ]
