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
# # 06 · Decoding: prefill in chunks, then one token at a time from a fixed-size state
#
# **Claim.** To generate with a KDA layer you keep a cache of fixed size: the `K x V` state
# per head plus the last `W - 1` inputs of each short convolution. Prefilling a prompt with
# the chunked kernel and then decoding token by token from that cache reproduces the layer's
# full forward pass to float32 rounding. The cache does not grow with the context, so memory
# per sequence is constant where a softmax attention KV cache grows linearly, and each
# decoding step costs the same whatever the position.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/06_decoding.ipynb)
#
# CI runs the small defaults of the `parameters` cell below in seconds; `make notebooks
# PARAMS=full` runs `notebooks/params/full/06_decoding.yaml`.

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
seed: int = 0  # seed of the one jax.random.key below

# %%
# Setup: install kda_lib when it is missing (e.g. on Colab); a no-op wherever it is importable.
try:
    import kda_lib
except ImportError:
    # %pip install -q git+https://github.com/kda-notebooks/kda-notebooks
    import kda_lib

import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from kda_lib import viz
from kda_lib.kernel import select_implementation
from kda_lib.testing import assert_close, relative_l2

viz.setup_style()
# Draw random numbers with the non-partitionable threefry: on CPU it compiles multi-dimensional
# draws many times faster; it only changes which numbers are drawn.
jax.config.update("jax_threefry_partitionable", False)
print("jax", jax.__version__, "on", jax.default_backend())

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
# form for a prompt (matrix products over chunks of `chunk_size` tokens) and the token-by-token
# recurrence for a single token, where one scan step beats a padded chunk.

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
# Each step feeds one token `[B, 1, hidden]` and the cache, and gets that token's output and
# the next cache. The step is jitted once (its shapes never change) and timed after a warm-up
# call (each step runs `timing_repeats` times on the same inputs and the fastest run counts,
# which filters out hiccups of a shared machine). Then the layer runs over all
# `prompt_len + decode_steps` tokens in one pass; prefill plus decoding must give the same
# outputs, the same final state and the same conv history.

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
ax.set_ylabel("||y_t - y_t(full)|| / ||y_t(full)||")
ax.legend(loc="upper left", ncol=2, fontsize=8)
viz.show(fig, "06_decode_error")

# %% [markdown]
# ## 3. Memory: a fixed-size state vs a growing KV cache
#
# The KDA cache holds `H K V` state floats plus `(W - 1)(2 H K + H V)` conv inputs per
# sequence, whatever the context length. A softmax attention layer with the same heads keeps
# every past key and value, `2 H K` floats per token. We read the KDA cache size off the
# arrays after every decoding step (it never changes) and compute the KV cache's from shapes.
# The KV cache is smaller only for contexts shorter than about `V / 2` tokens.

# %%
kda_bytes = cache_bytes[0]
kv_bytes_per_token = 2 * batch * num_heads * head_dim * 4  # keys and values, float32
assert len(set(cache_bytes)) == 1, "the KDA cache never grows"
state_bytes = batch * num_heads * head_dim * head_dim * 4
conv_bytes = batch * (conv_size - 1) * (3 * num_heads * head_dim) * 4
assert kda_bytes == state_bytes + conv_bytes
crossover = kda_bytes / kv_bytes_per_token
print(f"KDA cache: {kda_bytes:,} bytes (state {state_bytes:,} + conv {conv_bytes:,}); "
      f"KV cache: {kv_bytes_per_token:,} bytes per token; equal at T = {crossover:.0f} tokens")

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
ax.annotate(f"equal at {crossover:.0f} tokens", (crossover, kda_bytes), xytext=(8, 18),
            textcoords="offset points", fontsize=9, color="0.3")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_title(f"Decoding memory per sequence and layer (H = {num_heads}, K = V = {head_dim}, "
             "float32)")
ax.set_xlabel("context length T (tokens, log scale)")
ax.set_ylabel("cache size (bytes, log scale)")
ax.legend(loc="upper left")
viz.show(fig, "06_memory")

# %% [markdown]
# ## 4. Time per decoded token
#
# A decoding step does the same work at every position: project one token, update the conv
# histories, one delta-rule update of the state, one read. Below, the wall time of each jitted
# step on this machine (after the warm-up call that compiled it; the fastest of
# `timing_repeats` runs). Timings on a shared machine are noisy, so the check is loose: the
# later steps' median stays within a small factor of the earlier steps'.

# %%
step_ms = np.asarray(step_ms)
third = max(len(step_ms) // 3, 1)
early, late = np.median(step_ms[:third]), np.median(step_ms[-third:])
print(f"decode step: median {np.median(step_ms):.2f} ms (first third {early:.2f} ms, "
      f"last third {late:.2f} ms) on {jax.devices()[0].device_kind}")
assert late < 2 * early + 0.5, "decode time must not grow with the position"

fig, ax = plt.subplots(figsize=(8, 3.2))
ax.plot(decoded_at, step_ms, ".-", color=viz.PALETTE["blue"], linewidth=1,
        label=f"one jitted decode step (fastest of {timing_repeats})")
ax.axhline(np.median(step_ms), color=viz.PALETTE["orange"], linestyle="--",
           label=f"median {np.median(step_ms):.2f} ms")
ax.set_ylim(0, 1.2 * max(step_ms.max(), 1e-3))
ax.set_title(f"Measured time per decoded token, batch {batch} ({jax.default_backend()})")
ax.set_xlabel("position of the decoded token (tokens)")
ax.set_ylabel("wall time per step (ms)")
ax.legend(loc="upper right")
viz.show(fig, "06_decode_time")

# %% [markdown]
# ## Summary
#
# - Prefill (chunked kernel) followed by token-by-token decoding (recurrent step) from the
#   layer's cache reproduces one full forward pass: outputs, final state and conv history.
# - The cache is `H K V + (W - 1)(2 H K + H V)` floats per sequence and layer, measured
#   constant while decoding; a softmax KV cache passes it after about `V / 2` tokens and keeps
#   growing.
# - A decoding step costs the same at every position.
