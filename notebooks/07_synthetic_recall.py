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
# # 07 · Synthetic recall: MQAR, palindrome and stack, four token mixers
#
# **Claim.** On tasks that can only be solved by remembering specific earlier tokens, a model
# whose mixer is KDA learns what a model without a recurrent state cannot. The Kimi Linear
# paper (arXiv 2510.26692, synthetic tests) trains small models on Palindrome, Multi-Query
# Associative Recall (MQAR) and Stack at growing sequence lengths and reports KDA ahead of
# Gated DeltaNet (GDN). We rerun that comparison at laptop scale with four mixers behind one
# model: KDA, GDN (the same layer with one decay per head instead of one per channel), plain
# causal softmax attention, and a conv-only ablation. At CI size we check that KDA solves MQAR
# (held-out accuracy >= 0.9) where the conv-only model cannot, and we plot the bigger run we
# recorded beside the live one.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/07_synthetic_recall.ipynb)
#
# CI runs the small defaults below (one layer, a few seconds per run on two CPU cores);
# `make notebooks PARAMS=full` runs `notebooks/params/full/07_synthetic_recall.yaml`, the
# setting recorded in `data/results/synthetic_recall_full.json`. The same runs, one at a time,
# come from the command line: `python -m kda_lib.train mqar --mixer kda --seq-len 64 ...`.

# %% tags=["parameters"]
tasks: list[str] = ["mqar", "palindrome", "stack"]  # names in kda_lib.tasks.TASKS
mixers: list[str] = ["kda", "gdn", "attention", "conv"]  # names in kda_lib.train.MIXERS
seq_lens: list[int] = [32, 64]  # sequence lengths T (tokens) of the sweep
vocab_size: int = 32  # tokens, the same for every task so runs share compiled steps
num_pairs: int = 4  # MQAR key/value pairs per sequence
steps: int = 200  # optimiser steps per run
batch_size: int = 16  # sequences per step
learning_rate: float = 0.01  # AdamW peak rate (warmup, then cosine decay)
hidden_size: int = 64  # model width
num_layers: int = 1  # blocks of (norm, mixer, norm, MLP)
num_heads: int = 2  # heads of every mixer
head_dim: int = 32  # K and V per head
eval_batches: int = 4  # held-out batches per run
log_every: int = 25  # steps averaged into one point of the training curves
record_results: str = ""  # write this sweep's records to this JSON path ("" to skip)
recorded_results: str = "data/results/synthetic_recall_full.json"  # recorded full run
seed: int = 0  # seed of the one jax.random.key below

# %%
# Setup: install kda_lib when it is missing (e.g. on Colab); a no-op wherever it is importable.
try:
    import kda_lib
except ImportError:
    # %pip install -q git+https://github.com/kda-notebooks/kda-notebooks
    import kda_lib

import json
import pathlib

import jax
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from kda_lib import viz
from kda_lib.tasks import chance_accuracy
from kda_lib.train import (
    ModelConfig,
    TinyLM,
    count_params,
    make_task,
    run_sweep,
    save_record,
    summary_line,
)

viz.setup_style()
# Draw random numbers with the non-partitionable threefry: on CPU it compiles multi-dimensional
# draws many times faster; it only changes which numbers are drawn.
jax.config.update("jax_threefry_partitionable", False)
print("jax", jax.__version__, "on", jax.default_backend(), "| kda_lib from", kda_lib.__file__)

# %%
# Derived values
key = jax.random.key(seed)
key_seed, key_examples = jax.random.split(key)
# model init and batches take an integer seed (kda_lib.train.run_experiment): draw it from key
experiment_seed = int(jax.random.randint(key_seed, (), 0, 2**31 - 1))
task_options = {
    "mqar": dict(vocab_size=vocab_size, num_pairs=num_pairs),
    "palindrome": dict(vocab_size=vocab_size),
    "stack": dict(vocab_size=vocab_size),
}
task_options = {name: task_options[name] for name in tasks}
model_options = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                     head_dim=head_dim)
chance = {name: chance_accuracy(name, **options) for name, options in task_options.items()}
print(f"{len(tasks)} tasks x {len(seq_lens)} lengths x {len(mixers)} mixers = "
      f"{len(tasks) * len(seq_lens) * len(mixers)} runs of {steps} steps")

# %% [markdown]
# ## 1. The tasks
#
# Each generator in `kda_lib.tasks` returns inputs, targets and a mask of the positions that
# are scored; only those enter the loss and the accuracy.
#
# - **MQAR** (multi-query associative recall, as in the Zoology paper): the sequence opens
#   with `num_pairs` key/value pairs `k1 v1 k2 v2 ...`; later each key comes back once, among
#   filler tokens, and the model must answer with its value. It measures how many bindings a
#   state can hold and retrieve by content.
# - **Palindrome**: random content, a separator, then the content in reverse order. The
#   answer at step `i` lies `2i + 1` tokens back, so the model must keep the order of the
#   whole first half.
# - **Stack**: a stream of pushes (a value token) and pops; after each pop, name the new top
#   of the stack. Only pops are scored; the answer may have been pushed long ago.
#
# Below one example of each: the scored positions are outlined, with their target in the
# lower row.

# %%
example_len = 24
examples = {name: make_task(name, **options)(k, 1, example_len)
            for (name, options), k in zip(task_options.items(),
                                          jax.random.split(key_examples, len(task_options)),
                                          strict=True)}
fig, axes = plt.subplots(len(examples), 1, figsize=(9, 1.35 * len(examples) + 0.4),
                         squeeze=False)
for ax, (name, batch) in zip(axes[:, 0], examples.items(), strict=True):
    viz.token_rows(ax, *(a[0] for a in batch), vocab_size=vocab_size,
                   title=f"{name}: input tokens (top) and scored targets (bottom)")
viz.show(fig, "07_tasks")

# %% [markdown]
# The ground truth, re-derived here from the inputs alone for the MQAR example: every scored
# position holds a key, and its target is the token that followed that key in the pairs.

# %%
if "mqar" in examples:
    inputs, targets, mask = (np.asarray(a[0]) for a in examples["mqar"])
    pairs = dict(zip(inputs[0:2 * num_pairs:2], inputs[1:2 * num_pairs:2], strict=True))
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
# (`kda_lib.train.TinyLM`); only the mixer changes.
#
# - **kda**: `KimiDeltaAttention`: short causal convs on `q, k, v`, then the delta rule with a
#   forget gate per key channel.
# - **gdn**: Gated DeltaNet: the same layer with one forget gate value per head
#   (`KDAConfig(per_head_decay=True)`). The paper's claim is that per-channel decay is the
#   better memory.
# - **attention**: causal softmax attention with rotary positions, no convolution. It keeps
#   every past token, at a cost quadratic in `T`. With a single layer it cannot bind a key to
#   the token *after* it (that takes two layers, an "induction head"), so it cannot solve MQAR
#   at the one-layer CI size; the recorded run has two layers.
# - **conv**: the KDA layer's value convolution and output gate without the recurrence. It
#   sees `num_layers * (conv_size - 1)` tokens back and nothing before: the control.

# %%
for mixer in mixers:
    model = TinyLM(ModelConfig(vocab_size=vocab_size, mixer=mixer, **model_options),
                   rngs=nnx.Rngs(0))
    print(f"{mixer:10s} {count_params(model):8,d} parameters")
conv_reach = ModelConfig(vocab_size=vocab_size, **model_options).conv_reach
print(f"the conv-only model sees {conv_reach} tokens back")

# %% [markdown]
# ## 3. The sweep
#
# `kda_lib.train.run_sweep` trains one fresh model per task, length and mixer (AdamW, the
# same seed for every run) and scores it on held-out batches that training never draws. All
# tasks share one vocabulary, so the runs of one mixer and length reuse one compiled step.

# %%
records = run_sweep(task_options, mixers, seq_lens, report=lambda r: print(summary_line(r)),
                    steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                    seed=experiment_seed, eval_batches=eval_batches, log_every=log_every,
                    model_options=model_options)
if record_results:
    print("wrote", save_record(records, record_results))


# %%
def accuracy_table(records):
    """{(task, mixer): {T: held-out accuracy}} from a list of run records."""
    table = {}
    for r in records:
        table.setdefault((r["task"], r["mixer"]), {})[r["training"]["seq_len"]] = (
            r["eval"]["accuracy"])
    return table


def print_table(records, title):
    table = accuracy_table(records)
    lengths = sorted({r["training"]["seq_len"] for r in records})
    print(title)
    print(f"{'task':12s} {'mixer':10s} " + " ".join(f"{'T=' + str(t):>7s}" for t in lengths))
    for (task, mixer), by_len in table.items():
        cells = " ".join(f"{by_len[t]:7.3f}" if t in by_len else f"{'-':>7s}" for t in lengths)
        print(f"{task:12s} {mixer:10s} {cells}")


print_table(records, f"Held-out accuracy, this run ({num_layers} layer(s), {steps} steps):")
live = accuracy_table(records)

# %% [markdown]
# ## 4. Accuracy against sequence length, live and recorded
#
# Solid lines: this run. Dashed lines: the full-size run recorded in `recorded_results`
# (its setting is in the legend title; the parameters of `notebooks/params/full/`), made on
# the 2-core CPU machine this project's CI uses. Dotted: chance, guessing uniformly among the
# possible answers (the recorded run has a larger vocabulary, so a lower chance level).

# %%
recorded_path = pathlib.Path(recorded_results)
if not recorded_path.is_absolute() and not recorded_path.exists():
    recorded_path = pathlib.Path(kda_lib.__file__).parent.parent / recorded_results
recorded = json.loads(recorded_path.read_text()) if recorded_path.exists() else []
if recorded:
    first = recorded[0]
    recorded_setting = (f"recorded: {first['model']['num_layers']} layers, "
                        f"{first['training']['steps']} steps, vocab "
                        f"{first['task_options']['vocab_size']}")
else:
    recorded_setting = "no recorded run found"
    print(f"{recorded_results} not found: only the live run is drawn")
recorded_table = accuracy_table(recorded)

colors = dict(zip(["kda", "gdn", "attention", "conv"], viz.CYCLE, strict=False))
fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.9), squeeze=False)
for ax, task in zip(axes[0], tasks, strict=True):
    for mixer in mixers:
        color = colors.get(mixer, "0.4")
        by_len = live.get((task, mixer), {})
        ax.plot(sorted(by_len), [by_len[t] for t in sorted(by_len)], "o-", color=color,
                label=f"{mixer}, this run")
        rec = recorded_table.get((task, mixer), {})
        if rec:
            ax.plot(sorted(rec), [rec[t] for t in sorted(rec)], "s--", color=color, alpha=0.7,
                    markerfacecolor="none", label=f"{mixer}, recorded")
    ax.axhline(chance[task], color="0.3", linestyle=":", linewidth=1.2, label="chance, this run")
    recorded_chance = {r["chance_accuracy"] for r in recorded if r["task"] == task}
    for level in recorded_chance - {chance[task]}:
        ax.axhline(level, color="0.6", linestyle=":", linewidth=1.2, label="chance, recorded")
    ax.set_xscale("log", base=2)
    drawn = sorted(set(seq_lens) | {t for (k, _), v in recorded_table.items() if k == task
                                     for t in v})
    ax.set_xticks(drawn, [str(t) for t in drawn])
    ax.minorticks_off()
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{task}: held-out accuracy")
    ax.set_xlabel("sequence length T (tokens, log scale)")
    ax.set_ylabel("accuracy on scored positions")
axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8,
                   title=f"live: {num_layers} layer(s), {steps} steps\n{recorded_setting}",
                   title_fontsize=8)
viz.show(fig, "07_accuracy_vs_length")

# %% [markdown]
# ## 5. The check: KDA recalls, the conv-only model cannot
#
# At every length of this run, the KDA model answers MQAR queries on held-out sequences with
# accuracy at least 0.9. The conv-only model stays near chance: a query's pair sits beyond its
# reach except, rarely, for the last pair and the first query slot.

# %%
if "mqar" in tasks and "kda" in mixers and "conv" in mixers:
    for t in seq_lens:
        kda_acc, conv_acc = live[("mqar", "kda")][t], live[("mqar", "conv")][t]
        print(f"MQAR T={t}: kda {kda_acc:.3f}, conv only {conv_acc:.3f} "
              f"(chance {chance['mqar']:.3f})")
        assert kda_acc >= 0.9, f"KDA should solve MQAR at T={t}, got {kda_acc:.3f}"
        assert conv_acc < 0.25, f"conv-only should not solve MQAR at T={t}, got {conv_acc:.3f}"

# %% [markdown]
# The training curves of the longest MQAR run: the recurrent mixers climb from chance to
# near-perfect recall within a few hundred steps; the conv-only model stays at chance.

# %%
if "mqar" in tasks:
    longest = max(seq_lens)
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for r in records:
        if r["task"] == "mqar" and r["training"]["seq_len"] == longest:
            h = r["history"]
            ax.plot(h["step"], h["accuracy"], color=colors.get(r["mixer"], "0.4"),
                    label=r["mixer"])
    ax.axhline(chance["mqar"], color="0.3", linestyle=":", linewidth=1.2, label="chance")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"MQAR, T = {longest}: training accuracy ({log_every}-step means)")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("accuracy on scored positions")
    ax.legend(loc="center right")
    viz.show(fig, "07_mqar_curves")

# %% [markdown]
# ## 6. The recorded full-size run: does KDA beat GDN?
#
# The paper's claim is about KDA against GDN at growing lengths. In the recorded run we
# compare them per task and length, and call differences within 0.01 (a few scored positions
# of the held-out batches) a tie.
#
# What the recorded run shows (two layers, 800 steps, vocabulary 64):
#
# - **MQAR**: KDA and GDN both recall 8 pairs almost perfectly up to `T = 256`; KDA is ahead
#   at 64 tokens (GDN learned more slowly there), level at 128 and 256. Softmax attention
#   without a short convolution stays near 0.2 in 800 steps: it has to build its
#   key-to-next-token binding from two attention layers, which the recurrent mixers get from
#   their short convolutions. The conv-only control stays at chance.
# - **Palindrome**: attention, which keeps every token, is far ahead; the fixed-size states
#   of KDA and GDN lose the order of long strings, KDA less than GDN at every length.
# - **Stack**: KDA is ahead of GDN at 64 and 128 tokens and level at 256; both are far above
#   attention and the conv control (which gets the pops of recent pushes right).

# %%
if recorded:
    print_table(recorded, f"Held-out accuracy, {recorded_setting}:")
    verdicts = []
    for (task, mixer), by_len in recorded_table.items():
        if mixer != "kda" or (task, "gdn") not in recorded_table:
            continue
        for t, kda_acc in sorted(by_len.items()):
            gdn_acc = recorded_table[(task, "gdn")].get(t)
            if gdn_acc is None:
                continue
            diff = kda_acc - gdn_acc
            verdict = "tie" if abs(diff) <= 0.01 else "KDA ahead" if diff > 0 else "GDN ahead"
            verdicts.append(verdict)
            print(f"{task:12s} T={t:<5d} kda {kda_acc:.3f}  gdn {gdn_acc:.3f}  {verdict}")
    counts = {v: verdicts.count(v) for v in ("KDA ahead", "tie", "GDN ahead")}
    print(f"of {len(verdicts)} task/length pairs: " + ", ".join(f"{n} {v}" for v, n in
                                                             counts.items()))
    assert all(0.0 <= r["eval"]["accuracy"] <= 1.0 for r in recorded)

# %% [markdown]
# ## Summary
#
# - Four mixers behind one model and one training loop (`kda_lib.train`), three recall tasks
#   (`kda_lib.tasks`), one sweep function; the command line runs the same experiments one at a
#   time and writes JSON records.
# - At CI size, one-layer KDA solves MQAR at every length; the conv-only ablation stays near
#   chance, as its finite reach says it must; one-layer attention cannot bind a key to the
#   next token.
# - In the recorded two-layer run, KDA was ahead of GDN or level (within 0.01) at every task
#   and length: clearly ahead on palindrome and on stack up to 128 tokens, level on MQAR.
#   Softmax attention wins palindrome, where keeping every token pays, and had not learned
#   MQAR in 800 steps without the short convolutions the recurrent layers have.
#
# Try: more `num_pairs` (does the state run out of room?), `num_layers=2` (attention learns
# MQAR), longer `seq_lens`, or `mixers=["kda", "gdn"]` with more `steps`.
