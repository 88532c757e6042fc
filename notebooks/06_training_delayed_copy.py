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
# # 06 · Training: only the recurrent state can copy from far back
#
# **Claim.** A tiny two-layer language model whose token mixer is `KimiDeltaAttention` learns the
# *delayed-copy* task (repeat the token seen $\ell$ = `delay` steps ago) in `steps` AdamW steps
# (250 by default; this run, one seed), driving the loss far below the chance level
# $\log \lvert\mathcal V\rvert$, even though $\ell$ is beyond what the layer's short convolutions
# can see. The same model with the recurrence removed (the conv path only) is provably blind that
# far back and stays at chance. Sections 2-3 thus already imply that the copied token crosses
# through a recurrent state; section 4 clears the states mid-sequence to make this visible and to
# ask which path the trained model uses.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/06_training_delayed_copy.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults of the `parameters` cell below; `make notebooks PARAMS=full` runs
# the bigger experiment in `notebooks/params/full/06_training_delayed_copy.yaml`. The model and
# the loop live in `kda_lib.models.tiny_lm` and `kda_lib.lab.train`, the task in
# `kda_lib.lab.tasks`; this notebook only runs, plots and checks.

# %% tags=["parameters"]
vocab_size: int = 16  # distinct tokens; chance loss is log(vocab_size) nats
delay: int = 8  # copy the token seen this many steps ago
seq_len: int = 32  # tokens per training sequence
batch_size: int = 32  # sequences per optimiser step
steps: int = 250  # optimiser steps for each model
learning_rate: float = 0.01  # AdamW peak learning rate (warmup, then cosine decay)
hidden_size: int = 32  # model width
num_layers: int = 2  # blocks of (norm, mixer, norm, MLP)
num_heads: int = 2  # KDA heads per layer
head_dim: int = 16  # K and V per head
conv_size: int = 4  # short-conv width w: each layer's conv sees w - 1 tokens back
implementation: str = "recurrent"  # KDA kernel; recurrent compiles fastest on CPU at CI size
log_every: int = 10  # steps averaged into one point of the loss curves
eval_batches: int = 4  # held-out batches for the final scores
seed: int = 0  # seed of the one jax.random.key below


# %% tags=["hide-input"]
# Install what is missing (Colab, a fresh VM; 1 to 3 minutes): see the notebook notes.
import importlib.util
import os
import runpy
import subprocess
import sys

NEEDED = ("kda_lib", "jax", "flax", "optax", "numpy", "matplotlib")
sys.path += [d for d in map(os.path.abspath, (".", "..")) if os.path.isdir(f"{d}/kda_lib")][:1]
if missing := [name for name in NEEDED if importlib.util.find_spec(name) is None]:
    if "kda_lib" in missing:  # not installed, and no checkout here or a folder up: install it
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
    (kda_lib_dir,) = importlib.util.find_spec("kda_lib").submodule_search_locations
    runpy.run_path(f"{kda_lib_dir}/teaching/install.py")["install_dependencies"](missing=missing)

# %%
# Imports; kda_lib.teaching.notebook.setup() applies the settings every notebook shares.
import dataclasses
import functools

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib import KDAConfig
from kda_lib.lab.tasks import chance_loss, delayed_copy
from kda_lib.lab.train import evaluate, train
from kda_lib.layers.params import parameter_count
from kda_lib.models.tiny_lm import ModelConfig, TinyLM
from kda_lib.teaching import viz

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
# Derived values
key = jax.random.key(seed)
key_example, key_seeds, key_probe = jax.random.split(key, 3)
key_reset = jax.random.fold_in(key_probe, 1)  # held-out batch of section 4
# nnx.Rngs (model init) and kda_lib.lab.train (batches) take integer seeds: draw them from the key
init_kda, init_conv, data_seed = (int(x) for x in jax.random.randint(key_seeds, (3,), 0, 2**31 - 1))
task = functools.partial(delayed_copy, vocab_size=vocab_size, delay=delay)
chance = chance_loss(vocab_size)
mixer_config = KDAConfig(hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim,
                         conv_size=conv_size, implementation=implementation)  # every layer's KDA
config = ModelConfig(vocab_size=vocab_size, num_layers=num_layers, mixer_config=mixer_config)
conv_config = dataclasses.replace(config, mixer="conv")
print(f"chance loss log({vocab_size}) = {chance:.3f} nats; conv reach = {config.conv_reach} tokens")
# every seed-dependent number below (the weights, batches, scores) also depends on JAX's RNG mode
print(f"seed {seed}, jax_threefry_partitionable = {jax.config.jax_threefry_partitionable}")

# %% [markdown]
# ## 1. The task
#
# Inputs are uniform random tokens. The target at position $t$ is the input at $t - \ell$,
# scored only for $t \ge \ell$ (the mask). A model that cannot see $\ell$ tokens back can do no
# better than guessing: cross-entropy $\log \lvert\mathcal V\rvert$, accuracy
# $1 / \lvert\mathcal V\rvert$. `delayed_copy` is a pure function of its key, so a batch is
# reproducible anywhere with the same RNG mode (printed above). In the figure each cell shows a
# token id; the target row is blank where nothing is scored.

# %%
def print_rows(start, **rows):
    """Rows of token ids, a column per position from ``start`` (-1: not scored, shown '.')."""
    for name, row in {"position": range(start, start + len(rows["target"])), **rows}.items():
        print(f"{name:9s}", " ".join(" ." if t < 0 else f"{t:2d}" for t in row))


example = task(key_example, 2, seq_len)
x0, y0, m0 = (np.asarray(a[0]) for a in example)
shown = min(seq_len, max(24, delay + 12))  # positions printed and drawn
print_rows(0, input=x0[:shown], target=np.where(m0, y0, -1)[:shown])
np.testing.assert_array_equal(y0[delay:], x0[:-delay])
assert not m0[:delay].any() and m0[delay:].all()

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(max(8.0, shown / 3), 1.9))
viz.token_rows(ax, x0[:shown], y0[:shown], m0[:shown], vocab_size=vocab_size,
               title=f"Delayed copy: the target row is the input row shifted by {delay}")
ax.annotate("", xy=(delay, 0.75), xytext=(0, 0.25),
            arrowprops=dict(arrowstyle="->", color=viz.PALETTE["vermillion"], lw=2))
ax.text((delay - 1) / 2, 1, "not scored", ha="center", va="center", fontsize=9, color="0.3")
viz.show(fig, "06_task")

# %% [markdown]
# ## 2. Two models, one difference
#
# Both models are `embed -> 2 x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head`
# (`kda_lib.models.tiny_lm.TinyLM`). The KDA mixer runs short causal convolutions on $\mathbf q,
# \mathbf k, \mathbf v$ and then the delta-rule recurrence (notebook 04). The conv-only mixer
# (`kda_lib.models.tiny_lm.ConvMixer`) keeps the value path, its conv and the output gate, and drops
# the recurrence. A conv of width $w$ reaches $w - 1$ tokens back, so a stack of `num_layers`
# layers reaches `num_layers` $(w - 1)$ tokens (`conv_reach`): with $\ell$ beyond that, the
# conv-only model's prediction at $t$ cannot depend on the token at $t - \ell$. We check this
# with gradients: the gradient of the last position's logits (projected on a random direction)
# with respect to every input embedding is exactly zero beyond the reach for the conv model
# (asserted), and non-zero for KDA at $t - \ell$ (asserted) and at how many of the positions beyond
# the reach this run prints.

# %%
kda_model = TinyLM(config, rngs=nnx.Rngs(init_kda))
conv_model = TinyLM(conv_config, rngs=nnx.Rngs(init_conv))
print(f"KDA model: {parameter_count(kda_model):,} parameters; "
      f"conv-only model: {parameter_count(conv_model):,} parameters")
assert delay > config.conv_reach, (
    f"delay={delay} must exceed the convs' reach {config.conv_reach} for this experiment")


@nnx.jit
def grad_wrt_embeddings(model, tokens, direction):
    """d (direction . logits[-1]) / d embeddings, [1, T, hidden]."""
    def last_logits(emb):
        x = functools.reduce(lambda h, block: block(h), model.blocks, emb)
        return model.head(model.final_norm(x))[0, -1] @ direction

    return jax.grad(last_logits)(model.embed(tokens))


# %%
key_tokens, key_direction = jax.random.split(key_probe)
probe = jax.random.randint(key_tokens, (1, seq_len), 0, vocab_size)
direction = jax.random.normal(key_direction, (vocab_size,))
last = seq_len - 1
reach = {name: np.abs(np.asarray(grad_wrt_embeddings(m, probe, direction))).sum(axis=(0, 2))
         for name, m in (("KDA", kda_model), ("conv only", conv_model))}
assert (reach["conv only"][: last - config.conv_reach] == 0).all(), "conv model sees too far"
assert reach["conv only"][last - config.conv_reach] > 0
assert reach["KDA"][last - delay] > 0, "KDA's state carries the token delay steps back"
print(f"conv only: output at t={last} depends on positions {last - config.conv_reach}..{last}")
beyond = reach["KDA"][: last - config.conv_reach]
print(f"KDA: non-zero gradient at {np.sum(beyond > 0)} of the {beyond.size} positions beyond it")

# %% [markdown]
# ## 3. Training both
#
# `kda_lib.lab.train.train` runs AdamW (warmup, cosine decay, clipping; no weight decay on norms,
# biases, embeddings, `A_log` and `dt_bias`) with one jitted training step, each batch drawn just
# before it by a separately jitted, pure function of its key, and returns the mean masked loss
# and accuracy of every `log_every` steps.
# `evaluate` then scores held-out batches (a random stream training never draws from).

# %%
runs = {}
for name, model in (("KDA", kda_model), ("conv only", conv_model)):
    history = train(model, task, steps=steps, batch_size=batch_size, seq_len=seq_len,
                    learning_rate=learning_rate, seed=data_seed, log_every=log_every)
    scores = evaluate(model, task, batch_size=batch_size, seq_len=seq_len,
                      num_batches=eval_batches, seed=data_seed)
    runs[name] = dict(history=history, **scores)
    print(f"{name:9s}: held-out loss {scores['loss']:.3f} nats "
          f"({scores['loss'] / chance:.1%} of chance), accuracy {scores['accuracy']:.3f}; "
          f"{history['seconds'][-1]:.1f} s incl. compilation")

# %% tags=["hide-input"]
colors = {"KDA": viz.MODEL_COLORS["kda"], "conv only": viz.MODEL_COLORS["conv"]}
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
for name, run in runs.items():
    h = run["history"]
    style = "-" if name == "KDA" else "--"  # the two blues told apart by the line too
    for ax, key in ((ax_loss, "loss"), (ax_acc, "accuracy")):
        ax.plot(h["step"], h[key], style, color=colors[name], lw=2, label=f"{name} mixer")
ax_loss.axhline(chance, color="0.75", linewidth=4, zorder=0,  # grey, behind the conv-only curve
                label=f"chance, log {vocab_size}")
ax_acc.axhline(1 / vocab_size, color="0.75", linewidth=4, zorder=0, label=f"chance, 1/{vocab_size}")
ax_loss.set_ylim(0, 1.25 * chance), ax_acc.set_ylim(0, 1.02)
ax_loss.set_title(f"Training loss, delay {delay} > conv reach {config.conv_reach}")
ax_acc.set_title("Training accuracy on the scored positions")
for ax, label in ((ax_loss, "cross-entropy (nats)"), (ax_acc, "accuracy (fraction)")):
    ax.set(xlabel="optimiser step", ylabel=label)
    ax.legend(loc="center right")
viz.show(fig, "06_loss_curves")

# %% [markdown]
# The claim, checked on held-out batches: KDA ends far below chance (under a quarter of
# $\log \lvert\mathcal V\rvert$). The conv-only model's asserts are a **leakage sanity check**,
# not evidence: a correct conv-only model cannot get below chance (the targets are independent
# of everything it sees, section 2), so they fail only if a bug lets the target leak in. Below
# them, one held-out sequence with each model's guess (its argmax) under the target.

# %%
kda_loss, conv_loss = runs["KDA"]["loss"], runs["conv only"]["loss"]
assert kda_loss < 0.25 * chance, f"KDA loss {kda_loss:.3f} not well below chance {chance:.3f}"
assert runs["KDA"]["accuracy"] > 0.8
# leakage sanity check (cannot fail for a correct model): no target leaks into the conv model
assert conv_loss > 0.9 * chance, f"conv-only loss {conv_loss:.3f} below chance: a leak?"
assert runs["conv only"]["accuracy"] < 3 / vocab_size
print(f"KDA {kda_loss:.3f} nats vs conv only {conv_loss:.3f} nats; chance {chance:.3f} nats")
held_out = task(key_reset, 4 * batch_size, seq_len)  # a held-out batch, also section 4's
guess = {name: np.asarray(m(held_out.inputs[:1])[0, :shown].argmax(-1))
         for name, m in (("KDA", kda_model), ("conv only", conv_model))}
target = np.where(np.arange(shown) >= delay, held_out.targets[0, :shown], -1)
print_rows(0, target=target, **guess)
print(f"right at the {shown - delay} scored positions shown: " + ", ".join(
    f"{name} {np.sum(g[delay:] == target[delay:])}" for name, g in guess.items()))

# %% [markdown]
# ## 4. Where does the copied token travel? Clear the states and watch
#
# The trained KDA model has two ways to look back: its convolutions and its recurrent states.
# A causal test separates them. Run held-out sequences up to position $p = T/2$ with a cache,
# then **set every layer's state $S$ to zero** while keeping the convolutions' histories (the
# last $w - 1$ inputs of each conv), and run the rest. The token to copy at $t$ sits at
# $s = t - \ell$. What can still reach position $t \ge p$ from before $p$ (the figure)?
#
# 1. A token $s \ge p - w + 1$ crosses in layer 0's kept history (its embedding) or comes
#    after $p$.
# 2. A token $s < p - w + 1$ has exactly one path left, the arrows: (1) layer 0 reads it before
#    $p$ into its outputs at $p - w + 1 .. p - 1$, which layer 1's kept history holds; (2) layer
#    1's conv reads them at $p .. p + w - 2$; (3) layer 1's new state carries them to every later
#    $t$. Whether the model uses this path is an experiment on this trained model, not a proof.
# 3. A second run also empties the conv histories above layer 0, cutting step (2): then a token
#    $s < p - w + 1$ has no path to any later position, for any weights.
#
# The same run without the clearing is the control. A batch four times the training batch
# shrinks each per-position accuracy's binomial standard error (printed below); it is not zero.

# %% tags=["hide-input"]
viz.show(viz.clearing_paths(seq_len // 2, conv_size, delay, seq_len), "06_clearing_paths")

# %%
run_cached = nnx.jit(lambda model, tokens, cache: model(tokens, cache=cache))


def guesses_after(p, clear, clear_upper_convs=False):
    """The held-out batch's guesses (argmax) at t >= p, states cleared at p when ``clear``, every
    upper layer's conv history too when ``clear_upper_convs``; checks the prefix's cache."""
    _, caches = run_cached(kda_model, held_out.inputs[:, :p], kda_model.init_cache(4 * batch_size))
    for c in caches:
        assert c.state.shape == (4 * batch_size, num_heads, head_dim, head_dim)
        assert np.isfinite(np.asarray(c.state)).all()
    if clear:
        caches = tuple(c._replace(state=jnp.zeros_like(c.state)) for c in caches)
    if clear_upper_convs:
        caches = caches[:1] + tuple(
            c._replace(**{f: jnp.zeros_like(getattr(c, f)) for f in ("q_conv", "k_conv", "v_conv")})
            for c in caches[1:])
    return np.asarray(run_cached(kda_model, held_out.inputs[:, p:], caches)[0].argmax(-1))

def accuracy_after(p, clear, clear_upper_convs=False):
    """Accuracy at every scored position t >= max(p, delay), mean over the held-out batch."""
    scored = slice(max(delay - p, 0), None)  # t < delay: no token to copy (target 0)
    right = guesses_after(p, clear, clear_upper_convs) == np.asarray(held_out.targets[:, p:])
    return right[:, scored].mean(axis=0)


# %%
p = seq_len // 2
accuracy = {"states kept": accuracy_after(p, False),
            "states cleared at p": accuracy_after(p, True),
            "states and upper conv histories cleared": accuracy_after(p, True, True)}
source = np.arange(max(p, delay), seq_len) - delay  # s = t - delay for every scored t >= p
halo = conv_size - 1  # entries of each kept conv history
no_path = source < p - halo  # only layer 1's kept history; no path once it is cleared too
via_history, after_p = (source >= p - halo) & (source < p), source >= p  # layer 0's history; new
print(f"clearing at p = {p}: tokens s < p - (w - 1) = {p - halo} (at t = "
      f"{(source[no_path] + delay).tolist()}) can cross it only through layer 1's kept history")
se = [np.sqrt(a * (1 - a) / len(held_out.inputs)) for a in (1 / vocab_size, 0.9)]
print(f"standard error of one position's accuracy: {se[0]:.3f} at chance, {se[1]:.3f} at 0.9")

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(8, 3.4))
for (name, acc), style in zip(accuracy.items(), ("o-", "s--", "^:"), strict=True):
    ax.plot(source, acc, style, label=name)
ax.axvspan(source[0] - 0.5, p - halo - 0.5, color="0.93",
           label="only through layer 1's kept history (none once it is cleared)")
ax.axvspan(p - halo - 0.5, p - 0.5, color="0.8", label="through layer 0's kept history too")
ax.axvline(p - 0.5, color="0.2", linestyle="-", linewidth=1,
           label="the clearing at p (tokens right of it arrive after)")
ax.axhline(1 / vocab_size, color="0.5", linestyle=":", linewidth=1, label="chance")
ax.set(title=f"Accuracy after clearing at p = {p} ({4 * batch_size} held-out "
       "sequences)", xlabel=r"position $s = t - \ell$ of the token to copy",
       ylabel="accuracy at t", ylim=(0, 1.05))
ax.legend(loc="center right", fontsize=7)
viz.show(fig, "06_state_clearing")

# %%
kept, cleared = accuracy["states kept"], accuracy["states cleared at p"]
strict, kept_all = accuracy["states and upper conv histories cleared"], kept.mean()
back = source[no_path][cleared[no_path] > 0.5]  # the tokens this run brings back (above 0.5)
low = lambda a: f"{a.min():.3f} at the lowest" if a.size else "- (there are none)"  # noqa: E731
display(Markdown(
    f"With the states kept the lowest position scores {kept.min():.3f} (mean "
    f"{kept_all:.2f}). With the states alone cleared, the {(~no_path).sum()} positions whose "
    f"token enters through layer 0's kept history or after $p$ score "
    f"{low(cleared[~no_path])}; the {no_path.sum()} whose token lies before "
    f"$p - (w - 1)$ = {p - halo} score " + ", ".join(
        f"{a:.2f} ($s = {s}$)" for s, a in zip(source[no_path], cleared[no_path], strict=True))
    + f" (chance {1 / vocab_size:.2f}); of these this run brings back (above 0.5) "
    f"{'$s$ = ' + ', '.join(map(str, back)) if back.size else 'none'}. With the upper layers' conv "
    f"histories cleared as well, those {no_path.sum()} score at most {strict[no_path].max():.2f},"
    f" the others {low(strict[~no_path])}."))
assert (kept > 0.8).all(), "the control copies, at every position"
assert strict[no_path].max() < 3 / vocab_size, "no path: the clearing leaks (any weights)"
for run in (cleared, strict):  # per position: a pooled mean could hide one at chance
    assert (run[via_history] > 0.5 * kept_all).all(), "layer 0's history still hands these over"
    assert (run[after_p] > 0.8 * kept_all).all(), "tokens after the clearing are still copied"

# %%
# section 3's held-out sequence from p on: the guesses with the states kept, cleared, and
# cleared with the upper conv histories (+ upper)
target = np.where(np.arange(p, seq_len) >= delay, held_out.targets[0, p:], -1)[:shown]
rows = {name: guesses_after(p, *flags)[0, :shown] for name, flags in (
    ("kept", (False,)), ("cleared", (True,)), ("+ upper", (True, True)))}
print_rows(p, target=target, **rows)
print("wrong at t:", {name: (np.flatnonzero((g != target) & (target >= 0)) + p).tolist()
                      for name, g in rows.items()})

# %% [markdown]
# What the runs show for the tokens before $p - (w - 1)$. With the states kept they are copied
# (asserted per position; an untrained model fails this); with the states and layer 1's history
# cleared they are at chance for *any* weights (point 3; the assert only guards the clearing
# code): the copied token crossed through a state. With the states alone cleared they have one
# path left, which nothing in the training forces the model to use: **which come back depends
# on the run**, printed per position, not asserted. At seeds 0 to 5 every run brought back some
# and left others at chance, which ones varying with the seed (one retraining each, in the RNG
# mode printed before section 1, not re-run by a test: the
# [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-06)).
#
# ## Summary
#
# - Delayed copy with $\ell$ beyond the convolutions' reach: the KDA model's held-out loss
#   falls to a small fraction of $\log \lvert\mathcal V\rvert$, the conv-only ablation stays at
#   chance, as its architecture guarantees (its long-range gradients are exactly zero, section 2).
# - Section 4 makes it visible. The tokens left with no path once the states and upper histories
#   are cleared are copied while the states are kept (asserted) and are at chance once they are
#   cleared (true for any weights; the assert only guards the clearing code). Which of them come
#   back through layer 1's kept history when only the states are cleared depends on the run
#   (printed per position; other seeds: the notes). The $d_k \times d_v$ states are the layer's
#   only long-range memory; notebook 07 decodes with exactly this state.
#
# Try: `delay` larger than `seq_len / 2` with many more `steps` (the notes record such a run;
# from `seq_len / 2 + w - 1` on every token to copy lies before $p - (w - 1)$, the only group
# section 4 then has), a bigger `vocab_size`, a safe gate via `KDAConfig(lower_bound=...)` as
# the model's `mixer_config`, or the `full` parameter set.
#
# ## Exercises
#
# Each exercise cell leaves `answer = None`; replace it with your answer and run the cell:
# `kda_lib.teaching.exercises.check` says whether it is right without showing the solution (it
# catches honest slips, not deliberate copies of its own code). Worked
# solutions (try first) are in [`notebooks/solutions/ch06.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch06.py).
#
# 1. **A blind model's floor, skewed tokens.** Section 1's floor $\log \lvert\mathcal V\rvert$
#    assumes uniform tokens. Draw them i.i.d. from `probs` instead (a Zipf law, some tokens
#    never drawn). Derive the lowest loss (nats) and the highest accuracy a model that cannot
#    see the source token (the conv-only model) can reach: write `blind_floor(probs) ->
#    (loss, accuracy)` with numpy (scipy's entropy functions are refused). Predict both by hand
#    first for probabilities 1/2, 1/4, 1/8, 1/8.
# 2. **A dilated conv stack.** Section 2's stack reads every position within its reach. Give
#    each layer a dilation: layer `i`'s conv reads `t, t - dilations[i], ..., t - (widths[i] -
#    1) * dilations[i]`. Write `seen_positions(last, widths, dilations)`: the positions (sorted
#    ints) an output at `last` depends on. Try widths `[2, 2]`, dilations `[1, 4]` by hand first.
# 3. **Clearing at every `period` tokens.** A server clears the states of this two-layer model
#    at every multiple of `period`, layer 0's conv history always kept. Write
#    `lost_positions(seq_len, delay, conv_size, period, clear_upper_convs)`: the scored
#    positions whose token has no path left, the upper conv histories cleared at each clearing
#    too (`True`) or kept (`False`: section 4's path through them; one clearing loses nothing,
#    more can). Check the first clearing of `True` with `accuracy_after(period, True, True)`.

# %%
from kda_lib.teaching import exercises

answer = None  # 1: a function blind_floor(probs) -> (loss in nats, accuracy)
exercises.check("06.1", answer)
answer = None  # 2: a function seen_positions(last, widths, dilations) -> a list of ints
exercises.check("06.2", answer)
answer = None  # 3: a function lost_positions(seq_len, delay, conv_size, period, clear_upper_convs)
exercises.check("06.3", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture*, 2025.
#   [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - S. Arora et al., *Zoology: measuring and improving recall in efficient language models*
#   (synthetic recall tasks, why short convolutions alone are not enough), 2023.
#   [arXiv:2312.04927](https://arxiv.org/abs/2312.04927)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta rule*,
#   ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - I. Loshchilov, F. Hutter, *Decoupled weight decay regularization* (AdamW), ICLR 2019.
#   [arXiv:1711.05101](https://arxiv.org/abs/1711.05101)
