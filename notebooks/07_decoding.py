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
# (notebook 04). Prefilling a prompt with the chunked kernel (notebook 03) and then decoding
# token by token from that cache reproduces the layer's full forward pass to float32 rounding.
# The cache does not grow with the context, so memory per sequence is constant where a softmax
# attention KV cache grows linearly, and a decoding step costs the same at every position,
# where an attention step reads the whole KV cache.
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
prompt_len: int = 48  # tokens prefilled at once (chunked kernel)
decode_steps: int = 32  # tokens then decoded one at a time
chunk_size: int = 16  # chunk length of the chunked prefill
timing_repeats: int = 3  # times each decode step is timed; the fastest run is kept
memory_max_len: int = 131072  # longest context in the memory plot (tokens)
attention_contexts: list = [256, 2048, 16384]  # KV-cache lengths of the attention step timings
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
import dataclasses
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx
from IPython.display import Markdown, display

import kda_lib.notebook
from kda_lib import viz
from kda_lib.kernel import select_implementation
from kda_lib.measure import median_ms
from kda_lib.models import CausalSelfAttention
from kda_lib.testing import assert_close, relative_l2

kda_lib.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.notebook.setup()

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
# ## 1. Prefill with the chunked kernel
#
# `layer(x, cache=layer.init_cache(B))` runs the whole prompt at once and returns the outputs
# and the cache after its last token. With `implementation="auto"` the kernel is the chunked
# form for a prompt (matrix products over chunks of $C$ = `chunk_size` tokens) and the
# token-by-token recurrence for a single token, where one scan step beats a padded chunk (on
# a CPU, where the scan's forward pass measured faster at every length, a prompt that is not
# differentiated also runs the scan; training takes the chunked form's gradient):
#
# $$
# S_t = \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) D_t S_{t-1} + \beta_t \mathbf k_t
#   \mathbf v_t^\top, \qquad \mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k} .
# $$

# %%
picks = {t: select_implementation(seq_len=t, key_dim=head_dim, dtype=jnp.float32,
                                  lower_bound=None, fused_gate=True)
         for t in (prompt_len, 1)}
print(f"auto picks {picks[prompt_len]!r} for the {prompt_len}-token prompt, "
      f"{picks[1]!r} for one token")
if jax.default_backend() != "tpu":  # on a TPU v6+ auto may pick tokamax's Mosaic kernel
    assert picks == {prompt_len: "chunked", 1: "recurrent"}

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
# must give the same outputs, the same final state and the same conv history.

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

# %% tags=["hide-input"]
diff = np.linalg.norm(np.asarray(y_decoded - y_full), axis=-1)[0]  # row 0, per token
per_token = diff / np.linalg.norm(np.asarray(y_full), axis=-1)[0]
floor = 1e-10
fig, ax = plt.subplots(figsize=(8, 3.2))
ax.semilogy(np.arange(total_len), np.maximum(per_token, floor), ".", color=viz.PALETTE["blue"],
            label="relative difference (bitwise equal drawn at 1e-10)")
ax.axvspan(-0.5, prompt_len - 0.5, color=viz.PALETTE["sky"], alpha=0.2,
           label="prefill (chunked kernel)")
ax.axvspan(prompt_len - 0.5, total_len - 0.5, color=viz.PALETTE["orange"], alpha=0.15,
           label="decode (one token per step)")
ax.axhline(np.finfo(np.float32).eps, color="0.4", linestyle=":", linewidth=1,
           label="float32 eps")
ax.set_ylim(floor / 2, 1e-3)
ax.set_title("Prefill + decode vs one full pass, per token")
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
# machine), and of one decode step of `kda_lib.models.CausalSelfAttention` with the same heads
# over KV caches of `attention_contexts` tokens (one compilation per length; median of
# `timing_repeats` calls, `kda_lib.measure.median_ms`). Timings on a shared machine are noisy,
# so the KDA check is loose: the later steps' median stays within a small factor of the
# earlier steps'.

# %%
step_ms = np.asarray(step_ms)
third = max(len(step_ms) // 3, 1)
early, late = np.median(step_ms[:third]), np.median(step_ms[-third:])
print(f"KDA decode step: median {np.median(step_ms):.2f} ms (first third {early:.2f} ms, "
      f"last third {late:.2f} ms) on {jax.devices()[0].device_kind}")
assert late < 2 * early + 0.5, "decode time must not grow with the position"
attention = CausalSelfAttention(config, rngs=nnx.Rngs(layer_seed))
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
# ## Summary
#
# - Prefill (chunked kernel) followed by token-by-token decoding (recurrent step) from the
#   layer's cache reproduces one full forward pass: outputs, final state and conv history.
# - The cache is $H d_k d_v + (w - 1) H (2 d_k + d_v)$ floats per sequence and layer, measured
#   constant while decoding; a softmax KV cache passes it after $T^\ast$ tokens (computed
#   above) and keeps growing.
# - A KDA decoding step costs the same at every position; an attention step's cost grows with
#   its KV cache (measured above).
#
# ## Exercises
#
# 1. **No convolution, no history.** Build the layer with `conv_size=0`: its cache must then
#    be the states alone, $H d_k d_v$ floats.
# 2. **Prefill in two pieces.** Prefill the prompt in two halves (two calls with the cache),
#    then decode: the outputs must still equal the full pass.
# 3. **A realistic model.** For $H = 16$, $d_k = d_v = 128$ and $w = 4$, from how many tokens on
#    is one layer's KV cache larger than its KDA cache?
#
# The solutions below are hidden in the rendered page; they run (and assert) in CI.

# %% tags=["solution", "hide-input"]
# 1: conv_size = 0 -> the cache is the state only
plain = kda_lib.KimiDeltaAttention(dataclasses.replace(config, conv_size=0), rngs=nnx.Rngs(0))
plain_bytes = sum(a.nbytes for a in jax.tree.leaves(plain.init_cache(batch)))
assert plain_bytes == state_bytes, (plain_bytes, state_bytes)
# 2: two-piece prefill
half = prompt_len // 2
y_a, c_a = run(layer, x[:, :half], layer.init_cache(batch))
y_b, c_b = run(layer, x[:, half:prompt_len], c_a)
assert_close(jnp.concatenate([y_a, y_b], axis=1), y_full[:, :prompt_len], atol=1e-5, rtol=1e-4,
             name="exercise 2")
# 3: T* = (K V + (w - 1)(2K + V)) / (K + V) per head
t_star = (128 * 128 + 3 * (2 * 128 + 128)) / (128 + 128)
assert np.isclose(t_star, 128 / 2 + 3 * 3 / 2)
print(f"exercises 1-3: solutions checked (realistic crossover {t_star:.1f} tokens)")

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
