# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Synthetic recall: MQAR, palindrome and stack, with seeds and tuned baselines
#
# **Claim.** On tasks that can only be solved by remembering specific earlier tokens, a model
# whose mixer is KDA learns what a model without a recurrent state cannot. The Kimi Linear
# paper (arXiv 2510.26692, synthetic tests) trains small models on Palindrome, Multi-Query
# Associative Recall (MQAR) and Stack and plots accuracy against sequence length and against
# training steps; it reports KDA ahead of Gated DeltaNet (GDN). We rerun that comparison at
# laptop scale: two-layer models trained until they solve the task or reach a stated step
# budget, a learning rate tuned per task and mixer (best strictly inside its grid), three
# seeds per setting, and paired tests with Holm's correction for every ordering (section 8).
# Each of the paper's claims gets a verdict computed from the recording: reproduced, in part, or
# not shown, with the interval and what the design could detect. In section 9 we build, in
# closed form, a case where the decay per channel does what a scalar forget gate cannot. We
# also show why one layer of plain softmax attention, which is known to solve MQAR with more
# layers, sits low here: it has to *grow* an induction circuit, which the recurrent mixers'
# short convolution makes unnecessary by handing each token its predecessor.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/08_synthetic_recall.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults below (MQAR only, one layer, two seeds, one rate, KDA and the
# attention and conv controls) live; `make notebooks PARAMS=full` runs the live part larger
# (`notebooks/params/full/08_synthetic_recall.yaml`). The full comparison (sections 7 and 8)
# reads the sweep recorded in `data/results/synthetic_recall_sweep.json`, made and resumed by
# `scripts/synthetic_sweep.py` (command, wall time and state in `data/results/README.md`).
# One run at a time comes from the command line:
# `python -m kda_lib.lab.train_cli mqar --mixer kda --seq-len 64 ...`.

# %% tags=["parameters"]
tasks: list[str] = ["mqar"]  # names in kda_lib.lab.tasks.TASKS (the full run: all three)
mixers: list[str] = ["kda", "attention", "attention_conv", "conv"]  # full run: + gdn, - conv
seq_lens: list[int] = [32]  # sequence lengths T (tokens) of the sweep (full run: 64, 128)
vocab_size: int = 32  # tokens, the same for every task so runs share compiled steps
num_pairs: int = 4  # MQAR key/value pairs per sequence
steps: int = 300  # optimiser steps per run
batch_size: int = 8  # sequences per step (the full run: 16)
learning_rates: list[float] = [0.01]  # AdamW peak rates tried per mixer; the best is kept
tune_task: str = "mqar"  # the rates are compared on this task ...
tune_seq_len: int = 32  # ... at this length, with the first seed
num_seeds: int = 2  # seeds per setting (model init and batches; the full run: 3)
hidden_size: int = 64  # model width
num_layers: int = 1  # blocks of (norm, mixer, norm, MLP)
num_heads: int = 2  # heads of every mixer
head_dim: int = 32  # K and V per head
implementation: str = "recurrent"  # KDA kernel (recurrent compiles fastest at small T on CPU)
eval_batches: int = 4  # held-out batches per run
log_every: int = 25  # steps averaged into one point of the training curves
record_results: str = ""  # write this sweep's records to this JSON path ("" to skip)
recorded_results: str = "synthetic_recall_sweep.json"  # recorded sweep, in data/results/
recorded_phase: str = "mqar_attention_phase_transition_seed0.json"  # long attention MQAR run
seed: int = 0  # seed of the one jax.random.key below

# %% tags=["hide-input"]
# Install what is missing (Colab, a fresh VM): kda_lib, then this machine's accelerator
# stack, keeping the runtime's JAX if new enough (1 to 3 minutes; it says what it does).
import importlib.util
import runpy
import subprocess
import sys

NEEDED = ("kda_lib", "jax", "tokamax", "flax", "optax", "numpy", "matplotlib", "ipywidgets")
missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if missing:  # Colab, a fresh VM or an install cut short: install kda_lib and its dependencies
    if "kda_lib" in missing:
        KDA_LIB_SOURCE = "git+https://github.com/kda-notebooks/kda-notebooks"
        print(f"Installing kda_lib from {KDA_LIB_SOURCE} (about 10 s) ...", flush=True)
        pip = [sys.executable, "-m", "pip", "install", "-qq", "--no-color", "--no-deps"]
        done = subprocess.run([*pip, KDA_LIB_SOURCE], capture_output=True, text=True)
        why = [s for s in done.stderr.split("\n") if s.strip().startswith(("fatal:", "ERROR:"))]
        if done.returncode:  # one line: pip's reason and what to run instead (no traceback)
            error = RuntimeError(f"pip could not install kda_lib ({[*why, '?'][0].strip()}); "
                                 f"run `pip install {KDA_LIB_SOURCE}` to see pip's whole output")
            error._render_traceback_ = lambda: [f"InstallFailed: {error}"]  # how Jupyter shows it
            raise error
        importlib.invalidate_caches()
    (kda_lib_dir,) = importlib.util.find_spec("kda_lib").submodule_search_locations
    runpy.run_path(f"{kda_lib_dir}/teaching/install.py")["install_dependencies"](missing=missing)

# %%
# Imports; kda_lib.teaching.notebook.setup() applies the settings every notebook shares.
from collections import Counter

import jax
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

import kda_lib.teaching.notebook
from kda_lib.lab.records import load_recorded
from kda_lib.lab.significance import ALPHA, compare_family
from kda_lib.lab.tasks import chance_accuracy
from kda_lib.lab.train import make_task, run_sweep, save_record, summary_line
from kda_lib.layers.params import parameter_count
from kda_lib.models.tiny_lm import ModelConfig, TinyLM
from kda_lib.ops.reference import kda_recurrent
from kda_lib.teaching import viz

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
# Derived values
key = jax.random.key(seed)
key_seed, key_examples = jax.random.split(key)
# model init and batches take integer seeds (kda_lib.lab.train.run_experiment): draw them from key
seeds = [int(s) for s in jax.random.randint(key_seed, (num_seeds,), 0, 2**31 - 1)]
all_options = {
    "mqar": dict(vocab_size=vocab_size, num_pairs=num_pairs),
    "palindrome": dict(vocab_size=vocab_size),
    "stack": dict(vocab_size=vocab_size),
}
task_options = {name: all_options[name] for name in tasks}
model_options = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                     head_dim=head_dim, implementation=implementation)
chance = {name: chance_accuracy(name, **options) for name, options in all_options.items()}
runs = len(tasks) * len(seq_lens) * len(mixers) * len(learning_rates) * num_seeds
print(f"{len(tasks)} task(s) x {len(seq_lens)} length(s) x {len(mixers)} mixers x "
      f"{len(learning_rates)} rate(s) x {num_seeds} seeds = {runs} runs of {steps} steps")

# %% [markdown]
# ## 1. The tasks
#
# Each generator in `kda_lib.lab.tasks` returns inputs, targets and a mask of the positions that
# are scored; only those enter the loss and the accuracy.
#
# - **MQAR** (multi-query associative recall, from the Zoology paper): the sequence opens with
#   $N$ key/value pairs $k_1 v_1 k_2 v_2 \dots k_N v_N$; later each key $k_i$ comes back once,
#   among filler tokens, and the model must answer $v_i$. It measures how many bindings a state
#   can hold and retrieve by content.
# - **Palindrome**: random content $x_1 \dots x_n$, a separator, then the content reversed. The
#   answer at output step $i$ lies $2i + 1$ tokens back, so the model must keep the order of the
#   whole first half.
# - **Stack**: a stream of pushes (a value token) and pops; after each pop, name the new top of
#   the stack. Only pops are scored; the answer may have been pushed long ago.
#
# Below one example of each (top row: input tokens; bottom row: the target, drawn only at scored
# positions; token ids as numbers, colour by id).

# %% tags=["hide-input"]
example_len = 24
examples = {name: make_task(name, **options)(k, 1, example_len)
            for (name, options), k in zip(all_options.items(),
                                          jax.random.split(key_examples, len(all_options)),
                                          strict=True)}
fig, axes = plt.subplots(len(examples), 1, figsize=(9, 1.35 * len(examples) + 0.4),
                         squeeze=False)
for ax, (name, batch) in zip(axes[:, 0], examples.items(), strict=True):
    viz.token_rows(ax, *(a[0] for a in batch), vocab_size=vocab_size,
                   title=f"{name}: input tokens (top) and scored targets (bottom)")
viz.show(fig, "08_tasks")

# %% [markdown]
# The ground truth, re-derived here from the inputs alone for the MQAR example: every scored
# position holds a key, and its target is the token that followed that key in the pairs.

# %%
inputs, targets, mask = (np.asarray(a[0]) for a in examples["mqar"])
pairs = {int(k): int(v) for k, v in zip(inputs[0:2 * num_pairs:2], inputs[1:2 * num_pairs:2],
                                         strict=True)}
assert len(pairs) == num_pairs, "keys are distinct within a sequence"
for t in np.flatnonzero(mask):
    assert targets[t] == pairs[inputs[t]], (t, inputs[t], targets[t])
assert sorted(inputs[mask]) == sorted(pairs), "every key is queried exactly once"
print(f"MQAR example: {num_pairs} pairs {pairs}, queried at positions "
      f"{np.flatnonzero(mask).tolist()}")

# %% [markdown]
# ## 2. The mixers
#
# Every model is `embed -> N x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head`
# (`kda_lib.models.tiny_lm.TinyLM`); only the mixer changes.
#
# - **kda**: `KimiDeltaAttention`: short causal convs on $\mathbf q, \mathbf k, \mathbf v$,
#   then the delta rule with a forget gate per key channel,
#   $S_t = (I - \beta_t \mathbf k_t \mathbf k_t^\top)\,\mathrm{Diag}(\boldsymbol\alpha_t)\,S_{t-1}
#   + \beta_t \mathbf k_t \mathbf v_t^\top$.
# - **gdn**: Gated DeltaNet: the same layer with one forget value per head,
#   $\mathrm{Diag}(\boldsymbol\alpha_t) \to \alpha_t I$. The paper's claim is that per-channel
#   decay is the better memory.
# - **attention**: causal softmax attention with rotary positions, no convolution. It keeps every
#   past token, at a cost quadratic in $T$.
# - **attention_conv**: the same attention with the KDA layer's short convolutions on
#   $\mathbf q, \mathbf k, \mathbf v$: the ablation that isolates what the convolution gives.
# - **conv**: the KDA layer's value convolution and output gate without the recurrence. It sees
#   `num_layers * (conv_size - 1)` tokens back and nothing before: the control.

# %%
for mixer in mixers:
    model = TinyLM(ModelConfig(vocab_size=vocab_size, mixer=mixer, **model_options),
                   rngs=nnx.Rngs(0))
    print(f"{mixer:15s} {parameter_count(model):8,d} parameters")
conv_reach = ModelConfig(vocab_size=vocab_size, **model_options).conv_reach
print(f"the conv-only model sees {conv_reach} tokens back")

# %% [markdown]
# ## 3. The sweep: a learning-rate grid per mixer, then seeds
#
# `kda_lib.lab.train.run_sweep` trains one fresh model per task, length and mixer (AdamW, warmup
# then cosine decay) and scores it on held-out batches that training never draws. Following
# the Zoology protocol, every mixer gets its own best learning rate: each rate of the grid is
# tried on `tune_task` at `tune_seq_len` (first seed), the rate with the best held-out accuracy
# is kept, and every task, length and seed then runs at it. Runs differing only in task or seed
# share one compiled step (a new rate or length compiles anew).

# %%
tuning, records = [], []


def report(record, into):
    into.append(record)
    print(summary_line(record), f" lr {record['training']['learning_rate']:g}", flush=True)
    if record_results:  # rewritten after every run, so a stopped sweep keeps what finished
        save_record(dict(tuning=tuning, runs=records), record_results)


# %%
common = dict(steps=steps, batch_size=batch_size, eval_batches=eval_batches,
              log_every=log_every, model_options=model_options)
best_rate = {mixer: learning_rates[0] for mixer in mixers}
if len(learning_rates) > 1:
    for lr in learning_rates:
        run_sweep({tune_task: all_options[tune_task]}, mixers, [tune_seq_len], learning_rate=lr,
                  seed=seeds[0], report=lambda r: report(r, tuning), **common)
    for mixer in mixers:
        best = max((r for r in tuning if r["mixer"] == mixer), key=lambda r: r["eval"]["accuracy"])
        best_rate[mixer] = best["training"]["learning_rate"]
print("learning rate per mixer:", best_rate)
for s in seeds:
    for mixer in mixers:
        run_sweep(task_options, [mixer], seq_lens, learning_rate=best_rate[mixer], seed=s,
                  report=lambda r: report(r, records), **common)


# %% [markdown]
# Each task, length and mixer then has one run per seed; we report the mean held-out accuracy
# with the sample standard deviation and the range over seeds.

# %%
def tuned(records):
    """(task, mixer, T) -> {"lr", "acc" (one per seed), "runs"}; where a setting ran at several
    rates, the one with the best mean accuracy."""
    groups = {}
    for r in records:
        setting = (r["task"], r["mixer"], r["training"]["seq_len"])
        groups.setdefault(setting, {}).setdefault(r["training"]["learning_rate"], []).append(r)
    best = {}
    for setting, by_lr in groups.items():
        lr = max(by_lr, key=lambda lr: np.mean([r["eval"]["accuracy"] for r in by_lr[lr]]))
        best[setting] = dict(lr=lr, acc=np.array([r["eval"]["accuracy"] for r in by_lr[lr]]),
                             runs=by_lr[lr])
    return best


# %%
def print_table(best, title):
    print(title)
    for (task, mixer, t), b in sorted(best.items()):
        acc = b["acc"]
        sd = acc.std(ddof=1) if len(acc) > 1 else float("nan")
        print(f"{task:11s} T={t:<4d} {mixer:15s} lr {b['lr']:<7g} {acc.mean():.3f} +- {sd:.3f}"
              f"  [{acc.min():.3f}, {acc.max():.3f}]  ({len(acc)} seeds)")


live = tuned(records)
print_table(live, f"Held-out accuracy, this run ({num_layers} layer(s), {steps} steps): "
                  "mean +- sd [min, max] over seeds")

# %% [markdown]
# ## 4. The check at this size: KDA recalls, the conv-only model cannot
#
# At every length of this run, the KDA model answers MQAR queries on held-out sequences with
# mean accuracy at least 0.9 and no seed below 0.8. The conv-only model stays near chance: a
# query's pair sits beyond its reach except, rarely, for the last pair.

# %%
for t in seq_lens if "mqar" in tasks and {"kda", "conv"} <= set(mixers) else []:
    kda_acc, conv_acc = live[("mqar", "kda", t)]["acc"], live[("mqar", "conv", t)]["acc"]
    print(f"MQAR T={t}: kda {kda_acc.mean():.3f} (min {kda_acc.min():.3f}), conv only "
          f"{conv_acc.mean():.3f} (max {conv_acc.max():.3f}); chance {chance['mqar']:.3f}")
    assert kda_acc.mean() >= 0.9 and kda_acc.min() >= 0.8, kda_acc
    assert conv_acc.max() < 0.25, conv_acc

# %% [markdown]
# ## 5. Why attention sits low on MQAR
#
# MQAR asks the model, at a query $k_i$, for the token that *followed* $k_i$ earlier. Softmax
# attention can look $k_i$ up by content, but the position it finds holds $k_i$, not $v_i$: it
# must first copy each token's predecessor into the next position's key (a previous-token
# head), and only then can a second layer match the query against "my predecessor was $k_i$"
# and read $v_i$ (an induction head). One layer cannot do both. KDA and GDN get the first step
# for free: their short convolution mixes $\mathbf k_{t-1}$ into $\mathbf k_t$. Give attention
# the same convolution and one layer is enough:

# %%
for t in seq_lens if "mqar" in tasks else []:
    plain, conv = live[("mqar", "attention", t)]["acc"], live[("mqar", "attention_conv", t)]["acc"]
    print(f"MQAR T={t}, {num_layers} layer(s): attention {plain.mean():.3f} +- "
          f"{plain.std(ddof=1):.3f}; attention + short conv {conv.mean():.3f} +- "
          f"{conv.std(ddof=1):.3f}")
    if num_layers == 1:
        assert plain.max() < 0.5 and conv.mean() >= 0.9, (plain, conv)

# %% [markdown]
# With two layers attention *can* form the circuit, but gradient descent finds it late and
# abruptly. The recorded run below (`recorded_phase`, from the command in
# `data/results/README.md`: two layers, width 128, batch 32, rate $10^{-3}$) sits on a plateau
# for thousands of steps, then jumps. Two guessing levels are drawn for comparison: chance,
# uniform over all value tokens of the vocabulary, and uniform over the values of the
# sequence's own pairs, $(1 + (N - 1)/n_{\text{values}})/N$ for $N$ pairs (values are drawn
# with replacement, so the query's value can occur more than once; checked by sampling below).
# The plateau lies above both (printed below): before the jump the model already does better
# than picking one of the sequence's values at random. What it has learned at that point this
# notebook does not resolve.

# %% tags=["hide-input"]
phase = load_recorded("results", recorded_phase)
h = phase["history"]
fig, ax = plt.subplots(figsize=(7.5, 3.4))
ax.plot(h["step"], h["accuracy"], color=viz.CYCLE[2], label="attention, 2 layers (recorded)")
n_pairs_phase = phase["task_options"]["num_pairs"]
n_values_phase = round(1 / phase["chance_accuracy"])  # value tokens of the phase run's vocabulary
among_pairs = (1 + (n_pairs_phase - 1) / n_values_phase) / n_pairs_phase
ax.axhline(phase["chance_accuracy"], color="0.3", linestyle=":",
           label=f"chance: uniform over the {n_values_phase} value tokens")
ax.axhline(among_pairs, color="0.3", linestyle="--", linewidth=1,
           label=f"uniform over the sequence's {n_pairs_phase} pair values")
ax.set_ylim(-0.02, 1.02)
ax.set_xlabel("optimiser step")
ax.set_ylabel("training accuracy (100-step means)")
ax.set_title(f"MQAR, T = {phase['training']['seq_len']}, {phase['task_options']['num_pairs']} "
             "pairs: attention's phase transition")
ax.legend(loc="center right")
viz.show(fig, "08_attention_phase_transition")

# %%
acc = np.array(h["accuracy"])
jump = h["step"][int(np.argmax(acc > 0.5))] if (acc > 0.5).any() else None
steps_phase = np.array(h["step"])
plateau = acc[(steps_phase > 1000) & (steps_phase <= 6000)]
# guessing among the sequence's pair values, by sampling: pick one of the N pair values at random
sample = make_task("mqar", **phase["task_options"])(jax.random.key(1), 512,
                                                    phase["training"]["seq_len"])
pair_values = np.asarray(sample.inputs)[:, 1:2 * n_pairs_phase:2]  # [B, N]
queried = np.asarray(sample.targets)[np.asarray(sample.mask)].reshape(-1, n_pairs_phase)
sampled = (pair_values[:, None, :] == queried[:, :, None]).mean()
print(f"plateau (steps 1000-6000): accuracy {plateau.min():.3f}-{plateau.max():.3f}; chance "
      f"{phase['chance_accuracy']:.3f}; uniform over the pair values {among_pairs:.3f} "
      f"(sampled: {sampled:.3f})")
assert abs(sampled - among_pairs) < 0.01
assert plateau.min() > among_pairs > phase["chance_accuracy"]
print(f"recorded attention run: accuracy {acc[:10].mean():.2f} over its first "
      f"{h['step'][9]} steps, above 0.5 from step {jump}; held-out at the end "
      f"{phase['eval']['accuracy']:.3f} ({phase['train_seconds'] / 60:.0f} min)")
assert acc[:10].mean() < 0.5 and phase["eval"]["accuracy"] >= 0.9
# the setting the text above names
assert (phase["model"]["num_layers"], phase["model"]["hidden_size"]) == (2, 128)
assert (phase["training"]["batch_size"], phase["training"]["learning_rate"]) == (32, 1e-3)

# %% [markdown]
# ## 6. Accuracy against training steps
#
# The paper's second row: accuracy against training steps. Here each curve is the training
# accuracy of one run, averaged over windows of `log_every` steps (every batch is fresh, so this
# is accuracy on unseen sequences), mean over seeds with the range shaded. Steps are one run's
# schedule read along the way, not separate runs of each length.

# %% tags=["hide-input"]
def steps_panel(ax, best, task, t, colors, **style):
    for mixer in mixers:
        if (task, mixer, t) not in best:
            continue
        hist = np.array([r["history"]["accuracy"] for r in best[(task, mixer, t)]["runs"]])
        step_axis = best[(task, mixer, t)]["runs"][0]["history"]["step"]
        ax.plot(step_axis, hist.mean(0), color=colors[mixer], label=mixer, **style)
        ax.fill_between(step_axis, hist.min(0), hist.max(0), color=colors[mixer], alpha=0.15)
    ax.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("accuracy (window mean)")


colors = dict(zip(["kda", "gdn", "attention", "attention_conv", "conv"], viz.CYCLE, strict=False))
fig, axes = plt.subplots(1, len(seq_lens), figsize=(5.5 * len(seq_lens), 3.6), squeeze=False)
for ax, t in zip(axes[0], seq_lens, strict=True):
    steps_panel(ax, live, "mqar", t, colors)
    ax.set_title(f"this run: MQAR, T = {t}, {num_layers} layer(s)")
axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
viz.show(fig, "08_mqar_steps_live")

# %% [markdown]
# ## 7. The recorded sweep: both rows of the paper's figure
#
# The recorded sweep (`recorded_results`, made by `scripts/synthetic_sweep.py`; command, wall
# time and how to resume it in `data/results/README.md`) trains two-layer models until they
# solve the task or reach a step budget, per task, mixer, length and seed. Its protocol,
# stated once and stored in the file:
#
# - **Rates, per task and mixer.** Each rate of a grid is tried at the task's first length
#   with the first seed; the best (solved in the fewest steps, else the highest held-out
#   accuracy) must lie strictly inside the rates tried, else the grid grows by one point past
#   that edge.
# - **Seeds.** Every length of the task then runs at that rate with three seeds.
# - **Stopping.** Held-out accuracy (batches training never sees) every `eval_every` steps; a
#   run stops once it reaches the `solved` level. At the budget its verdict is *flat* (held-out
#   accuracy moved by less than `flat_tol` over the last fifth of the steps) or *rising*
#   (still learning: not converged, so its accuracy is a lower bound).
#
# A sweep cut short leaves some cells unfinished. A cell (task, mixer, length) is **complete**
# when its rate is tuned with the best inside the grid and it has three seeds; only complete
# cells enter the comparisons below; the others are drawn hollow and listed.

# %%
sweep = load_recorded("results", recorded_results)
grids, setting = sweep["grids"], sweep["setting"]
MIN_SEEDS = 3  # seeds a cell needs to be complete
cells = {}  # (task, mixer, T) -> the runs at the tuned rate, one per seed
for r in sweep["runs"]:
    grid_row = grids.get(f"{r['task']}/{r['mixer']}")
    if grid_row and r["training"]["learning_rate"] == grid_row["best"]:
        cells.setdefault((r["task"], r["mixer"], r["training"]["seq_len"]), []).append(r)
cells = {c: sorted(rs, key=lambda r: r["training"]["seed"]) for c, rs in cells.items()}
seed_of = {c: [r["training"]["seed"] for r in rs] for c, rs in cells.items()}  # the pairing
complete = {c for c, rs in cells.items()
            if len(rs) >= MIN_SEEDS and grids[f"{c[0]}/{c[1]}"]["inside"]}
acc = {c: np.array([r["eval"]["accuracy"] for r in rs]) for c, rs in cells.items()}
rec_tasks = list(dict.fromkeys(r["task"] for r in sweep["runs"]))
rec_mixers = list(dict.fromkeys(r["mixer"] for r in sweep["runs"]))
rec_lens = {task: sorted({c[2] for c in cells if c[0] == task}) for task in rec_tasks}
chance.update({r["task"]: r["chance_accuracy"] for r in sweep["runs"]})
print(f"recorded setting: {setting}")
print(f"{len(sweep['runs'])} runs; {len(complete)} of {len(cells)} started cells complete")
for name, g in grids.items():
    print(f"rates {name:26s} {g['rates']} -> {g['best']:g}"
          f"{'' if g['inside'] else '  (at an edge: not complete)'}")

# %%
for (task, mixer, t), rs in sorted(cells.items()):
    a = acc[(task, mixer, t)]
    spread = f"{a.std(ddof=1):.3f}" if a.size > 1 else "  -  "
    stops = ", ".join(f"{v} {k}" for k, v in sorted(Counter(r["stop"] for r in rs).items()))
    print(f"{task:10s} T={t:<3d} {mixer:15s} {a.mean():.3f} +- {spread} [{a.min():.3f}, "
          f"{a.max():.3f}] {a.size} seed(s): {stops}; steps {[r['training']['steps'] for r in rs]}"
          f"{'' if (task, mixer, t) in complete else '  INCOMPLETE'}")


# %% tags=["hide-input"]
def curves(rs, budget):
    """Held-out accuracy of each run on the grid of evaluation steps up to ``budget``; a run
    that stopped when solved keeps its last value (it is not trained further)."""
    grid_steps = np.arange(setting["eval_every"], budget + 1, setting["eval_every"])
    return grid_steps, np.array([np.interp(grid_steps, r["curve"]["step"],
                                           r["curve"]["accuracy"]) for r in rs])


# %% tags=["hide-input"]
def length_panel(ax, task):
    for mixer in rec_mixers:
        ts = [t for t in rec_lens[task] if (task, mixer, t) in cells]
        mean = np.array([acc[(task, mixer, t)].mean() for t in ts])
        lo = mean - [acc[(task, mixer, t)].min() for t in ts]
        hi = [acc[(task, mixer, t)].max() for t in ts] - mean
        ax.errorbar(ts, mean, yerr=[lo, hi], color=colors[mixer], capsize=3, label=mixer)
        full = [(task, mixer, t) in complete for t in ts]
        ax.scatter(ts, mean, color=[colors[mixer] if f else "white" for f in full],
                   edgecolors=colors[mixer], zorder=3)
    ax.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(rec_lens[task], [str(t) for t in rec_lens[task]])
    ax.minorticks_off()
    ax.set(ylim=(-0.02, 1.02), title=f"{task}: accuracy vs length",
           xlabel="sequence length T (log scale)", ylabel="held-out accuracy")


# %% tags=["hide-input"]
def steps_panel_recorded(ax, task, t):
    for mixer in rec_mixers:
        if (task, mixer, t) not in cells:
            continue
        x, y = curves(cells[(task, mixer, t)], setting["max_steps"])
        style = "-" if (task, mixer, t) in complete else "--"
        ax.plot(x, y.mean(0), style, color=colors[mixer], label=mixer)
        ax.fill_between(x, y.min(0), y.max(0), color=colors[mixer], alpha=0.15)
    ax.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2)
    ax.set(ylim=(-0.02, 1.02), title=f"{task}, T = {t}: accuracy vs steps",
           xlabel="optimiser step", ylabel="held-out accuracy")


# %% tags=["hide-input"]
fig, axes = plt.subplots(2, len(rec_tasks), figsize=(4.4 * len(rec_tasks), 7.4), squeeze=False)
for ax_len, ax_steps, task in zip(axes[0], axes[1], rec_tasks, strict=True):
    length_panel(ax_len, task)
    steps_panel_recorded(ax_steps, task, rec_lens[task][0])
axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8,
                   title="hollow / dashed:\nincomplete", title_fontsize=7)
viz.show(fig, "08_recorded_length_and_steps")

# %% [markdown]
# Top: mean held-out accuracy over seeds, bars from the lowest to the highest seed. Bottom:
# held-out accuracy against steps at each task's first length (mean over seeds, range shaded;
# a run that stopped when solved is drawn flat from there). Dotted: chance, guessing uniformly
# among the answers a scored position can hold.
#
# ## 8. The paper's claims, tested on paired seeds
#
# **The statistics** (`kda_lib.lab.significance`, the same for notebook 09). A seed fixes a
# run's initialisation and its training and held-out batches, and every mixer of a cell ran
# with the same seeds, so the scores are paired by seed: a comparison tests the per-seed
# differences, KDA minus the other mixer, with a paired t-test (`scipy.stats`, $n - 1$ degrees
# of freedom). Every comparison this section makes (KDA against each other complete mixer at
# each complete length in accuracy, and KDA against GDN in steps to solve where both solve on
# every seed) is one family, and Holm's correction keeps the chance of any false ordering in it
# below $\alpha$ = 0.05. Two mixers are *ordered* only when the Holm-adjusted p is below
# $\alpha$; otherwise they are *level*: not shown to differ, printed with the 95% interval of
# the mean difference and the smallest gap this design (three seeds, the observed spread,
# $\alpha/m$ for $m$ comparisons) detects with 80% power.
#
# **What this recording cannot show** (known limitations, pending the re-run issue 39 asks
# for): three seeds per cell; the tuning run is reused as seed 0 of its cell, so seed 0 is a
# maximum over rates; the same held-out batches decide the early stop, the rate and the
# reported accuracy (no separate validation and test streams); and MQAR at 4 pairs and
# $T \le 64$ sits at the ceiling for every recurrent mixer.
#
# The paper reports two things on these tasks: **(A)** KDA reaches the highest accuracy on
# all three tasks as the sequence grows, and **(B)** it gets there in fewer training steps
# than GDN. Below, for each task, a verdict per claim from the complete cells only:
# *reproduced* (ordered at every complete length), *in part* (at some), or *not shown*.

# %%
def solve_step(r):
    """The step of the first held-out evaluation at the solved level (None: never solved)."""
    hits = [s for s, a in zip(r["curve"]["step"], r["curve"]["accuracy"], strict=True)
            if a >= setting["solved"]]
    return hits[0] if hits else None


family = {}  # (task, T, mixer or "steps") -> (KDA's per-seed scores, the other's), by seed
for task, mixer, t in sorted(complete):
    if mixer != "kda" and (task, "kda", t) in complete:
        assert seed_of[(task, "kda", t)] == seed_of[(task, mixer, t)], "paired by seed"
        family[(task, t, mixer)] = acc[(task, "kda", t)], acc[(task, mixer, t)]
for task in rec_tasks:
    for t in rec_lens[task]:
        if {(task, "kda", t), (task, "gdn", t)} <= complete:
            k, g = ([solve_step(r) for r in cells[(task, m, t)]] for m in ("kda", "gdn"))
            if None not in k + g:  # steps to solve: "<" is KDA faster
                family[(task, t, "steps")] = k, g
tests = compare_family(family, alpha=ALPHA)
print(f"{len(tests)} paired comparisons, Holm-corrected together at alpha {ALPHA}; the mean "
      "difference KDA - other [95% interval], and the gap detectable at 80% power:")
for (task, t, m), c in tests.items():
    what = "steps to solve, KDA - gdn" if m == "steps" else f"accuracy, KDA - {m}"
    print(f"{task:10s} T={t:<3d} {what:29s} {c.describe()}; detectable {c.detectable:.3g}")


# %%
def claim_a(task):
    """Claim A at each complete length: KDA ordered above every other complete mixer."""
    per_len = {t: {m: c.verdict for (k, t2, m), c in tests.items()
                   if (k, t2) == (task, t) and m != "steps"} for t in rec_lens[task]}
    per_len = {t: o for t, o in per_len.items() if o}
    if not per_len:
        return "not recorded yet (no complete length)", per_len
    top = [t for t, o in per_len.items() if all(v == ">" for v in o.values())]
    above = [t for t, o in per_len.items() if "<" not in o.values() and ">" in o.values()]
    return ("reproduced" if len(top) == len(per_len) else "in part" if top or above
            else "not shown"), per_len


def claim_b(task):
    """Claim B where KDA and GDN solve on every seed: KDA ordered faster."""
    found = {t: c.verdict for (k, t, m), c in tests.items() if (k, m) == (task, "steps")}
    faster = [t for t, v in found.items() if v == "<"]
    return ("no length where both solve on every seed" if not found else "reproduced"
            if len(faster) == len(found) else "in part" if faster else "not shown"), found


# %%
verdicts = {}
for task in rec_tasks:
    solved_by = {c[1:] for c in complete if c[0] == task
                 and all(r["stop"] == "solved" for r in cells[c])}
    (va, per_len), (vb, found) = claim_a(task), claim_b(task)
    verdicts[task] = dict(A=va, B=vb, solved_by=sorted(solved_by))
    print(f"{task}: solved on every seed by (mixer, T) {sorted(solved_by) or 'none'}")
    print(f"  claim A: {va}; KDA vs the others per length {per_len}")
    print(f"  claim B: {vb}; KDA vs GDN in steps to solve per length {found}")

# %%
for task in rec_tasks:  # the evidence in the complete cells that are not solved on every seed
    open_cells = sorted(c for c in complete if c[0] == task and c[1:] not in
                        verdicts[task]["solved_by"])
    rs = [r for c in open_cells for r in cells[c] if r["stop"] != "solved"]
    if not rs:
        print(f"{task}: every complete cell solved on every seed")
        continue
    drops = [r["curve"]["train_loss"][int(0.8 * len(r["curve"]["step"]))]
             - r["curve"]["train_loss"][-1] for r in rs]
    print(f"{task}: {len(rs)} unsolved runs in {[c[1:] for c in open_cells]}: "
          f"{sum(r['stop'] == 'rising' for r in rs)} still rising at {setting['max_steps']} "
          f"steps; best {max(r['eval']['accuracy'] for r in rs):.3f}; training loss fell by "
          f"{min(drops):.3f} to {max(drops):.3f} nats over the last fifth of the steps")

# %% [markdown]
# **Nothing is ordered** (asserted below when every cell is complete): at three seeds, with
# $\alpha$ shared by 24 comparisons, the smallest accuracy gap the design detects is 0.04 where
# the seeds agree and more than the whole accuracy range where they do not (printed above), so
# every claim is *not shown* at this scale. By task:
#
# - **MQAR** (4 pairs, T up to 64): KDA, GDN and attention with the short convolution solve it
#   on every seed at both lengths, two-layer attention at T = 32: a ceiling with nothing to
#   separate. The largest gap, KDA above plain attention at T = 64, comes from attention runs
#   still rising at the step budget on every seed (the slow start of section 5; one at 0.95,
#   two below 0.4; printed in section 7): its interval spans zero. KDA and GDN solve in level
#   numbers of steps.
# - **Palindrome**: at T = 16 every mixer but plain attention solves it on every seed. At
#   T = 32 plain attention solves it on every seed and KDA on one of three; attention's mean is
#   higher, but the interval spans zero; most recurrent runs there were still rising at the
#   budget, so their accuracies are lower bounds.
# - **Stack**: no mixer reaches the solved level on any seed, and the training loss was still
#   falling over the last fifth of the steps in every run (printed above): the accuracies are
#   lower bounds and this notebook claims no mechanism for the task. KDA's lead over plain
#   attention is the one large gap of the sweep (about 0.2 to 0.3 at every length, each
#   interval above zero, p below 0.011 alone), and it is still level once corrected for the
#   whole family: a design with more seeds is what could order it.

# %%
if len(complete) == len(cells):  # the statements above, on a complete recording
    assert all(c.verdict == "level" for c in tests.values()), tests
    assert all(v[k].startswith(("not shown", "no length")) for v in verdicts.values()
               for k in "AB"), verdicts
    mqar_cells = [c for c in complete if c[0] == "mqar" and c[1:] != ("attention", 64)]
    assert all(r["stop"] == "solved" for c in mqar_cells for r in cells[c])
    assert all(r["stop"] == "rising" for r in cells[("mqar", "attention", 64)])
    assert round(min(c.detectable for (_, _, m), c in tests.items() if m != "steps"), 2) == 0.04
    assert np.round(np.sort(acc[("mqar", "attention", 64)]), 2).tolist()[1:] == [0.39, 0.95]
    assert tests[("mqar", 64, "attention")].low < 0 < tests[("mqar", 64, "attention")].mean
    stops = {c[1:]: [r["stop"] for r in cells[c]] for c in complete if c[0] == "palindrome"}
    assert all(stops[(m, 16)] == ["solved"] * 3 for m in ("kda", "gdn", "attention_conv"))
    assert stops[("attention", 32)] == ["solved"] * 3 and stops[("kda", 32)].count("solved") == 1
    assert tests[("palindrome", 32, "attention")].high > 0 > tests[("palindrome", 32,
                                                                     "attention")].mean
    recurrent_32 = stops[("kda", 32)] + stops[("gdn", 32)]
    assert recurrent_32.count("rising") > len(recurrent_32) / 2, recurrent_32
    stack_runs = [r for c in complete if c[0] == "stack" for r in cells[c]]
    assert not any(r["stop"] == "solved" for r in stack_runs)
    assert all(r["curve"]["train_loss"][int(0.8 * len(r["curve"]["step"]))]
               > r["curve"]["train_loss"][-1] for r in stack_runs), "loss still falling"
    stack_attention = [tests[("stack", t, "attention")] for t in rec_lens["stack"]]
    assert all(0.2 < c.mean < 0.3 and c.low > 0 and c.p < 0.011 for c in stack_attention)
    print("the statements above hold on the recorded sweep")

# %% [markdown]
# ## 9. Where a decay per channel helps: two time scales in one head
#
# Whatever the trained models of section 8 show, here is a small case where the per-channel
# decay is worth something, built in closed form rather than trained. The task: filter a stream of
# numbers $x_t$ (the values, $d_v = 1$) at two time scales at once,
#
# $$
# y_t = \sum_{\tau \ge 0} h(\tau)\, x_{t - \tau}, \qquad
# h(\tau) = \tfrac12\, r_{\text{slow}}^{\tau} + \tfrac12\, r_{\text{fast}}^{\tau},
# $$
#
# with half-lives `slow_half_life` and `fast_half_life` tokens, using **one head with two key
# channels** whose key, query, gate and $\beta$ are the same at every token (a filter that does
# not change over time). The recurrence is $S_t = A S_{t-1} + \beta \mathbf k x_t$ with
# $A = (I - \beta \mathbf k \mathbf k^\top) D$, so the head computes the filter
# $h(\tau) = \beta\, \mathbf q^\top A^{\tau} \mathbf k$.
#
# - **Scalar gate (GDN), $D = \alpha I$:** $A \mathbf k = \alpha (1 - \beta) \mathbf k$, so the
#   state never leaves the direction of $\mathbf k$ and the head's filter is one exponential,
#   $c\, \rho^{\tau}$, whatever $\mathbf k$, $\mathbf q$, $\alpha$ and $\beta$. Its best fit:
#   $c$ in closed form for each $\rho$ on a fine grid.
# - **Per-channel gate (KDA), $D = \mathrm{Diag}(\alpha_1, \alpha_2)$:** $D \mathbf k$ is not
#   parallel to $\mathbf k$, the state uses both directions, and the filter is a sum of two
#   exponentials, the eigenvalues of $A$. We pick $\beta$ and a key that lies mostly on the
#   fast channel, solve $\operatorname{tr} A = r_{\text{slow}} + r_{\text{fast}}$ and
#   $\det A = (1 - \beta)\alpha_1\alpha_2 = r_{\text{slow}} r_{\text{fast}}$ for the two
#   decays (a quadratic), and fit $\mathbf q$ by least squares.
#
# Both heads then run through `kda_lib.kda_recurrent` in float64 on random inputs.

# %%
slow_half_life, fast_half_life = 20.0, 1.0  # the two time scales (tokens)
two_scale_len = 256  # tokens of the filter and its test input
r_slow, r_fast = 0.5 ** (1 / slow_half_life), 0.5 ** (1 / fast_half_life)
lag = np.arange(two_scale_len)
target = 0.5 * r_slow**lag + 0.5 * r_fast**lag  # h(tau)
beta_two, slow_share = 0.3, 0.05  # beta, and the key's squared weight on the slow channel
k_two = np.sqrt([slow_share, 1 - slow_share])
# tr A = alpha_1 (1 - beta k_1^2) + alpha_2 (1 - beta k_2^2), det A = (1 - beta) alpha_1 alpha_2
qa, qb = 1 - beta_two * slow_share, -(r_slow + r_fast)
qc = r_slow * r_fast * (1 - beta_two * (1 - slow_share)) / (1 - beta_two)
alpha_slow = (-qb + np.sqrt(qb**2 - 4 * qa * qc)) / (2 * qa)
alpha_fast = r_slow * r_fast / ((1 - beta_two) * alpha_slow)
A_two = (np.eye(2) - beta_two * np.outer(k_two, k_two)) @ np.diag([alpha_slow, alpha_fast])
assert 0 < alpha_fast < alpha_slow <= 1, (alpha_slow, alpha_fast)
assert np.allclose(np.sort(np.linalg.eigvals(A_two).real), [r_fast, r_slow])
powers = np.stack([beta_two * np.linalg.matrix_power(A_two, t) @ k_two for t in lag])
q_two = np.linalg.lstsq(powers, target, rcond=None)[0]

# %%
# scalar gate: the best single exponential c rho^tau (c in closed form for each rho)
rho_grid = np.linspace(0, 1, 20001)[1:-1]
basis = rho_grid[:, None] ** lag[None, :]
c_grid = basis @ target / (basis * basis).sum(axis=1)
fit_error = np.linalg.norm(c_grid[:, None] * basis - target, axis=1) / np.linalg.norm(target)
rho_best, c_best = rho_grid[np.argmin(fit_error)], c_grid[np.argmin(fit_error)]


def run_head(alphas, beta, k, q, x):
    """One head, d_k = 2, d_v = 1, the same k, q, gate and beta at every token (float64)."""
    steps = x.size
    const = [np.broadcast_to(np.asarray(a, np.float64), (1, steps, 1, 2))
             for a in (q, k, np.log(alphas))]
    with jax.enable_x64(True):
        o, _ = kda_recurrent(const[0], const[1], np.asarray(x, np.float64)[None, :, None, None],
                             const[2], np.full((1, steps, 1), beta), scale=1.0)
        return np.asarray(o)[0, :, 0, 0]


# %%
x_two = np.asarray(jax.random.normal(jax.random.key(3), (two_scale_len,), "float32"), np.float64)
y_two = np.convolve(x_two, target)[:two_scale_len]
y_kda = run_head([alpha_slow, alpha_fast], beta_two, k_two, q_two, x_two)
# GDN's best as a head: rho = alpha (1 - beta); alpha = 1, beta = 1 - rho, q^T k beta = c
y_gdn = run_head([1.0, 1.0], 1 - rho_best, [0.0, 1.0], [0.0, c_best / (1 - rho_best)], x_two)
err_kda = np.linalg.norm(y_kda - y_two) / np.linalg.norm(y_two)
err_gdn = np.linalg.norm(y_gdn - y_two) / np.linalg.norm(y_two)
print(f"KDA head: decays alpha = ({alpha_slow:.4f}, {alpha_fast:.4f}), beta {beta_two}, key "
      f"{np.round(k_two, 3)}: output error {err_kda:.1e}")
print(f"best scalar-gate head: one exponential rho = {rho_best:.4f}, c = {c_best:.3f}: filter "
      f"error {fit_error.min():.3f}, output error {err_gdn:.3f} (relative L2)")
assert err_kda < 1e-10, "two time scales in one KDA head, exactly"
assert err_gdn > 0.1 and fit_error.min() > 0.1, "no single exponential comes close"

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.semilogy(lag, target, color="0.2", linewidth=3, alpha=0.35, label="target h(tau)")
ax.semilogy(lag, powers @ q_two, "--", color=colors["kda"], label="KDA head (per-channel decay)")
ax.semilogy(lag, c_best * rho_best**lag, ":", color=colors["gdn"], linewidth=2,
            label="best scalar-decay head (one exponential)")
ax.set(xlim=(0, 4 * slow_half_life), ylim=(1e-4, 1.5), xlabel="lag tau (tokens)",
       ylabel="weight of x(t - tau) (log scale)",
       title="Two time scales in one head: per-channel vs scalar decay")
ax.legend(loc="upper right", fontsize=8)
viz.show(fig, "08_two_time_scales")

# %% [markdown]
# The scalar-gate head must choose one time scale: its best compromise overshoots the short
# lags and undershoots the long ones. Two scalar-gate heads could hold one time scale each, at
# twice the state; one KDA head holds both. Whether trained models use this, the recorded
# sweep above does not show.

# %% [markdown]
# ## Summary
#
# - Five mixers behind one model and one training loop (`kda_lib.lab.train`), three recall tasks
#   (`kda_lib.lab.tasks`), every setting run with several seeds (three in the recorded sweep, at
#   the best of a learning-rate grid per task and mixer); the command line runs the same
#   experiments one at a time.
# - At CI size, one-layer KDA solves MQAR on every seed; the conv-only ablation stays near
#   chance, as its finite reach says it must.
# - One-layer softmax attention cannot solve MQAR, and the reason is structural, not a bug:
#   with the short convolution the recurrent mixers have, one attention layer solves it too.
#   Two attention layers can learn it without the convolution, after a phase transition (the
#   recorded long run).
# - The recorded sweep (two layers, a rate tuned per task and mixer with the best inside its
#   grid, three seeds, trained until solved or a stated budget) gives each of the paper's two
#   claims a verdict per task from the complete cells only, each ordering a paired t-test
#   across seeds Holm-corrected over the notebook's comparisons (`kda_lib.lab.significance`):
#   nothing is ordered, and every claim is *not shown* at this scale (section 8, with its
#   intervals and the gaps three seeds could detect).
# - A decay per channel can do what one forget value per head cannot: a single head with two
#   channels holds two time scales at once (section 9, exact to float64 rounding), while a
#   scalar gate's head is one exponential.

# %% [markdown]
# ## Exercises
#
# Each exercise cell leaves `answer = None`; replace it with your answer and run the cell:
# `kda_lib.teaching.exercises.check` says whether it is right without showing the solution. Worked
# solutions are in `notebooks/solutions/ch08.py` (try first).
#
# 1. **Chance by hand.** In MQAR, a scored position's answer is one of the value tokens. How
#    many are there for `vocab_size` tokens, and what accuracy does uniform guessing give?
#    (Answer: the accuracy, a float; compare with `chance_accuracy("mqar", ...)`.)
# 2. **Which settings are solved?** From the complete cells of the recorded sweep (`acc`,
#    `complete`), list the (task, T) pairs at which at least one mixer reaches a mean accuracy
#    of 0.9 over seeds.
# 3. **The conv-only reach.** In an MQAR sequence, query $k_i$ is answered by $v_i$, which sits
#    at a known position. For the example of section 1, count the queries whose value lies
#    within `conv_reach` tokens of the query: that bounds what the conv-only model can get
#    right.
# 4. **Three time scales in one head.** Extend section 9 to three key channels: build a KDA
#    head (decays $\alpha_i \in (0, 1]$, $\beta \in (0, 1]$, a unit key $\mathbf k$, a query
#    $\mathbf q$) whose filter $\beta\, \mathbf q^\top A^\tau \mathbf k$ is
#    $h(\tau) = \frac13 (r_1^\tau + r_2^\tau + r_3^\tau)$ for half-lives 1, 8 and 64 tokens.
#    Answer: a dict with keys `alphas`, `beta`, `k`, `q`; the checker computes the filter over
#    `two_scale_len` lags. Hint: $A$ is similar to $D - \mathbf u \mathbf u^\top$ with
#    $u_i^2 = \beta \alpha_i k_i^2$, whose eigenvalues interlace the $\alpha_i$.

# %%
from kda_lib.teaching import exercises

answer = None  # 1: the chance accuracy of MQAR, a float
exercises.check("08.1", answer, vocab_size=vocab_size)
answer = None  # 2: a list of (task, T) pairs
exercises.check("08.2", answer, accuracy={cell: acc[cell].tolist() for cell in complete})
answer = None  # 3: the number of queries within conv_reach of their value, an int
exercises.check("08.3", answer, inputs=inputs, mask=mask, num_pairs=num_pairs,
                        conv_reach=conv_reach)
answer = None  # 4: dict(alphas=[3 floats], beta=float, k=[3 floats], q=[3 floats])
exercises.check("08.4", answer, half_lives=(1.0, 8.0, 64.0), length=two_scale_len)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture*, 2025 (KDA; the
#   synthetic tests). [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - S. Arora, S. Eyuboglu, A. Timalsina, I. Johnson, M. Poli, J. Zou, A. Rudra, C. Ré,
#   *Zoology: measuring and improving recall in efficient language models*, 2023 (MQAR; the
#   learning-rate protocol). [arXiv:2312.04927](https://arxiv.org/abs/2312.04927)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta
#   rule*, ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - C. Olsson et al., *In-context learning and induction heads*, 2022 (the two-layer circuit
#   and its phase change). [arXiv:2209.11895](https://arxiv.org/abs/2209.11895)
# - J. Su et al., *RoFormer: enhanced transformer with rotary position embedding*, 2021.
#   [arXiv:2104.09864](https://arxiv.org/abs/2104.09864)
