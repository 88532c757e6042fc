"""Notebook 08's helpers: the bookkeeping of synthetic-recall sweeps (grouping runs into
cells, the verdicts on the paper's claims) and the figures. The protocol these implement is
stated in the notebook (and in ``docs/DESIGN.md``, section 6); the statistics are
:mod:`kda_lib.lab.significance`'s.

* :func:`reporter` -- what a live sweep does with each finished run (print, save).
* :func:`tuned` -- a live sweep's runs per (task, mixer, T) at the rate chosen on validation
  batches, with the test accuracies reported; :func:`print_table` prints them.
* :func:`sweep_cells` -- a recorded sweep's runs per cell at the tuned rate, sorted by seed,
  and which cells are complete (enough seeds, best rate strictly inside its grid);
  :func:`print_cells` prints them.
* :func:`check_protocol` -- a recorded sweep's protocol (test stream, tuning seed never
  reported, the same seeds in every complete cell), or ValueError.
* :func:`kda_family` -- KDA against every other complete mixer, paired by seed: the family of
  comparisons the claims' verdicts are read from; :func:`ordered_in_every_family` -- which
  ordered rows survive larger families; :func:`ordered_ahead` -- the rows ordered on every seed.
* :func:`recorded_sizes` -- each mixer's parameter count, rebuilt from the runs' model dicts;
  :func:`size_line` prints them.
* :func:`beyond_reach` -- stack's test accuracy on the pops beyond the conv-only reach.
* :func:`vote_accuracy` -- MQAR accuracy of voting for the sequence's most frequent value.
* :func:`stop_label` -- a run's stop, "rising" only where validation rose (net) at the budget.
* :func:`solve_step`, :func:`claim_a`, :func:`claim_b` -- steps to the solved level and the
  verdict rules for the paper's two claims.
* :func:`induction_reads` -- where the two-step (previous-token, induction) circuit reads
  each MQAR answer.
* :func:`capacity_curve` -- a capacity record's test accuracies per mixer and pairs count;
  :func:`print_capacity` prints them; :func:`capacity_reading` -- the numbers notebook 08 reads
  from them (the vote level a reference); :func:`exact_recall_errors` -- how many pairs a state
  holds exactly, in float64; :func:`tuning_steps` -- a sweep's steps to solve per tuning rate.
* :func:`plot_task_examples`, :func:`plot_induction_steps`, :func:`plot_recorded`,
  :func:`plot_capacity` -- the figures.
"""

from __future__ import annotations

import json
import re
from math import factorial

import matplotlib.pyplot as plt
import numpy as np

from kda_lib.lab.significance import check_paired, compare_family, sign_flip_p
from kda_lib.lab.train import record_scores, save_record, summary_line
from kda_lib.models.tiny_lm import ModelConfig, config_param_count
from kda_lib.teaching.viz import MODEL_COLORS, token_rows

MIXER_ORDER = ("kda", "gdn", "mamba2", "attention", "attention_conv", "conv")
COLORS = {m: MODEL_COLORS[m] for m in MIXER_ORDER}  # viz's one colour per model
MARKERS = dict(zip(MIXER_ORDER, "osD^vP", strict=True))  # ceiling lines stay told apart


def label(mixer: str) -> str:
    """The name a mixer is shown by: ``"mamba2"`` (``"mamba2 beyond"``) reads ``"mamba2-style"``
    (the stand-in whose writes are not scaled by the step size: not Mamba2 itself);
    ``"mamba2_dt"``, with Mamba2's discretisation, reads ``"mamba2 (Δt)"``."""
    return re.sub(r"mamba2(?!_dt)", "mamba2-style", mixer).replace("mamba2_dt", "mamba2 (Δt)")


def reporter(tuning: list, records: list, path: str):
    """``report(record, into)`` for :func:`kda_lib.lab.train.run_sweep`: appends ``record`` to
    ``into``, prints its summary line and rate and, if ``path`` is not empty, rewrites
    ``path`` with ``{"tuning": tuning, "runs": records}`` after every run."""

    def report(record, into):
        into.append(record)
        print(summary_line(record), f" lr {record['training']['learning_rate']:g}", flush=True)
        if path:
            save_record(dict(tuning=tuning, runs=records), path)

    return report


def tuned(records) -> dict:
    """(task, mixer, T) -> {"lr", "acc" (test accuracy, one per seed), "runs"}; where a setting
    ran at several rates, the one with the best mean *validation* accuracy (the test batches
    decide nothing)."""
    groups = {}
    for r in records:
        setting = (r["task"], r["mixer"], r["training"]["seq_len"])
        groups.setdefault(setting, {}).setdefault(r["training"]["learning_rate"], []).append(r)
    best = {}
    for setting, by_lr in groups.items():
        lr = max(
            by_lr,
            key=lambda lr: np.mean([record_scores(r)["validation"]["accuracy"] for r in by_lr[lr]]),
        )
        acc = [record_scores(r)["test"]["accuracy"] for r in by_lr[lr]]
        best[setting] = dict(lr=lr, acc=np.array(acc), runs=by_lr[lr])
    return best


def print_table(best: dict, title: str) -> None:
    """Mean +- sample sd [min, max] of each setting's accuracies over seeds."""
    print(title)
    for (task, mixer, t), b in sorted(best.items()):
        acc = b["acc"]
        sd = acc.std(ddof=1) if len(acc) > 1 else float("nan")
        print(
            f"{task:11s} T={t:<4d} {mixer:15s} lr {b['lr']:<7g} {acc.mean():.3f} +- {sd:.3f}"
            f"  [{acc.min():.3f}, {acc.max():.3f}]  ({len(acc)} seeds)"
        )


def sweep_cells(sweep: dict, min_seeds: int = 3):
    """``(cells, complete, acc)`` of a recorded sweep: ``cells[(task, mixer, T)]`` the runs at
    the tuned rate sorted by seed, ``complete`` the cells with ``min_seeds`` seeds whose best
    rate lies strictly inside its grid, ``acc[cell]`` the reported accuracies by seed.

    A protocol-2 record (``setting["protocol_version"] >= 2``) reports the test stream and
    leaves its tuning runs (``setting["tune_seed"]``) out of the cells; an earlier record has
    one held-out stream, and its tuning run at the chosen rate is seed 0 of the cell."""
    grids, cells = sweep["grids"], {}
    protocol = sweep["setting"].get("protocol_version", 1)
    reported = "test" if protocol >= 2 else "validation"
    tuning_seed = sweep["setting"].get("tune_seed") if protocol >= 2 else None
    for r in sweep["runs"]:
        row = grids.get(f"{r['task']}/{r['mixer']}")
        if r["training"]["seed"] == tuning_seed:
            continue
        if row and r["training"]["learning_rate"] == row["best"]:
            cells.setdefault((r["task"], r["mixer"], r["training"]["seq_len"]), []).append(r)
    cells = {c: sorted(rs, key=lambda r: r["training"]["seed"]) for c, rs in cells.items()}
    complete = {
        c for c, rs in cells.items() if len(rs) >= min_seeds and grids[f"{c[0]}/{c[1]}"]["inside"]
    }
    acc = {
        c: np.array([record_scores(r)[reported]["accuracy"] for r in rs]) for c, rs in cells.items()
    }
    return cells, complete, acc


def check_protocol(sweep: dict, cells: dict, complete: set, num_seeds: int) -> set:
    """The reported seeds of a recorded sweep (``sweep_cells``'s ``cells``, ``complete``) whose
    protocol is as notebook 08 states it, else ValueError naming what is not: protocol 2, every
    run scored on the test stream, the tuning seed never reported, ``num_seeds`` reported seeds,
    the same in every complete cell."""
    runs, setting = sweep["runs"], sweep["setting"]
    reported = {r["training"]["seed"] for r in runs if r["phase"] == "seeds"}
    problems = [why for why, bad in (
        ("not protocol 2", setting.get("protocol_version") != 2),
        ("a run without a test score", not all(record_scores(r)["test"] for r in runs)),
        ("the tuning seed reported", setting.get("tune_seed") in reported),
        (f"{len(reported)} reported seeds, not {num_seeds}", len(reported) != num_seeds),
        ("a complete cell without the reported seeds", any(
            {r["training"]["seed"] for r in cells[c]} != reported for c in complete))) if bad]
    if problems:
        raise ValueError("check_protocol: " + "; ".join(problems))
    return reported


def recorded_sizes(runs) -> dict:
    """``{mixer: parameter count}``, rebuilt from each run's recorded ``model`` dict; ValueError
    unless every run's recorded ``params`` is its model's count and each mixer has one model."""
    sizes, counted = {}, {}
    for r in runs:
        model = json.dumps(r["model"], sort_keys=True)  # each distinct model counted once
        if model not in counted:
            counted[model] = config_param_count(ModelConfig.from_flat(**r["model"]))
        count = counted[model]
        if r["params"] != count or sizes.setdefault(r["mixer"], count) != count:
            raise ValueError(f"{r['mixer']}: {r['params']} parameters recorded, {count} rebuilt "
                             f"(another of its runs: {sizes.get(r['mixer'])})")
    return sizes


def size_line(size: dict) -> str:
    """``parameters: KDA n, GDN m (KDA +x%), ...`` from :func:`recorded_sizes`."""
    return "parameters: " + ", ".join(f"{label(m)} {n:,d}" + (
        f" (KDA {size['kda'] / n - 1:+.1%})" if m != "kda" else "") for m, n in size.items())


def beyond_reach(runs) -> np.ndarray | None:
    """The runs' test accuracy on the scored positions whose answer lies beyond the conv-only
    model's reach (``beyond_reach_accuracy``: stack), by run; None for a task without it."""
    scores = [record_scores(r)["test"].get("beyond_reach_accuracy") for r in runs]
    return None if None in scores else np.array(scores)


def vote_accuracy(num_pairs: int, num_values: int, probs=None) -> float:
    """MQAR accuracy of answering every query with the sequence's most frequent value (the
    best rule that sees which values are present but not which key each follows): E[largest
    multiplicity] / ``num_pairs`` for ``num_pairs`` values drawn independently, with
    replacement, from ``num_values`` (uniformly, or value i with probability ``probs[i]``);
    exact (truncated exponential generating functions)."""
    n, expected_max = num_pairs, 0.0
    scale = np.ones(num_values) if probs is None else num_values * np.asarray(probs, np.float64)
    for k in range(1, n + 1):  # P(largest count >= k) = 1 - P(every count < k)
        poly, part = np.ones(1), np.array([1 / factorial(j) for j in range(k)])
        for s in scale:  # value i taking j draws: (m p_i)^j / j!, the m^n divided out below
            poly = np.convolve(poly, part * s ** np.arange(k))[: n + 1]
        expected_max += 1 - factorial(n) * (poly[n] if poly.size > n else 0.0) / num_values**n
    return expected_max / n


def stop_label(run: dict, flat_tol: float, window: float = 0.2) -> str:
    """The run's recorded stop, with "rising" kept only where validation accuracy ended at least
    ``flat_tol`` above its value before the last ``window`` of the steps; a run that moved by
    ``flat_tol`` (the recording rule, either way) without that net gain is "moving"."""
    if run["stop"] != "rising":
        return run["stop"]
    steps, accuracy = run["curve"]["step"], run["curve"]["accuracy"]
    start = steps[-1] * (1 - window)  # a rising run ran to its budget
    before = [a for s, a in zip(steps, accuracy, strict=True) if s <= start] or accuracy[:1]
    return "rising" if accuracy[-1] - before[-1] >= flat_tol else "moving"


def solve_step(run: dict, solved: float):
    """The step of the run's first held-out evaluation at the ``solved`` level (None: never)."""
    hits = [
        s
        for s, a in zip(run["curve"]["step"], run["curve"]["accuracy"], strict=True)
        if a >= solved
    ]
    return hits[0] if hits else None


def kda_family(cells: dict, complete: set, acc: dict, solved: float) -> dict:
    """The comparisons of claims A and B, paired by seed: ``{(task, T, mixer): (KDA's test
    accuracies, the mixer's)}`` for every other complete mixer of a complete KDA cell, and
    ``{(task, T, "steps"): (KDA's steps to ``solved``, GDN's)}`` where both solve on every seed.
    Raises ValueError where two cells' seeds differ (their scores would not be paired)."""
    family = {}
    for task, mixer, t in sorted(complete):
        kda = (task, "kda", t)
        if mixer == "kda" or kda not in complete:
            continue
        check_paired(
            {
                f"{task} T={t} {m}": [r["training"]["seed"] for r in cells[(task, m, t)]]
                for m in ("kda", mixer)
            }
        )
        family[(task, t, mixer)] = acc[kda], acc[(task, mixer, t)]
        if mixer == "gdn":  # steps to solve: "<" is KDA faster
            steps = [[solve_step(r, solved) for r in cells[c]] for c in (kda, (task, mixer, t))]
            if None not in steps[0] + steps[1]:
                family[(task, t, "steps")] = tuple(steps)
    return family


def ordered_in_every_family(*families: dict, against=("gdn", "mamba2")) -> tuple[dict, list]:
    """Holm over each family of :func:`kda_family` comparisons in turn: ``({family size: its
    ordered rows}, the rows against ``against`` ordered in every family)``, the check that an
    exploratory family's ordered rows do not hang on which rows were put in it."""
    ordered = {len(f): [k for k, c in compare_family(f).items() if c.verdict != "level"]
               for f in families}  # fmt: skip
    every = set.intersection(*(set(v) for v in ordered.values()))
    return ordered, sorted(k for k in every if k[2].split()[0] in against)


def ordered_ahead(tests: dict, task: str) -> set:
    """``{(T, other)}``: ``task``'s rows of a family of comparisons (keys ``(task, T, other)``)
    ordered by Holm with KDA ahead on every seed."""
    return {(t, m) for (name, t, m), c in tests.items()
            if name == task and c.verdict != "level" and c.above == c.n}


def recorded_limits(sweep: dict, cells: dict, chance: float) -> dict:
    """What bounds the reading of a recorded sweep (``sweep_cells``'s ``cells``): ``palindrome``
    the recurrent mixers' (kda, gdn, mamba2) test accuracies per (mixer, T) in multiples of
    ``chance``, ``rising`` how many of those runs were still rising at the budget
    (:func:`stop_label`: a net gain over the last fifth of the steps), ``tune``
    stack/GDN's validation accuracy per rate on the tuning seed, ``margin`` the chosen rate's
    lead over the next best, ``solve`` MQAR's steps to ``solved`` per mixer (kda, gdn) at the
    longest length, a run that never got there counted as the budget ``max_steps``."""
    setting, tuning = sweep["setting"], ("tune", "stack", "gdn")
    pal = {c[1:]: cells[c] for c in cells if c[0] == "palindrome" and c[1] in MIXER_ORDER[:3]}
    tune = {
        r["training"]["learning_rate"]: record_scores(r)["validation"]["accuracy"]
        for r in sweep["runs"]
        if (r.get("phase"), r["task"], r["mixer"]) == tuning
    }
    longest = max(t for task, _, t in cells if task == "mqar")
    solve = {
        m: [solve_step(r, setting["solved"]) or setting["max_steps"] for r in cells[cell]]
        for m, cell in (("kda", ("mqar", "kda", longest)), ("gdn", ("mqar", "gdn", longest)))
    }
    times = {k: np.array([record_scores(r)["test"]["accuracy"] for r in v]) / chance
             for k, v in pal.items()}  # fmt: skip
    return dict(
        palindrome=times,
        rising=sum(stop_label(r, setting["flat_tol"]) == "rising" for v in pal.values() for r in v),
        tune=tune,
        margin=tune[sweep["grids"]["stack/gdn"]["best"]] - sorted(tune.values())[-2],
        solve=solve,
    )


def print_cells(cells: dict, complete: set, acc: dict, flat_tol: float = 0.01) -> None:
    """One line per recorded cell: mean test accuracy (4 decimals: 0.98975 is not 0.99) [min,
    max] over seeds, each run's stop (:func:`stop_label`), INCOMPLETE where the cell is not
    complete, and for stack the accuracy beyond the conv reach."""
    for (task, mixer, t), runs in sorted(cells.items()):
        a, beyond = acc[(task, mixer, t)], beyond_reach(runs)
        print(
            f"{task:10s} T={t:<3d} {label(mixer):15s} {a.mean():.4f} "
            f"[{a.min():.3f}, {a.max():.3f}] "
            f"{[stop_label(r, flat_tol) for r in runs]}"
            f"{'' if (task, mixer, t) in complete else ' INCOMPLETE'}"
            + (f" beyond the conv reach {beyond.mean():.3f}" if beyond is not None else "")
        )


def claim_a(tests: dict, task: str, lengths):
    """Claim A at each complete length: KDA ordered above every other complete mixer.
    Returns (verdict, {T: {mixer: "<" | ">" | "level"}})."""
    per_len = {
        t: {
            m: c.verdict for (k, t2, m), c in tests.items() if (k, t2) == (task, t) and m != "steps"
        }
        for t in lengths
    }
    per_len = {t: o for t, o in per_len.items() if o}
    if not per_len:
        return "not recorded yet (no complete length)", per_len
    top = [t for t, o in per_len.items() if all(v == ">" for v in o.values())]
    above = [t for t, o in per_len.items() if "<" not in o.values() and ">" in o.values()]
    return (
        "reproduced" if len(top) == len(per_len) else "in part" if top or above else "not shown"
    ), per_len


def claim_b(tests: dict, task: str):
    """Claim B where KDA and GDN solve on every seed: KDA ordered faster (fewer steps).
    Returns (verdict, {T: verdict})."""
    found = {t: c.verdict for (k, t, m), c in tests.items() if (k, m) == (task, "steps")}
    faster = [t for t, v in found.items() if v == "<"]
    return (
        "no length where both solve on every seed"
        if not found
        else "reproduced"
        if len(faster) == len(found)
        else "in part"
        if faster
        else "not shown"
    ), found


def plot_task_examples(examples: dict, vocab_size: int) -> plt.Figure:
    """One row per task: an example's input tokens (top) and its scored targets (bottom)."""
    fig, axes = plt.subplots(
        len(examples), 1, figsize=(9, 1.35 * len(examples) + 0.4), squeeze=False
    )
    for ax, (name, batch) in zip(axes[:, 0], examples.items(), strict=True):
        token_rows(
            ax,
            *(a[0] for a in batch),
            vocab_size=vocab_size,
            title=f"{name}: input tokens (top) and scored targets (bottom)",
        )
    return fig


def induction_reads(inputs, mask) -> dict[int, int]:
    """For each scored position ``t`` of one MQAR example (``inputs``, ``mask``: ``[T]``), the
    earlier position ``s`` whose predecessor is ``t``'s token: where an induction head reads,
    once a previous-token head (or a short convolution) has put ``inputs[s - 1]`` at ``s``.
    ``{t: s}``; ``inputs[s]`` is the value that followed the queried key."""
    inputs, reads = np.asarray(inputs), {}
    for t in np.flatnonzero(np.asarray(mask)):
        earlier = np.flatnonzero(inputs[: t - 1] == inputs[t])
        if earlier.size == 0:
            raise ValueError(f"induction_reads: inputs[{t}] (a scored position) has no earlier "
                             "occurrence before its predecessor: not an MQAR query")  # fmt: skip
        reads[int(t)] = int(earlier[0]) + 1
    return reads


def plot_induction_steps(inputs, targets, mask, vocab_size: int) -> plt.Figure:
    """MQAR answered in two steps, on one example (``[T]`` arrays): top row the tokens, bottom
    row each position's predecessor (grey arrows: what a previous-token head or the short
    convolution puts there); for the first query, the induction step (outlined): match its key
    among the predecessors, read the token at that position (its target)."""
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    previous = np.r_[-1, inputs[:-1]]
    fig, ax = plt.subplots(figsize=(9, 2.6), layout="constrained")
    token_rows(ax, inputs, previous, previous >= 0, vocab_size=vocab_size,
               title="layer 1 (grey): each position gets its predecessor; layer 2 (outlined): "
               "the query's key\nis matched among the predecessors, the token above the match "
               "is read")  # fmt: skip
    ax.set_yticks([0, 1], ["token $x_t$", "predecessor $x_{t-1}$"])
    for s in range(1, inputs.size):
        ax.annotate("", xy=(s - 0.15, 0.62), xytext=(s - 0.85, 0.38),
                    arrowprops=dict(arrowstyle="->", color="0.6", lw=0.8))  # fmt: skip
    t, s = next(iter(induction_reads(inputs, mask).items()))
    ink = COLORS["attention_conv"]
    for x, y in ((t, 0), (s, 1), (s, 0)):
        ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, ec=ink, lw=2))
    ax.annotate("", xy=(s, -0.5), xytext=(t, -0.5), arrowprops=dict(
        arrowstyle="->", color=ink, lw=1.6, connectionstyle="arc3,rad=0.25"))  # fmt: skip
    note = f"query {inputs[t]} at t = {t}: its key is the predecessor at {s}, read {inputs[s]}"
    ax.text((s + t) / 2, -1.05, f"{note} (target {targets[t]})", ha="center", color=ink, fontsize=9)
    ax.set_ylim(1.5, -1.4)
    return fig


def _curves(runs, budget: int, every: int):
    """Held-out accuracy of each run on the evaluation steps up to ``budget``; a run that
    stopped when solved keeps its last value (it is not trained further)."""
    steps = np.arange(every, budget + 1, every)
    return steps, np.array(
        [np.interp(steps, r["curve"]["step"], r["curve"]["accuracy"]) for r in runs]
    )


def _draw_mixer(ax, ax_steps, task: str, mixer: str, lens, sweep_view, score=None):
    """One mixer of :func:`plot_recorded` on one task: its accuracies (``score(runs)``, else
    the test accuracy) against length on ``ax``, nudged sideways per mixer so that lines at
    the ceiling stay apart, its validation curve at the first length on ``ax_steps`` (None:
    not drawn)."""
    cells, complete, acc, setting = sweep_view
    color, name = COLORS[mixer], label(mixer)
    ts = [t for t in lens if (task, mixer, t) in cells]
    a = [acc[(task, mixer, t)] if score is None else score(cells[(task, mixer, t)]) for t in ts]
    mean = np.array([x.mean() for x in a])
    spread = [mean - [x.min() for x in a], [x.max() for x in a] - mean]
    x = np.array(ts) * 2 ** (0.03 * (MIXER_ORDER.index(mixer) - 2.5))
    # markers only: two lengths joined by a line would read as a trend
    ax.errorbar(x, mean, yerr=spread, color=color, capsize=3, label=name, linestyle="none")
    fill = [color if (task, mixer, t) in complete else "white" for t in ts]
    ax.scatter(x, mean, edgecolors=color, zorder=3, color=fill, marker=MARKERS[mixer])
    if ax_steps is not None and (task, mixer, lens[0]) in cells:
        steps, y = _curves(
            cells[(task, mixer, lens[0])], setting["max_steps"], setting["eval_every"]
        )
        style = "-" if (task, mixer, lens[0]) in complete else "--"
        ax_steps.plot(steps, y.mean(0), style, color=color, label=name, marker=MARKERS[mixer],
                      markevery=4, markersize=4)  # fmt: skip
        ax_steps.fill_between(steps, y.min(0), y.max(0), color=color, alpha=0.15)


def plot_recorded(cells, complete, acc, setting: dict, chance: dict,
                  levels: dict | None = None) -> plt.Figure:
    """Top: mean test accuracy over seeds at each length per task (markers, not joined), bars
    from the lowest seed to the highest, incomplete cells hollow, each mixer nudged sideways and
    marked; last, stack's accuracy beyond the conv reach (the claims' endpoint). Bottom:
    validation accuracy against steps at each task's first length (incomplete cells dashed),
    then the legend (its note on incomplete cells only if there are any). ``levels``: {task:
    (accuracy, label)}, a dash-dot line on that task's panels (MQAR's vote level). For a
    protocol-2 record (``sweep_cells``)."""
    tasks = list(dict.fromkeys(c[0] for c in cells))
    mixers = [m for m in MIXER_ORDER if any(c[1] == m for c in cells)]
    fig, axes = plt.subplots(2, len(tasks) + 1, figsize=(4 * len(tasks) + 4, 7.4), squeeze=False,
                             layout="constrained")  # fmt: skip
    panels = [(t, None, f"{t}: accuracy at each length") for t in tasks]
    if "stack" in tasks:
        panels.append(("stack", beyond_reach, "stack, pops beyond the conv reach"))
    for i, (task, score, title) in enumerate(panels):
        ax, ax_steps = axes[0, i], axes[1, i] if score is None else None
        lens = sorted({c[2] for c in cells if c[0] == task})
        for mixer in mixers:
            _draw_mixer(ax, ax_steps, task, mixer, lens, (cells, complete, acc, setting), score)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens, [str(t) for t in lens])
        ax.minorticks_off()
        ax.set(ylim=(-0.02, 1.02), title=title, ylabel="test accuracy",
               xlabel="sequence length T (log scale)")  # fmt: skip
        ax.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2)
        level, label = (levels or {}).get(task, (None, None))
        for axis in [ax, ax_steps] if level is not None and score is None else []:
            if axis is not None:
                axis.axhline(level, color="0.3", linestyle="-.", linewidth=1.0, label=label)
        if ax_steps is not None:
            ax_steps.set(ylim=(-0.02, 1.02), title=f"{task}, T = {lens[0]}: accuracy vs steps",
                         xlabel="optimiser step", ylabel="validation accuracy")  # fmt: skip
            ax_steps.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2,
                             label="chance (every panel)")
    axes[1, -1].axis("off")
    title = "hollow / dashed: incomplete" if set(cells) - set(complete) else None
    handles = {}  # every bottom panel's entries, once each (a level line is on one panel)
    for ax in axes[1, :-1]:
        handles.update(zip(*ax.get_legend_handles_labels()[::-1], strict=True))
    axes[1, -1].legend(list(handles.values()), list(handles), loc="center", fontsize=9,
                       title=title, title_fontsize=8)  # fmt: skip
    if len(panels) == len(tasks):
        axes[0, -1].axis("off")
    return fig


def capacity_curve(record: dict) -> tuple[list[int], dict, dict]:
    """A capacity record (``scripts/recall_capacity.py``): ``(pairs, acc, stops)``, the pairs
    counts n ascending, ``acc[mixer][n]`` the reported runs' test accuracies by seed and
    ``stops[mixer][n]`` their stops (:func:`stop_label`); a count without a mixer's runs is left
    out of that mixer's entries."""
    acc, stops = {}, {}
    for part in sorted(record["parts"], key=lambda p: p["setting"]["num_pairs"]):
        n, tol = part["setting"]["num_pairs"], part["setting"]["flat_tol"]
        for mixer in MIXER_ORDER:
            runs = sorted((r for r in part["runs"] if (r["mixer"], r["phase"]) == (mixer, "seeds")),
                          key=lambda r: r["training"]["seed"])  # fmt: skip
            if runs:
                acc.setdefault(mixer, {})[n] = np.array([r["test"]["accuracy"] for r in runs])
                stops.setdefault(mixer, {})[n] = [stop_label(r, tol) for r in runs]
    pairs = sorted(p["setting"]["num_pairs"] for p in record["parts"])
    return pairs, acc, stops


def print_capacity(acc: dict, stops: dict) -> None:
    """One line per mixer of :func:`capacity_curve`'s ``acc`` and ``stops``: at each pairs count
    n, the mean test accuracy [min, max] over seeds, then an r for each run still rising."""
    for mixer, by_n in acc.items():
        print(f"{label(mixer):12s}", "  ".join(
            f"{n}: {a.mean():.2f} [{a.min():.2f}, {a.max():.2f}]" + "r" * stops[mixer][n].count(
                "rising") for n, a in by_n.items()))


def capacity_reading(acc: dict, head_dim: int, num_values: int,
                     recurrent=("kda", "gdn", "mamba2")) -> dict:
    """Section 8's numbers from :func:`capacity_curve`'s ``acc`` (d = ``head_dim``), over the
    ``recurrent`` mixers: "low", the lowest run below d pairs; "best", each one's best seed at
    2 d and 4 d pairs (2 decimals); "kda below mamba2", at d and 2 d, on how many seeds; "kda
    mean", KDA's mean at d, 2 d and 4 d (2 decimals); "vote", the vote level at every pairs
    count of KDA's (:func:`vote_accuracy` over ``num_values`` values, 3 decimals: the score of a
    rule blind to which key each value follows); "means at 2d", each one's mean there (2
    decimals); "above vote", each one's runs above the vote level at 2 d and 4 d; "sign-flip p",
    KDA against mamba2-style at 2 d (:func:`~kda_lib.lab.significance.sign_flip_p`)."""
    d, kda, mamba2 = head_dim, acc["kda"], acc["mamba2"]
    vote = {n: vote_accuracy(n, num_values) for n in kda}
    return {"low": float(min(acc[m][n].min() for m in recurrent for n in acc[m] if n < d)),
            "best": {m: [round(float(acc[m][n].max()), 2) for n in (2 * d, 4 * d)]
                     for m in recurrent},
            "kda below mamba2": {n: int((kda[n] < mamba2[n]).sum()) for n in (d, 2 * d)},
            "kda mean": [round(float(kda[n].mean()), 2) for n in (d, 2 * d, 4 * d)],
            "vote": {n: round(float(v), 3) for n, v in vote.items()},
            "means at 2d": {m: round(float(acc[m][2 * d].mean()), 2) for m in recurrent},
            "above vote": {m: [int((acc[m][n] > vote[n]).sum()) for n in (2 * d, 4 * d)]
                           for m in recurrent},
            "sign-flip p": sign_flip_p(kda[2 * d], mamba2[2 * d])}


def tuning_steps(sweep: dict, task: str, mixers, rates) -> dict:
    """``{mixer: [steps to the sweep's solved level at each of rates]}`` over a recorded sweep's
    tuning runs (``phase`` "tune") on ``task`` (None: never solved)."""
    steps = {(r["mixer"], r["training"]["learning_rate"]): solve_step(r, sweep["setting"]["solved"])
             for r in sweep["runs"] if (r.get("phase"), r["task"]) == ("tune", task)}
    return {m: [steps[(m, lr)] for lr in rates] for m in mixers}


def exact_recall_errors(head_dim: int, seed: int = 0) -> dict:
    """Section 8's rank argument in float64: ``head_dim + 1`` random unit keys in R^head_dim and
    standard normal values, and the largest recall error |k_j^T S - v_j| over the pairs a state
    ``S`` [head_dim, head_dim] stores: the first ``head_dim`` pairs (keys linearly independent,
    not orthogonal: "overlap" is their largest |k_i^T k_j|) in the state that solves k_j^T S =
    v_j ("solved": exact), in one delta-rule sweep (beta = 1) and in a sum of outer products;
    the same values under orthonormal keys in one sweep (exact, notebook 01); all ``head_dim +
    1`` pairs in the least-squares state ("one pair more": no state holds them). Two digits;
    0 below 1e-12 (float64's rounding)."""
    keys, values = np.random.default_rng(seed).normal(size=(2, head_dim + 1, head_dim))
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    k, v = keys[:head_dim], values[:head_dim]
    ortho = np.linalg.qr(k.T)[0].T  # orthonormal rows

    def sweep(keys_):
        state = np.zeros((head_dim, head_dim))
        for k_j, v_j in zip(keys_, v, strict=True):
            state += np.outer(k_j, v_j - k_j @ state)
        return state

    states = {"solved": (k, v, np.linalg.solve(k, v)), "one sweep": (k, v, sweep(k)),
              "sum": (k, v, k.T @ v), "orthogonal, one sweep": (ortho, v, sweep(ortho)),
              "one pair more": (keys, values, np.linalg.lstsq(keys, values, rcond=None)[0])}
    errors = {name: np.abs(a @ state - b).max() for name, (a, b, state) in states.items()}
    out = {"overlap": np.abs(k @ k.T - np.eye(head_dim)).max(), **errors}
    return {name: float(f"{value:.2g}") if value > 1e-12 else 0.0 for name, value in out.items()}


def plot_capacity(pairs, acc: dict, head_dim: int, num_heads: int, chance: float,
                  vote: dict | None = None) -> plt.Figure:
    """Mean test accuracy against the number of pairs (log scale), bars from the lowest seed to
    the highest, each mixer nudged sideways; a vertical line at a head's key dimension d_k and a
    dashed one at the layer's num_heads * d_k (where exact recall must fail); chance dotted;
    ``vote`` ({n: level}, :func:`capacity_reading`'s "vote"), the vote level, dash-dot."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
    for mixer in (m for m in MIXER_ORDER if m in acc):
        ns = [n for n in pairs if n in acc[mixer]]
        a = [acc[mixer][n] for n in ns]
        mean = np.array([x.mean() for x in a])
        x = np.array(ns) * 2 ** (0.06 * (MIXER_ORDER.index(mixer) - 2.5))
        ax.errorbar(x, mean, yerr=[mean - [v.min() for v in a], [v.max() for v in a] - mean],
                    color=COLORS[mixer], marker=MARKERS[mixer], capsize=3, label=label(mixer))
    ax.axvline(head_dim, color="0.55", linewidth=2.5, alpha=0.5, zorder=0,
               label=f"$d_k$ = {head_dim}: exact recall's limit, one head")  # behind the points
    ax.axvline(num_heads * head_dim, color="0.55", linestyle="--", linewidth=1.5, zorder=0,
               label=f"{num_heads} heads x $d_k$ = {num_heads * head_dim}: the layer's")
    ax.axhline(chance, color="0.3", linestyle=":", linewidth=1.2, label="chance")
    if vote:
        ax.plot(list(vote), list(vote.values()), color="0.3", linestyle="-.", linewidth=1.2,
                label="vote level (no key bound)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(pairs, [str(n) for n in pairs])
    ax.minorticks_off()
    ax.set(ylim=(-0.02, 1.02), xlabel="key-value pairs n (log scale; T = 4 n)",
           ylabel="test accuracy (mean; bars: seed range)",
           title="MQAR recall against the number of pairs")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
    return fig
