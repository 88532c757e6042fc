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
# # 07 · Decoding: prefill the prompt in one call, then one token at a time from a fixed-size state
#
# **Claim.** To generate with a KDA layer you keep a cache of fixed size: the $d_k \times d_v$
# state per head plus the last $w - 1$ inputs of each short convolution (notebook 04).
# Prefilling a prompt in one call and then decoding token by token from that cache reproduces
# the layer's full forward pass to float32 rounding (asserted: below 10 float32 epsilons over
# all tokens; section 2 gives the bound on a TPU and each token's error). The
# cache does not grow with the context, where a softmax attention KV cache grows linearly, and a
# decoding step does the same work at every position, where an attention step reads the whole KV
# cache: we compute the context length beyond which a KV cache holds more bytes than the KDA
# cache, and time both steps.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/07_decoding.ipynb)
#
# Symbols follow [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the defaults below; `make notebooks PARAMS=full` runs `notebooks/params/full/`.
# Serving with this cache (prefix caching, speculative decoding), bytes against a GPU's ridge:
# [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-07).

# %% tags=["parameters"]
batch: int = 1  # sequences decoded side by side
hidden_size: int = 64  # layer width
num_heads: int = 2  # heads H
head_dim: int = 32  # d_k and d_v per head
conv_size: int = 4  # short-conv width w; the conv cache holds max(w - 1, 0) inputs (0: none)
prompt_len: int = 48  # tokens prefilled at once (one call)
decode_steps: int = 32  # tokens then decoded one at a time
chunk_size: int = 16  # chunk length of the chunked prefill
timing_repeats: int = 5  # timed rounds of each decode loop (after a compiling one); min kept
timing_steps: int = 16  # decode steps in one timed call (one compiled loop)
memory_max_len: int = 131072  # longest context in the memory plot (tokens)
attention_contexts: list = [256, 2048, 16384]  # contexts T of the decode-step timings
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
import time

import jax
import jax.numpy as jnp
import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

import kda_lib.teaching.notebook
from kda_lib.lab import at_scale
from kda_lib.layers.attention import AttentionConfig, CausalSelfAttention
from kda_lib.models import presets
from kda_lib.ops.api import select_implementation
from kda_lib.ops.gating import kda_gate
from kda_lib.teaching import decode_timing, viz
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
x = jax.random.normal(key_x, (batch, total_len, hidden_size))  # prompt, then generated tokens

@nnx.jit
def run(layer, x, cache):
    """layer(x, cache=cache) -> (y, new_cache): prefill, decode step or full pass."""
    return layer(x, cache=cache)

# %% [markdown]
# ## 1. Prefill: the whole prompt in one call
#
# `layer(x, cache=layer.init_cache(B))` runs the whole prompt at once and returns the outputs
# and the cache after its last token. With `implementation="auto"` the kernel is chosen per
# call (printed): the recurrent scan for one token, and the chunked form of notebook 03 or the
# scan for a prompt; the rules are in DESIGN's
# [engineering notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/DESIGN.md#engineering-notes-decoding-and-serving-from-notebook-07).
# Section 2 also prefills with the chunked kernel on every machine. Both compute
#
# $$
# S_t = \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) D_t S_{t-1} + \beta_t \mathbf k_t
#   \mathbf v_t^\top, \qquad \mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k} .
# $$

# %%
picks = {t: select_implementation(seq_len=t, batch=batch, num_heads=num_heads, key_dim=head_dim,
                                  dtype=jnp.float32, lower_bound=None, fused_gate=True,
                                  differentiated=False) for t in (prompt_len, 1)}
print(f"auto picks {picks[prompt_len]!r} for the {prompt_len}-token prompt, "
      f"{picks[1]!r} for one token")
assert jax.default_backend() != "cpu" or picks[1] == "recurrent"
cache = layer.init_cache(batch)
for name, part in cache._asdict().items():  # conv parts are None when conv_size is 0
    print(f"cache.{name:7s} " + (f"{str(part.shape):18s} {part.dtype}" if part is not None
                                  else "None (no short convolution)"))
start = time.perf_counter()
y_prompt, cache = jax.block_until_ready(run(layer, x[:, :prompt_len], cache))
print(f"prefill of {prompt_len} tokens: {time.perf_counter() - start:.2f} s (incl. compilation)")

# %% [markdown]
# ## 2. Decode one token at a time, and compare with the full forward pass
#
# Each step feeds one token $\mathbf x_t$ (`[B, 1, hidden]`) and the cache, and gets that
# token's output $\mathbf y_t$ and the next cache. Then the layer runs over all tokens in one pass:
# prefill plus decoding must give the same outputs, final state and conv histories. The same
# check follows with the prompt prefilled by the chunked kernel (same weights). The bound is on
# the relative L2 error over all tokens: 10 float32 epsilons on a CPU, 1e-5 on a TPU, whose
# float32 products are the chip's (notebook 00). A single token's error can be a few times
# larger; the figure below draws each token's, with the bound. Prefilled
# tokens may differ from the full pass by about $10^{-7}$ even when `auto` runs the same scan
# for both: prompt and full pass are separately compiled programs of different lengths, and
# XLA may round their float32 operations differently.
#
# First one step by hand, the equation of section 1 applied from the right ($D_t$ acts first):
# decay the state ($D_t S_{t-1}$), read what it recalls for the key
# ($\mathbf k_t^\top D_t S_{t-1}$), write $\beta_t$ times the error ($\mathbf v_t$ minus that)
# along $\mathbf k_t$ (the factor $I - \beta_t \mathbf k_t \mathbf k_t^\top$ and the added
# term together), then read with the query. The layer's projections and gated norm before and
# after are reused; the library's step must agree (asserted).

# %%
x_t = x[:, prompt_len: prompt_len + 1]  # the first decoded token, [B, 1, hidden]
proj, kw = layer.project(x_t, cache=cache), layer.kernel_kwargs()  # q, k, v, raw gate f, beta
g = kda_gate(proj.f, kw["a_log"], kw["dt_bias"], lower_bound=kw["lower_bound"])  # log decays
unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731 (L2-normalised)
q_t, k_t = (unit(np.asarray(a, np.float64)[:, 0]) for a in (proj.q, proj.k))  # [B, H, K]
v_t, beta_t, g_t = (np.asarray(a, np.float64)[:, 0] for a in (proj.v, proj.beta, g))
S = np.exp(g_t)[..., None] * np.asarray(cache.state, np.float64)  # decay: D_t S, [B, H, K, V]
recalled = np.einsum("bhk,bhkv->bhv", k_t, S)  # read: what the state holds for k_t
S = S + beta_t[..., None, None] * k_t[..., None] * (v_t - recalled)[..., None, :]  # delta write
o_t = np.einsum("bhk,bhkv->bhv", q_t, S) / np.sqrt(head_dim)  # output: S^T q / sqrt(d_k)
y_hand = layer.project_output(x_t, jnp.asarray(o_t[:, None], jnp.float32))
y_lib, cache_lib = run(layer, x_t, cache)
assert_close(S, cache_lib.state, atol=1e-5, rtol=1e-4, name="hand-written state")
assert_close(y_hand, y_lib, atol=1e-5, rtol=1e-4, name="hand-written output")
print(f"one step by hand vs the library: state {relative_l2(S, cache_lib.state):.1e}, "
      f"output {relative_l2(y_hand, y_lib):.1e} (relative)")

# %%
decode_cache, outputs, measured_bytes = cache, [], []
for t in range(prompt_len, total_len):
    y_t, decode_cache = run(layer, x[:, t: t + 1], decode_cache)
    outputs.append(y_t)
    measured_bytes.append(sum(a.nbytes for a in jax.tree.leaves(decode_cache)))
y_decoded = jnp.concatenate([y_prompt, *outputs], axis=1)

y_full, cache_full = run(layer, x, layer.init_cache(batch))
err = relative_l2(y_decoded, y_full)
eps = float(np.finfo(np.float32).eps)  # float32 rounding: 1.2e-7
bound = 1e-5 if jax.default_backend() == "tpu" else 10 * eps  # the chip's float32: notebook 00
print(f"prefill + {decode_steps} decode steps vs one full pass: relative L2 error over all "
      f"tokens {err:.1e}, {err / eps:.1f} float32 eps")
assert_close(y_decoded, y_full, atol=1e-5, rtol=1e-4, name="decoded outputs")
assert err < bound  # float32 rounding: a few eps, not a looser path's tens
for name, a, b in zip(cache_full._fields, decode_cache, cache_full, strict=True):
    if a is not None or b is not None:  # conv parts are None when conv_size is 0
        assert_close(a, b, atol=1e-5, rtol=1e-4, name=f"cache.{name}")  # state, conv histories

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
print(f"chunked-kernel prefill + {decode_steps} decode steps: relative L2 error "
      f"{err_chunked:.1e}, {err_chunked / eps:.1f} float32 eps")
if picks[prompt_len] == "chunked":  # auto's prefill was the chunked kernel too: same program
    np.testing.assert_array_equal(np.asarray(y_chunked), np.asarray(y_decoded))
    print("auto picked the chunked kernel here too: the two prefills agree bit for bit")
assert err_chunked < bound
for name, a, b in zip(cache_full._fields, chunked_cache, cache_full, strict=True):
    if a is not None or b is not None:
        assert_close(a, b, atol=1e-5, rtol=1e-4, name=f"cache.{name} after a chunked prefill")

# %% tags=["hide-input"]
per_token = {label: np.linalg.norm(np.asarray(y_ours - y_full), axis=-1)[0]  # row 0
             / np.linalg.norm(np.asarray(y_full), axis=-1)[0] for y_ours, label in (
                 (y_decoded, f"auto's prefill ({picks[prompt_len]})"),
                 (y_chunked, "chunked-kernel prefill"))}  # fmt: skip
if np.array_equal(*per_token.values()):  # auto ran the chunked kernel: one curve, not two
    per_token = {"auto's prefill = chunked-kernel prefill (bit for bit)": per_token.popitem()[1]}
every = np.concatenate([*per_token.values()])  # every token's error, on every curve
zeros, largest, lowest = int((every == 0).sum()), every.max(), every[every > 0].min(initial=1)
print(f"{len(per_token)} curve(s); tokens equal to the full pass bit for bit: {zeros}; largest "
      f"single-token error {largest / eps:.1f} float32 eps")
fig, ax = plt.subplots(figsize=(8, 3.2))
for (label, errors), style in zip(per_token.items(), ".x", strict=False):
    ax.semilogy(np.arange(total_len), np.maximum(errors, 1e-10), style, label=label)
ax.axvline(prompt_len - 0.5, color="0.3", linestyle="--", linewidth=1)
ax.axhline(eps, color="0.4", linestyle=":", linewidth=1, label="float32 eps")
ax.axhline(bound, color=viz.PALETTE["vermillion"], lw=1, label="bound asserted over all tokens")
ax.set(ylim=(5e-11 if zeros else lowest / 3, max(10 * bound, 3 * largest)),
       xlabel="token position t (tokens): prefilled left of the dashed line, decoded one per "
       "step right of it", ylabel=r"$\|\mathbf{y}_t - \mathbf{y}_t^{\mathrm{full}}\|"
       r" / \|\mathbf{y}_t^{\mathrm{full}}\|$",
       title="Prefill + decode vs one full pass, per token"
       + (f" ({zeros} equal bit for bit, drawn at 1e-10)" if zeros else ""))
ax.legend(loc="upper left", ncol=2, fontsize=8)
viz.show(fig, "07_decode_error")

# %% [markdown]
# ## 3. Memory: a fixed-size state vs a growing KV cache
#
# Per sequence and layer, in floats:
#
# $$
# \text{KDA cache} = \underbrace{H d_k d_v}_{\text{states}}
#   + \underbrace{\max(w - 1, 0)\, H (2 d_k + d_v)}_{\text{conv histories}},
# \qquad
# \text{KV cache after } T \text{ tokens} = T\, H (d_k + d_v),
# $$
#
# fixed for KDA, growing with the context for softmax attention (same heads). We read the KDA
# cache size off the arrays after every decoding step and the KV cache's from shapes; they are
# equal at $T^\ast = \frac{d_k d_v + \max(w - 1, 0)(2 d_k + d_v)}{d_k + d_v}$, which is
# $\frac{d_v}{2} + \frac{3 \max(w - 1, 0)}{2}$ for $d_k = d_v$ (printed below). That is this toy
# layer's, against attention with the same heads; the last line below gives it at Kimi Linear's
# published size against the MLA cache it is paired with (notebook 10's cost functions), in
# bytes as served: a float32 state against bf16 conv rows and a bf16 MLA cache. That is about
# twice the crossing the formula gives in numbers, one dtype for all (printed in brackets).

# %%
kda_bytes = measured_bytes[0]
kv_bytes_per_token = 2 * batch * num_heads * head_dim * 4  # keys and values, float32 (d_k = d_v)
state_bytes = batch * num_heads * head_dim * head_dim * 4
conv_bytes = batch * max(conv_size - 1, 0) * (3 * num_heads * head_dim) * 4
assert len(set(measured_bytes)) == 1 and kda_bytes == state_bytes + conv_bytes, "never grows"
crossover = kda_bytes / kv_bytes_per_token
print(f"KDA cache: {kda_bytes:,} bytes (state {state_bytes:,} + conv {conv_bytes:,}); "
      f"KV cache: {kv_bytes_per_token:,} bytes per token; equal at T = {crossover:.1f} tokens")
kimi = presets.KIMI_LINEAR_48B  # float32 state, bf16 conv rows; MLA: latent + shared key, bf16
kimi_bytes, mla_bytes = at_scale.kda_state_bytes(kimi), 2 * at_scale.mla_cache_numbers(kimi)
one_dtype = at_scale.kda_state_bytes(kimi, state_bytes=2, conv_bytes=2) / mla_bytes  # all bf16
print(f"{kimi.name} (H = {kimi.num_heads}, d_k = d_v = {kimi.head_dim}, w = {kimi.conv_size}): "
      f"KDA cache {kimi_bytes:,} bytes (float32 state, bf16 conv rows), MLA {mla_bytes:,} "
      f"bytes per token (bf16); equal at T = {kimi_bytes / mla_bytes:,.1f} tokens "
      f"({one_dtype:,.1f} with one dtype for all)")

# %% tags=["hide-input"]
contexts = np.unique(np.geomspace(1, memory_max_len, 200).astype(int))
decoded_at = np.arange(prompt_len + 1, total_len + 1)
fig, ax = plt.subplots(figsize=(8, 3.6))
ax.plot(contexts, contexts * kv_bytes_per_token, color=viz.MODEL_COLORS["attention"],
        label="softmax attention KV cache (from shapes)")
ax.plot(contexts, np.full(contexts.shape, kda_bytes), color=viz.PALETTE["blue"],
        label="KDA cache (state + conv history)")
every = max(len(decoded_at) // 8, 1)
ax.plot(decoded_at[::every], measured_bytes[::every], "o", color=viz.PALETTE["blue"],
        markerfacecolor="white", label="KDA cache, measured while decoding")
ax.plot(crossover, kda_bytes, "ko", label=f"equal at T = {crossover:.1f} tokens")
ax.set(xscale="log", yscale="log", xlabel="context length T (tokens, log scale)",
       ylabel="cache size (bytes, log scale)", title="Decoding memory per sequence and layer "
       f"(H = {num_heads}, $d_k = d_v$ = {head_dim}, float32)")
ax.legend(loc="upper left")
viz.show(fig, "07_memory")

# %% [markdown]
# ## 4. Time per decoded token, against a KV cache
#
# A KDA decoding step does the same work at every position, $O(H d_k d_v)$; a softmax attention
# step reads every cached key and value, $O(T H (d_k + d_v))$. The KDA cache has the same shapes
# after any prompt (asserted), so one compiled KDA step serves every context and is timed once;
# attention (same heads) is timed from a KV cache of $T$ tokens, and of one token. A KDA step
# costs the same at every $T$; attention's grows once its cache is large (printed: its step at
# the largest $T$ against its $T = 1$ step; asserted from 8 MiB cached). How the steps are timed,
# and why CPU times are not the bytes ratio: the notes.

# %%
for context in attention_contexts:  # shapes only: nothing runs
    after = decode_timing.cache_shapes_after(layer, batch, context, hidden_size)
    assert after == jax.tree.map(jnp.shape, decode_cache), context
attention = CausalSelfAttention(AttentionConfig(hidden_size=hidden_size, num_heads=num_heads,
                                                head_dim=head_dim), rngs=nnx.Rngs(layer_seed))
calls = {"KDA": (layer, x[:, :1], decode_cache)}
for n, context in enumerate([*attention_contexts, 1]):  # T cached tokens, room for the steps
    kv = jax.random.normal(jax.random.fold_in(key_x, n),
                           (2, batch, context + timing_steps, num_heads, head_dim))
    kv_cache = attention.init_cache(batch, max_len=context + timing_steps)._replace(
        keys=kv[0], values=kv[1], length=jnp.asarray(context, jnp.int32))
    calls[context] = (attention, x[:, :1], kv_cache)
step_ms = decode_timing.step_ms(calls, timing_steps, timing_repeats)  # ms per step
print(f"ms per decode step, fastest of {timing_repeats} rounds of {timing_steps}-step loops "
      f"({jax.devices()[0].device_kind}): KDA {step_ms['KDA']:.3f} at every T; attention "
      + ", ".join(f"{step_ms[t]:.3f} at T = {t:,}" for t in [1, *attention_contexts]))
largest = max(attention_contexts)  # below 8 MiB cached a fixed step cost can hide the read
print(f"attention at T = {largest:,} ({largest * kv_bytes_per_token / 2**20:.0f} MiB cached): "
      f"{step_ms[largest] / step_ms[1]:.1f}x its T = 1 step")
assert step_ms[largest] > step_ms[1] or largest * kv_bytes_per_token < 2**23  # asserted from 8 MiB

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.axhline(step_ms["KDA"], color=viz.PALETTE["blue"], linewidth=2,
           label="KDA layer: one program, timed once (same cache shapes at every T)")
ax.plot(attention_contexts, [step_ms[t] for t in attention_contexts], "s-", ms=8,
        color=viz.MODEL_COLORS["attention"], label="softmax attention layer: KV cache of T tokens")
ax.plot([1], [step_ms[1]], "s", ms=8, mfc="white", color=viz.MODEL_COLORS["attention"],
        label="softmax attention layer, T = 1: a step that reads almost no cache")
times = [step_ms["KDA"], step_ms[1], *(step_ms[t] for t in attention_contexts)]
ax.set(xscale="log", yscale="log", ylim=(min(times) / 2, max(times) * 2),
       xlabel="context length T (tokens, log scale)", ylabel="wall time per step (ms, log scale)",
       title=f"Measured time per decoded token, batch {batch} ({jax.default_backend()}), "
       f"fastest of {timing_repeats} rounds")
ax.yaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1, 2, 5)))  # plain decimals: 0.02, 0.05
ax.yaxis.set_major_formatter(mpl.ticker.FormatStrFormatter("%g"))
ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
ax.set_xticks([1, *attention_contexts], [f"{t:,}" for t in [1, *attention_contexts]], minor=False)
ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
ax.legend(loc="upper left", fontsize=8)
viz.show(fig, "07_decode_time")

# %% [markdown]
# ## Summary
#
# - Prefill in one call (the chunked kernel, and whatever `auto` runs here), then decoding
#   token by token from the cache, reproduces one full forward pass: outputs, state, conv.
# - One step by hand (decay, read, delta write, output; float64 NumPy) equals the library's step.
# - The cache is $H d_k d_v + \max(w - 1, 0) H (2 d_k + d_v)$ floats per sequence and layer,
#   constant while decoding; a softmax KV cache passes it after $T^\ast$ tokens and keeps growing.
# - A KDA step is one program at every context (its cache has the same shapes, asserted), timed
#   once; an attention step's time grows with the KV cache it reads once that cache is large
#   (section 4). Why bytes
#   decide on a GPU (both steps memory-bound): the notes.
#
# ## Exercises
#
# **Their setting: speculative decoding.** A cheap model drafts $m$ tokens; the layer runs all
# $m$ in one call from its cache (a short prefill) and keeps the first ones the real model
# agrees with; decoding resumes from the cache after the last kept token. A KV cache drops its
# last rows; a KDA state has no rows to drop: it is rolled back (exercise 2) or kept after every
# draft token (exercise 1), and the verify call moves those states (exercise 3). Replace each
# `answer = None` and run the cell: `check` says right or not, never the solution (it catches
# honest slips, not deliberate copies of its own code). Worked
# solutions (try first): [`notebooks/solutions/ch07.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch07.py).
#
# 1. **The cache that rolls back a draft.** To return to any prefix of an $m$-token draft
#    (0 to $m$ tokens accepted) without recomputing, keep the $m + 1$ states (before the draft,
#    after each token) and the fewest conv rows from which every prefix's history can be read.
#    Write `draft_cache_bytes(batch, num_heads, num_v_heads, key_dim, value_dim, conv_size,
#    conv_bytes, draft)` (no kda_lib): `num_v_heads` value heads $H_v$ (a float32 state each, as
#    `KDAConfig(num_v_heads=...)`); conv rows of `conv_bytes` bytes a number, q and k keeping
#    `num_heads` heads of $d_k$ and v $H_v$ heads of $d_v$; `conv_size` 0, 1 too.
# 2. **Roll back a rejected draft.** From the state after the whole draft (one head, `[K, V]`)
#    and the draft's unit keys `k`, values `v`, log decays `g`, strengths `beta` (a row per
#    token), write `roll_back(state, k, v, g, beta, rejected)`: the state before the last
#    `rejected` tokens, undoing token by token. Invert each token's map $M_t = (I - \beta_t
#    \mathbf k_t \mathbf k_t^\top) D_t$ ($S_t = M_t S_{t-1} + \beta_t \mathbf k_t \mathbf v_t^\top$)
#    in closed form, $O(d_k d_v)$ a token, no $d_k \times d_k$ matrix; some $\beta_t$ are in
#    $(1, 2)$, as `allow_neg_eigval=True` allows. Which $\beta_t$ cannot be undone? Why keep each
#    draft token's state instead (notes)?
# 3. **The crossover of a verify call.** Verifying an $m$-token draft, a KDA layer (`heads`
#    heads, one state each, `conv_size` $= w$) moves exercise 1's cache once (reads what it held
#    before the draft, writes the rest), every number of it (states and conv rows alike: no
#    separate `conv_bytes` here) `state_bytes` bytes; attention over $T$ cached
#    tokens writes $m$ entries and reads all $T + m$, an entry being `kv_numbers` numbers for the
#    **whole layer**, all heads together (MLA: its latent and shared key), `kv_bytes` bytes each.
#    Write `t_star(heads, key_dim, value_dim, conv_size, kv_numbers, state_bytes, kv_bytes,
#    draft)`: the least whole $T \ge 1$ where attention moves no fewer bytes
#    ($T^\ast_{\text{draft}}$ in NOTATION). Predict for Kimi Linear (`KIMI_LINEAR` below: $H = 32$,
#    $d_k = d_v = 128$, $w = 4$, a float32 state; MLA: 576 bf16 numbers a token): $m = 4$ against 1?

# %%
from kda_lib.teaching import exercises

answer = None  # 1: a function draft_cache_bytes(batch, num_heads, ..., draft) -> int
exercises.check("07.1", answer)
answer = None  # 2: a function roll_back(state, k, v, g, beta, rejected) -> [K, V]
exercises.check("07.2", answer)
answer = None  # 3: a function t_star(heads, key_dim, ..., kv_bytes, draft) -> int
KIMI_LINEAR = dict(heads=32, key_dim=128, value_dim=128, conv_size=4, kv_numbers=576,
                   state_bytes=4, kv_bytes=2)  # then: answer(**KIMI_LINEAR, draft=4)
exercises.check("07.3", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture*, 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - R. Pope et al., *Efficiently scaling transformer inference* (the KV cache), MLSys 2023. [arXiv:2211.05102](https://arxiv.org/abs/2211.05102)
# - A. Katharopoulos et al., *Transformers are RNNs* (constant-time decoding), ICML 2020. [arXiv:2006.16236](https://arxiv.org/abs/2006.16236)
# - fla's decode kernel: [`fla/ops/kda/fused_recurrent.py`](https://github.com/fla-org/flash-linear-attention)
