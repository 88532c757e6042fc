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
# **Claim.** From Kimi Linear's published widths (`kda_lib.models.presets`), as the JAX scaling
# book does, we write down what its KDA layer and its MLA layer (the paper's global layer) cost in
# parameters, flops per token and cache memory, and check the flops against real programs at a
# small size. The KV cache reduction follows from the layer
# pattern; the decoding speed-up does not: with equal global layers and an equal rest of the step,
# the hybrid decodes at most 27/7 times faster, short of the paper's measured 6.3x.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/10_kimi_linear_at_scale.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md);
# for MLA, $d_c$ is the cached key/value latent, $d_R$ the cached key channels all heads share
# (DeepSeek's rotary slot, NoPE in Kimi Linear), $d_{qk}$ each head's own. Other models
# (Kimi K3, a GLM model), softmax attention (GQA, MHA), other chips, batched experts, short
# contexts, context parallelism, tests: [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-10).

# %% tags=["parameters"]
contexts: list = [4096, 131072, 1048576]  # ascending; first 1024 or more, last 2^20 (1M)
check_hidden: int = 512  # width d of the scaled-down layers checked against XLA
check_heads: int = 4  # heads H of the scaled-down layers
check_head_dim: int = 128  # d_k and d_v (and the gate rank) of the scaled-down layers
check_latent: int = 128  # MLA compressed latent d_c (kv_lora_rank) of the scaled-down layer
check_shared_key: int = 64  # MLA shared key d_R of the scaled-down MLA layer
check_seq_len: int = 256  # prefill length checked, chunks of 64: 2, 4, .., 64 or a multiple of 64
check_context: int = 256  # cache slots of the decode steps checked
decode_batches: list = [1, 16, 256]  # sequences decoded together (decode-time model); must hold 1
seed: int = 0  # every notebook has one; this one draws no random numbers

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
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.lab import at_scale
from kda_lib.layers.params import parameter_count
from kda_lib.models import presets
from kda_lib.teaching import decode_scaling, viz

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()
if len(contexts) < 2 or contexts != sorted(contexts) or contexts[0] < 1024 or contexts[-1] != 2**20:
    raise ValueError("contexts: two or more, ascending, [0] >= 1024, [-1] = 1048576 (the "
                     f"paper's 1M context, sections 5, 6), got {contexts}")
if not (check_seq_len in (2, 4, 8, 16, 32) or (check_seq_len > 0 and check_seq_len % 64 == 0)):
    raise ValueError(f"check_seq_len must be 2, 4, .., 64 or a multiple of 64, got {check_seq_len}")
if 1 not in decode_batches:  # at 1M tokens, the one batch one chip fits
    raise ValueError(f"decode_batches must hold 1, got {decode_batches}")
reported_active_params, reported_total_params = 3e9, 48e9  # facts: Kimi Linear's config.json
routed_experts, experts_per_token, paper_tpot_speedup = 256, 8, 6.3  # and its Figure 1b

# %% [markdown]
# ## 1. The model, from its config
#
# The preset records Kimi Linear's KDA layer, its layer pattern and its MLA widths, each number
# citing its source (`models/presets.py`). Both layers build here (`eval_shape`: shapes, no
# weights; $H_v = H$); section 2 counts their parameters by hand. Kimi K3, the GLM model: notes.

# %%
kimi = presets.KIMI_LINEAR_48B
built = {kind: parameter_count(build(kimi)) for kind, build in (  # the modules' own parameters
    ("KDA", presets.build_kda_layer), ("MLA", presets.build_mla_layer))}
print(f"{kimi.name}: d = {kimi.hidden_size}, KDA heads {kimi.num_heads} x {kimi.head_dim}, "
      f"{len(kimi.kda_layers)} KDA + {len(kimi.global_layers)} MLA layers; parameters of a built "
      f"layer: KDA {built['KDA']:,}, MLA {built['MLA']:,}")

# %% [markdown]
# ## 2. Parameters and flops per token, as formulas
#
# Per token and layer, counting matrix products (2 flops per multiply-add; `kda_lib.lab.at_scale`),
# $\lvert\theta_{\text{mm}}\rvert$ the projection weights, $T_k$ the keys a query is scored against:
#
# - **KDA**: $2 \lvert\theta_{\text{mm}}\rvert$ for `q/k/v/f/b/g/o_proj`, $2 w (2 H d_k + H d_v)$
#   for the short convolutions, and the chunked kernel, $H \cdot F_C / C$ with $F_C$ the flops
#   of one chunk of $C$ tokens (notebook 03): **independent of the context**. Decoding runs the
#   recurrent step, $7 d_k d_v$ per head: per state entry $\mathbf k^\top S$ 2, the write 2,
#   $S^\top \mathbf q$ 2 (notebook 03's 6 flops: three multiply-adds) and the decay's multiply 1
#   (XLA's count: [notebook 07's notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-07)).
# - **MLA**: $2 \lvert\theta_{\text{mm}}\rvert + 2 H T_k (d_{qk} + d_R + d_v)$ with the latents
#   expanded (prefill); decoding absorbs `kv_b_proj` into the query and the output:
#   $2 \lvert\theta_{\text{mm}}\rvert + 2 H T_k (2 d_c + d_R)$.
#
# A masked prefill of $T$ tokens scores $T_k = (T + 1)/2$ keys a query on average (a flash kernel
# skips the masked half), a decode step $T_k = T$. Training, GQA and MHA: the notes.

# %%
lines = [f"| {t:,} | {at_scale.kda_flops_per_token(kimi) / 1e6:,.0f} | "
         f"{at_scale.mla_flops_per_token(kimi, (t + 1) / 2) / 1e6:,.0f} |" for t in contexts]
display(Markdown(f"{kimi.name}: forward MFLOP per token and layer (prefill)\n\n| T | KDA | MLA |"
                 "\n|---|---|---|\n" + "\n".join(lines)))

# %%
d, h, dk, w = kimi.hidden_size, kimi.num_heads, kimi.head_dim, kimi.conv_size  # d_v = d_k = rank
m, t_k = kimi.mla, (contexts[-1] + 1) / 2  # MLA's widths; the keys a query scores at T = 1M
dc, dr = m.kv_lora_rank, m.shared_key_dim  # MLA's latent d_c and shared key d_R
theta_kda = 3 * d * h * dk + h * dk * d + 2 * (d * dk + dk * h * dk) + d * h  # q/k/v, o, f/g, b
kda_sum = theta_kda + 3 * w * h * dk + h + h * dk + dk  # + the convs, A_log, dt_bias, o_norm
theta = (d * h * (m.head_dim + dr) + d * (dc + dr)  # q, kv_a (latent, shared key)
         + dc * h * (m.head_dim + m.value_head_dim) + h * m.value_head_dim * d)  # kv_b, o
mla_sum = theta + dc  # + the latent's RMSNorm
assert (kda_sum, mla_sum) == (built["KDA"], built["MLA"])  # by hand == the built modules
kda_terms = (2 * theta_kda, 2 * w * 3 * h * dk, at_scale.kda_kernel_flops_per_token(kimi))
mla_hand = 2 * theta + 2 * m.num_heads * t_k * (m.head_dim + dr + m.value_head_dim)
assert kda_terms[:2] == (2 * at_scale.kda_matmul_params(kimi), at_scale.kda_conv_flops_per_token(
    kimi)) and theta == at_scale.mla_matmul_params(kimi)  # the library's terms, one by one
assert np.isclose(mla_hand, at_scale.mla_flops_per_token(kimi, t_k)) and np.isclose(
    sum(kda_terms), at_scale.kda_flops_per_token(kimi))  # the table's columns, by hand
print(f"{kimi.name} at T = {contexts[-1]:,}, T_k = {t_k:,.1f}:\n  MLA: 2 x {theta:,} + 2 x "
      f"{m.num_heads} x T_k x ({m.head_dim} + {dr} + {m.value_head_dim}) = {mla_hand / 1e6:,.1f} "
      f"MFLOP\n  KDA: 2 x {theta_kda:,} + 2 x {w} x 3 x {h} x {dk} + H F_C / C (notebook 03) = "
      + " + ".join(f"{f / 1e6:.2f}" for f in kda_terms) + f" = {sum(kda_terms) / 1e6:.1f} MFLOP: "
      f"MLA costs {mla_hand / sum(kda_terms):.1f}x KDA")

# %% [markdown]
# ## 3. Each formula against the real program
#
# Kimi Linear's layers scaled down (`at_scale.scaled_down`), as real programs: KDA's chunked prefill
# and decode step, MLA's prefill and absorbed decode step. Test: the traced matrix products
# (`kda_lib.lab.costs.matmul_flops`: a `lax.scan`'s body times its length, so the chunk count $H F_C
# / C$ is checked too) equal the formula's. Prefills score the full causal square, $T_k = T$; of the
# KDA step's 7 $d_k d_v$ it checks the 4 of $\mathbf k^\top S$ and $S^\top \mathbf q$.

# %%
small = at_scale.scaled_down(kimi, hidden=check_hidden, heads=check_heads, head_dim=check_head_dim,
                          rank=check_head_dim, kv_lora_rank=check_latent,
                          shared_key_dim=check_shared_key)
checks = at_scale.program_costs(small, check_seq_len, check_context, compile=False)  # lowered
print(f"KDA prefill: {check_seq_len} tokens in {max(1, check_seq_len // 64)} chunk(s)\n"
      f"{'program':16s} {'traced matmul flops':>20s} {'formula':>14s}")
for name, row in ((k, v) for k, v in checks.items() if not k.startswith("MHA")):  # notes
    print(f"{name:16s} {row['traced_matmul']:20,.0f} {row['formula_matmul']:14,.0f}")
    assert row["traced_matmul"] == row["formula_matmul"], name

# %% [markdown]
# ## 4. Memory: the KDA state against the KV caches
#
# Per sequence and layer, a KDA layer keeps $H d_k d_v$ float32 state numbers and the last
# $w - 1$ inputs of its $2 H d_k + H d_v$ conv channels (bf16), whatever the context; per token
# an MLA layer caches $d_c + d_R$ bf16 numbers (latent, shared key).

# %%
state = 4 * h * dk**2 + 2 * (w - 1) * 3 * h * dk  # bytes: float32 state, bf16 conv history
per_token = 2 * (dc + dr)  # MLA's bf16 bytes a token
assert state == at_scale.kda_state_bytes(kimi) and per_token == 2 * at_scale.mla_cache_numbers(kimi)
display(Markdown("MiB per sequence and layer\n\n| T | KDA | MLA |\n|---|---|---|\n" + "\n".join(
    f"| {t:,} | {state / 2**20:.1f} | {t * per_token / 2**20:,.1f} |" for t in contexts)))
first_mla = -(-state // per_token)  # the first whole T with T x per_token >= state
print(f"{kimi.name}: state = 4 x {kimi.num_heads} x {kimi.head_dim}^2 + 2 x ({kimi.conv_size} - 1)"
      f" x 3 x {kimi.num_heads} x {kimi.head_dim} = {state:,} bytes; MLA 2 x ({m.kv_lora_rank} + "
      f"{m.shared_key_dim}) = {per_token:,} bytes a token, past the state at T = {first_mla:,} "
      f"(ceil); at T = {contexts[-1]:,}, {contexts[-1] * per_token / state:.0f}x the state")
mem = [at_scale.model_cache_bytes(kimi, first_mla - d, hybrid=h)
       for d in (1, 0) for h in (True, False)]
assert mem[0] > mem[1] and mem[2] <= mem[3]  # hybrid vs all-MLA: a token before the crossing, at it

# %% [markdown]
# ## 5. The roofline: where each layer sits on the H200 SXM
#
# A chip runs a step at min(peak, arithmetic intensity x bandwidth), the intensity its flops per
# byte moved: a *roofline*, whose ridge, peak / bandwidth, is the intensity above which a step is
# compute-bound. Kimi Linear's two layers (`at_scale.operating_point`, bf16) on the H200 SXM
# (section 6's chip; three other chips: the notes): a prefill of `contexts[0]` tokens, decode
# steps at `contexts[1]` of one sequence and of the largest of `decode_batches`. The decode steps
# sit left of the ridge, the prefills right (asserted). A hollow marker: the hybrid model's
# weights and that batch's caches do not fit one H200 (printed).

# %%
h200 = at_scale.CHIPS["H200 SXM"]  # the chip of sections 5 and 6
steps = {"prefill": (contexts[0], 1), **{f"decode B={n}": (contexts[1], n)
                                         for n in (1, max(decode_batches))}}
intensity = {(kind, s): np.divide(*at_scale.operating_point(kimi, kind, s.split()[0], t, b))
             for kind in ("KDA", "MLA") for s, (t, b) in steps.items()}
fits = {s: 2 * reported_total_params + b * at_scale.model_cache_bytes(kimi, t) <= h200.hbm_bytes
        for s, (t, b) in steps.items()}  # bf16 weights + b hybrid caches on one chip
print(f"flop/byte, Kimi Linear's layers; H200 SXM ridge {h200.ridge:.0f}")
for s, (t, _) in steps.items():
    print(f"  {s:13s} at T = {t:7,}: KDA {intensity[('KDA', s)]:8,.1f}, MLA "
          f"{intensity[('MLA', s)]:8,.1f}" + ("" if fits[s] else "; does not fit one H200"))
assert all((i > h200.ridge) == (s == "prefill") for (_, s), i in intensity.items())

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(8, 4.2))
x = np.geomspace(0.3, 3e4, 200)  # intensities spanned by the roofline
ax.plot(x, np.minimum(h200.peak_flops, x * h200.hbm_bandwidth), color="0.1", lw=2, zorder=1,
        label=f"H200 SXM roof (ridge {h200.ridge:.0f} flop/byte)")
for (kind, s), i in intensity.items():  # hollow: the batch's caches do not fit one chip
    color = viz.MODEL_COLORS[kind.lower()]
    ax.plot(i, min(h200.peak_flops, i * h200.hbm_bandwidth), "os^"[list(steps).index(s)], ms=11,
            mew=2, color=color, mfc=color if fits[s] else "white", zorder=2,
            label=kind if s == "prefill" else None)
for marker, (s, (t, _)) in zip("os^", steps.items(), strict=True):  # step types in the legend
    ax.plot([], [], marker, color="k", mfc="k" if fits[s] else "white", label=f"{s}, T = {t:,}"
            + ("" if fits[s] else " (weights + hybrid caches do not fit one H200)"))
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (flop/byte, log)",
       ylabel="attainable flop/s (log)", title="Kimi Linear's layers on the H200 SXM's roof")
ax.legend(fontsize=8, loc="lower right")
viz.show(fig, "10_roofline")

# %% [markdown]
# ## 6. The paper's headline numbers
#
# The paper reports up to 75% less KV cache than full attention (MLA) and up to 6x its decoding
# throughput at 1M tokens (6.3x faster time per output token, TPOT, Figure 1b). **The cache.**
# Only the global layers' cache grows: the hybrid's tends to 7/27 of an all-MLA model's, a
# reduction of $1 - 7/27$ ("up to 75%" is the limit of a 3:1 ratio).

# %%
n_kda, n_glob, n = len(kimi.kda_layers), len(kimi.global_layers), kimi.num_layers
reduction = {t: 1 - (n_kda * state + n_glob * t * per_token) / (n * t * per_token)
             for t in contexts}  # 1 - hybrid / all-MLA, section 4's bytes
assert all(np.isclose(r, 1 - at_scale.model_cache_bytes(kimi, t) / at_scale.model_cache_bytes(
    kimi, t, hybrid=False)) for t, r in reduction.items())
print(f"1 - ({n_kda} x state + {n_glob} x T x {per_token}) / ({n} x T x {per_token}): " + ", ".join(
    f"{r:.1%} at T = {t:,}" for t, r in reduction.items()) + f"; limit {n_kda}/{n} = "
    f"{n_kda / n:.1%} (the paper: up to 75%)")
mixer_params = n_kda * kda_sum + n_glob * mla_sum  # section 2's sums, for the speed below

# %% [markdown]
# **The decoding speed, in a model.** On section 5's roofline a step takes the longer of its flops
# at the peak rate and its bytes at the bandwidth (`at_scale.CHIPS`). A decode step of $B$
# sequences at context $T$ reads each layer's bf16 weights once, and per sequence an MLA layer's
# cache (cache$(T)$ bytes) or a KDA layer's state, read *and* written (2 x state, section 4).
# The step times, in seconds, of one MLA layer, one KDA layer and the weights outside the mixers:
#
# $$t_{\text{MLA}}(B, T) = \max\Big(\frac{B\,\text{flops}_{\text{MLA}}(T)}{\text{peak}},
#   \frac{\text{weights}_{\text{MLA}} + B\,\text{cache}(T)}{\text{bandwidth}}\Big),\quad
#   t_{\text{KDA}}(B) = \max\Big(\frac{B\,\text{flops}_{\text{KDA}}}{\text{peak}},
#   \frac{\text{weights}_{\text{KDA}} + 2B\,\text{state}}{\text{bandwidth}}\Big),\quad
#   t_{\text{other}}(B) = \frac{\text{other}(B)}{\text{bandwidth}}.$$
#
# other$(B)$ counts the bf16 bytes a step of $B$ tokens reads outside the mixers: the dense
# weights $\lvert\theta_{\text{dense}}\rvert$ and the routed experts' $\lvert\theta_{\text{exp}}
# \rvert$ the batch touches, $\lvert\theta_{\text{dense}}\rvert + \lvert\theta_{\text{exp}}\rvert$
# = 48B and $\lvert\theta_{\text{dense}}\rvert + \lvert\theta_{\text{exp}}\rvert\,k_{\text{exp}} /
# n_{\text{exp}}$ = 3B active ($k_{\text{exp}}$ = 8 of $n_{\text{exp}}$ = 256 experts a token),
# tokens picking experts uniformly (`decode_scaling.moe_weight_bytes`, written out below):
#
# $$\text{other}(B) = 2\,\big(\lvert\theta_{\text{dense}}\rvert + \lvert\theta_{\text{exp}}\rvert
#   \,(1 - (1 - k_{\text{exp}}/n_{\text{exp}})^B) - \text{mixer weights}\big)\ \text{bytes}.$$
#
# $t_{\text{other}}$ has no compute term: at the largest batch its flops (2 a weight a token, the
# active weights) take a fraction of the time its weight reads do (printed below).
#
# With 27 layers, 7 global, all-MLA takes $27\,t_{\text{MLA}} + t_{\text{other}}$ a step and the
# hybrid $7\,t_{\text{MLA}} + 20\,t_{\text{KDA}} + t_{\text{other}}$ (the cell below, asserted
# equal to `at_scale.model_decode_time`). Assume the same global layer and other in both (same
# layer, kernel, batch, serving). Since $t_{\text{KDA}} \ge 0$ and $t_{\text{other}} \ge 0$, the
# bound is one line:
#
# $$\frac{\text{all-MLA}}{\text{hybrid}} \le \frac{27\,t_{\text{MLA}} + t_{\text{other}}}
#   {7\,t_{\text{MLA}} + t_{\text{other}}} \le \frac{27}{7}.$$
#
# A dearer global layer or other in all-MLA alone lifts it. As $B$ grows the weights are shared
# away; at a fixed $T$ the ratio tends to $27\,\text{cache}(T) / (7\,\text{cache}(T) + 20 \times
# 2\,\text{state})$, 27/7 only as $T$ grows.

# %%
t_long, weights, bound = contexts[-1], 2 * reported_total_params, n / n_glob  # bf16; 27/7
routed = (reported_total_params - reported_active_params) / (1 - experts_per_token / routed_experts)
def other_weights(b):  # other(B) above, in bf16 bytes; routed = |theta_exp|
    read = reported_total_params - routed * (1 - experts_per_token / routed_experts) ** b
    return 2 * (read - mixer_params)
kda_flops = 2 * at_scale.kda_matmul_params(kimi) + 2 * w * 3 * h * dk + 7 * h * dk * dk  # a token
def step_time(t, b, hybrid, chip=h200):  # the equation above: b sequences at T = t, in seconds
    peak, bw, n_mla = chip.peak_flops, chip.hbm_bandwidth, n_glob if hybrid else n
    mla_flops = 2 * theta + 2 * m.num_heads * t * (2 * dc + dr)  # absorbed decode (section 2)
    kda_layer = max(b * kda_flops / peak, (2 * kda_sum + b * 2 * state) / bw)  # bf16 weights once
    mla_layer = max(b * mla_flops / peak, (2 * mla_sum + b * t * per_token) / bw)  # + per sequence
    return n_mla * mla_layer + (n - n_mla) * kda_layer + other_weights(b) / bw
def ratio(t, b, chip=h200):  # all-MLA's step time over the hybrid's: above 1, the hybrid is faster
    return step_time(t, b, False, chip) / step_time(t, b, True, chip)
assert all(np.isclose(step_time(t, b, y, c), at_scale.model_decode_time(kimi, c, t, b, hybrid=y,
    other_weight_bytes=other_weights(b)), rtol=1e-12) for c in at_scale.CHIPS.values()  # library
    for t in (1, *contexts) for b in decode_batches for y in (False, True))
assert all(np.isclose(other_weights(b), decode_scaling.moe_weight_bytes(b, reported_total_params,
    reported_active_params, routed_experts, experts_per_token, mixer_params)) for b in (1, 16))

# %%
b_max = max(decode_batches)  # the rest of the step: flops at peak against its weight reads
rest = (b_max * 2 * reported_active_params / h200.peak_flops,
        other_weights(b_max) / h200.hbm_bandwidth)
print(f"outside the mixers at B = {b_max}: compute {rest[0] * 1e3:.1f} ms at peak, weight reads "
      f"{rest[1] * 1e3:.1f} ms")
assert rest[0] < rest[1] / 4

# %%
speedup = {b: ratio(t_long, b) for b in decode_batches}  # on the H200 SXM (other chips: notes)
fits = {b: weights + b * at_scale.model_cache_bytes(kimi, t_long, hybrid=False) <= h200.hbm_bytes
        for b in decode_batches}  # bf16 weights and b all-MLA caches on one H200
print("\n".join(f"batch {b:3d}: ratio {speedup[b]:.2f}; weights + all-MLA caches "
                + ("fit" if fits[b] else "do not fit") + " one H200 SXM" for b in decode_batches))
feasible = max((b for b in speedup if fits[b]), key=speedup.get)
batch_limit = n * t_long * per_token / (n_glob * t_long * per_token + n_kda * 2 * state)  # B: inf
assert max(speedup.values()) < batch_limit < bound
display(Markdown(
    f"In this model, at {t_long:,} tokens the speed-up is {speedup[feasible]:.2f}x where one "
    f"chip holds the weights and the all-MLA caches (H200 SXM, batch {feasible}), at "
    f"most {max(speedup.values()):.2f}x over `decode_batches` {decode_batches}; as the batch "
    f"grows it tends to {batch_limit:.2f} (the bound {bound:.2f} needs T to grow too). The paper "
    f"measured {paper_tpot_speedup}x, so its all-MLA step must cost more (global layers or rest). "
    "Two hypotheses, neither measured here: at this context all-MLA's caches fit one chip only at "
    "a small batch (printed above), so the paper may have served the two models at different "
    "batches or chip counts, which this model's equal setup leaves out (notes); and MLA's decode "
    "kernels may run well below this roofline at 1M tokens."))
slower = {b: 1 / ratio(1, b) - 1 for b in decode_batches}  # the grey band below (exercise 10.3)
assert min(slower.values()) > 0  # why, and where it ends: the notes
print("at T = 1 the hybrid is slower, by batch:", {b: f"{v:.1%}" for b, v in slower.items()})

# %% tags=["hide-input"]
t_axis, ticks = np.geomspace(256, t_long, 64), (.1, .2, .3, .4, .5, .6, .8, 1, 2, 3, 4, 6)
fig, ax = plt.subplots(figsize=(9, 4.6))  # to the paper's 1M context, no further; no pale shade:
shades = plt.get_cmap(viz.SEQUENTIAL_CMAP)(np.linspace(0.1, 0.7, len(decode_batches)))
curves = {b: np.array([ratio(t, b) for t in t_axis]) for b in decode_batches}
low = max(y for y in (0.05, *ticks) if y <= 0.9 * min(0.9, *map(min, curves.values())))  # a tick
def draw_batches(fit):  # one line a batch, where weights + all-MLA caches fit one H200 (or not)
    for b, color in zip(decode_batches, shades, strict=True):  # batch sizes: a sequential map
        room = weights + b * n * t_axis * per_token <= h200.hbm_bytes  # all-MLA caches: n T c
        ax.plot(t_axis, np.where(room == fit, curves[b], np.nan), color=color, lw=2.5 - 0.5 * fit,
                ls="-" if fit else ":", label=f"batch {b}: weights + all-MLA caches " + (
                "fit one H200 SXM" if fit else "do not fit") if (room == fit).any() else "_")
draw_batches(fit=True)  # the legend in order: fits, one batch a row, the bound, the paper
ax.axhline(bound, c="0.3", ls="--", label=f"bound: layers / global layers = {bound:.2f}")
ax.plot([t_long], [paper_tpot_speedup], "*", color=viz.PALETTE["vermillion"], markersize=12,
        clip_on=False, label=f"the paper reports {paper_tpot_speedup}x TPOT (measured, own setup)")
draw_batches(fit=False)  # then does not fit (where a batch has such contexts), the band below 1
ax.axhspan(low, 1, fc="0.9", ec="0.5", lw=1, label="below 1: the hybrid is slower")
ax.set(xscale="log", yscale="log", xlabel="context T (tokens, log scale)", ylim=(low, 7.5),
       xlim=(t_axis[0], t_long), ylabel="all-MLA / hybrid step time (log)",
       title="Kimi Linear decode, H200 SXM roofline (to the paper's 1M context)")
ax.set_yticks(t := [y for y in ticks if y >= low], t)
ax.yaxis.set_minor_formatter(plt.NullFormatter())  # only the labelled ticks above
fig.legend(loc="outside lower center", ncol=2, fontsize=8)
viz.show(fig, "10_decode_speedup")

# %% [markdown]
# ## Summary
#
# - Parameters, flops and cache bytes per layer are formulas of the configs (sections 2, 4);
#   traced programs check the flops (section 3); the decode model is written out (section 6).
# - A KDA layer's cost and cache do not grow with $T$, MLA's do: the cache reduction tends to
#   KDA layers / layers; "up to 75%" is the limit of a 3:1 ratio (section 6).
# - If a global layer and the rest of a step cost the same in both models, the 1M-token decode
#   speed-up stays below 27/7 (section 6): the paper's 6.3x needs all-MLA's step to cost more
#   (hypotheses, not measured: a setup that differs where all-MLA's caches fit only a small batch;
#   MLA decode kernels below the roofline).
#
# ## Exercises
#
# Replace `answer = None` and run the cell: `check` says right or not, never the solution (it
# catches honest slips, not deliberate copies of its own code).
# Worked solutions (try first): [`notebooks/solutions/ch10.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch10.py).
#
# In all three, `mla_numbers` is what an MLA layer caches a token: $d_c + d_R$ bf16 numbers
# (latent and shared key, section 4), not $d_c$ alone.
#
# 1. **Against grouped-query attention.** Write `reduction_context(fraction, kda_layers,
#    global_layers, heads, head_dim, conv_size, mla_numbers, kv_heads)` (no kda_lib): the real $T$
#    at which the decode memory of one sequence (section 4's KDA cache, MLA's `mla_numbers` a
#    token) is `fraction` below that of as many GQA layers of `kv_heads` $G$ (each caching $2 G d_k$
#    bf16 numbers a token; 0 $\le$ `fraction` $<$ 1);
#    `math.inf` where no $T$ does: `fraction` at or above this reduction's limit as $T$ grows.
#    *Explain why* (open): Kimi K3 reaches a half sooner against GQA ($G = 8$) than against all-MLA.
# 2. **Ring attention against summaries.** Split one sequence over $R$ ranks (notebook 05): a
#    global layer's ranks pass their MLA latents around a ring, a KDA layer's exchange float32
#    state summaries (notebook 05's all-gather: each rank receives the other $R - 1$ ranks'
#    $(M^{(\rho)}, E^{(\rho)})$) and a bf16 conv halo. Write `ring_crossover(ranks, heads,
#    head_dim, conv_size, mla_numbers)` (no kda_lib): the least whole $T$ where the ring moves more.
# 3. **Quantised weights move the crossing.** Write `decode_crossover(batch, heads, head_dim,
#    conv_size, mla_numbers, kda_params, mla_params, weight_bytes)` (no kda_lib): the smallest whole
#    $T \ge 1$ at which an MLA layer's decode step of `batch` sequences moves at least as many
#    bytes as a KDA layer's: weights read once, `weight_bytes` each (fp8: 1, int4: 0.5); per
#    sequence MLA's $T$ times `mla_numbers` bf16 numbers, KDA's section-4 cache read and
#    written. How far do fp8 and int4 weights move the bf16 crossing at batch 1?

# %%
from kda_lib.teaching import exercises

answer = None  # 1: a function reduction_context(fraction, ...) -> a context T (a float)
exercises.check("10.1", answer, preset=presets.KIMI_K3.name, fraction=0.5)
answer = None  # 2: a function ring_crossover(ranks, ...) -> an int (tokens)
exercises.check("10.2", answer, preset=kimi.name, ranks=8)
answer = None  # 3: a function decode_crossover(batch, ...) -> an int (tokens)
exercises.check("10.3", answer, preset=kimi.name)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear* (the KV cache reduction, the 6.3x TPOT at 1M tokens, Figure 1b), 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - J. Austin et al., *How to scale your model*, 2025. [scaling-book](https://jax-ml.github.io/scaling-book/)
# - DeepSeek-AI, *DeepSeek-V2* (MLA), 2024. [arXiv:2405.04434](https://arxiv.org/abs/2405.04434)
# - H. Liu et al., *Ring attention*, 2023. [arXiv:2310.01889](https://arxiv.org/abs/2310.01889)
# - Chips (`at_scale.CHIPS`): [H100](https://www.nvidia.com/en-us/data-center/h100/), [H200](https://www.nvidia.com/en-us/data-center/h200/),
#   [TPU v5e](https://cloud.google.com/tpu/docs/v5e), [TPU v6e](https://cloud.google.com/tpu/docs/v6e)
