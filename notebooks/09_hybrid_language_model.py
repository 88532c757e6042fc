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
# # 09 · Kimi Linear in miniature: a hybrid KDA + attention decoder on real text
#
# **Claim.** Kimi Linear is not KDA alone: it stacks three KDA layers for every global softmax
# attention layer, and its attention layers use no positional encoding (NoPE), because the KDA
# layers already carry position. (The paper's global layers are multi-head latent attention,
# MLA; ours are plain multi-head attention, whose cache holds every head's keys and values.)
# We build that decoder from `kda_lib.models` (one mixer per layer, each decoding from a cache
# of its own kind), train it and three baselines of the same
# parameter count (softmax attention, KDA, Gated DeltaNet) as byte-level language models on the
# Python standard library's own source files, and measure what the paper claims in miniature:
# validation bits per byte, loss against position in the context, training and decoding speed,
# and decoding memory, which stays constant for KDA and grows with the context for attention.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/09_hybrid_language_model.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults below (two layers, so its hybrid is one KDA layer to one attention
# layer, and a few hundred steps); `make notebooks PARAMS=full` runs
# `notebooks/params/full/09_hybrid_language_model.yaml` (four layers, the 3:1 hybrid), the run
# recorded in `data/results/stdlib_lm_full.json` and drawn beside the live one.

# %% tags=["parameters"]
num_layers: int = 2  # blocks per model (the hybrid's pattern is tiled over them)
hybrid_layers: list[str] = ["kda", "attention"]  # the hybrid's pattern (full run: 3 kda : 1)
hidden_size: int = 32  # model width
num_heads: int = 2  # heads of every mixer
head_dim: int = 16  # K and V per head
seq_len: int = 64  # bytes per training window
batch_size: int = 8  # windows per step
steps: int = 150  # optimiser steps per model
learning_rate: float = 0.01  # AdamW peak rate (warmup, cosine decay; full run: 0.003)
eval_every: int = 50  # steps between validation scores
val_windows: int = 32  # fixed validation windows (the same for every model and step)
implementation: str = "recurrent"  # KDA kernel (recurrent compiles fastest at small T on CPU)
sample_prompt: str = "def "  # prompt for the generated samples
sample_steps: int = 60  # bytes generated per sample
decode_contexts: list[int] = [64, 512, 2048]  # context lengths of the decode measurement
record_results: str = ""  # write this run's results to this JSON path ("" to skip)
recorded_results: str = "stdlib_lm_full.json"  # recorded full run, in data/results/
recorded_seeds: str = "stdlib_lm_seeds.json"  # the full setting rerun with other seeds
recorded_benchmark: str = "cpu-2026-12-01.json"  # training-step timings, in data/benchmarks/
seed: int = 0  # seed of the one jax.random.key below

# %% tags=["hide-input"]
# Install: where kda_lib or what it needs is missing (Colab, a fresh VM, an install
# cut short) install it, then the dependencies for this machine's accelerator, keeping
# the runtime's JAX when it is new enough (about 1 to 3 minutes; it says what it does).
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
        pip = [sys.executable, "-m", "pip", "install", "-qq", "--no-deps", KDA_LIB_SOURCE]
        subprocess.run(pip, check=True)
        importlib.invalidate_caches()
    (kda_lib_dir,) = importlib.util.find_spec("kda_lib").submodule_search_locations
    runpy.run_path(f"{kda_lib_dir}/notebook.py")["install_dependencies"](missing=missing)

# %%
# Imports; kda_lib.notebook.setup() applies the settings every notebook shares.
import dataclasses
import datetime
import math
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx
from IPython.display import Markdown, display

import kda_lib.notebook
from kda_lib import viz
from kda_lib.corpus import load_stdlib_corpus, text_task, validation_windows
from kda_lib.generate import decode_cost, generate, generate_text, score_text
from kda_lib.models import ModelConfig, TinyLM, config_param_count, match_parameter_count
from kda_lib.records import load_recorded
from kda_lib.train import save_record, train

kda_lib.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.notebook.setup()

# %%
# Derived values
key = jax.random.key(seed)
model_seed, data_seed = (int(s) for s in jax.random.randint(key, (2,), 0, 2**31 - 1))
base = ModelConfig(vocab_size=256, hidden_size=hidden_size, num_layers=num_layers,
                   num_heads=num_heads, head_dim=head_dim, implementation=implementation)
patterns = {"attention": ("attention",), "kda": ("kda",), "gdn": ("gdn",),
            "hybrid": tuple(hybrid_layers)}
LN2 = math.log(2)

# %% [markdown]
# ## 1. The hybrid decoder and three baselines of the same size
#
# Every model is `embed -> N x (RMSNorm, mixer, RMSNorm, MLP) -> RMSNorm -> head`; block $i$
# uses the mixer `ModelConfig.layer_mixers[i]`. `ModelConfig(layers=("kda", "kda", "kda",
# "attention"))` is Kimi Linear's pattern, tiled over `num_layers`; `rope=False` drops the
# rotary embedding from the attention layers (NoPE). The baselines use one mixer everywhere;
# softmax attention keeps RoPE, since nothing else would tell it where a token is.
#
# The mixers differ in size (a KDA layer has gates, a convolution and a forget-gate projection
# that attention lacks), so we give every model the parameter count of the KDA model by
# resizing its MLPs alone (`match_parameter_count`): each MLP unit costs $2d + 1$ parameters per
# layer.

# %%
kda_config = dataclasses.replace(base, layers=patterns["kda"])
target = config_param_count(kda_config)
configs = {}
for name, layers in patterns.items():  # NoPE in the hybrid, RoPE in the attention baseline
    config = dataclasses.replace(base, layers=layers, rope=name != "hybrid")
    configs[name] = match_parameter_count(config, target)
sizes = {name: config_param_count(config) for name, config in configs.items()}
for name, config in configs.items():
    print(f"{name:9s} layers {'/'.join(config.layer_mixers):32s} MLP width "
          f"{config.mlp_hidden:4d}  {sizes[name]:8,d} parameters  RoPE {config.rope}")
assert max(abs(n - target) for n in sizes.values()) <= 0.01 * target

# %% [markdown]
# ## 2. The corpus: the standard library, byte by byte
#
# `kda_lib.corpus.load_stdlib_corpus` reads every `.py` file under
# `sysconfig.get_paths()["stdlib"]` (test suites and installed packages left out) and sends each
# file to the training or validation split by a hash of its path, so no file is split and the
# split never changes. Tokens are bytes. We score a model by its **bits per byte** on fixed
# validation windows,
# $$\mathrm{bpb} = \frac{1}{N T}\sum_{n=1}^{N}\sum_{t=1}^{T} -\log_2 p_\theta\!\left(x^{(n)}_{t+1}
# \,\middle|\, x^{(n)}_{\le t}\right),$$
# which is 8 for a uniform guess and, for a model that ignores context, the entropy of the
# byte frequencies.

# %%
corpus = load_stdlib_corpus()
info = corpus.describe()
print({k: info[k] for k in ("python_version", "train_files", "validation_files",
                            "train_bytes", "validation_bytes", "fingerprint")})
counts = np.bincount(corpus.train, minlength=256) + 1  # add-one: no byte has probability 0
p = counts / counts.sum()
unigram_bpb = float(-(np.bincount(corpus.validation, minlength=256) * np.log2(p)).sum()
                    / corpus.validation.size)
print(f"uniform guess: 8.000 bits per byte; byte frequencies alone: {unigram_bpb:.3f}")
valid = validation_windows(corpus.validation, seq_len, val_windows)
print("one validation window:", repr(bytes(np.asarray(valid.inputs[0], np.uint8))[:60]))

# %% [markdown]
# ## 3. Training the four models
#
# Each model trains with the same AdamW schedule on the same random windows
# (`kda_lib.train.train` with `kda_lib.corpus.text_task`: every position is scored, its target
# the next byte). Every `eval_every` steps a callback scores the validation windows. Training
# speed is measured over the steps after the first window (which includes compilation), with
# the validation time taken out.

# %%
def train_model(name):
    model = TinyLM(configs[name], rngs=nnx.Rngs(model_seed))
    curve, spent = {"step": [], "bpb": []}, []

    def validate(record):  # called after each window of eval_every steps
        start = time.perf_counter()
        curve["step"].append(record["step"])
        curve["bpb"].append(score_text(model, valid, batch_size=val_windows)["bits_per_token"])
        spent.append(time.perf_counter() - start)

    history = train(model, text_task(corpus.train), steps=steps, batch_size=batch_size,
                    seq_len=seq_len, learning_rate=learning_rate, seed=data_seed,
                    log_every=eval_every, progress=validate)
    # the steps after the first window; their clock includes the validations before the last
    timed = history["step"][-1] - history["step"][0]
    seconds = history["seconds"][-1] - history["seconds"][0] - sum(spent[:-1])
    return model, dict(curve=curve, seconds=history["seconds"][-1],
                       train_tokens_per_second=timed * batch_size * seq_len / seconds)


# %%
models, results = {}, {}
for name in configs:
    models[name], results[name] = train_model(name)
    scores = score_text(models[name], valid, batch_size=val_windows)
    results[name].update(bpb=scores["bits_per_token"], params=sizes[name],
                         bpb_by_position=[x / LN2 for x in scores["loss_by_position"]])
    print(f"{name:9s} validation {results[name]['bpb']:.3f} bits per byte; training "
          f"{results[name]['train_tokens_per_second']:,.0f} tokens/s; "
          f"{results[name]['seconds']:.0f} s with compilation")
assert all(r["bpb"] < unigram_bpb for r in results.values()), "every model beats unigram"

# %% [markdown]
# Validation bits per byte over training (this run; the recorded run is drawn beside it in
# section 7). Dotted: the byte-frequency baseline.

# %% tags=["hide-input"]
colors = dict(zip(configs, viz.CYCLE, strict=False))


def curves_panel(ax, source, title):
    for name, r in source.items():
        ax.plot(r["curve"]["step"], r["curve"]["bpb"], "o-", color=colors.get(name, "0.4"),
                label=name)
    ax.axhline(unigram_bpb, color="0.3", linestyle=":", label="byte frequencies")
    ax.set(xlabel="optimiser step", ylabel="validation bits per byte", title=title)
    ax.title.set_fontsize(9)


fig, ax = plt.subplots(figsize=(7, 3.6))
curves_panel(ax, results, f"this run: {num_layers} layers, width {hidden_size}, T={seq_len}")
ax.legend(fontsize=8)
viz.show(fig, "09_validation_curves")

# %% [markdown]
# ## 4. Loss against position: does a model keep using context further back?
#
# Position $t$ of a window has seen $t + 1$ bytes. A model that uses more context than its
# neighbours gets better the further into the window it is; one that forgets stays flat. Below,
# the validation bits per byte at each position (mean over windows, smoothed over 8 positions),
# this run (the recorded run in section 7). With the few validation windows and short training
# of the CI defaults, which bytes happen to sit at which position dominates this curve; the
# recorded run (more windows and steps; its setting is printed in section 7) shows the gain
# from context.

# %% tags=["hide-input"]
def smooth(y, width=8):
    y = np.asarray(y)
    return np.convolve(y, np.ones(width) / width, mode="valid") if y.size > width else y


def position_panel(ax, source, title):
    for name, r in source.items():
        y = smooth(r["bpb_by_position"])
        ax.plot(np.arange(y.size) + 1, y, color=colors.get(name, "0.4"), label=name)
    ax.set(xscale="log", xlabel="position in the window (bytes seen, log scale)",
           ylabel="bits per byte", title=title)
    ax.title.set_fontsize(9)


fig, ax = plt.subplots(figsize=(7, 3.6))
position_panel(ax, results, "this run: validation bits per byte by position")
ax.legend(fontsize=8)
viz.show(fig, "09_loss_vs_position")

# %%
def context_gain(r):
    y = np.asarray(r["bpb_by_position"])
    return y[: y.size // 4].mean(), y[-(y.size // 4):].mean()


for name, r in results.items():
    first, last = context_gain(r)
    print(f"{name:9s} first quarter {first:.3f}, last quarter {last:.3f} bits per byte "
          f"(gain {first - last:+.3f})")

# %% [markdown]
# ## 5. Samples
#
# Each model continues the prompt for `sample_steps` bytes at temperature 0.8
# (`kda_lib.generate.generate_text`: prefill, then one byte at a time from the caches). First a
# check that decoding from the caches is the model itself: greedy generation from the hybrid
# equals, byte for byte, taking the argmax of the full forward pass over the text so far.

# %%
prompt_ids = np.frombuffer(sample_prompt.encode(), np.uint8).astype(np.int32)
greedy = generate(models["hybrid"], prompt_ids, sample_steps, temperature=0.0)
forward = nnx.jit(lambda model, tokens: model(tokens))  # one compiled program, not op by op
full = np.asarray(forward(models["hybrid"], jnp.asarray(greedy[None, :-1])).argmax(-1))[0]
assert (full[prompt_ids.size - 1:] == greedy[prompt_ids.size:]).all()
print(f"hybrid, greedy: decoding from the caches == full forward for {sample_steps} bytes")
for name, model in models.items():
    results[name]["sample"] = generate_text(model, sample_prompt, sample_steps, temperature=0.8,
                                            seed=seed)
    print(f"--- {name}\n{results[name]['sample']}")

# %% [markdown]
# ## 6. Decoding memory and speed against context length
#
# To decode token $t + 1$ a KDA layer needs its state $S_t \in \mathbb R^{H \times K \times V}$
# and the last $W - 1$ inputs of its convolutions, whatever $t$ is; an attention layer needs
# the keys and values of all $t$ tokens, $2 H K$ numbers per token. `kda_lib.generate.decode_cost`
# fills each model's caches as if `context` tokens had been seen and times single decode steps
# (the cost of a step depends on the caches' shapes and fill, not their values). In the memory
# panel the KDA and GDN lines coincide.

# %%
costs = {name: decode_cost(model, decode_contexts, steps=8, repeats=3)
         for name, model in models.items()}
for name, rows in costs.items():
    results[name]["decode"] = rows
    print(f"{name:9s} " + "  ".join(f"T={r['context']}: {r['cache_bytes'] / 1024:7.1f} KiB "
                                    f"{r['tokens_per_second']:6.0f} tok/s" for r in rows))
kda_bytes = [r["cache_bytes"] for r in costs["kda"]]
attention_bytes = [r["cache_bytes"] for r in costs["attention"]]
assert len(set(kda_bytes)) == 1, "KDA's cache does not grow"
growth = np.diff(attention_bytes) / np.diff(decode_contexts)
assert np.allclose(growth, num_layers * 2 * num_heads * head_dim * 4), growth

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for name, rows in costs.items():
    x = [r["context"] for r in rows]
    axes[0].plot(x, [r["cache_bytes"] / 1024 for r in rows], "o-", color=colors[name], label=name)
    axes[1].plot(x, [1e3 * r["seconds_per_token"] for r in rows], "o-", color=colors[name],
                 label=name)
axes[0].set(xscale="log", yscale="log", xlabel="context (tokens seen, log scale)",
            ylabel="decode cache (KiB, log scale)", title="memory per sequence")
axes[1].set(xscale="log", xlabel="context (tokens seen, log scale)",
            ylabel="ms per decoded token", title="time per decode step (this machine)")
axes[0].legend(fontsize=8)
viz.show(fig, "09_decode_cost")

# %%
if record_results:  # everything above, as JSON (the recorded file of a full run)
    record = dict(config=dict(num_layers=num_layers, hybrid_layers=hybrid_layers,
                              hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim,
                              seq_len=seq_len, batch_size=batch_size, steps=steps,
                              learning_rate=learning_rate, val_windows=val_windows, seed=seed),
                  corpus=info, unigram_bpb=unigram_bpb, platform=jax.devices()[0].platform,
                  date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  models={name: dict(r, config=dataclasses.asdict(configs[name]))
                          for name, r in results.items()})
    print("wrote", save_record(record, record_results))

# %% [markdown]
# ## 7. The recorded full run, beside this one
#
# The recorded run (`recorded_results`, command and time in `data/results/README.md`) has four
# layers, so its hybrid is Kimi Linear's 3:1 pattern, with one difference from the paper: its
# global layers are plain multi-head attention (NoPE), where Kimi Linear's are multi-head
# latent attention (MLA), whose cache holds one compressed latent per token instead of every
# head's keys and values (notebook 07, section 5, compares the two caches). Left of each pair
# below: this run; right: the recorded one. Every model gained about a quarter of a bit per
# byte from the first to the last quarter of its window (asserted below).

# %%
recorded = load_recorded("results", recorded_results)
rc = recorded["config"]
rec_setting = (f"recorded: {rc['num_layers']} layers ({'/'.join(rc['hybrid_layers'])} hybrid), "
               f"width {rc['hidden_size']}, T={rc['seq_len']}, {rc['steps']} steps")
print(rec_setting, "| corpus", recorded["corpus"]["fingerprint"], "| python",
      recorded["corpus"]["python_version"])
print(f"{'model':9s} {'params':>8s} {'bpb':>6s} {'train tok/s':>11s} {'decode tok/s at T':>18s}")
for name, r in recorded["models"].items():
    last = r["decode"][-1]
    print(f"{name:9s} {r['params']:8,d} {r['bpb']:6.3f} {r['train_tokens_per_second']:11,.0f} "
          f"{last['tokens_per_second']:10,.0f} ({last['context']})")

# %% tags=["hide-input"]
fig, axes = plt.subplots(2, 2, figsize=(11, 7))
curves_panel(axes[0, 0], results, "this run: validation bits per byte")
curves_panel(axes[0, 1], recorded["models"], rec_setting)
position_panel(axes[1, 0], results, "this run: bits per byte by position")
position_panel(axes[1, 1], recorded["models"], "recorded: bits per byte by position")
axes[0, 1].legend(fontsize=8)
viz.show(fig, "09_live_and_recorded")

# %%
for name, r in recorded["models"].items():
    first, last = context_gain(r)
    print(f"--- {name} (recorded; context gain {first - last:+.3f} bits per byte)\n{r['sample']}")
    assert 0.2 < first - last < 0.3, (name, first - last)  # "about a quarter of a bit"

# %% [markdown]
# **Which model is best? One rule for every ordering.** We call one model better than another
# only when the gap between their mean bits per byte exceeds both 0.01 and two standard errors
# over seeds, the rule of notebook 08 (section 8). One seed has no standard error, so the full
# setting was rerun with two more seeds per model (`recorded_seeds`, made by
# `scripts/stdlib_lm_seeds.py`, which reproduces the recorded run at seed 0: checked below).
# Every pair of models is then either ordered or level by the same rule.

# %%
seed_runs = load_recorded("results", recorded_seeds)["runs"]
bpb_seeds = {name: {0: r["bpb"]} for name, r in recorded["models"].items()}
for row in seed_runs:
    if row["seed"] == 0:  # the script's rerun of the recorded seed
        assert abs(row["bpb"] - bpb_seeds[row["model"]][0]) < 1e-5, row
    else:
        bpb_seeds[row["model"]][row["seed"]] = row["bpb"]
bpb_by_model = {name: np.array(list(b.values())) for name, b in bpb_seeds.items()}


# %%
def ordering(a, b):
    """'<' (a lower bpb), '>' or 'level': the gap must exceed 0.01 and two standard errors."""
    gap = a.mean() - b.mean()
    se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return "level" if abs(gap) <= max(0.01, 2 * se) else "<" if gap < 0 else ">"


for name, values in bpb_by_model.items():
    print(f"{name:9s} bits per byte over {len(values)} seeds: {values.mean():.4f} +- "
          f"{values.std(ddof=1):.4f} [{values.min():.4f}, {values.max():.4f}]")
names = list(bpb_by_model)
orders = {(a, b): ordering(bpb_by_model[a], bpb_by_model[b])
          for i, a in enumerate(names) for b in names[i + 1:]}
for (a, b), o in orders.items():
    print(f"{a} vs {b}: " + {"<": f"{a} lower", ">": f"{b} lower", "level": "level"}[o])

# %%
kg = bpb_by_model["kda"], bpb_by_model["gdn"]
kg_gap = kg[0].mean() - kg[1].mean()
kg_bar = max(0.01, 2 * np.sqrt(kg[0].var(ddof=1) / kg[0].size + kg[1].var(ddof=1) / kg[1].size))
seed0 = {name: b[0] for name, b in bpb_seeds.items()}
display(Markdown(
    f"By this rule attention is behind each of the three other models; GDN is ahead of KDA, by "
    f"{kg_gap:.3f} bits per byte against a threshold of {kg_bar:.3f}, a margin one more seed "
    f"could erase; the hybrid is level with both KDA and GDN. The recorded run alone (seed 0) had "
    f"the hybrid lowest, {seed0['gdn'] - seed0['hybrid']:.3f} below GDN: that order does not "
    f"survive the seeds, whose spread is largest for GDN "
    f"({np.ptp(bpb_by_model['gdn']):.3f} bits per byte between its best and worst seed)."))
assert all(orders[("attention", other)] == ">" for other in ("kda", "gdn", "hybrid"))
assert orders[("kda", "gdn")] == ">" and 0 < kg_gap - kg_bar < 0.01  # ordered, barely
assert orders[("kda", "hybrid")] == "level" and orders[("gdn", "hybrid")] == "level"
assert min(seed0, key=seed0.get) == "hybrid" and np.ptp(bpb_by_model["gdn"]) > 0.05

# %% [markdown]
# **Training speed.** The introduction promises the paper's speed claims in miniature; here is
# what this CPU recorded. Attention trained fastest at this size, about twice as fast as KDA
# per token, in the recorded run and in the seed reruns made under another load (printed
# below). On a CPU at $T = 128$, an attention layer is a few
# $[T \times T]$ matrix products per head, which run near the CPU's matrix-product rate. A KDA
# layer runs the chunked form (notebook 03): per chunk a triangular solve and a dozen small
# matrix products, a sequential pass over the chunks, plus its short convolutions, gate
# projections and output norm: many small operations, each far from that rate. Attention's work
# per token grows with $T$ and KDA's does not, so the order turns at longer sequences: in the
# recorded benchmark (`recorded_benchmark`: four-layer byte-level models, batch 1) the
# attention model's training step is about level with KDA's at $T = 1024$ and several times
# slower at $T = 4096$ (printed below). The paper's speed claims are about long contexts on
# GPUs (it reports up to 6 times the decoding throughput of full attention at a context of 1M
# tokens); they cannot be checked on this machine.

# %%
train_rate = {name: r["train_tokens_per_second"] for name, r in recorded["models"].items()}
assert rc["seq_len"] == 128  # the length the text names
print(f"recorded training tokens/s (T = {rc['seq_len']}): "
      + ", ".join(f"{n} {v / 1e3:.1f}k" for n, v in train_rate.items()))
rerun_rate = {}
for row in seed_runs:
    rerun_rate.setdefault(row["model"], []).append(row["train_tokens_per_second"])
print("seed reruns, training tokens/s: " + ", ".join(
    f"{n} {min(v) / 1e3:.1f}k-{max(v) / 1e3:.1f}k" for n, v in sorted(rerun_rate.items())))
assert max(train_rate, key=train_rate.get) == "attention"
assert 1.5 < train_rate["attention"] / train_rate["kda"] < 3
assert 1.5 < min(rerun_rate["attention"]) / max(rerun_rate["kda"])
bench = load_recorded("benchmarks", recorded_benchmark)
bench_rate = {(r["impl"][len("train_"):], r["T"]): r["tokens_per_s"] for r in bench["records"]
              if r["impl"].startswith("train_")}
for t in sorted({t for _, t in bench_rate}):
    rates = ", ".join(f"{m} {bench_rate[(m, t)]:,.0f}" for m in ("attention", "kda", "gdn",
                                                                   "hybrid"))
    print(f"benchmark T = {t:5d}: {rates} tokens/s")
assert 0.9 < bench_rate[("kda", 1024)] / bench_rate[("attention", 1024)] < 1.1  # "about level"
assert bench_rate[("kda", 4096)] > 3 * bench_rate[("attention", 4096)]  # "several times"

# %% [markdown]
# **Decoding speed.** From the shortest recorded context to the longest, the attention model's
# decoding slows down more than tenfold (it reads a cache that grows with the context) and the
# hybrid's several times (its one attention layer). KDA's and GDN's step reads a fixed state:
# neither is slower at the longest context than at the shortest. Their speeds still move between
# contexts, by the spread printed below: at about one millisecond per step, timed as the best of
# three runs of eight steps on a shared machine, that is timing noise, so the recording supports
# "not slower at long context", not "equally fast at every context".

# %%
slowdown, swing = {}, {}  # tokens/s at the shortest recorded context over that at the longest
for name, r in recorded["models"].items():
    rates = [row["tokens_per_second"] for row in r["decode"]]
    slowdown[name] = rates[0] / rates[-1]
    swing[name] = max(rates) / min(rates)
    print(f"{name:9s} decode {min(rates):6,.0f}-{max(rates):6,.0f} tokens/s over contexts "
          f"{r['decode'][0]['context']}-{r['decode'][-1]['context']} (max/min {swing[name]:.2f}); "
          f"shortest / longest context {slowdown[name]:.2f}")
assert slowdown["attention"] > 10 and max(slowdown["kda"], slowdown["gdn"]) <= 1
assert 1.5 < slowdown["hybrid"] < slowdown["attention"]

# %% [markdown]
# ## Summary
#
# - `ModelConfig(layers=...)` builds a decoder whose layers mix KDA and attention; each layer
#   decodes from its own cache, and greedy decoding from the caches reproduces the full forward
#   pass byte for byte (asserted above, and for the 3:1 pattern in `tests/test_models.py`).
#   Its attention layers are multi-head attention, not the paper's MLA.
# - On the standard library's bytes, all four models of equal size beat the byte-frequency
#   baseline (asserted). In the recorded full setting, with three seeds and one rule for every
#   ordering (section 7), the orderings printed there are the only ones claimed.
# - On this CPU at $T = 128$, attention trained fastest (chunked KDA is many small operations);
#   the recorded benchmark shows the order turning at longer sequences. The paper's speed
#   claims are about long contexts on GPUs and are not checked here.
# - The decode cache of the KDA model is the same at every context; the attention model's grows
#   by $2 H K$ floats per token and layer (asserted), the hybrid's by that times the share of
#   attention layers. Attention's and the hybrid's decoding slow with the context; KDA's and
#   GDN's do not, within a timing spread shown in section 7.

# %% [markdown]
# ## Exercises
#
# Each exercise cell leaves `answer = None`; replace it with your answer and run the cell:
# `kda_lib.exercises.check` says whether it is right without showing the solution. Worked
# solutions are in `notebooks/solutions/ch09.py` (try first).
#
# 1. **Count the cache.** Write `hybrid_cache_bytes(context)` giving the hybrid's decode cache
#    in bytes after `decode_cost` has filled it for `context` tokens: KDA layers hold an
#    $H K V$ float32 state plus three conv tails of $W - 1$ rows, attention layers $2 L H K$
#    float32 numbers for a capacity of $L$ tokens (look up how much room `decode_cost` leaves),
#    plus an int32 length. The checker compares with the measured `costs["hybrid"]`.
# 2. **Where is the hybrid's memory?** At the longest context measured, what fraction of the
#    hybrid's cache is its attention layers? (a float)
# 3. **Context use.** From `results`, which model gains the most bits per byte between the
#    first and the last quarter of the window? (a model name)

# %%
import kda_lib.exercises

answer = None  # 1: a function hybrid_cache_bytes(context) -> int
kda_lib.exercises.check("09.1", answer, measured={r["context"]: r["cache_bytes"]
                                                  for r in costs["hybrid"]})
W, H, K = base.conv_size, num_heads, head_dim
n_kda = sum(m != "attention" for m in configs["hybrid"].layer_mixers)
answer = None  # 2: the attention layers' share of the hybrid's cache at the longest context
kda_lib.exercises.check("09.2", answer, cache_bytes=costs["hybrid"][-1]["cache_bytes"],
                        kda_layers=n_kda, heads=H, key_dim=K, value_dim=K, conv_size=W)
answer = None  # 3: the name of the model with the largest context gain
kda_lib.exercises.check("09.3", answer, bpb_by_position={n: r["bpb_by_position"]
                                                         for n, r in results.items()})

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture*, 2025 (KDA, the
#   3:1 hybrid with NoPE attention, decoding memory and speed).
#   [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta
#   rule*, ICLR 2025 (GDN and its hybrids). [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - A. Kazemnejad et al., *The impact of positional encoding on length generalization in
#   transformers*, NeurIPS 2023 (causal attention without positional encoding).
#   [arXiv:2305.19466](https://arxiv.org/abs/2305.19466)
# - J. Su et al., *RoFormer: enhanced transformer with rotary position embedding*, 2021.
#   [arXiv:2104.09864](https://arxiv.org/abs/2104.09864)
# - The byte-level view of language modelling and bits per byte: e.g. L. Gao et al., *The Pile*,
#   2020. [arXiv:2101.00027](https://arxiv.org/abs/2101.00027)
