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
# # 10 · Kimi Linear at scale: the published models' arithmetic, from their configs
#
# **Claim.** From the widths of the published models that use KDA (`kda_lib.models.presets`:
# Kimi-Linear-48B-A3B, Kimi K3, GLM-5.3-Flash) we can write down, in the manner of the JAX
# scaling book, what each layer costs: parameters, flops per token, bytes per decoded token and
# cache memory, for a KDA layer, an MLA layer (the paper's global layer) and softmax attention.
# Each formula is checked against the real program at a small size (the traced matrix products
# exactly, XLA's cost analysis within 5%). From the formulas and a stated bandwidth
# model of named chips we then check the paper's headline numbers: the KV cache reduction
# follows from the layer pattern; the decoding speed-up at 1M tokens is bounded by the same
# pattern, below what the paper reports, and we say which assumption that leaves.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/10_kimi_linear_at_scale.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md);
# for MLA, $d_c$ is the cached latent (`kv_lora_rank`) and $d_R$ the key part shared by all heads
# (`shared_key_dim`, unrotated in Kimi Linear). CI runs the defaults of the `parameters` cell;
# `make notebooks PARAMS=full` runs `notebooks/params/full/10_kimi_linear_at_scale.yaml`.

# %% tags=["parameters"]
contexts: list = [4096, 131072, 1048576]  # context lengths of the memory tables (tokens)
gqa_kv_heads: int = 8  # key/value heads of the grouped-query attention compared
check_hidden: int = 512  # width d of the scaled-down layers checked against XLA
check_heads: int = 4  # heads H of the scaled-down layers
check_head_dim: int = 128  # d_k and d_v (and the gate rank) of the scaled-down layers
check_latent: int = 128  # MLA latent d_c of the scaled-down MLA layer
check_shared_key: int = 64  # MLA shared key d_R of the scaled-down MLA layer
check_seq_len: int = 64  # prefill length of the check: one chunk, so XLA counts it exactly
check_context: int = 256  # cache slots of the decode steps checked
check_compile: bool = False  # XLA's count of the compiled programs (slower) or the lowered ones
decode_batches: list = [1, 16, 256]  # sequences decoded together in the decode-time model
reported_active_params: float = 3e9  # Kimi-Linear-48B-A3B: the paper reports 3B activated ...
reported_total_params: float = 48e9  # ... of 48B parameters
routed_experts: int = 256  # Kimi-Linear-48B-A3B's config.json: num_experts ...
experts_per_token: int = 8  # ... and num_experts_per_token (top-k routing)
tensor_parallel: int = 8  # ranks of the head-parallel tensor-parallel decode of section 5
paper_tpot_speedup: float = 6.3  # the paper reports 6.3x faster TPOT than MLA at 1M tokens
cp_seq_len: int = 1048576  # sequence length of the context-parallel section (tokens)
cp_max_ranks: int = 1024  # most ranks R drawn
matmul_size: int = 1024  # n of the n x n float32 matmul timed on this CPU
bandwidth_mib: int = 64  # MiB streamed to time this CPU's memory bandwidth
timing_repeats: int = 5  # timed calls of each CPU measurement (median)
recorded_benchmark: str = "cpu-2026-12-01.json"  # CPU timings in data/benchmarks/
seed: int = 0  # seed of the random inputs of the CPU measurements

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
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.lab import at_scale
from kda_lib.lab.measure import median_ms
from kda_lib.lab.records import load_recorded
from kda_lib.layers.params import parameter_count
from kda_lib.models import presets
from kda_lib.teaching import decode_scaling, viz

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %% [markdown]
# ## 1. The models, from their configs
#
# Each preset records a published model's KDA layer, its layer pattern (which layers are KDA,
# which global attention) and, where the source gives them, its MLA widths, each number citing
# its source (`kda_lib/models/presets.py`). All three KDA layers can be built here (the table's
# last column, asserted; all three have $H_v = H$); GLM-5.3-Flash's source gives no MLA widths.
# The formulas below read the numbers, never a built layer; Kimi Linear's layers are built as
# shapes only (`jax.eval_shape`, no memory) to check the parameter counts.

# %%
rows = []
for p in presets.PRESETS.values():
    rows.append(f"| {p.name} | {p.hidden_size} | {p.num_heads} x {p.head_dim} | "
                f"{len(p.kda_layers)} + {len(p.global_layers)} | {p.kda_parameter_count():,} | "
                + (f"{p.mla_parameter_count():,} |" if p.mla else "not given |")
                + f" {', '.join(p.unsupported_options()) or 'builds'} |")
display(Markdown("| model | d | KDA heads | KDA + global layers | KDA layer params | MLA layer "
                 "params | this repository |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows)))
assert set(presets.PRESETS) == {"Kimi-Linear-48B-A3B", "Kimi-K3", "GLM-5.3-Flash"}
assert not any(p.unsupported_options() for p in presets.PRESETS.values()), "all three build"
kimi = presets.KIMI_LINEAR_48B
built = {"KDA": presets.build_kda_layer(kimi), "MLA": presets.build_mla_layer(kimi)}
counted = {"KDA": kimi.kda_parameter_count(), "MLA": kimi.mla_parameter_count()}
for kind, layer in built.items():
    assert parameter_count(layer) == counted[kind], kind
    print(f"{kimi.name} {kind} layer built with eval_shape: "
          f"{parameter_count(layer):,} parameters = the published config's count")

# %% [markdown]
# ## 2. Parameters and flops per token, as formulas
#
# Per token and layer, counting matrix products (2 flops per multiply-add; `kda_lib.lab.at_scale`):
#
# - **KDA**: $2 P_{\text{mm}}$ for the projections ($P_{\text{mm}}$: the weights of
#   `q/k/v/f/b/g/o_proj`), $2 w (2 H d_k + H d_v)$ for the short convolutions, and the chunked
#   kernel, $H \cdot F_C / C$ with $F_C$ the flops of one chunk of $C$ tokens (notebook 03,
#   `kda_lib.lab.costs.chunk_terms`): **independent of the context**. Decoding runs the recurrent
#   step instead, $7 d_k d_v$ per head.
# - **MLA** scoring each query against $T_k$ keys: $2 P_{\text{mm}} + 2 H T_k (d_{qk} + d_R + d_v)$
#   with the latents expanded (prefill, training); decoding absorbs `kv_b_proj` into the query
#   and the output and reads the latents directly: $2 P_{\text{mm}} + 2 H T_k (2 d_c + d_R)$.
# - **Softmax attention** with $G$ key/value heads of $d_h$ (MHA: $G = H$):
#   $4 d\, d_h (H + G) + 4 H T_k d_h$.
#
# Training is three forward passes (each product's backward is two products of its size).
# A prefill of $T$ tokens that skips the masked half has $T_k \approx T/2$ on average; this
# repository's attention programs compute the whole square ($T_k = T$), the decode step has
# $T_k = T$. The table gives each preset's numbers at the context lengths `contexts`
# (MHA/GQA: the same $d$, $H$ and $d_h = d_k$ as the KDA layer; GQA with `gqa_kv_heads`).

# %%
def flops_row(preset, t):
    """Per token: KDA, MLA, GQA and MHA forward flops (prefill, T_k = T/2) and KDA training."""
    row = {"KDA": at_scale.kda_flops_per_token(preset),
           "MLA": at_scale.mla_flops_per_token(preset, t / 2) if preset.mla else float("nan")}
    for kind, g in (("GQA", gqa_kv_heads), ("MHA", None)):
        shape = at_scale.full_attention_shape(preset, g)
        row[kind] = at_scale.attention_flops_per_token(**shape, keys=t / 2)
    return row


lines = []
for p in presets.PRESETS.values():
    for t in contexts:
        r = flops_row(p, t)
        lines.append(f"| {p.name} | {t:,} | " + " | ".join(f"{r[k] / 1e6:,.0f}" for k in r)
                     + f" | {3 * r['KDA'] / 1e6:,.0f} |")
display(Markdown("Forward MFLOP per token and layer (prefill; training is 3x)\n\n| model | T | "
                 "KDA | MLA | GQA | MHA | KDA training |\n|---|---|---|---|---|---|---|\n"
                 + "\n".join(lines)))
kda_flat = {p.name: at_scale.kda_flops_per_token(p) for p in presets.PRESETS.values()}
mla_1m = at_scale.mla_flops_per_token(kimi, contexts[-1] / 2)
print(f"{kimi.name}: at T = {contexts[-1]:,} an MLA layer costs "
      f"{mla_1m / kda_flat[kimi.name]:.1f}x the flops per token of a KDA layer")

# %% [markdown]
# ## 3. Each formula against the real program
#
# We scale Kimi Linear's layers down (`kda_lib.lab.at_scale.scaled_down`: width `check_hidden`,
# `check_heads` heads of `check_head_dim`, the same gates and structure) and build the real
# programs: the KDA layer's chunked prefill of one chunk (XLA counts a loop's body once, so one
# chunk makes its count exact), its recurrent decode step, the MLA layer's prefill and absorbed
# decode step, and `kda_lib.models.tiny_lm.CausalSelfAttention` (MHA). For each, the matrix products
# traced in the program (`kda_lib.lab.costs.matmul_flops`) must equal the formula's, and XLA's cost
# analysis (all ops, elementwise included) must exceed the formula by at most 5%. For
# decode steps the bytes formula (every weight and the cache or state, float32 here) is the
# least a step can move; XLA's byte count, which adds the copies a CPU program makes, must not
# be below it. `tests/lab/test_at_scale.py` repeats this on the compiled programs and checks
# training (3x forward within 5%) on the compiled gradients.

# %%
small = at_scale.scaled_down(kimi, hidden=check_hidden, heads=check_heads, head_dim=check_head_dim,
                          rank=check_head_dim, kv_lora_rank=check_latent,
                          shared_key_dim=check_shared_key)
checks = at_scale.program_costs(small, check_seq_len, check_context, compile=check_compile)
xla_band = 1.05  # XLA's count may add up to 5% of elementwise work at these sizes
print(f"{'program':16s} {'traced / formula':>17s} {'XLA / formula':>14s} "
      f"{'bytes XLA / formula':>20s}")
for name, row in checks.items():
    exact = row["traced_matmul"] / row["formula_matmul"]
    ratio = row["xla_flops"] / row["formula_flops"]
    hbm = "" if row["formula_bytes"] is None else f"{row['xla_bytes'] / row['formula_bytes']:.2f}"
    print(f"{name:16s} {exact:17.6f} {ratio:14.3f} {hbm:>20s}")
    assert row["traced_matmul"] == row["formula_matmul"], name
    assert 1.0 <= ratio <= xla_band, (name, ratio)
    assert row["formula_bytes"] is None or row["xla_bytes"] >= row["formula_bytes"], name

# %% [markdown]
# ## 4. Memory: the KDA state against the KV caches
#
# Per sequence and layer, a KDA layer keeps $H d_k d_v$ float32 state numbers and the last
# $w - 1$ inputs of its convolutions, whatever the context; an MLA layer caches $d_c + d_R$
# numbers per token, GQA $2 G d_h$ and MHA $2 H d_h$ (bf16). The table is per layer; the
# figure adds up a whole Kimi Linear model (its KDA layers and its global layers) against the
# same depth of global layers only.

# %%
def cache_row(preset, t):
    """Bytes per sequence and layer: KDA cache, then MLA / GQA / MHA caches at T tokens."""
    mla = t * at_scale.mla_cache_numbers(preset) * at_scale.BF16 if preset.mla else float("nan")
    gqa = t * at_scale.attention_cache_numbers(gqa_kv_heads, preset.head_dim) * at_scale.BF16
    mha = t * at_scale.attention_cache_numbers(preset.num_heads, preset.head_dim) * at_scale.BF16
    return [at_scale.kda_state_bytes(preset), mla, gqa, mha]


lines = [f"| {p.name} | {t:,} | " + " | ".join(f"{b / 2**20:,.1f}" for b in cache_row(p, t)) + " |"
         for p in presets.PRESETS.values() for t in contexts]
display(Markdown("MiB per sequence and layer (KDA: float32 state + bf16 conv history; caches "
                 "bf16)\n\n| model | T | KDA | MLA | GQA | MHA |\n|---|---|---|---|---|---|\n"
                 + "\n".join(lines)))
kimi_rows = {t: cache_row(kimi, t) for t in contexts}
assert len({r[0] for r in kimi_rows.values()}) == 1, "the KDA cache does not grow"
first_mla = int(np.ceil(kimi_rows[contexts[0]][0] / (at_scale.mla_cache_numbers(kimi) * 2)))
print(f"{kimi.name}: one MLA layer's latents pass one KDA layer's cache at T = {first_mla:,}; "
      f"at T = {contexts[-1]:,} they are "
      f"{kimi_rows[contexts[-1]][1] / kimi_rows[contexts[-1]][0]:.0f}x it")

# %% tags=["hide-input"]
t_axis = np.geomspace(256, 4 * contexts[-1], 80)
per_token = {"MLA": at_scale.mla_cache_numbers(kimi), f"GQA, G = {gqa_kv_heads}":
             at_scale.attention_cache_numbers(gqa_kv_heads, kimi.head_dim),
             "MHA": at_scale.attention_cache_numbers(kimi.num_heads, kimi.head_dim)}
fig, ax = plt.subplots(figsize=(8, 3.8))
hybrid = [at_scale.model_cache_bytes(kimi, t) / 2**30 for t in t_axis]
ax.plot(t_axis, hybrid, color=viz.PALETTE["blue"], linewidth=2.5,
        label=f"Kimi Linear: {len(kimi.kda_layers)} KDA + {len(kimi.global_layers)} MLA layers")
for (name, n), color in zip(per_token.items(), viz.CYCLE[1:], strict=False):
    ax.plot(t_axis, kimi.num_layers * t_axis * n * at_scale.BF16 / 2**30, color=color,
            label=f"{kimi.num_layers} {name} layers")
for t in contexts:
    ax.axvline(t, color="0.7", linestyle=":", linewidth=1)
ax.set(xscale="log", yscale="log", xlabel="context T (tokens, log scale)",
       ylabel="GiB per sequence (log scale)",
       title=f"Decode memory of the mixer layers, one sequence, {kimi.name}")
ax.legend(loc="upper left", fontsize=8)
viz.show(fig, "10_memory")

# %% [markdown]
# ## 5. The paper's headline numbers
#
# The paper reports that Kimi Linear reduces the KV cache by up to 75% and reaches up to 6x the
# decoding throughput of full attention (MLA) at a context of 1M tokens (6.3x faster time per
# output token, TPOT, in its Figure 1b). **The cache.** Only the global layers keep a cache that
# grows, so the hybrid's memory tends to $L_{\text{global}} / L$ of an all-MLA model of the same
# depth: 7 of 27 layers here, a reduction of $1 - 7/27$, "up to 75%" being the 3:1 ratio's limit.

# %%
paper_cache_reduction = 0.75  # the paper's "up to 75%"
reduction = {t: 1 - at_scale.model_cache_bytes(kimi, t)
             / at_scale.model_cache_bytes(kimi, t, hybrid=False) for t in contexts}
limit = 1 - len(kimi.global_layers) / kimi.num_layers
print("cache reduction vs all-MLA: " + ", ".join(f"{r:.1%} at T = {t:,}" for t, r in
                                                   reduction.items()) + f"; limit {limit:.1%}")
assert reduction[contexts[-1]] <= limit < paper_cache_reduction
assert limit - reduction[contexts[-1]] < 0.01, "at 1M tokens the limit is reached"
for p in (presets.KIMI_K3, presets.GLM_5_3_FLASH):
    print(f"{p.name}: {len(p.global_layers)} global of {p.num_layers} layers, reduction limit "
          f"{1 - len(p.global_layers) / p.num_layers:.1%}")

# %% [markdown]
# **The decoding speed.** A decode step of one model reads, per layer, its weights once for the
# whole batch and each sequence's cache or state; the time of each layer is the slower of its
# flops at the chip's peak and its bytes at the chip's HBM bandwidth (a roofline with perfect
# overlap, `kda_lib.lab.at_scale.step_time`; the published numbers of each chip are in
# `kda_lib.lab.at_scale.CHIPS`, with their vendor pages; "H200" is the H200 SXM throughout).
# The rest of the model (its MoE and embeddings) is the same in both models: we charge it as
# bf16 weights read once per step: the weights every token uses and the routed experts the
# batch touches. If each token picks $k$ = `experts_per_token` of $E$ = `routed_experts`
# experts uniformly (a model of the router), $B$ tokens touch $E\,(1 - (1 - k/E)^B)$ of them on
# average, about 102 of 256 at $B = 16$, not all (`kda_lib.teaching.decode_scaling` splits the
# reported 48B total, 3B active into routed experts and the rest). The ratio of the two times
# at 1M tokens for the batches `decode_batches`, and the caches' memory that batch needs:

# %%
t_long = contexts[-1]
mixer_params = (len(kimi.kda_layers) * kimi.kda_parameter_count()
                + len(kimi.global_layers) * kimi.mla_parameter_count())

other_bytes = {b: decode_scaling.moe_weight_bytes(  # MoE/MLP/embedding weights a step reads, bf16
    b, reported_total_params, reported_active_params, routed_experts, experts_per_token,
    mixer_params) for b in {1, *decode_batches}}

# %%
speedup, h200 = {}, at_scale.CHIPS["H200"]  # "H200": the H200 SXM
node_hbm = tensor_parallel * h200.hbm_bytes  # one node of tensor_parallel chips
for b in decode_batches:
    for chip in at_scale.CHIPS.values():
        times = [at_scale.model_decode_time(kimi, chip, t_long, b, hybrid=h,
                                         other_weight_bytes=other_bytes[b]) for h in (False, True)]
        speedup[(chip.name, b)] = times[0] / times[1]
    caches = [b * at_scale.model_cache_bytes(kimi, t_long, hybrid=h) for h in (False, True)]
    experts = decode_scaling.expected_distinct_experts(b, routed_experts, experts_per_token)
    print(f"batch {b:3d}: ratio {speedup[(h200.name, b)]:.2f} on all four chips (memory-bound); "
          f"{experts:.0f} of {routed_experts} experts read; caches {caches[0] / 1e12:.2f} TB "
          f"all-MLA, {caches[1] / 1e12:.2f} TB hybrid" + ("" if caches[0] < node_hbm else
          f" > {tensor_parallel} H200 SXM's {node_hbm / 1e12:.2f} TB: infeasible, a model only"))
    assert np.ptp([speedup[(c, b)] for c in at_scale.CHIPS]) < 1e-9, "memory-bound: one ratio"
assert abs(decode_scaling.expected_distinct_experts(16, 256, 8) - 102) < 0.5
bound = at_scale.decode_speedup_bound(kimi)
assert max(speedup.values()) < bound < paper_tpot_speedup

# %% tags=["hide-input"]
t_axis = np.geomspace(4096, 4 * t_long, 40)
chip = h200
fig, ax = plt.subplots(figsize=(8, 3.6))
for b, color in zip(decode_batches, viz.CYCLE, strict=False):
    ratio = [at_scale.model_decode_time(kimi, chip, t, b, hybrid=False,
                                     other_weight_bytes=other_bytes[b])
             / at_scale.model_decode_time(kimi, chip, t, b, other_weight_bytes=other_bytes[b])
             for t in t_axis]
    ax.plot(t_axis, ratio, color=color, label=f"roofline model, batch {b}")
ax.axhline(bound, color="0.3", linestyle="--", label=f"bound L / L_global = {bound:.2f}")
ax.plot([t_long], [paper_tpot_speedup], "*", color=viz.PALETTE["vermillion"], markersize=12,
        label=f"the paper reports {paper_tpot_speedup}x TPOT (measured)")
ax.set(xscale="log", xlabel="context T (tokens, log scale)", ylim=(0, 1.15 * paper_tpot_speedup),
       ylabel="all-MLA step time / hybrid step time",
       title=f"Decoding speed-up of {kimi.name} over all-MLA, H200 SXM roofline model")
ax.legend(loc="upper left", fontsize=8)
viz.show(fig, "10_decode_speedup")

# %%
best = max(speedup, key=speedup.get)
display(Markdown(
    f"In this model the speed-up at {t_long:,} tokens is at most {speedup[best]:.2f}x "
    f"({best[0]}, batch {best[1]}), below the bound $L / L_{{\\text{{global}}}}$ = "
    f"{kimi.num_layers}/{len(kimi.global_layers)} = {bound:.2f}. The bound holds for any batch, "
    "any chip, and whether a step is bound by bandwidth or by flops: the two models differ only "
    "in their KDA layers, whose cost does not grow with $T$, so at long contexts the all-MLA "
    "model can only cost as much more as it has more MLA layers. A memory-limited batch does not "
    "escape it either: the batch that fits grows by the inverse of the cache ratio, at most "
    f"{bound:.2f}x. The reported {paper_tpot_speedup}x therefore needs the two models' global "
    "layers to run differently in the measurement (another kernel, batch or memory layout for "
    "the full-attention model), which the configs cannot check; the cache reduction, by "
    "contrast, follows from the layer pattern alone."))

# %% [markdown]
# **Several chips do not divide both models alike.** Split by heads over $R$ = `tensor_parallel`
# ranks, a rank holds $1/R$ of every weight, KDA state and expert, but every MLA head reads the
# same latent, so each rank reads the whole latent cache: the all-MLA model's largest term does
# not shrink and the ratio grows towards the bound (`decode_scaling.tp_decode_time`, batch 1):

# %%
tp_ratio = {}
for r in (1, tensor_parallel):
    times = [decode_scaling.tp_decode_time(kimi, chip, t_long, 1, r, hybrid=h,
                                           other_weight_bytes=other_bytes[1]) for h in (0, 1)]
    tp_ratio[r] = times[0] / times[1]
print(f"batch 1, T = {t_long:,}: ratio {tp_ratio[1]:.2f} on one chip, "
      f"{tp_ratio[tensor_parallel]:.2f} on {tensor_parallel} head-split ranks (bound {bound:.2f})")
assert tensor_parallel == 1 or tp_ratio[1] < tp_ratio[tensor_parallel] < bound

# %% [markdown]
# ## 6. Context parallelism at scale
#
# With the sequence split over $R$ ranks (notebook 05), each rank of a KDA layer receives the
# other ranks' slice summaries, $(R - 1) H d_k (d_k + d_v)$ float32 numbers, and a conv halo of
# $(w - 1)(2 H d_k + H d_v)$ inputs: **independent of $T$**. Ring attention instead passes every
# rank's keys and values (for MLA, its latents) around the ring: each rank receives
# $\frac{R-1}{R} T n$ cached numbers, $n$ per token as in section 4. In exchange, a KDA rank
# computes more: a summary pass (the kernel over $[\,\mathbf 0 \mid \mathbf v\,]$, $d_k + d_v$
# value columns) and a fold of $R$ maps ($2 d_k^2 d_v$ flops each per head), against its
# slice's ordinary forward. The summaries do not grow with $T$ but their all-gather grows with
# $R$, while ring attention's traffic per rank grows with $T$ and hardly with $R$: the two meet
# at $R^\ast \approx T (d_c + d_R) b_{KV} / \big(H d_k (d_k + d_v) b_S\big)$ for MLA.

# %%
ranks = np.array([2**i for i in range(1, int(np.log2(cp_max_ranks)) + 1)])
traffic = {}
for p in (kimi, presets.KIMI_K3):
    kda_b = [at_scale.cp_summary_bytes(p, int(r)) + at_scale.cp_halo_bytes(p) for r in ranks]
    mla_cache = at_scale.mla_cache_numbers(p)
    mha_cache = at_scale.attention_cache_numbers(p.num_heads, p.head_dim)
    mla_b = [at_scale.ring_attention_bytes(mla_cache, cp_seq_len, r) for r in ranks]
    mha_b = [at_scale.ring_attention_bytes(mha_cache, cp_seq_len, r) for r in ranks]
    work = [at_scale.cp_compute_per_rank(p, cp_seq_len, r) for r in ranks]
    traffic[p.name] = tr = dict(kda=np.array(kda_b), mla=np.array(mla_b), mha=np.array(mha_b),
                                summary=np.array([w["summary"] / w["layer"] for w in work]),
                                fold=np.array([w["fold"] / w["layer"] for w in work]))
    over = tr["fold"] > tr["summary"]
    fold_wins = int(ranks[np.argmax(over)]) if over.any() else None
    print(f"{p.name}, T = {cp_seq_len:,}: R = 8: summaries + halo {tr['kda'][2] / 2**20:.1f} MiB "
          f"per rank, ring over MLA latents {tr['mla'][2] / 2**20:,.0f} MiB, MHA "
          f"{tr['mha'][2] / 2**20:,.0f} MiB; summary pass +{tr['summary'][0]:.1%} of the layer's "
          f"flops at every R; the fold passes it from R = {fold_wins}")
    # the summaries grow with R, ring attention's share with T: equal near R* (halo left out)
    tr["r_star"] = r_star = at_scale.cp_ring_crossover(p, cp_seq_len)
    print(f"  summaries pass ring attention over MLA latents at R* = {r_star:.0f} ranks")
    assert (tr["mla"][ranks < r_star / 1.1] > tr["kda"][ranks < r_star / 1.1]).all()
    assert (tr["mla"][ranks > r_star * 1.1] < tr["kda"][ranks > r_star * 1.1]).all()
    assert np.allclose(tr["summary"], tr["summary"][0]), "the summary pass: a fixed fraction"

# %% tags=["hide-input"]
fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
tr = traffic[kimi.name]
ax.plot(ranks, tr["kda"] / 2**20, "o-", color=viz.PALETTE["blue"], label="KDA: summaries + halo")
ax.plot(ranks, tr["mla"] / 2**20, "s-", color=viz.PALETTE["orange"],
        label="ring attention, MLA latents")
ax.plot(ranks, tr["mha"] / 2**20, "^-", color=viz.PALETTE["vermillion"],
        label="ring attention, MHA")
ax.set(xscale="log", yscale="log", xlabel="ranks R (log scale)", ylabel="MiB received per rank",
       title=f"Per layer and sequence, T = {cp_seq_len:,}")
ax.legend(fontsize=8)
for name, color in ((kimi.name, viz.PALETTE["blue"]), (presets.KIMI_K3.name, viz.PALETTE["green"])):
    t = traffic[name]
    bx.plot(ranks, t["summary"] + t["fold"], "o-", color=color, label=f"{name}: summary + fold")
    bx.plot(ranks, t["fold"], "--", color=color, label=f"{name}: fold alone")
bx.set(xscale="log", yscale="log", xlabel="ranks R (log scale)",
       ylabel="extra flops / the slice's forward", title="What context parallelism adds per rank")
bx.legend(fontsize=8)
viz.show(fig, "10_context_parallel")

# %%
tr, k3 = traffic[kimi.name], traffic[presets.KIMI_K3.name]
display(Markdown(
    f"For {kimi.name} at $T$ = {cp_seq_len:,} and 8 ranks, ring attention over the MLA latents "
    f"moves {tr['mla'][2] / tr['kda'][2]:.0f}x the bytes of the summaries + halo per rank, MHA "
    f"{tr['mha'][2] / tr['kda'][2]:.0f}x; the summaries' all-gather catches up with the latents "
    f"near $R^\\ast$ = {tr['r_star']:.0f} ranks ({k3['r_star']:.0f} for Kimi K3, whose state is "
    "larger per layer), where a tree or a ring of partial folds (notebook 05, exercise 4) would "
    f"send less. The summary pass adds {tr['summary'][0]:.0%} to a rank's flops of the layer at "
    f"every $R$ ({k3['summary'][0]:.0%} for Kimi K3); the fold, growing with $R$ while the slices "
    f"shrink, adds {tr['fold'][2]:.2%} at 8 ranks and {tr['fold'][-1]:.0%} at {ranks[-1]}."))

# %% [markdown]
# ## 7. The roofline: where each layer sits on each chip
#
# A step's arithmetic intensity is its flops per byte moved; a chip runs it at the smaller of
# its peak flop rate and intensity x bandwidth, compute-bound above the ridge, peak / bandwidth.
# We place Kimi Linear's layers at three operating points
# (`kda_lib.lab.at_scale.operating_point`, bf16 weights and caches): a prefill of
# `contexts[0]` tokens, decode steps at `contexts[1]` tokens for one sequence and the largest of
# `decode_batches`. This machine's CPU is measured: a `matmul_size`-square float32 matrix
# product for its peak and a sum over `bandwidth_mib` MiB for its bandwidth (medians of
# `timing_repeats` calls), beside the recorded benchmark's matrix-product rate.

# %%
key_a, key_b = jax.random.split(jax.random.key(seed))
a = jax.random.normal(key_a, (matmul_size, matmul_size))
mm_ms, _ = median_ms(jax.jit(jnp.matmul), a, a.T, repeats=timing_repeats)
stream = jax.random.normal(key_b, (bandwidth_mib * 2**18,))  # float32: 2^18 numbers per MiB
sum_ms, _ = median_ms(jax.jit(jnp.sum), stream, repeats=timing_repeats)
recorded = load_recorded("benchmarks", recorded_benchmark)
cpu = at_scale.Chip("this CPU (measured)", stream.nbytes / (sum_ms / 1e3),
                 2 * matmul_size**3 / (mm_ms / 1e3), 0.0, 0.0, "measured in this notebook")
print(f"{jax.devices()[0].device_kind}: matmul {cpu.peak_flops / 1e9:.1f} GFLOP/s (recorded "
      f"{recorded['date']}: {recorded['matmul_gflops']:.1f}), stream {cpu.hbm_bandwidth / 1e9:.1f} "
      f"GB/s, ridge {cpu.ridge:.1f} flop/byte")

# %%
points = {}
for kind in at_scale.MIXERS:
    points[(kind, "prefill")] = at_scale.operating_point(kimi, kind, "prefill", contexts[0],
                                                      kv_heads=gqa_kv_heads)
    for b in (1, max(decode_batches)):
        points[(kind, f"decode B={b}")] = at_scale.operating_point(
            kimi, kind, "decode", contexts[1], b, kv_heads=gqa_kv_heads)
intensity = {k: f / q for k, (f, q) in points.items()}
chips = [*at_scale.CHIPS.values(), cpu]
print(f"{'layer, step':22s} {'flop/byte':>9s} " + " ".join(f"{c.name[:11]:>11s}" for c in chips))
for k, i in intensity.items():
    print(f"{k[0] + ', ' + k[1]:22s} {i:9.1f} "
          + " ".join(f"{'compute' if i > c.ridge else 'memory':>11s}" for c in chips))
assert intensity[("KDA", "decode B=1")] < min(c.ridge for c in chips), "KDA decode: memory"
named_ridge = min(c.ridge for c in at_scale.CHIPS.values())  # the four named chips
mla_i = [i for (kind, step), i in intensity.items() if kind == "MLA" and step != "prefill"]
print(f"MLA decode {min(mla_i):.0f}-{max(mla_i):.0f} flop/byte; lowest ridge {named_ridge:.0f}")
assert all(i < named_ridge for (_, step), i in intensity.items() if step != "prefill"), (
    "every decode step, MLA's included, is memory-bound on the four named chips")
assert all(intensity[(k, "prefill")] > max(c.ridge for c in at_scale.CHIPS.values())
           for k in at_scale.MIXERS), "a prefill of this length is compute-bound on every chip"

# %% tags=["hide-input"]
i_axis = np.geomspace(0.1, 1e5, 200)
fig, ax = plt.subplots(figsize=(9, 4.2))
for c, color in zip(chips, viz.CYCLE, strict=False):
    ax.plot(i_axis, np.minimum(c.peak_flops, i_axis * c.hbm_bandwidth) / 1e12, color=color,
            label=f"{c.name}: ridge {c.ridge:.0f} flop/byte")
markers = {"prefill": "o", "decode B=1": "v", f"decode B={max(decode_batches)}": "s"}
kind_colors = dict(zip(at_scale.MIXERS, ("0.1", "0.45", "0.65", "0.8"), strict=True))
for (kind, step), i in intensity.items():  # drawn on the H200 SXM's roofline
    ax.plot(i, min(chips[1].peak_flops, i * chips[1].hbm_bandwidth) / 1e12, markers[step],
            color=kind_colors[kind], markeredgecolor="k", markersize=8)
for step, m in markers.items():
    ax.plot([], [], m, color="w", markeredgecolor="k", label=f"Kimi Linear layer: {step}")
for kind, color in kind_colors.items():
    ax.plot([], [], "D", color=color, markeredgecolor="k", label=f"fill: {kind}")
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (flop per HBM byte, log scale)",
       ylabel="attainable TFLOP/s (log scale)", title="Rooflines (vendor peaks; this CPU "
       "measured); layers drawn on the H200 SXM's")
ax.legend(loc="lower right", fontsize=7, ncol=3)
viz.show(fig, "10_roofline")

# %%
kda_decode, mla_decode = intensity[("KDA", "decode B=1")], intensity[("MLA", "decode B=1")]
display(Markdown(
    f"A KDA decode step for one sequence does {kda_decode:.1f} flop per byte, far below every "
    f"ridge: its time is its bytes (weights and state). An MLA decode step at {contexts[1]:,} "
    f"tokens does {mla_decode:.0f}, because all {kimi.mla.num_heads} heads read the same latents "
    f"(an MHA step does {intensity[('MHA', 'decode B=1')]:.1f}), still below every named chip's "
    f"ridge (the lowest, the H200 SXM's, is {named_ridge:.0f}): memory-bound on all four, as "
    "every decode step here; batching raises the KDA layer to "
    f"{intensity[('KDA', f'decode B={max(decode_batches)}')]:.0f} by sharing the weights, while "
    "an attention layer's cache is per sequence and stays at its own intensity. A prefill of "
    f"{contexts[0]:,} tokens is compute-bound everywhere."))

# %% [markdown]
# ## Summary
#
# - Parameters, flops per token and bytes per decoded token of the KDA, MLA and softmax
#   attention layers are formulas of the configs (`kda_lib.lab.at_scale`); at a small size each
#   equals the real program's traced matrix products exactly, and XLA's count within
#   5% (section 3; training, 3x forward, in `tests/lab/test_at_scale.py`).
# - A KDA layer costs the same per token at every context; MLA's cost and cache grow with $T$
#   (sections 2 and 4).
# - The paper's KV cache reduction follows from the layer pattern ($1 - L_{\text{global}}/L$).
#   Its decoding speed-up at 1M tokens does not follow from the configs: a roofline model of
#   named chips stays below $L / L_{\text{global}}$ for any batch and on several chips (section
#   5; head-parallel ranks each read MLA's whole latent, which raises the ratio towards the
#   bound), so the reported figure also measures how the two models were run.
# - Context parallelism moves summaries + halo independent of $T$, far below ring attention at
#   1M tokens on a few ranks, until their all-gather, growing with $R$, meets ring attention's
#   traffic at $R^\ast$; the summary pass adds a fixed fraction of the layer's flops and the fold
#   a fraction growing with $R$ (section 6).
# - Every decode step is memory-bound on the four named chips, MLA's shared-latent attention
#   included; prefills are compute-bound (section 7).
#
# ## Exercises
#
# Each exercise cell leaves `answer = None`; replace it with your answer and run the cell:
# `kda_lib.teaching.exercises.check` says whether it is right without showing the solution. Worked
# solutions (try first) are in [`notebooks/solutions/ch10.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch10.py).
#
# 1. **The cache reduction at one context.** For Kimi K3 at `contexts[0]` tokens, the fraction
#    $1 - $ (hybrid decode memory) / (all-MLA decode memory) of one sequence, counting the KDA
#    layers' states and conv histories (`kda_lib.lab.at_scale.kda_state_bytes`). Why is it
#    further from its limit than Kimi Linear's at 1M?
# 2. **Ring attention against summaries.** For Kimi Linear on 8 ranks, the smallest whole $T$ at
#    which ring attention over the MLA latents (bf16) makes each rank receive more bytes than the
#    KDA summaries (float32) + halo (bf16).
# 3. **Decode crossover per layer.** For Kimi Linear, the smallest context $T$ at which one MLA
#    layer's decode step reads at least as many cache bytes (bf16 latents) as one KDA layer moves
#    for its cache (read and written: float32 state, bf16 conv history).

# %%
from kda_lib.teaching import exercises

answer = None  # 1: a fraction, at most 1 (it can be negative: count before you guess)
exercises.check("10.1", answer, preset=presets.KIMI_K3.name, context=contexts[0])
answer = None  # 2: an int (tokens)
exercises.check("10.2", answer, preset=kimi.name, ranks=8)
answer = None  # 3: an int (tokens)
exercises.check("10.3", answer, preset=kimi.name)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (the KV cache
#   reduction, the 6.3x TPOT at 1M tokens, Figure 1b), 2025.
#   [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - J. Austin et al., *How to scale your model* (the JAX scaling book: rooflines, the costs of
#   transformer layers), 2025. [jax-ml.github.io/scaling-book](https://jax-ml.github.io/scaling-book/)
# - DeepSeek-AI, *DeepSeek-V2* (multi-head latent attention, the absorbed decode), 2024.
#   [arXiv:2405.04434](https://arxiv.org/abs/2405.04434)
# - H. Liu, M. Zaharia, P. Abbeel, *Ring attention with blockwise transformers*, 2023.
#   [arXiv:2310.01889](https://arxiv.org/abs/2310.01889)
# - Chip numbers: [NVIDIA H100](https://www.nvidia.com/en-us/data-center/h100/),
#   [NVIDIA H200](https://www.nvidia.com/en-us/data-center/h200/),
#   [Cloud TPU v5e](https://cloud.google.com/tpu/docs/v5e),
#   [Cloud TPU v6e](https://cloud.google.com/tpu/docs/v6e) (`kda_lib.lab.at_scale.CHIPS`).
# - Model configs: the sources cited in `kda_lib/models/presets.py`.
