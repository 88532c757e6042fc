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
# training steps, with KDA ahead of Gated DeltaNet (GDN). We rerun that comparison at laptop
# scale, with every number a mean over seeds (spread shown) and every mixer's learning rate
# picked from a grid (the Zoology protocol: each model gets its best rate). We also show why
# plain softmax attention, which is known to solve MQAR, sits low here: it has to *grow* an
# induction circuit, a sudden phase transition that the recurrent mixers skip because their
# short convolution hands each token its predecessor.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/08_synthetic_recall.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults below (MQAR only, one layer, two seeds, one rate, KDA and the
# attention and conv controls);
# `make notebooks PARAMS=full` runs `notebooks/params/full/08_synthetic_recall.yaml`, the
# setting recorded in `data/results/synthetic_recall_seeds.json` (its command and time are in
# `data/results/README.md`). One run at a time comes from the command line:
# `python -m kda_lib.train mqar --mixer kda --seq-len 64 ...`.

# %% tags=["parameters"]
tasks: list[str] = ["mqar"]  # names in kda_lib.tasks.TASKS (the full run: all three)
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
recorded_results: str = "synthetic_recall_seeds.json"  # recorded full run, in data/results/
recorded_phase: str = "mqar_attention_phase_transition_seed0.json"  # long attention MQAR run
seed: int = 0  # seed of the one jax.random.key below

# %% tags=["hide-input"]
# Install: where kda_lib is missing (Colab, a fresh VM) install it, then the
# dependencies for this machine's accelerator, keeping the runtime's JAX when it
# is new enough (one line says what was installed).
import importlib.util
import runpy
import subprocess
import sys

if importlib.util.find_spec("kda_lib") is None:  # Colab or a fresh VM: install kda_lib first
    KDA_LIB_SOURCE = "git+https://github.com/kda-notebooks/kda-notebooks"
    pip = [sys.executable, "-m", "pip", "install", "-qq", "--no-deps", KDA_LIB_SOURCE]
    subprocess.run(pip, check=True)
    importlib.invalidate_caches()
    (kda_lib_dir,) = importlib.util.find_spec("kda_lib").submodule_search_locations
    runpy.run_path(f"{kda_lib_dir}/notebook.py")["install_dependencies"]()

# %%
# Imports; kda_lib.notebook.setup() applies the settings every notebook shares.
import jax
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

import kda_lib.notebook
from kda_lib import viz
from kda_lib.models import ModelConfig, TinyLM, count_params
from kda_lib.recorded import load_recorded
from kda_lib.tasks import chance_accuracy
from kda_lib.train import make_task, run_sweep, save_record, summary_line

kda_lib.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.notebook.setup()

# %%
# Derived values
key = jax.random.key(seed)
key_seed, key_examples = jax.random.split(key)
# model init and batches take integer seeds (kda_lib.train.run_experiment): draw them from key
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
# Each generator in `kda_lib.tasks` returns inputs, targets and a mask of the positions that
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
# (`kda_lib.models.TinyLM`); only the mixer changes.
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
    print(f"{mixer:15s} {count_params(model):8,d} parameters")
conv_reach = ModelConfig(vocab_size=vocab_size, **model_options).conv_reach
print(f"the conv-only model sees {conv_reach} tokens back")

# %% [markdown]
# ## 3. The sweep: a learning-rate grid per mixer, then seeds
#
# `kda_lib.train.run_sweep` trains one fresh model per task, length and mixer (AdamW, warmup
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
# `data/results/README.md`: two layers, width 128, batch 32, rate $10^{-3}$) sits at the
# accuracy of guessing among the values for thousands of steps, then jumps.

# %% tags=["hide-input"]
phase = load_recorded("results", recorded_phase)
h = phase["history"]
fig, ax = plt.subplots(figsize=(7.5, 3.4))
ax.plot(h["step"], h["accuracy"], color=viz.CYCLE[2], label="attention, 2 layers (recorded)")
ax.axhline(phase["chance_accuracy"], color="0.3", linestyle=":", label="chance")
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
# ## 7. The recorded full run: both rows of the paper's figure
#
# The recorded run (`recorded_results`) has all three tasks, two lengths, a learning-rate grid
# per mixer and three seeds per setting. Top: accuracy against length (mean, bars from min to
# max over seeds); bottom: accuracy against steps at the longest length. Dotted: chance, guessing
# uniformly among the answers a scored position can hold.

# %%
recorded_file = load_recorded("results", recorded_results)
recorded, rec_tuning = recorded_file["runs"], recorded_file["tuning"]
rec = tuned(recorded)
first = recorded[0]
rec_tasks = list(dict.fromkeys(r["task"] for r in recorded))
rec_lens = sorted({r["training"]["seq_len"] for r in recorded})
rec_setting = (f"recorded: {first['model']['num_layers']} layer(s), width "
               f"{first['model']['hidden_size']}, {first['training']['steps']} steps, vocab "
               f"{first['task_options']['vocab_size']}, rates "
               f"{sorted({r['training']['learning_rate'] for r in rec_tuning})}")
chance.update({r["task"]: r["chance_accuracy"] for r in recorded})
print_table(rec, rec_setting + "\nmean +- sd [min, max] over seeds, at each setting's best rate")

# %% tags=["hide-input"]
fig, axes = plt.subplots(2, len(rec_tasks), figsize=(4.4 * len(rec_tasks), 7.2), squeeze=False)
for ax, task in zip(axes[0], rec_tasks, strict=True):
    for mixer in mixers:
        cells = [rec.get((task, mixer, t)) for t in rec_lens]
        if any(c is None for c in cells):
            continue
        mean = np.array([c["acc"].mean() for c in cells])
        err = [mean - [c["acc"].min() for c in cells], [c["acc"].max() for c in cells] - mean]
        ax.errorbar(rec_lens, mean, yerr=err, marker="o", capsize=3, color=colors[mixer],
                    label=mixer)
    ax.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(rec_lens, [str(t) for t in rec_lens])
    ax.minorticks_off()
    ax.set(ylim=(-0.02, 1.02), title=f"{task}: accuracy vs length",
           xlabel="sequence length T (tokens, log scale)", ylabel="held-out accuracy")
for ax, task in zip(axes[1], rec_tasks, strict=True):
    steps_panel(ax, rec, task, rec_lens[-1], colors)
    ax.set_title(f"{task}, T = {rec_lens[-1]}: accuracy vs steps")
axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, title=rec_setting
                   .replace(", rates", "\nrates").replace("recorded: ", ""), title_fontsize=7)
viz.show(fig, "08_recorded_length_and_steps")

# %% [markdown]
# ## 8. Does KDA beat GDN?
#
# Per task and length we compare the two means and call a difference real only when it is
# larger than both 0.01 and twice its standard error over seeds,
# $|\bar a_{\mathrm{KDA}} - \bar a_{\mathrm{GDN}}| > \max\!\big(0.01,\;
# 2\sqrt{s_{\mathrm{KDA}}^2/n + s_{\mathrm{GDN}}^2/n}\big)$; otherwise the two are level.
#
# In the recorded run KDA is never behind GDN: it is ahead on palindrome at both lengths (the
# task that needs the order of many tokens, where a decay per channel can keep some channels
# for long and others short) and level on MQAR and stack. GDN's MQAR at $T = 64$ shows why
# seeds matter: one of its three seeds stalled below 0.7 (asserted below).

# %%
def verdict(a, b):
    diff, se = a.mean() - b.mean(), np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return "level" if abs(diff) <= max(0.01, 2 * se) else "KDA ahead" if diff > 0 else "GDN ahead"


verdicts = {}
for task in rec_tasks:
    for t in rec_lens:
        a, b = rec[(task, "kda", t)]["acc"], rec[(task, "gdn", t)]["acc"]
        verdicts[(task, t)] = verdict(a, b)
        print(f"{task:11s} T={t:<4d} kda {a.mean():.3f} +- {a.std(ddof=1):.3f}   gdn "
              f"{b.mean():.3f} +- {b.std(ddof=1):.3f}   {verdicts[(task, t)]}")
counts = {v: list(verdicts.values()).count(v) for v in ("KDA ahead", "level", "GDN ahead")}
print(f"of {len(verdicts)} task/length pairs: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
assert counts["GDN ahead"] == 0, verdicts  # the claims above
assert all(verdicts[("palindrome", t)] == "KDA ahead" for t in rec_lens)
gdn_mqar = rec[("mqar", "gdn", rec_lens[0])]["acc"]
assert gdn_mqar.min() < 0.7 and gdn_mqar.max() > 0.99, gdn_mqar  # one seed stalled
attention_mqar = [rec[("mqar", "attention", t)] for t in rec_lens]
print("attention on MQAR at its best rate:", [(a["lr"], round(a["acc"].mean(), 3)) for a in
                                               attention_mqar])
assert all(a["lr"] == 0.003 and a["acc"].mean() < 0.36 for a in attention_mqar)

# %% [markdown]
# ## Summary
#
# - Five mixers behind one model and one training loop (`kda_lib.train`), three recall tasks
#   (`kda_lib.tasks`), every setting run with several seeds (three in the recorded run, with
#   the best of a learning-rate grid per mixer); the command line runs the same experiments
#   one at a time.
# - At CI size, one-layer KDA solves MQAR on every seed; the conv-only ablation stays near
#   chance, as its finite reach says it must.
# - One-layer softmax attention cannot solve MQAR, and the reason is structural, not a bug:
#   with the short convolution the recurrent mixers have, one attention layer solves it too.
#   Two attention layers can learn it without the convolution, after a phase transition (the
#   recorded long run).
# - With three seeds and a tuned rate per mixer, KDA was ahead of GDN on palindrome and level
#   with it on MQAR and stack at the recorded size (printed in section 7); never behind.
# - Softmax attention, tuned over the same grid (its best rate: 0.003), stays below 0.36 on
#   MQAR with one layer at both lengths: the missing previous-token step, not the rate.

# %% [markdown]
# ## Exercises
#
# 1. **Chance by hand.** In MQAR, a scored position's answer is one of the value tokens. How
#    many are there for `vocab_size` tokens, and what accuracy does uniform guessing give?
#    Compare with `chance_accuracy("mqar", ...)`.
# 2. **Was the grid wide enough?** A rate picked at the edge of the grid may not be the best
#    one. From the recorded tuning runs (`rec_tuning`), find each mixer's best rate and whether
#    it is the smallest or the largest tried.
# 3. **The conv-only reach.** In an MQAR sequence, query $k_i$ is answered by $v_i$, which sits
#    at a known position. For the example above, count the queries whose value lies within
#    `conv_reach` tokens of the query: that bounds what the conv-only model can get right.
#
# The solutions below are hidden in the rendered page; they run (and assert) in CI.

# %% tags=["solution", "hide-input"]
# 1: token 0 is filler, (V - 1) // 2 tokens are keys, the rest values (kda_lib.tasks.mqar)
n_values = vocab_size - 1 - (vocab_size - 1) // 2
batch = make_task("mqar", **all_options["mqar"])(jax.random.key(9), 64, 64)
seen = set(np.asarray(batch.targets)[np.asarray(batch.mask)].tolist())
assert seen <= set(range(vocab_size - n_values, vocab_size)) and len(seen) == n_values
assert abs(chance["mqar"] - 1 / n_values) < 1e-12
print(f"exercise 1: {n_values} value tokens, chance {1 / n_values:.4f}")
# 2: the tuning runs of the recorded sweep: is a mixer's best rate at an edge of the grid?
grid = sorted({r["training"]["learning_rate"] for r in rec_tuning})
picked = {m: max((r for r in rec_tuning if r["mixer"] == m), key=lambda r: r["eval"]["accuracy"])
          for m in {r["mixer"] for r in rec_tuning}}
edges = sorted(m for m, r in picked.items()
               if r["training"]["learning_rate"] in (grid[0], grid[-1]))
assert all(rec[(r["task"], m, r["training"]["seq_len"])]["lr"] == r["training"]["learning_rate"]
           for m, r in picked.items())
print(f"exercise 2: grid {grid}; best rate at an edge for {edges}")
# 3: queries whose value lies within the conv reach
value_pos = {k: 2 * i + 1 for i, k in enumerate(inputs[0:2 * num_pairs:2])}
near = sum(t - value_pos[inputs[t]] <= conv_reach for t in np.flatnonzero(mask))
print(f"exercise 3: {near} of {mask.sum()} queries within {conv_reach} tokens of their value")
assert 0 <= near <= mask.sum()

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
