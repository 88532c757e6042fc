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
# # 07 · Decoding: prefill in chunks, then one token at a time from a fixed-size state
#
# **Claim.** To generate with a KDA layer you keep a cache of fixed size: the
# $d_k \times d_v$ state per head plus the last $w - 1$ inputs of each short convolution
# (notebook 04). Prefilling a prompt in one call (the chunked kernel of notebook 03, or the
# scan, whichever `implementation="auto"` picks on this machine; both are run below) and then
# decoding token by token from that cache reproduces the layer's full forward pass to float32
# rounding.
# The cache does not grow with the context, so memory per sequence is constant where a softmax
# attention KV cache grows linearly, and a decoding step costs the same at every position,
# where an attention step reads the whole KV cache. Both steps are bound by memory bandwidth,
# so the bytes they read decide which is faster: we compute the context length beyond which a
# KV cache (multi-head, grouped-query or latent) is read more slowly than the KDA state.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/07_decoding.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults of the `parameters` cell below; `make notebooks PARAMS=full` runs
# `notebooks/params/full/07_decoding.yaml`.

# %% tags=["parameters"]
batch: int = 1  # sequences decoded side by side
hidden_size: int = 64  # layer width
num_heads: int = 2  # heads H
head_dim: int = 32  # K and V per head
conv_size: int = 4  # short-conv width W; the conv cache holds W - 1 inputs
prompt_len: int = 48  # tokens prefilled at once (one call)
decode_steps: int = 32  # tokens then decoded one at a time
chunk_size: int = 16  # chunk length of the chunked prefill
timing_repeats: int = 3  # times each decode step is timed; the fastest run is kept
memory_max_len: int = 131072  # longest context in the memory plot (tokens)
attention_contexts: list = [256, 2048, 16384]  # KV-cache lengths of the attention step timings
roofline_heads: int = 16  # H of the realistic layer of section 5 (the published GPU shapes)
roofline_head_dim: int = 128  # head size (d_k and d_v) of that layer
gqa_kv_heads: int = 4  # key/value heads of the grouped-query cache of section 5
mla_latent: int = 512  # MLA's cached latent per token (DeepSeek-V2's d_c) ...
mla_rope_dim: int = 64  # ... plus its decoupled RoPE key (d_h^R): numbers cached per token
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
import dataclasses
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.lab.measure import median_ms
from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
from kda_lib.ops.api import select_implementation
from kda_lib.ops.reference import kda_step
from kda_lib.teaching import viz
from kda_lib.testing import assert_close, relative_l2

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
# Derived values
total_len = prompt_len + decode_steps
key = jax.random.key(seed)
key_layer, key_x = jax.random.split(key)
layer_seed = int(jax.random.randint(key_layer, (), 0, 2**31 - 1))
config = kda_lib.KDAConfig(hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim,
                           conv_size=conv_size, chunk_size=chunk_size, implementation="auto")
layer = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(layer_seed))
# the inputs a layer would see: prompt then the generated tokens' hidden states
x = jax.random.normal(key_x, (batch, total_len, hidden_size))


@nnx.jit
def run(layer, x, cache):
    """layer(x, cache=cache) -> (y, new_cache): prefill, decode step or full pass."""
    return layer(x, cache=cache)


# %% [markdown]
# ## 1. Prefill: the whole prompt in one call
#
# `layer(x, cache=layer.init_cache(B))` runs the whole prompt at once and returns the outputs
# and the cache after its last token. With `implementation="auto"` the kernel is chosen per
# call (`kda_lib.ops.api.select_implementation`): the token-by-token recurrence for a single
# token, where one scan step beats a padded chunk. For a prompt it depends on the machine and on
# whether the call is differentiated: on a CPU a forward-only call (a prefill) runs the scan too,
# a differentiated one the chunked form's forward and backward (matrix products over chunks of
# $C$ = `chunk_size` tokens); on a GPU the chunked form, and on a TPU v6+ `auto` may pick
# tokamax's Mosaic kernel. The rules come from a recorded grid of timings
# (`data/benchmarks/policy/`, made by `kda-bench --preset auto-grid`). The cell below prints
# what it picks here. Section 2 also prefills with `implementation="chunked"` explicitly, so that
# the chunked path is compared with decoding on every machine (where `auto` picks `"chunked"`
# for the prompt, the two prefills are one program and their outputs bitwise equal, asserted
# there). Both compute
#
# $$
# S_t = \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) D_t S_{t-1} + \beta_t \mathbf k_t
#   \mathbf v_t^\top, \qquad \mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k} .
# $$

# %%
picks = {t: select_implementation(seq_len=t, key_dim=head_dim, dtype=jnp.float32,
                                  lower_bound=None, fused_gate=True, differentiated=False)
         for t in (prompt_len, 1)}
print(f"auto picks {picks[prompt_len]!r} for the {prompt_len}-token prompt, "
      f"{picks[1]!r} for one token")
if jax.default_backend() == "cpu":
    assert picks == {prompt_len: "recurrent", 1: "recurrent"}

cache = layer.init_cache(batch)
for name, part in cache._asdict().items():
    print(f"cache.{name:7s} {str(part.shape):18s} {part.dtype}")
start = time.perf_counter()
y_prompt, cache = run(layer, x[:, :prompt_len], cache)
jax.block_until_ready(y_prompt)
print(f"prefill of {prompt_len} tokens: {time.perf_counter() - start:.2f} s (incl. compilation)")

# %% [markdown]
# ## 2. Decode one token at a time, and compare with the full forward pass
#
# Each step feeds one token $\mathbf x_t$ (`[B, 1, hidden]`) and the cache, and gets that
# token's output $\mathbf y_t$ and the next cache. The step is jitted once (its shapes never
# change) and timed after a warm-up call (each step runs `timing_repeats` times on the same
# inputs and the fastest run counts, which filters out hiccups of a shared machine). Then the
# layer runs over all `prompt_len + decode_steps` tokens in one pass; prefill plus decoding
# must give the same outputs, the same final state and the same conv history. The same check
# is then repeated with the prompt prefilled by the chunked kernel (`implementation="chunked"`,
# same weights) and decoded from its cache.

# %%
decode_cache = cache
jax.block_until_ready(run(layer, x[:, prompt_len: prompt_len + 1], decode_cache))  # compile
outputs, step_ms, cache_bytes = [], [], []
for t in range(prompt_len, total_len):
    runs_ms = []
    for _ in range(timing_repeats):  # same inputs each time; the fastest run resists noise
        start = time.perf_counter()
        y_t, next_cache = run(layer, x[:, t: t + 1], decode_cache)
        jax.block_until_ready(y_t)
        runs_ms.append(1e3 * (time.perf_counter() - start))
    step_ms.append(min(runs_ms))
    decode_cache = next_cache
    outputs.append(y_t)
    cache_bytes.append(sum(a.nbytes for a in jax.tree.leaves(decode_cache)))
y_decoded = jnp.concatenate([y_prompt, *outputs], axis=1)

y_full, cache_full = run(layer, x, layer.init_cache(batch))
err = relative_l2(y_decoded, y_full)
print(f"prefill + {decode_steps} decode steps vs one full pass: relative error {err:.1e}")
assert_close(y_decoded, y_full, atol=1e-5, rtol=1e-4, name="decoded outputs")
assert err < 1e-5
for name, a, b in zip(cache_full._fields, decode_cache, cache_full, strict=True):
    assert_close(a, b, atol=1e-5, rtol=1e-4, name=f"cache.{name}")
print("final state and conv histories match")

# %%
# the chunked kernel's prefill, decoded from its cache by the same jitted step
layer_chunked = kda_lib.KimiDeltaAttention(dataclasses.replace(config, implementation="chunked"),
                                           rngs=nnx.Rngs(layer_seed))
y_chunked, chunked_cache = run(layer_chunked, x[:, :prompt_len], layer.init_cache(batch))
chunked_outputs = []
for t in range(prompt_len, total_len):
    y_t, chunked_cache = run(layer, x[:, t: t + 1], chunked_cache)
    chunked_outputs.append(y_t)
y_chunked = jnp.concatenate([y_chunked, *chunked_outputs], axis=1)
err_chunked = relative_l2(y_chunked, y_full)
print(f"chunked-kernel prefill + {decode_steps} decode steps vs one full pass: relative error "
      f"{err_chunked:.1e}")
assert err_chunked < 1e-5
if picks[prompt_len] == "chunked":  # auto's prefill was the chunked kernel too: same program
    np.testing.assert_array_equal(np.asarray(y_chunked), np.asarray(y_decoded))
    print("auto picked the chunked kernel here too: the two prefills agree bit for bit")
for name, a, b in zip(cache_full._fields, chunked_cache, cache_full, strict=True):
    assert_close(a, b, atol=1e-5, rtol=1e-4, name=f"cache.{name} after a chunked prefill")

# %% tags=["hide-input"]
floor = 1e-10
fig, ax = plt.subplots(figsize=(8, 3.2))
for y_ours, style, label in ((y_decoded, ".", f"auto's prefill ({picks[prompt_len]})"),
                             (y_chunked, "x", "chunked-kernel prefill")):
    diff = np.linalg.norm(np.asarray(y_ours - y_full), axis=-1)[0]  # row 0, per token
    per_token = diff / np.linalg.norm(np.asarray(y_full), axis=-1)[0]
    ax.semilogy(np.arange(total_len), np.maximum(per_token, floor), style, label=label)
ax.axvspan(-0.5, prompt_len - 0.5, color=viz.PALETTE["sky"], alpha=0.2,
           label="prefill (one call)")
ax.axvspan(prompt_len - 0.5, total_len - 0.5, color=viz.PALETTE["orange"], alpha=0.15,
           label="decode (one token per step)")
ax.axhline(np.finfo(np.float32).eps, color="0.4", linestyle=":", linewidth=1,
           label="float32 eps")
ax.set_ylim(floor / 2, 1e-3)
ax.set_title("Prefill + decode vs one full pass, per token (bitwise equal drawn at 1e-10)")
ax.set_xlabel("token position t (tokens)")
ax.set_ylabel(r"$\|y_t - y_t^{\mathrm{full}}\| / \|y_t^{\mathrm{full}}\|$")
ax.legend(loc="upper left", ncol=2, fontsize=8)
viz.show(fig, "07_decode_error")

# %% [markdown]
# ## 3. Memory: a fixed-size state vs a growing KV cache
#
# Per sequence and layer, in floats:
#
# $$
# \text{KDA cache} = \underbrace{H d_k d_v}_{\text{states}}
#   + \underbrace{(w - 1)\, H (2 d_k + d_v)}_{\text{conv histories}},
# \qquad
# \text{KV cache after } T \text{ tokens} = T\, H (d_k + d_v),
# $$
#
# whatever the context length for KDA, growing with it for softmax attention (same heads). We
# read the KDA cache size off the arrays after every decoding step (it never changes) and
# compute the KV cache's from shapes. The two are equal at
# $T^\ast = \frac{d_k d_v + (w - 1)(2 d_k + d_v)}{d_k + d_v}$, which is
# $\frac{d_v}{2} + \frac{3 (w - 1)}{2}$ for $d_k = d_v$: beyond a few dozen tokens at these
# sizes the fixed state is the smaller cache.

# %%
kda_bytes = cache_bytes[0]
kv_bytes_per_token = 2 * batch * num_heads * head_dim * 4  # keys and values, float32 (d_k = d_v)
assert len(set(cache_bytes)) == 1, "the KDA cache never grows"
state_bytes = batch * num_heads * head_dim * head_dim * 4
conv_bytes = batch * (conv_size - 1) * (3 * num_heads * head_dim) * 4
assert kda_bytes == state_bytes + conv_bytes
crossover = kda_bytes / kv_bytes_per_token
assert np.isclose(crossover, head_dim / 2 + 3 * (conv_size - 1) / 2), "T* = d_v/2 + 3(w-1)/2"
print(f"KDA cache: {kda_bytes:,} bytes (state {state_bytes:,} + conv {conv_bytes:,}); "
      f"KV cache: {kv_bytes_per_token:,} bytes per token; equal at T = {crossover:.1f} tokens")

# %% tags=["hide-input"]
contexts = np.unique(np.geomspace(1, memory_max_len, 200).astype(int))
decoded_at = np.arange(prompt_len + 1, total_len + 1)
fig, ax = plt.subplots(figsize=(8, 3.6))
ax.plot(contexts, contexts * kv_bytes_per_token, color=viz.PALETTE["vermillion"],
        label="softmax attention KV cache (from shapes)")
ax.plot(contexts, np.full(contexts.shape, kda_bytes), color=viz.PALETTE["blue"],
        label="KDA cache (state + conv history)")
ax.plot(decoded_at[:: max(len(decoded_at) // 8, 1)], cache_bytes[:: max(len(decoded_at) // 8, 1)],
        "o", color=viz.PALETTE["blue"], markersize=6, markerfacecolor="white",
        label="KDA cache, measured while decoding")
ax.axvline(crossover, color="0.5", linestyle=":", linewidth=1)
ax.annotate(f"equal at {crossover:.1f} tokens", (crossover, kda_bytes), xytext=(8, 18),
            textcoords="offset points", fontsize=9, color="0.3")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_title(f"Decoding memory per sequence and layer (H = {num_heads}, "
             f"$d_k = d_v$ = {head_dim}, float32)")
ax.set_xlabel("context length T (tokens, log scale)")
ax.set_ylabel("cache size (bytes, log scale)")
ax.legend(loc="upper left")
viz.show(fig, "07_memory")

# %% [markdown]
# ## 4. Time per decoded token, against a KV cache
#
# A KDA decoding step does the same work at every position: project one token, update the conv
# histories, one delta-rule update of the state, one read, $O(H d_k d_v)$ whatever the
# context. A softmax attention step reads every cached key and value, $O(T H (d_k + d_v))$.
# Below, the wall time of the jitted KDA step at each decoded position (after the warm-up call
# that compiled it; the fastest of `timing_repeats` runs, which filters out hiccups of a shared
# machine), and of one decode step of `kda_lib.layers.attention.CausalSelfAttention` with the same
# heads
# over KV caches of `attention_contexts` tokens (one compilation per length; median of
# `timing_repeats` calls, `kda_lib.lab.measure.median_ms`). Timings on a shared machine are noisy,
# so the KDA check is loose: the later steps' median stays within a small factor of the
# earlier steps'.

# %%
step_ms = np.asarray(step_ms)
third = max(len(step_ms) // 3, 1)
early, late = np.median(step_ms[:third]), np.median(step_ms[-third:])
print(f"KDA decode step: median {np.median(step_ms):.2f} ms (first third {early:.2f} ms, "
      f"last third {late:.2f} ms) on {jax.devices()[0].device_kind}")
assert late < 2 * early + 0.5, "decode time must not grow with the position"
attention = CausalSelfAttention(
    AttentionConfig(hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim),
    rngs=nnx.Rngs(layer_seed))
attention_ms = []
for n, context in enumerate(attention_contexts):
    kv = jax.random.normal(jax.random.fold_in(key_x, n), (2, batch, context + 1, num_heads,
                                                          head_dim))
    kv_cache = attention.init_cache(batch, max_len=context + 1)._replace(
        keys=kv[0], values=kv[1], length=jnp.asarray(context, jnp.int32))
    attention_ms.append(median_ms(run, attention, x[:, :1], kv_cache, repeats=timing_repeats)[0])
print("attention decode step: " + ", ".join(
    f"{ms:.2f} ms at T = {c}" for c, ms in zip(attention_contexts, attention_ms, strict=True)))

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.plot(decoded_at, step_ms, ".-", color=viz.PALETTE["blue"], linewidth=1,
        label=f"KDA layer: one decode step (fastest of {timing_repeats})")
ax.axhline(np.median(step_ms), color=viz.PALETTE["blue"], linestyle="--", linewidth=1,
           label=f"KDA median {np.median(step_ms):.2f} ms")
ax.plot(attention_contexts, attention_ms, "s-", color=viz.PALETTE["vermillion"],
        label="softmax attention layer: one decode step over a KV cache of T tokens")
ax.set_xscale("log")
ax.set_ylim(0, 1.2 * max(step_ms.max(), max(attention_ms), 1e-3))
ax.set(title=f"Measured time per decoded token, batch {batch} ({jax.default_backend()})",
       xlabel="position of the decoded token = context length T (tokens, log scale)",
       ylabel="wall time per step (ms)")
ax.legend(loc="upper left", fontsize=8)
viz.show(fig, "07_decode_time")

# %%
slowest_attention = attention_ms[int(np.argmax(attention_contexts))]
display(Markdown(
    f"The KDA step takes {np.median(step_ms):.2f} ms at every position (median); the attention "
    f"step takes {attention_ms[0]:.2f} ms over {attention_contexts[0]} cached tokens and "
    f"{slowest_attention:.2f} ms over {max(attention_contexts)}."))
assert slowest_attention > attention_ms[int(np.argmin(attention_contexts))], "reads grow with T"

# %% [markdown]
# ## 5. A decode step is bound by memory bandwidth: the crossover against a KV cache
#
# Per sequence and layer, a KDA decode step reads the state ($H d_k d_v$ numbers) and writes
# it back, and does a handful of flops per state entry: the decay, the delta rule's read
# $\mathbf k^\top S$ and its rank-one write, the output's read $\mathbf q^\top S$ (XLA counts
# them on the compiled `kda_step` below). That is about one flop per byte moved in float32,
# two orders of magnitude below the flops-per-byte ratio at which a GPU stops waiting on
# memory (computed below from the H200's datasheet numbers), so the step takes the time its
# bytes take to stream from memory. The same holds for an attention decode step, which reads
# $T$ cached entries of $n$ numbers each, where $n$ depends on the kind of cache:
#
# - multi-head attention (MHA): $n = 2 H d$, keys and values of every head;
# - grouped-query attention (GQA) with $G$ key/value heads: $n = 2 G d$;
# - multi-head latent attention (MLA, the kind of the Kimi Linear paper's global layers): one
#   latent of $d_c$ numbers plus a RoPE key of $d_R$ per token, shared by all heads; we use
#   DeepSeek-V2's sizes (`mla_latent`, `mla_rope_dim`).
#
# With $b_S$ bytes per state number and $b_{KV}$ per cached number, the two steps move the
# same bytes at (the first whole context at or past it is printed below)
#
# $$
# T^\ast = \frac{2\, H d_k d_v\, b_S}{n\, b_{KV}}
# $$
#
# (the 2: the state is read and written; the conv histories and the new token's cache entry,
# a few rows each, are left out). Beyond $T^\ast$ the attention step is the slower one. When the
# state and the cache have the same dtype, $b_S / b_{KV} = 1$ and the dtype drops out; kda_lib
# and fla keep the state in float32 even for bf16 models, and against a bf16 cache that
# doubles $T^\ast$.

# %%
H, d = roofline_heads, roofline_head_dim
step_args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in
             ((1, H, d, d), (1, H, d), (1, H, d), (1, H, d), (1, H, d), (1, H))]
cost = jax.jit(kda_step).lower(*step_args).compile().cost_analysis()
cost = cost[0] if isinstance(cost, list) else cost  # some JAX versions return one per device
entries = H * d * d  # state numbers of one layer and sequence
flops_per_entry = cost["flops"] / entries
intensity = cost["flops"] / (2 * 4 * entries)  # flop per byte: the state read and written once
H200_BANDWIDTH = 4.8e12  # bytes/s of HBM, NVIDIA's H200 datasheet
H200_BF16_FLOPS = 989e12  # dense bf16 tensor-core flop/s, same datasheet
ridge = H200_BF16_FLOPS / H200_BANDWIDTH
print(f"kda_step at H = {H}, d_k = d_v = {d}: {cost['flops']:,.0f} flops = {flops_per_entry:.1f} "
      f"per state entry; {intensity:.2f} flop per byte of state read and written; XLA's own "
      f"byte count {cost['bytes accessed'] / (2 * 4 * entries):.1f}x that minimum (CPU program)")
print(f"H200 (datasheet): {ridge:.0f} flop/byte before the tensor cores, not memory, limit; "
      f"streaming one layer's float32 state in and out at {H200_BANDWIDTH / 1e12:.1f} TB/s "
      f"takes at least {2 * 4 * entries / H200_BANDWIDTH * 1e6:.2f} us")
assert 6 <= flops_per_entry <= 10, flops_per_entry
assert intensity < 2 and ridge > 50 * intensity, "bandwidth-bound by a wide margin"
assert cost["bytes accessed"] >= 2 * 4 * entries, "at least the state, read and written"

# %%
caches = {"MHA": 2 * H * d, f"GQA, G = {gqa_kv_heads}": 2 * gqa_kv_heads * d,
          "MLA": mla_latent + mla_rope_dim}  # numbers cached per token and layer
dtypes = {"float32 state, float32 cache": (4, 4), "bf16 state, bf16 cache": (2, 2),
          "float32 state, bf16 cache": (4, 2)}  # (b_S, b_KV) bytes per number


def crossover(n, b_state, b_cache):
    """T*: the context at which an attention step over n numbers per token moves as many
    bytes as a KDA step reading and writing an H x d x d state."""
    return 2 * H * d * d * b_state / (n * b_cache)


t_star = {(c, dt): crossover(n, *b) for c, n in caches.items() for dt, b in dtypes.items()}
print(f"{'cache':16s} {'numbers/token':>13s} " + " ".join(f"{dt:>29s}" for dt in dtypes))
for c, n in caches.items():
    print(f"{c:16s} {n:13d} " + " ".join(f"{t_star[(c, dt)]:29.1f}" for dt in dtypes))

# %%
for (c, dt), t in t_star.items():  # the formula, against a count of bytes token by token
    b_state, b_cache = dtypes[dt]
    first = next(T for T in range(1, 10**5) if T * caches[c] * b_cache >= 2 * entries * b_state)
    assert first == np.ceil(t), (c, dt, first, t)
for c in caches:  # one dtype for both: it cancels; a float32 state against bf16: twice T*
    assert t_star[(c, "float32 state, float32 cache")] == t_star[(c, "bf16 state, bf16 cache")]
    assert t_star[(c, "float32 state, bf16 cache")] == 2 * t_star[(c, "bf16 state, bf16 cache")]
# n for MHA is what kda_lib's attention cache grows by per token (float32, the layer above)
grown = [sum(a.nbytes for a in jax.tree.leaves(attention.init_cache(batch, max_len=m)))
         for m in (8, 9)]
assert grown[1] - grown[0] == batch * 2 * num_heads * head_dim * 4
assert state_bytes == batch * num_heads * head_dim * head_dim * 4  # H d_k d_v numbers, float32

# %% tags=["hide-input"]
context = np.geomspace(16, 65536, 100)
fig, ax = plt.subplots(figsize=(8, 3.6))
b_state, b_cache = dtypes["float32 state, bf16 cache"]
ax.axhline(2 * entries * b_state / 2**20, color=viz.PALETTE["blue"],
           label="KDA step: float32 state read and written")
for (c, n), color in zip(caches.items(), viz.CYCLE[1:], strict=False):
    ax.plot(context, context * n * b_cache / 2**20, color=color, label=f"{c} step: bf16 cache read")
    ax.plot(t_star[(c, "float32 state, bf16 cache")], 2 * entries * b_state / 2**20, "o",
            color=color)
ax.set(xscale="log", yscale="log", xlabel="context length T (tokens, log scale)",
       ylabel="MiB moved per step and layer (log scale)",
       title=f"Bytes a decode step moves, one sequence and layer, H = {H}, d = {d}")
ax.legend(loc="upper left", fontsize=8)
viz.show(fig, "07_decode_roofline")

# %%
gqa = f"GQA, G = {gqa_kv_heads}"
first_t = {key: int(np.ceil(t)) for key, t in t_star.items()}  # first whole T at or past T*
same, mixed = "bf16 state, bf16 cache", "float32 state, bf16 cache"
display(Markdown(
    f"At $H$ = {H}, $d_k = d_v$ = {d}, with the same dtype for state and cache, the KDA step "
    f"moves no more bytes than an MHA step from {first_t[('MHA', same)]} tokens of context on, "
    f"than a GQA ({gqa_kv_heads} key/value heads) step from {first_t[(gqa, same)]}, and than an "
    f"MLA step from {first_t[('MLA', same)]}; a float32 state against a bf16 cache doubles "
    f"$T^\\ast$: {first_t[('MHA', mixed)]}, {first_t[(gqa, mixed)]} and "
    f"{first_t[('MLA', mixed)]} tokens. The smaller the cache per token, the longer the context "
    "before a fixed state pays off; past it, the KDA step's cost stays flat while attention's "
    "grows with every token."))

# %% [markdown]
# ## Summary
#
# - A prompt prefilled in one call (the chunked kernel, and whatever `auto` runs here)
#   followed by token-by-token decoding (recurrent step) from the layer's cache reproduces one
#   full forward pass: outputs, final state and conv history.
# - The cache is $H d_k d_v + (w - 1) H (2 d_k + d_v)$ floats per sequence and layer, measured
#   constant while decoding; a softmax KV cache passes it after $T^\ast$ tokens (computed
#   above) and keeps growing.
# - A KDA decoding step costs the same at every position; an attention step's cost grows with
#   its KV cache (measured above).
# - Both are bandwidth-bound (about one flop per byte), so bytes decide: the crossover length
#   against MHA, GQA and MLA caches, in bf16 and float32, is computed in section 5.
#
# ## Exercises
#
# Each exercise cell leaves `answer = None`; replace it with your answer and run the cell:
# `kda_lib.teaching.exercises.check` says whether it is right without showing the solution. Worked
# solutions are in `notebooks/solutions/ch07.py` (try first).
#
# 1. **No convolution, no history.** Build the layer with `conv_size=0` and measure its cache
#    in bytes (`sum(a.nbytes for a in jax.tree.leaves(cache))`): it must be the states alone.
# 2. **Prefill in two pieces.** Prefill the prompt in two halves (two calls with the cache);
#    the answer is the two halves' outputs concatenated, `[B, prompt_len, hidden]`, which must
#    equal the full pass.
# 3. **The decode crossover, derived.** Write `t_star(heads, key_dim, value_dim, kv_numbers,
#    state_bytes, cache_bytes)` returning the smallest whole context length $T$ at which one
#    attention decode step (reading $T$ cached entries of `kv_numbers` numbers of `cache_bytes`
#    bytes) moves at least as many bytes as one KDA step (reading and writing its state of
#    `state_bytes` bytes per number). The checker tries it on several caches and dtypes.

# %%
from kda_lib.teaching import exercises

answer = None  # 1: the cache bytes (an int) of the conv_size=0 layer
exercises.check("07.1", answer, batch=batch, num_heads=num_heads, key_dim=head_dim,
                        value_dim=head_dim)
answer = None  # 2: the two-piece prefill's outputs, [B, prompt_len, hidden]
exercises.check("07.2", answer, full=y_full[:, :prompt_len], prompt=x[:, :prompt_len])
answer = None  # 3: a function t_star(heads, key_dim, value_dim, kv_numbers, state_bytes,
#                  cache_bytes) -> int
exercises.check("07.3", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (decoding with a
#   fixed-size state), 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - R. Pope et al., *Efficiently scaling transformer inference* (the KV cache and its memory
#   cost), MLSys 2023. [arXiv:2211.05102](https://arxiv.org/abs/2211.05102)
# - A. Katharopoulos, A. Vyas, N. Pappas, F. Fleuret, *Transformers are RNNs* (constant-time
#   decoding of linear attention), ICML 2020. [arXiv:2006.16236](https://arxiv.org/abs/2006.16236)
# - fla's recurrent decode kernel, `fla/ops/kda/fused_recurrent.py`:
#   [fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention)
