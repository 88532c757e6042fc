"""Notebook 09's reading of a protocol-2 language-model record (``scripts/stdlib_lm_seeds.py``):
the runs per model at its chosen rate, the scores the notebook compares, and the figures.

* :func:`seed_runs` -- per model, the runs at the rate its grid chose, by seed (the tuning
  seed's runs left out), and which models are complete (enough seeds, best rate strictly
  inside its grid).
* :func:`by_seed` -- one number per run of each model, in seed order (paired across models).
* :func:`position_gap` -- a model's mean test bits per byte at given window positions minus
  another's, over seeds.
* :func:`gaps_from` -- a model minus others, paired by seed: compared at the first test position,
  and the mean gap at each validation.
* :func:`gap_beyond` -- how much of a model's gap to others appears only beyond 32 bytes of
  context (positions 33 on less 5-32), paired by seed.
* :func:`pair_table` -- a family of paired comparisons as a Markdown table.
* :func:`probe_scores` -- the copy probe's gain, its z over windows and the control, by seed.
* :func:`probe_against` -- the copy probe's gain of models minus another's, paired by seed, and
  their scores on the copy and control windows themselves; :func:`brief` one difference in short.
* :func:`plot_curves_and_positions` -- validation curves (mean over seeds) and test bits per
  byte by position, and both minus a reference model's.
* :func:`plot_decode_cost`, :func:`plot_live_and_recorded` -- the figures of the notebook's
  live run: decode cache against context, validation curves beside the recorded run's.
* :func:`live_record` -- the notebook's live run as the JSON of a recorded full run.

The statistics are :mod:`kda_lib.lab.significance`'s; the rules the runs follow are the
script's docstring, stored in the record under ``protocol``.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np

from kda_lib.lab.significance import Comparison, check_paired, compare, compare_family
from kda_lib.teaching.viz import MODEL_COLORS

MODEL_ORDER = ("hybrid", "hybrid_mha", "kda", "gdn", "attention")
COLORS = {m: MODEL_COLORS[m] for m in MODEL_ORDER}  # viz's one colour per model
_STYLES, _MARKERS = ("-", "--", "-.", ":"), ("o", "s", "^", "D", "v")  # told apart in grey
_BUCKETS = (0, 1, 4, 32)  # where the position buckets start (0-based): 1, 2-4, 5-32, 33 on
# the notebook's parameters a recorded full run keeps (``data/results/stdlib_lm_full.json``)
RECORDED_PARAMETERS = ("num_layers", "hybrid_layers", "kv_lora_rank", "hidden_size", "num_heads",
                       "head_dim", "seq_len", "batch_size", "steps", "learning_rate", "val_windows",
                       "seed")


def seed_runs(record: dict, min_seeds: int = 5) -> tuple[dict, set]:
    """``(runs, complete)``: ``runs[model]`` the model's runs at its grid's best rate with the
    reported seeds (never the tuning seed), sorted by seed; ``complete`` the models with at
    least ``min_seeds`` of them whose best rate lies strictly inside the rates tried."""
    grids, tune_seed = record["grids"], record["setting"]["tune_seed"]
    runs = {}
    for r in record["runs"]:
        grid = grids.get(r["model"])
        if grid and r["seed"] != tune_seed and r["learning_rate"] == grid["best"]:
            runs.setdefault(r["model"], []).append(r)
    runs = {m: sorted(rs, key=lambda r: r["seed"]) for m, rs in runs.items()}
    complete = {m for m, rs in runs.items() if len(rs) >= min_seeds and grids[m]["inside"]}
    return runs, complete


def by_seed(runs: dict, score: Callable[[dict], float], models) -> dict:
    """``{model: np.array of score(run) in seed order}`` for ``models``, checked paired (the
    same seeds for every model)."""
    check_paired({m: [r["seed"] for r in runs[m]] for m in models})
    return {m: np.array([score(r) for r in runs[m]], dtype=float) for m in models}


def position_gap(runs: dict, model: str, other: str, positions: slice) -> float:
    """Mean over seeds of ``model``'s test bits per byte at the window ``positions`` (0-based:
    ``slice(0, 1)`` is the first target, the window's second byte, predicted from one byte of
    context: ``bits_by_position`` scores targets 1..T) minus ``other``'s."""
    bits = {m: np.array([r["test"]["bits_by_position"] for r in runs[m]]) for m in (model, other)}
    return float(bits[model][:, positions].mean() - bits[other][:, positions].mean())


def gaps_from(runs: dict, model: str, others) -> tuple[list[Comparison], np.ndarray]:
    """``model`` minus each of ``others``, paired by seed: the paired comparisons
    (:func:`kda_lib.lab.significance.compare`: mean, 95% interval, seeds on each side) of their
    test bits at the first position (one byte of context), and the mean over seeds of the gap in
    validation bits per byte at each validation, ``[len(others), validations]``."""
    models = [model, *others]
    first = by_seed(runs, lambda r: r["test"]["bits_by_position"][0], models)
    curves = {m: np.array([r["curve"]["validation_bpb"] for r in runs[m]], float) for m in models}
    return ([compare(first[model], first[o]) for o in others],
            np.array([(curves[model] - curves[o]).mean(0) for o in others]))


def gap_beyond(
    runs: dict, model: str, others, split: int = 32, start: int = 4
) -> list[Comparison]:
    """How much of ``model``'s gap to each of ``others`` appears only beyond ``split`` bytes of
    context: per seed, ``model``'s test bits per byte averaged over the targets from ``split``
    on (positions ``split + 1`` to T, 1-based) minus those over ``start`` to ``split`` (positions
    ``start + 1`` to ``split``), minus the same for the other model; the paired comparisons
    (:func:`kda_lib.lab.significance.compare`: mean, 95% interval, seeds on each side)."""
    def excess(r):
        bits = np.asarray(r["test"]["bits_by_position"], float)
        if not 0 <= start < split < bits.size:
            raise ValueError(f"gap_beyond needs 0 <= start < split < T: start={start}, "
                             f"split={split}, T={bits.size}")
        return bits[split:].mean() - bits[start:split].mean()

    beyond = by_seed(runs, excess, [model, *others])
    return [compare(beyond[model], beyond[o]) for o in others]


def pair_table(tests: dict, models) -> str:
    """``tests`` (``{(a, b): Comparison}``, :func:`kda_lib.lab.significance.compare_family`'s,
    ``a`` before ``b`` in ``models``) as a Markdown table: row ``a``, column ``b``, the mean
    difference ``a - b`` to 3 decimals, `` *`` after it where the verdict is not level."""
    mark = {k: f"{c.mean:+.3f}" + ("" if c.verdict == "level" else " *") for k, c in tests.items()}
    rows = [f"| a \\ b | {' | '.join(models[1:])} |", "|---" * len(models) + "|"]
    rows += [f"| {a} | " + " | ".join(mark.get((a, b), "") for b in models[1:]) + " |"
             for a in models[:-1]]
    return "\n".join(rows)


def probe_scores(runs: dict, models) -> tuple[dict, dict, dict, dict, dict]:
    """``(gain, z, control, share, above_zero)``: per model, by seed (:func:`by_seed`), the copy
    probe's gain (control minus copy bits per byte), the gain over its windows' standard error,
    and the control windows' bits per byte (what an exact copier could save); ``share[model]``
    the mean gain over the mean control; ``above_zero[model]`` the gain against 0, paired t, Holm
    over ``models`` (:func:`kda_lib.lab.significance.compare_family`)."""
    gain, z, control = (by_seed(runs, f, models) for f in (
        lambda r: r["probe"]["gain_bpb"], lambda r: r["probe"]["gain_bpb"] / r["probe"]["gain_se"],
        lambda r: r["probe"]["control_bpb"]))
    share = {m: gain[m].mean() / control[m].mean() for m in models}
    above_zero = compare_family({m: (g, np.zeros(g.size)) for m, g in gain.items()})
    return gain, z, control, share, above_zero


def probe_against(runs: dict, models, other: str) -> dict:
    """``{part: {model: Comparison}}`` of each of ``models`` minus ``other``, paired by seed, for
    each ``part`` of the copy probe (``r["probe"]``): ``"gain_bpb"`` (control minus copy: how
    much the copy helps), ``"copy_bpb"`` and ``"control_bpb"`` (bits per byte on the copy and the
    control windows themselves); Holm over ``models`` within each part. A larger gain need not be
    a better copy score: it may come from a worse control."""
    parts = ("gain_bpb", "copy_bpb", "control_bpb")
    scores = {p: by_seed(runs, lambda r, p=p: r["probe"][p], [*models, other]) for p in parts}
    return {p: compare_family({m: (s[m], s[other]) for m in models}) for p, s in scores.items()}


def brief(c: Comparison) -> str:
    """``"+0.011 [-0.014, +0.037] bpb, higher on 3 of 5 seeds, level after Holm"``: a paired
    difference of a Holm family (:func:`kda_lib.lab.significance.compare_family`'s, as
    :func:`probe_against` gives) in short, with its verdict in that family."""
    verdict = "level" if c.verdict == "level" else "ordered"
    return (f"{c.mean:+.3f} [{c.low:+.3f}, {c.high:+.3f}] bpb, higher on {c.above} of {c.n} seeds, "
            f"{verdict} after Holm")


def one_byte_bound(data) -> float:
    """Bits per byte of ``data[1:]`` under its own (previous, next) byte frequencies, unsmoothed:
    the conditional entropy H(next | previous) of ``data`` (uint8 bytes), below which no model
    of the previous byte alone scores on ``data`` (Gibbs' inequality)."""
    data = np.asarray(data)
    if data.ndim != 1 or data.size < 2 or data.dtype != np.uint8:
        raise ValueError(
            f"one_byte_bound: data must be 1-d uint8 bytes, at least 2, got "
            f"{data.dtype} {data.shape}"
        )
    pairs = np.bincount(data[:-1].astype(np.int64) * 256 + data[1:], minlength=256 * 256)
    pairs = pairs.reshape(256, 256)
    rows = np.maximum(pairs.sum(1, keepdims=True), 1)
    return float(-(pairs * np.log2(np.maximum(pairs, 1) / rows)).sum() / pairs.sum())


def plot_curves_and_positions(
    runs: dict, models, reference: str = "kda", off_scale=("attention",)
) -> plt.Figure:
    """Top: validation bits per byte against steps (mean over seeds, range shaded) and test
    bits per byte by position (mean over seeds, log-scaled positions), one line style per model.
    Bottom: the same minus ``reference``'s, paired by seed, for every model but ``reference`` and
    ``off_scale`` (differences too large for the panel's scale): against steps with the seeds'
    range shaded; by position averaged within the buckets 1, 2-4, 5-32 and 33 on (one number a
    seed and bucket), the mean over seeds with min-max bars."""
    if reference not in models:
        raise ValueError(f"plot_curves_and_positions: reference {reference!r} not in {models}")
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.6), layout="constrained")
    curves = {m: np.array([r["curve"]["validation_bpb"] for r in runs[m]]) for m in models}
    bits = {m: np.array([r["test"]["bits_by_position"] for r in runs[m]]) for m in models}
    steps, size = runs[reference][0]["curve"]["step"], bits[reference].shape[1]
    every = [2**k - 1 for k in range(size.bit_length())]  # log-spaced markers
    styles, diffs = {}, {}
    for i, m in enumerate(models):
        styles[m] = dict(color=COLORS[m], linestyle=_STYLES[i % 4], marker=_MARKERS[i % 5], label=m)
        rows = [(curves[m], bits[m])]
        if m != reference and m not in off_scale:  # paired by seed: the same seeds, in order
            rows.append((curves[m] - curves[reference], None))
            diffs[m] = bits[m] - bits[reference]
        for ax, curve in zip(axes[:, 0], (row[0] for row in rows), strict=False):
            ax.plot(steps, curve.mean(0), **styles[m])
            ax.fill_between(steps, curve.min(0), curve.max(0), color=COLORS[m], alpha=0.12)
        axes[0, 1].plot(np.arange(1, size + 1), bits[m].mean(0), lw=1, markevery=every, **styles[m])
    _plot_buckets(axes[1, 1], diffs, size, styles)
    seeds, unit = "mean over seeds", f"bpb minus {reference}'s (bits per byte)"
    axes[0, 0].set(ylabel="validation bits per byte", title=f"validation ({seeds}, range shaded)")
    axes[0, 1].set(ylabel="test bits per byte", title=f"test bits per byte by position ({seeds})")
    off = f"; {', '.join(off_scale)} off scale: top" if off_scale else ""
    axes[1, 0].set(ylabel=unit, title=f"validation minus {reference}'s, paired by seed "
                   f"(range shaded{off})")  # fmt: skip
    axes[1, 1].set(ylabel=unit, title=f"test minus {reference}'s by position bucket ({seeds}, "
                   "range bars)")  # fmt: skip
    for ax in axes.flat:
        ax.title.set_fontsize(9)
    for ax in axes[1]:
        ax.axhline(0.0, color=COLORS[reference], linewidth=1, label=f"{reference} (0)")
    for ax in axes[:, 0]:
        ax.set(xlabel="optimiser step")
        ax.legend(fontsize=8)
    axes[0, 1].set(xscale="log", xlabel="position in the window (bytes seen, log scale)")
    axes[1, 1].set(xlabel="positions in the window (bytes seen)")
    return fig


def _plot_buckets(ax, diffs: dict, size: int, styles: dict) -> None:
    """``diffs[model]`` (seeds x positions) averaged within the position buckets 1, 2-4, 5-32,
    33-``size`` (those below ``size``): per model the mean over seeds, min-max bars, nudged."""
    edges = [e for e in _BUCKETS if e < size] + [size]
    spans = list(zip(edges[:-1], edges[1:], strict=True))
    x = np.arange(len(spans), dtype=float)
    for i, (m, d) in enumerate(diffs.items()):
        per_seed = np.stack([d[:, a:b].mean(1) for a, b in spans], 1)  # seeds x buckets
        mean, shift = per_seed.mean(0), 0.08 * (i - (len(diffs) - 1) / 2)
        ax.errorbar(x + shift, mean, yerr=(mean - per_seed.min(0), per_seed.max(0) - mean),
                    capsize=3, **styles[m])  # fmt: skip
    ax.set_xticks(x, [f"{a + 1}" if b == a + 1 else f"{a + 1}-{b}" for a, b in spans])


def plot_decode_cost(costs: dict) -> plt.Figure:
    """Decode cache (KiB, log) against context (tokens, log), one line per model:
    ``costs[model]`` the rows of :func:`kda_lib.lab.generate.decode_cost`; a model whose
    caches equal an earlier one's is drawn over it and its label says so."""
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    drawn = {}
    for name, rows in costs.items():  # models without a growing cache coincide
        cache = tuple(r["cache_bytes"] for r in rows)
        label = f"{name} (hides {drawn[cache]}: equal caches)" if cache in drawn else name
        drawn.setdefault(cache, name)
        ax.plot([r["context"] for r in rows], [b / 1024 for b in cache], "o-",
                color=MODEL_COLORS[name], label=label)  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="context (tokens seen, log scale)",
           ylabel="decode cache (KiB, log scale)", title="decode memory per sequence")  # fmt: skip
    ax.legend(fontsize=8)
    return fig


def plot_live_and_recorded(
    sources: dict, baseline: float, bound: float | None = None
) -> plt.Figure:
    """One panel per ``{title: {model: {"curve": {"step", "bpb"}}}}`` (this run, the recorded
    one), one y axis for all: validation bits per byte against steps, ``baseline`` (byte
    frequencies) dotted and, when given, ``bound`` (:func:`one_byte_bound`) dashed in every
    panel, labelled as of this run's validation bytes (it bounds one-byte models on all of them,
    not on a panel's windows, nor on a record's other corpus)."""
    fig, axes = plt.subplots(1, len(sources), figsize=(5.5 * len(sources), 3.6), squeeze=False,
                             sharey=True, layout="constrained")  # fmt: skip
    for ax, (title, models) in zip(axes[0], sources.items(), strict=True):
        for name, r in models.items():
            curve = r["curve"]
            ax.plot(curve["step"], curve["bpb"], "o-", color=MODEL_COLORS[name], label=name)
        ax.axhline(baseline, color="0.3", linestyle=":", label="byte frequencies")
        if bound is not None:  # labelled in each panel, not only in the legend
            ax.axhline(bound, color="0.3", linestyle="--", label="one-byte bound")
            ax.text(
                0.99,
                bound,
                "one-byte bound: H(next | previous) of this run's validation bytes",
                transform=ax.get_yaxis_transform(),
                ha="right",
                va="bottom",
                fontsize=7,
            )
        ax.set(xlabel="optimiser step", ylabel="validation bits per byte")
        ax.set_title(textwrap.fill(title, 60), fontsize=9)  # a long one on two lines
    # below the panels, not over them (the recorded curves fill the corners) nor beside them (a
    # long title would run under it)
    handles, labels = axes[0, -1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 7), fontsize=8)
    return fig


def live_record(parameters: dict, corpus: dict, unigram_bpb: float, results: dict, configs: dict,
                costs: dict) -> dict:
    """Notebook 09's live run as the JSON of a recorded full run: the :data:`RECORDED_PARAMETERS`
    of ``parameters`` (the notebook's globals), the corpus's description, the unigram baseline,
    the platform, per trained model its ``results`` with its config's record and its decode
    ``costs``, and the date (UTC)."""
    import jax  # the platform only

    return dict(config={n: parameters[n] for n in RECORDED_PARAMETERS}, corpus=corpus,
                unigram_bpb=unigram_bpb, platform=jax.devices()[0].platform,
                models={name: dict(r, config=configs[name].record(), decode=costs[name])
                        for name, r in results.items()},
                date=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()))
