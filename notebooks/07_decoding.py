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
gqa_kv_heads: int = 8  # key/value heads of the grouped-query cache of section 7
requests: int = 3  # requests sharing the prompt in section 3, each with decode_steps own tokens
draft_tokens: int = 4  # tokens of the draft verified in section 4
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
from kda_lib.lab import at_scale
from kda_lib.lab.measure import median_ms
from kda_lib.layers import cache_at
from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
from kda_lib.models import presets
from kda_lib.ops.api import select_implementation
from kda_lib.ops.reference import kda_step
from kda_lib.teaching import serving, viz
from kda_lib.testing import assert_close, relative_l2

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
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
# call (`kda_lib.ops.api.select_implementation`, rules from a recorded grid of timings): the
# token-by-token recurrence for one token; for a prompt, on a CPU the scan, on a GPU the
# chunked form of notebook 03 (details: DESIGN,
# [engineering notes from notebook 07](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/DESIGN.md#engineering-notes-decoding-and-serving-from-notebook-07)).
# The cell below prints what it picks here; section 2 also prefills with
# `implementation="chunked"`, so that the chunked path is compared with decoding on every
# machine. Both compute
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
    assert_close(a, b, atol=1e-5, rtol=1e-4, name=f"cache.{name}")  # final state, conv histories

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
print(f"chunked-kernel prefill + {decode_steps} decode steps: relative error {err_chunked:.1e}")
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
ax.axvspan(-0.5, prompt_len - 0.5, color=viz.PALETTE["sky"], alpha=0.2, label="prefill (one call)")
ax.axvspan(prompt_len - 0.5, total_len - 0.5, color=viz.PALETTE["orange"], alpha=0.15,
           label="decode (one token per step)")
ax.axhline(np.finfo(np.float32).eps, color="0.4", linestyle=":", linewidth=1, label="float32 eps")
ax.set(ylim=(floor / 2, 1e-3), xlabel="token position t (tokens)",
       title="Prefill + decode vs one full pass, per token (bitwise equal drawn at 1e-10)",
       ylabel=r"$\|y_t - y_t^{\mathrm{full}}\| / \|y_t^{\mathrm{full}}\|$")
ax.legend(loc="upper left", ncol=2, fontsize=8)
viz.show(fig, "07_decode_error")

# %% [markdown]
# ## 3. A shared prompt computed once: prefix caching
#
# Many requests start with the same system prompt. A KV cache keeps a row per token, so any
# prefix of it is reusable; a KDA cache holds the state after the last token only, so reusing
# a prompt's first $t$ tokens needs the state *after token $t$*. The chunked kernel carries it from
# chunk to chunk anyway: `layer.prefill(x)` returns the cache at every chunk boundary
# (`kda(..., output_chunk_states=True)`, no second pass), and `cache_at(boundaries, i)` is the
# cache after $(i + 1) C$ tokens. Each request resumes at the last boundary in the prompt and
# runs the rest of the prompt (fewer than $C$ tokens) and its own tokens:

# %% tags=["hide-input"]
counts = serving.prefix_tokens(prompt_len, chunk_size, decode_steps, requests)
viz.show(serving.draw_shared_prefix(prompt_len, chunk_size, decode_steps, requests),
         "07_shared_prefix")

# %%
assert prompt_len >= chunk_size, "a reusable prefix needs at least one full chunk"
prefill = nnx.jit(lambda layer, x: layer.prefill(x))
prompt = x[:, :prompt_len]  # the shared system prompt
prefill_ms, (_, _, boundaries) = median_ms(prefill, layer, prompt, repeats=timing_repeats)
shared = cache_at(boundaries, counts["reused"] // chunk_size - 1)  # after `reused` tokens
scratch_ms, resumed_ms, tokens_run = [], [], [prompt_len, 0]  # [cached, from scratch]
for r in range(requests):
    own = jax.random.normal(jax.random.fold_in(key_x, 100 + r), x[:, prompt_len:].shape)
    whole = jnp.concatenate([prompt, own], axis=1)  # this request's tokens, from the first
    ms, (y_whole, cache_whole) = median_ms(run, layer, whole, layer.init_cache(batch),
                                           repeats=timing_repeats)  # fmt: skip
    scratch_ms.append(ms)
    ms, (y_rest, cache_rest) = median_ms(run, layer, whole[:, counts["reused"]:], shared,
                                         repeats=timing_repeats)  # fmt: skip
    resumed_ms.append(ms)
    tokens_run = [tokens_run[0] + whole.shape[1] - counts["reused"], tokens_run[1] + whole.shape[1]]
    assert_close(y_rest, y_whole[:, counts["reused"]:], atol=1e-5, rtol=1e-4, name=f"request {r}")
    assert_close(cache_rest.state, cache_whole.state, atol=1e-5, rtol=1e-4, name="state")
assert tokens_run == [counts["cached"], counts["scratch"]], "the picture's counts are the run's"
print(f"{requests} requests sharing a {prompt_len}-token prompt: {counts['cached']} tokens run "
      f"instead of {counts['scratch']} ({counts['saved']} saved); each request's outputs equal "
      f"its run from scratch")
print(f"time here: {sum(scratch_ms):.2f} ms from scratch vs {prefill_ms:.2f} ms prefill + "
      f"{sum(resumed_ms):.2f} ms resumed (medians of {timing_repeats} calls)")

# %% [markdown]
# ## 4. Draft, then verify: the state rolled back to the accepted prefix
#
# In speculative decoding a cheap model drafts $k$ tokens, the real model runs all $k$ in one
# call and accepts the first $a \le k$ it would have produced itself, then continues from the
# cache after token $a$. An attention cache drops its last $k - a$ rows; a recurrent state
# cannot be un-updated, so `layer.draft(x, cache=cache)` keeps the cache after *every* draft
# token (`output_token_states=True`) and `cache_at(token_caches, a - 1)` (an $a$ per sequence)
# rolls back. Each sequence below accepts a random $a < k$: the rolled-back cache must equal
# decoding those $a$ tokens alone, the cache after the whole draft must not.

# %%
assert 2 <= draft_tokens <= decode_steps, "a draft with a token to reject, from x's decode part"
draft = nnx.jit(lambda layer, x, cache: layer.draft(x, cache=cache))
proposed = x[:, prompt_len: prompt_len + draft_tokens]  # drafted after the prompt's cache
y_draft, cache_no_rollback, token_caches = draft(layer, proposed, cache)
accepted = jax.random.randint(jax.random.fold_in(key_x, 7), (batch,), 1, draft_tokens)
rolled_back = cache_at(token_caches, accepted - 1)
plain, plain_states = cache, []  # decoding without a draft: one token per step
for t in range(draft_tokens):
    y_t, plain = run(layer, proposed[:, t: t + 1], plain)
    assert_close(y_draft[:, t], y_t[:, 0], atol=1e-5, rtol=1e-4, name=f"draft output {t}")
    plain_states.append(plain)
for row, a in enumerate(np.asarray(accepted)):  # each row: the cache after its a tokens
    for name, got, want in zip(plain._fields, rolled_back, plain_states[a - 1], strict=True):
        assert_close(got[row], want[row], atol=1e-5, rtol=1e-4, name=f"row {row} {name}")
kept = [relative_l2(cache_no_rollback.state[row], plain_states[a - 1].state[row])
        for row, a in enumerate(np.asarray(accepted))]
print(f"accepted {np.asarray(accepted).tolist()} of {draft_tokens} drafted tokens: the rolled-"
      f"back cache equals decoding only those; without a rollback the state is off by at least "
      f"{min(kept):.2f} (relative)")
assert min(kept) > 1e-3, "without a rollback the state holds the rejected tokens"

# %% [markdown]
# ## 5. Memory: a fixed-size state vs a growing KV cache
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
# fixed for KDA, growing with the context for softmax attention (same heads). We read the KDA
# cache size off the arrays after every decoding step and the KV cache's from shapes; equal at
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
ax.set(xscale="log", yscale="log", xlabel="context length T (tokens, log scale)",
       ylabel="cache size (bytes, log scale)", title="Decoding memory per sequence and layer "
       f"(H = {num_heads}, $d_k = d_v$ = {head_dim}, float32)")
ax.legend(loc="upper left")
viz.show(fig, "07_memory")

# %% [markdown]
# ## 6. Time per decoded token, against a KV cache
#
# A KDA decoding step does the same work at every position: project one token, update the conv
# histories, one delta-rule update of the state, one read, $O(H d_k d_v)$ whatever the
# context. A softmax attention step reads every cached key and value, $O(T H (d_k + d_v))$.
# Below, the wall time of the jitted KDA step at each decoded position (timed in section 2),
# and of one decode step of `kda_lib.layers.attention.CausalSelfAttention` with the same heads
# over KV caches of `attention_contexts` tokens (median of `timing_repeats` calls after a
# compiling one). Timings on a shared machine are noisy, so the KDA check is loose: the later
# steps' median stays within a small factor of the earlier steps'.

# %%
step_ms = np.asarray(step_ms)
third = max(len(step_ms) // 3, 1)
early, late = np.median(step_ms[:third]), np.median(step_ms[-third:])
print(f"KDA decode step: median {np.median(step_ms):.2f} ms (first third {early:.2f} ms, "
      f"last third {late:.2f} ms) on {jax.devices()[0].device_kind}")
assert late < 2 * early + 0.5, "decode time must not grow with the position"
attention = CausalSelfAttention(AttentionConfig(hidden_size=hidden_size, num_heads=num_heads,
                                                head_dim=head_dim), rngs=nnx.Rngs(layer_seed))
attention_ms = []
for n, context in enumerate(attention_contexts):
    kv = jax.random.normal(jax.random.fold_in(key_x, n), (2, batch, context + 1, num_heads,
                                                          head_dim))
    kv_cache = attention.init_cache(batch, max_len=context + 1)._replace(
        keys=kv[0], values=kv[1], length=jnp.asarray(context, jnp.int32))
    attention_ms.append(median_ms(run, attention, x[:, :1], kv_cache, repeats=timing_repeats)[0])
print("attention decode step: " + ", ".join(
    f"{ms:.2f} ms at T = {c}" for c, ms in zip(attention_contexts, attention_ms, strict=True)))
assert attention_ms[int(np.argmax(attention_contexts))] > attention_ms[
    int(np.argmin(attention_contexts))], "the attention step's reads grow with T"

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

# %% [markdown]
# ## 7. A decode step is bound by memory bandwidth: where the state pays off
#
# We size this at Kimi Linear's KDA layer (`kda_lib.models.presets.KIMI_LINEAR_48B`, read from
# its published config). Per sequence, a KDA decode step reads the state ($H d_k d_v$ numbers)
# and writes it back, and does a handful of flops per entry (XLA counts them on the compiled
# `kda_step` below): about one flop per byte in float32. That is elementwise float32 work for
# a GPU's CUDA cores, whose ridge (the flops per byte above which compute, not memory, limits)
# is far lower than the tensor cores' bf16 one; both are computed below from NVIDIA's H200 SXM
# spec sheet. An attention decode step reads $T$ cached entries of $n$ numbers each:
#
# - multi-head attention (MHA): $n = 2 H d$, $4 H d$ flops per cached token (scores and sum):
#   one flop per byte in bf16;
# - grouped-query attention (GQA), $G$ key/value heads: $n = 2 G d$ serving $H / G$ query
#   heads each: $H / G$ flops per byte;
# - multi-head latent attention (MLA, Kimi Linear's global layers): a latent of $d_c$ numbers
#   plus a shared key part of $d_R$, which in Kimi Linear carries no rotary position (NoPE,
#   `mla_use_nope` in its config). With the up-projections absorbed, every head scores and
#   sums the latent itself: $2 H (2 d_c + d_R)$ flops over $d_c + d_R$ numbers, about $1.9 H$.
#
# With $b_S$ bytes per state number and $b_{KV}$ per cached number, the two *mixing steps* move
# the same bytes per sequence at
#
# $$
# T^\ast = \frac{2\, H d_k d_v\, b_S}{n\, b_{KV}}
# $$
#
# (the 2: read and written; the conv histories and the new cache entry are left out). $T^\ast$
# compares the state with the cache rows only; the layer's weights, read once per step for
# all $B$ sequences of a batch, come after it.

# %%
preset = presets.KIMI_LINEAR_48B
H, d, mla = preset.num_heads, preset.head_dim, preset.mla
step_args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in
             ((1, H, d, d), (1, H, d), (1, H, d), (1, H, d), (1, H, d), (1, H))]
cost = jax.jit(kda_step).lower(*step_args).compile().cost_analysis()
cost = cost[0] if isinstance(cost, list) else cost  # some JAX versions return one per device
entries = H * d * d  # state numbers of one layer and sequence
flops_per_entry = cost["flops"] / entries
intensity = cost["flops"] / (2 * 4 * entries)  # flop per byte: the state read and written once
h200 = at_scale.CHIPS["H200"]  # bandwidth and dense bf16 tensor-core flop/s, from NVIDIA's page
H200_FP32_FLOPS = 67e12  # fp32 (CUDA cores, no tensor cores), NVIDIA's H200 SXM spec sheet
ridge_fp32 = H200_FP32_FLOPS / h200.hbm_bandwidth
attention_intensity = {"MHA": 4 * H * d / (2 * H * d * 2), "GQA": H / gqa_kv_heads,
                       "MLA": 2 * H * (2 * mla.kv_lora_rank + mla.shared_key_dim)
                       / ((mla.kv_lora_rank + mla.shared_key_dim) * 2)}  # fmt: skip
print(f"kda_step at H = {H}, d_k = d_v = {d}: {flops_per_entry:.1f} flops per state entry, "
      f"{intensity:.2f} flop/byte; H200 SXM ridge {ridge_fp32:.1f} flop/byte for fp32 CUDA-core "
      f"work, {h200.ridge:.0f} for bf16 tensor-core products")
print("attention decode, bf16 cache: " + ", ".join(
    f"{c} {v:.1f}" for c, v in attention_intensity.items()) + f" flop/byte (G = {gqa_kv_heads})")
assert 6 <= flops_per_entry <= 10 and intensity < 2 and ridge_fp32 > 5 * intensity
assert attention_intensity["MHA"] == 1 and attention_intensity["GQA"] == H / gqa_kv_heads
assert round(attention_intensity["MLA"] / H, 1) == 1.9 and attention_intensity["MLA"] < h200.ridge
assert cost["bytes accessed"] >= 2 * 4 * entries, "at least the state, read and written"

# %%
caches = {"MHA": 2 * H * d, f"GQA, G = {gqa_kv_heads}": 2 * gqa_kv_heads * d,
          "MLA": mla.kv_lora_rank + mla.shared_key_dim}  # numbers cached per token and layer
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
for (c, dt), t in t_star.items():  # the formula, against a count of bytes token by token
    b_state, b_cache = dtypes[dt]
    assert np.ceil(t) == next(T for T in range(1, 10**5)
                              if T * caches[c] * b_cache >= 2 * entries * b_state), (c, dt)
    assert t == crossover(caches[c], 1, 1) * b_state / b_cache  # one dtype for both: it cancels

# %% [markdown]
# **The whole layer.** A decode step also reads the layer's $W$ weights once for all $B$
# sequences, $W b_W / B$ bytes per sequence. Kimi Linear's KDA layer has more weights than its
# MLA layer, and at $B = 1$ those extra bytes, not the state, decide where the layers cross.
# Both layers are built at the published size (shapes only) and their parameters counted.

# %%
weights = {name: sum(p.size for p in jax.tree.leaves(nnx.state(built, nnx.Param)))
           for name, built in (("KDA", presets.build_kda_layer(preset)),
                               ("MLA", presets.build_mla_layer(preset)))}  # fmt: skip
assert weights == {"KDA": preset.kda_parameter_count(), "MLA": preset.mla_parameter_count()}
conv_numbers = (preset.conv_size - 1) * at_scale.kda_conv_channels(preset)
kda_per_seq = 2 * (entries * 4 + conv_numbers * 2)  # state (f32) and conv history (bf16)
layer_cross = {b: ((weights["KDA"] - weights["MLA"]) * 2 / b + kda_per_seq)
               / (caches["MLA"] * 2) for b in (1, 256)}  # fmt: skip
for b, t in layer_cross.items():  # the same bytes at t, counted by kda_lib.lab.at_scale
    assert np.isclose(at_scale.kda_decode_bytes(preset, b), at_scale.mla_decode_bytes(preset, t, b))
print(f"parameters: KDA layer {weights['KDA']:,}, MLA layer {weights['MLA']:,}; KDA vs MLA "
      f"layer, weights included: equal bytes at T = {layer_cross[1]:,.0f} (B = 1) and "
      f"{layer_cross[256]:,.0f} (B = 256); the mixing steps alone: "
      f"{t_star[('MLA', 'float32 state, bf16 cache')]:,.0f}")
t_mla = t_star[("MLA", "float32 state, bf16 cache")]
assert layer_cross[1] > 5 * t_mla and t_mla < layer_cross[256] < 1.1 * t_mla, "weights: B = 1"

# %% tags=["hide-input"]
context = np.geomspace(16, 65536, 100)
fig, ax = plt.subplots(figsize=(8, 3.8))
ax.axhline(kda_per_seq / 2**20, color=viz.PALETTE["blue"], label="KDA step: state (f32) + conv")
for (c, n), color in zip(caches.items(), viz.CYCLE[1:], strict=False):
    ax.plot(context, context * n * 2 / 2**20, color=color, label=f"{c} step: bf16 cache read")
ax.axhline((weights["KDA"] * 2 + kda_per_seq) / 2**20, color=viz.PALETTE["blue"], ls="--",
           label="KDA layer at B = 1: + bf16 weights")  # fmt: skip
ax.plot(context, (weights["MLA"] * 2 + context * caches["MLA"] * 2) / 2**20, "--",
        color=viz.CYCLE[3], label="MLA layer at B = 1: + bf16 weights")
ax.plot(layer_cross[1], (weights["KDA"] * 2 + kda_per_seq) / 2**20, "ko")
ax.set(xscale="log", yscale="log", xlabel="context length T (tokens, log scale)",
       ylabel="MiB moved per sequence (log scale)",
       title=f"Bytes one decode step moves, {preset.name}'s layers (H = {H}, d = {d})")
ax.legend(loc="upper left", fontsize=7, ncol=2)
viz.show(fig, "07_decode_roofline")

# %%
gqa, mixed = f"GQA, G = {gqa_kv_heads}", "float32 state, bf16 cache"
first_t = {key: int(np.ceil(t)) for key, t in t_star.items()}  # first whole T at or past T*
display(Markdown(
    f"With a float32 state and a bf16 cache, the KDA step moves no more bytes than an MHA step "
    f"from {first_t[('MHA', mixed)]} tokens of context on, than a GQA step from "
    f"{first_t[(gqa, mixed)]} and than an MLA step from {first_t[('MLA', mixed)]} (half these "
    f"with one dtype for both). With the weights, Kimi Linear's KDA layer moves no more bytes "
    f"than its MLA layer from {int(np.ceil(layer_cross[1])):,} tokens on at batch 1 and from "
    f"{int(np.ceil(layer_cross[256])):,} at batch 256: the larger the batch, the closer the "
    "layers come to the mixing steps' $T^\\ast$."))

# %% [markdown]
# ## Summary
#
# - A prompt prefilled in one call (the chunked kernel, and whatever `auto` runs here)
#   followed by token-by-token decoding (recurrent step) from the layer's cache reproduces one
#   full forward pass: outputs, final state and conv history.
# - A prompt shared by several requests is prefilled once; each request resumes from the cache
#   at the last chunk boundary (`prefill`, `cache_at`) and gets the outputs of its full run.
# - A verified draft rolls the state back to the accepted prefix (`draft` keeps the cache after
#   every token), equal to decoding only the accepted tokens.
# - The cache is $H d_k d_v + (w - 1) H (2 d_k + d_v)$ floats per sequence and layer, measured
#   constant while decoding; a softmax KV cache passes it after $T^\ast$ tokens (computed
#   above) and keeps growing.
# - A KDA decoding step costs the same at every position; an attention step's cost grows with
#   its KV cache (measured above).
# - Both decode steps are memory-bound on an H200 (KDA's float32 work about one flop per byte,
#   attention's 1, $H/G$ or about $1.9 H$), so bytes decide: section 7 computes the crossover
#   of the mixing steps and, counting the weights, of Kimi Linear's KDA and MLA layers.
#
# ## Exercises
#
# Each exercise cell leaves `answer = None`; replace it with your answer and run the cell:
# `kda_lib.teaching.exercises.check` says whether it is right without showing the solution. Worked
# solutions (try first) are in [`notebooks/solutions/ch07.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch07.py).
#
# 1. **Any layer's cache, predicted.** Write `cache_bytes(batch, num_heads, key_dim,
#    value_dim, conv_size)` (no kda_lib) for any KDA layer, $K \ne V$, `conv_size=0` (no conv)
#    and `1` included; check one on a layer you build. The checker tries layers of its own.
# 2. **Prefill in two pieces.** Write `second_piece(layer, x_prompt, split)`: prefill
#    `x_prompt[:, :split]` in one call `layer(..., cache=...)`, return the outputs of a second
#    call on the rest from the cache the first returned (call `layer`, not `run`).
# 3. **The decode crossover, derived.** Write `t_star(heads, key_dim, value_dim, kv_numbers,
#    state_bytes, cache_bytes)` returning the smallest whole context length $T$ at which one
#    attention decode step (reading $T$ cached entries of `kv_numbers` numbers of `cache_bytes`
#    bytes) moves at least as many bytes as one KDA step (reading and writing its state of
#    `state_bytes` bytes per number). The checker tries it on several caches and dtypes.

# %%
from kda_lib.teaching import exercises

answer = None  # 1: a function cache_bytes(batch, num_heads, key_dim, value_dim, conv_size)
exercises.check("07.1", answer)
answer = None  # 2: a function second_piece(layer, x_prompt, split) -> outputs after split
exercises.check("07.2", answer)
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
