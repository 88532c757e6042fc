"""Notebook 01's recall experiments, in float64 NumPy: how many pairs a memory holds, and a task
with two time scales where one decay per key channel beats one decay per head.

* :func:`recall_errors` scores memories on stored pairs; :func:`plot_recall_vs_pairs` draws
  section 7's figure (error against the number of pairs, and by age of the pair).
* The two-time-scale task (section 8) holds two kinds of entries, as a cache with a
  time-to-live would: **facts**, written first, that must be recalled at the end of the
  sequence (keys in the first half of the key channels), and a **stream** of short-lived
  entries written after them (keys in the second half), of which only the newest
  ``live_window`` must still be recalled; an older one has **expired**, and the right answer
  for its key is nothing (the zero vector).

Each memory of the task is the delta rule with beta = 1 and a per-channel retention per token
(decay first, then the write, as in KDA). A scalar gate (Gated DeltaNet) keeps the same
fraction in every channel; a per-channel gate (KDA) may keep the fact channels and clear the
stream channels. :func:`half_life_grid_errors` scores every pair of half-lives (fact channels,
stream channels); its diagonal is the scalar gate.
"""

from __future__ import annotations

import jax
import matplotlib.pyplot as plt
import numpy as np

GROUPS = ("facts", "live stream entries", "expired stream entries")


def recall_errors(states, keys, values):
    """``err[n, j]``: ``|S_n^T k_j - v_j|^2 / |v_j|^2`` for every memory ``states [N, K, V]``
    and stored pair ``j`` (keys ``[J, K]``, values ``[J, V]``)."""
    recalled = np.einsum("nkv,jk->njv", states, keys)
    return np.sum((recalled - values[None]) ** 2, -1) / np.sum(values**2, -1)[None]


def plot_recall_vs_pairs(curves, by_age, *, key_dim: int, title: str, law=None,
                         by_age_seeds=None) -> plt.Figure:
    """Left: mean error against the number of stored pairs ``curves[name] [n]`` (and ``law [n]``,
    linear attention's expected error, dotted); right: the error after every write by age of the
    pair, ``by_age[name] [n]`` (newest first), the mean of ``by_age_seeds[name] [seeds, n]``
    when given, then with a band of one standard error of that mean (and ``law[-1]``, linear
    attention's expected error at every age: each pair has the same ``n - 1`` others)."""
    n_max = len(next(iter(curves.values())))
    fig, (ax_n, ax_age) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (name, curve), style in zip(curves.items(), ("-", "--", "-."), strict=False):
        ax_n.plot(np.arange(1, n_max + 1), curve, style, label=name)
        line = ax_age.plot(np.arange(n_max), by_age[name], style, label=name)[0]
        if by_age_seeds is not None and len(by_age_seeds[name]) > 1:
            per_seed = np.asarray(by_age_seeds[name])
            se = per_seed.std(0, ddof=1) / np.sqrt(len(per_seed))
            ax_age.fill_between(np.arange(n_max), by_age[name] - se, by_age[name] + se,
                                color=line.get_color(), alpha=0.2, linewidth=0)
    if law is not None:
        ax_n.plot(np.arange(1, n_max + 1), law, ":", color="0.3",
                  label=r"$\frac{n-1}{d_k} \frac{d_v}{d_v-2}$ (linear, expected)")
        ax_age.axhline(law[-1], color="0.3", linewidth=1, linestyle=(0, (1, 2)),
                       label="linear, expected (every age)")
    ax_n.axvline(key_dim, color="0.4", linewidth=1, linestyle=":")
    ax_n.annotate(
        f"$n = d_k = {key_dim}$",
        (key_dim, 0.02),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        fontsize=9,
        color="0.3",
    )
    ax_n.set(
        title="Recall error vs pairs stored",
        xlabel="stored key/value pairs $n$",
        ylabel=r"mean $\|S^\top \mathbf{k} - \mathbf{v}\|^2 / \|\mathbf{v}\|^2$",
    )
    ax_n.legend(loc="upper left")
    ax_age.axhline(1.0, color="0.4", linewidth=1, linestyle=":")
    ax_age.annotate(
        "error 1: what returning 0 scores",
        (n_max - 1, 1.0),
        xytext=(0, -12),
        textcoords="offset points",
        ha="right",
        fontsize=9,
        color="0.3",
    )
    ax_age.legend(loc="lower right", fontsize=8)
    seeds = "" if by_age_seeds is None else f" over {len(next(iter(by_age_seeds.values())))} seeds"
    ax_age.set(
        title=f"After {n_max} writes: error by age of the pair",
        xlabel="age of the pair (writes since it was stored)",
        ylabel=f"mean{seeds} of\n" + r"$\|S^\top \mathbf{k} - \mathbf{v}\|^2 / \|\mathbf{v}\|^2$",
    )
    fig.suptitle(title)
    return fig


def two_timescale_task(key, *, key_dim, value_dim, num_facts, stream_len, batch):
    """``batch`` draws of the sequence: keys ``[batch, N, K]`` (unit rows; facts in channels
    ``:K // 2``, stream entries in ``K // 2:``) and values ``[batch, N, V]`` (norm about 1),
    ``N = num_facts + stream_len``, facts first."""
    half, num = key_dim // 2, num_facts + stream_len
    draw = np.asarray(jax.random.normal(key, (batch, num, key_dim + value_dim)), np.float64)
    keys = draw[..., :key_dim].copy()
    keys[:, :num_facts, half:] = 0.0  # facts: the first half of the channels
    keys[:, num_facts:, :half] = 0.0  # stream: the second half
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    return keys, draw[..., key_dim:] / np.sqrt(value_dim)


def final_memories(keys, values, retention):
    """The delta rule (beta = 1) after every write, one memory per retention setting.

    keys ``[N, K]``, values ``[N, V]``, retention ``[n, K]`` (the fraction each channel keeps
    per token, ``exp(g)``); returns the final states ``[n, K, V]``, float64."""
    keys, values = np.asarray(keys, np.float64), np.asarray(values, np.float64)
    retention = np.asarray(retention, np.float64)
    S = np.zeros((retention.shape[0], keys.shape[1], values.shape[1]))
    for k, v in zip(keys, values, strict=True):
        S *= retention[:, :, None]  # forget, channel by channel
        S += k[None, :, None] * (v - np.einsum("k,nkv->nv", k, S))[:, None, :]  # write the error
    return S


def group_errors(memories, keys, values, *, num_facts, live_window):
    """``[n, 3]``: the mean of ``|S^T k_j - target_j|^2 / |v_j|^2`` over the facts, the live
    stream entries (target ``v_j``) and the expired ones (target 0), for each memory."""
    recalled = np.einsum("jk,nkv->njv", keys, memories)
    norms = np.sum(values**2, -1)
    live = np.arange(len(keys)) >= len(keys) - live_window
    facts = np.arange(len(keys)) < num_facts
    targets = np.where((facts | live)[:, None], values, 0.0)
    err = np.sum((recalled - targets[None]) ** 2, -1) / norms[None]
    expired = ~(facts | live)
    return np.stack([err[:, facts].mean(1), err[:, live].mean(1), err[:, expired].mean(1)], 1)


def half_life_grid_errors(keys, values, half_lives, *, num_facts, live_window):
    """``[B, len(h), len(h), 3]``: :func:`group_errors` of each draw (keys ``[B, N, K]``, values
    ``[B, N, V]``) with half-life ``h[i]`` (tokens) in the fact channels and ``h[j]`` in the
    stream channels; ``inf`` keeps everything. The diagonal ``i == j`` is one decay per head."""
    keep = np.exp(np.log(0.5) / np.asarray(half_lives, np.float64))  # per token; inf -> 1
    half, n = keys.shape[-1] // 2, len(keep)
    fact_keep, stream_keep = (x.reshape(-1, 1) for x in np.meshgrid(keep, keep, indexing="ij"))
    retention = np.concatenate(
        [np.repeat(fact_keep, half, 1), np.repeat(stream_keep, keys.shape[-1] - half, 1)], axis=1
    )
    grids = []
    for keys_b, values_b in zip(keys, values, strict=True):
        memories = final_memories(keys_b, values_b, retention)
        errors = group_errors(
            memories, keys_b, values_b, num_facts=num_facts, live_window=live_window
        )
        grids.append(errors.reshape(n, n, 3))
    return np.stack(grids)


def best_settings(errors):
    """From a grid ``[h, h, 3]`` (mean over draws): ``(i, i)``, the best scalar gate, and
    ``(i, j)``, the best per-channel pair, by the mean of the three groups."""
    mean = errors.mean(-1)
    diagonal = int(np.argmin(np.diag(mean)))
    pair = np.unravel_index(int(np.argmin(mean)), mean.shape)
    return (diagonal, diagonal), (int(pair[0]), int(pair[1]))


def plot_two_timescales(errors, half_lives, *, title: str) -> plt.Figure:
    """Left: the scalar gate's three errors against its half-life, with the best per-channel
    mean; right: the mean error over both half-lives (the diagonal is the scalar gate)."""
    finite = np.where(
        np.isfinite(half_lives), half_lives, 4 * half_lives[np.isfinite(half_lives)].max()
    )
    scalar, pair = best_settings(errors)
    mean = errors.mean(-1)
    fig, (ax_s, ax_m) = plt.subplots(1, 2, figsize=(10.5, 3.9))
    for group, style in zip(range(3), ("-", "--", "-."), strict=True):
        ax_s.plot(finite, np.diag(errors[:, :, group]), style, label=GROUPS[group])
    ax_s.plot(finite, np.diag(mean), color="0.2", linewidth=2, label="mean of the three")
    ax_s.axhline(mean[pair], color="0.2", linestyle=":", label="per-channel gate, best pair")
    ax_s.set(
        xscale="log",
        xlabel="half-life of the one decay (tokens; right end: no decay)",
        ylabel=r"$\|S^\top \mathbf{k} - \mathrm{target}\|^2 / \|\mathbf{v}\|^2$",
        title="One decay per head (Gated DeltaNet)",
    )
    ax_s.set_ylim(0, 1.5)  # room for the legend
    ax_s.legend(fontsize=8, loc="upper center", ncol=2)
    image = ax_m.pcolormesh(finite, finite, mean.T, shading="nearest", cmap="viridis")
    ax_m.plot(finite, finite, color="w", linewidth=1, linestyle="--")
    ax_m.plot(finite[scalar[0]], finite[scalar[1]], "wo", markersize=7, label="best scalar gate")
    ax_m.plot(finite[pair[0]], finite[pair[1]], "w*", markersize=12, label="best per-channel")
    ax_m.set(
        xscale="log",
        yscale="log",
        xlabel="half-life in the fact channels (tokens; right: none)",
        ylabel="half-life in the stream channels (top: none)",
        title="Mean error, one decay per channel group",
    )
    ax_m.grid(False)
    ax_m.legend(fontsize=8, loc="upper left")
    fig.colorbar(image, ax=ax_m, label="mean error")
    fig.suptitle(title)
    return fig
