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
# # 00 · Quick start: two kernels and one entry point, one answer
#
# **Claim.** Two forms of Kimi Delta Attention (KDA), a token-by-token recurrence (`kda_recurrent`)
# and a chunkwise matrix form (`kda_chunked`), and the entry point `kda` give the same outputs and
# states; a decoding loop reproduces them; both forms sit within a few float32 epsilons of a
# float64 oracle (on a CPU; on a TPU, within the suite's float32 tolerance). All of it is asserted.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/00_quickstart.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults of the `parameters` cell below; `make notebooks PARAMS=full` runs
# the bigger experiment in `notebooks/params/full/00_quickstart.yaml`.

# %% tags=["parameters"]
batch: int = 1  # sequences per batch
seq_len: int = 100  # tokens per sequence (not a multiple of the chunk size, on purpose)
num_heads: int = 2  # attention heads
key_dim: int = 16  # K: channels of q, k and of the forget gate
value_dim: int = 32  # V: channels of v and of the output
chunk_size: int = 32  # tokens per chunk in kda_chunked (a power of two)
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
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import kda_lib.teaching.notebook
from kda_lib.ops.norms import l2_normalize
from kda_lib.teaching import exercises, viz
from kda_lib.testing import CHIP_FLOAT32_ATOL, assert_close

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
# Derived values
shape_qk = (batch, seq_len, num_heads, key_dim)
shape_v = (batch, seq_len, num_heads, value_dim)
key = jax.random.key(seed)
key_q, key_k, key_v, key_f, key_beta, key_a, key_dt = jax.random.split(key, 7)

# %% [markdown]
# ## 1. Inputs
#
# KDA reads, per head $h$ and token $t$, a query and a key $\mathbf q_t, \mathbf k_t \in
# \mathbb R^{d_k}$ (unit length), a value $\mathbf v_t \in \mathbb R^{d_v}$, a per-channel log
# decay $\mathbf g_t \le 0$ ($\mathbf g_t \in \mathbb R^{d_k}$) and a write strength
# $\beta_t \in [0, 1]$. Batched, the arrays are `q, k, g: [B, T, H, K]`, `v: [B, T, H, V]`,
# `beta: [B, T, H]`. It keeps a state $S_t \in \mathbb R^{d_k \times d_v}$ per head (keys index
# its rows, values its columns). Each token moves it three times and then reads it: decay each row
# by its gate, erase what the state holds along $\mathbf k_t$, write $\beta_t \mathbf k_t
# \mathbf v_t^\top$, read with $\mathbf q_t$. The figure after the next cell draws one such step
# on the inputs drawn there (head 0, token 10), and asserts that it is the kernel's.

# %%
q = l2_normalize(jax.random.normal(key_q, shape_qk))
k = l2_normalize(jax.random.normal(key_k, shape_qk))
v = jax.random.normal(key_v, shape_v)
f = jax.random.normal(key_f, shape_qk)
a_log = kda_lib.init_a_log(key_a, num_heads)
dt_bias = kda_lib.init_dt_bias(key_dt, num_heads, key_dim)
g = kda_lib.kda_gate(f, a_log, dt_bias)
beta = jax.nn.sigmoid(jax.random.normal(key_beta, (batch, seq_len, num_heads)))

bias_hk = dt_bias.reshape(num_heads, key_dim)  # stored flat [H * K]; one b per head and channel
for name, arr in dict(q=q, k=k, v=v, g=g, beta=beta, a_log=a_log, dt_bias=bias_hk).items():
    print(f"{name:8s} {str(arr.shape):20s} {arr.dtype}")
assert float(g.max()) <= 0.0, "log-space decay must be <= 0"
_ = assert_close(jnp.linalg.norm(k, axis=-1), jnp.ones(shape_qk[:-1]), atol=1e-5, name="|k|")

# %% tags=["hide-input"]
t_shown = min(10, seq_len - 1)  # the token pictured: head 0 of sequence 0
inputs = (q, k, v, g, beta)
_, s_before = kda_lib.kda_recurrent(*(a[:, :t_shown] for a in inputs), output_final_state=True)
_, s_after = kda_lib.kda_recurrent(*(a[:, :t_shown + 1] for a in inputs), output_final_state=True)
fig, s_drawn = viz.one_step(s_before[0, 0], *(a[0, t_shown, 0] for a in inputs))
fig.suptitle(f"One step of KDA: head 0, token t = {t_shown}")
viz.show(fig, "00_quickstart_one_step")
_ = assert_close(s_drawn, s_after[0, 0], name="the pictured step = kda_recurrent's state")

# %% [markdown]
# In symbols, the three moves and the read are
#
# $$
# S_t = \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) \operatorname{diag}(e^{\mathbf g_t})
#   S_{t-1} + \beta_t \mathbf k_t \mathbf v_t^\top, \qquad
# \mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k}
# $$
#
# (notebook 01 derives them). In a model, $\mathbf g_t$ comes from a raw projection $\mathbf f_t$ of
# the input through `kda_gate`, $\mathbf g_t = -a_h \operatorname{softplus}(\mathbf f_t +
# \mathbf b)$, with a learned rate $a_h$ per head (stored as its log, `a_log`; fla's `A_log`) and
# bias $\mathbf b$ per channel (`dt_bias`, stored flat as `[H * K]`, printed above as `(H, K)`);
# here $\mathbf f$ is random and the parameters are at their initial values.

# %% [markdown]
# ## 2. Two forms and the entry point, one answer
#
# `kda_recurrent` scans over tokens; `kda_chunked` processes `chunk_size` tokens at a time with
# matrix products (notebook 03 derives it); `kda(...)` runs the form you name
# (`implementation="auto"` picks one for the platform and size: the
# [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-00)).
# Here `kda` runs the chunked form and applies the gate itself: it takes the raw $\mathbf f$ with
# `a_log` and `dt_bias`.

# %%
recurrent = jax.jit(kda_lib.kda_recurrent, static_argnames=["output_final_state"])
chunked = jax.jit(kda_lib.kda_chunked, static_argnames=["output_final_state", "chunk_size"])
kda = jax.jit(kda_lib.kda, static_argnames=["output_final_state", "chunk_size", "implementation",
                                           "use_gate_in_kernel"])

o_rec, state_rec = recurrent(q, k, v, g, beta, output_final_state=True)
o_chk, state_chk = chunked(q, k, v, g, beta, output_final_state=True, chunk_size=chunk_size)
o_kda, state_kda = kda(
    q, k, v, f, beta, a_log=a_log, dt_bias=dt_bias, use_gate_in_kernel=True,
    output_final_state=True, chunk_size=chunk_size, implementation="chunked",
)

print("outputs     ", o_rec.shape, o_rec.dtype)
print("final state ", state_rec.shape, state_rec.dtype)
rows = [("kda_chunked", o_chk, state_chk), ("kda (chunked, gate inside)", o_kda, state_kda)]
for name, o, s in rows:
    err = assert_close(o, o_rec, name=f"{name} output")
    assert_close(s, state_rec, name=f"{name} final state")
    print(f"{name:26s} max |o - o_recurrent| = {err:.1e}")

# %% [markdown]
# ## 3. Decoding one token at a time
#
# Generation needs the state, not the past tokens: `kda_step` takes the `[B, H, K, V]` state
# and one token and returns the next state and that token's output. Prefilling the first half
# with the chunked form and decoding the rest step by step gives the full-sequence outputs.

# %%
prefill = seq_len // 2
o_pre, state = chunked(
    q[:, :prefill], k[:, :prefill], v[:, :prefill], g[:, :prefill], beta[:, :prefill],
    output_final_state=True, chunk_size=chunk_size,
)
step = jax.jit(kda_lib.kda_step)
decoded = []
for t in range(prefill, seq_len):
    state, o_t = step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
    decoded.append(o_t)
o_decode = jnp.concatenate([o_pre, jnp.stack(decoded, axis=1)], axis=1)
print(f"decoded {seq_len - prefill} tokens after a {prefill}-token prefill")
assert_close(o_decode, o_rec, name="prefill + decode")
_ = assert_close(state, state_rec, name="state after decoding")

# %% [markdown]
# ## 4. How close to exact?
#
# The oracle is `kda_recurrent` itself run in float64 (on the host's CPU): the same code, so it
# measures rounding, not the formula (notebook 01 checks the formula against a NumPy loop). On a
# CPU both float32 forms should differ from it by float32 rounding, and not more: each transition
# has norm at most 1 (notebook 01) and the gate decays the state, so older rounding does not grow,
# and the per-token error levels off after about 20 tokens (the figure below). The yardstick is
# `np.finfo(np.float32).eps` $= 2^{-23}$, float32's **machine epsilon** (the gap between 1 and
# the next float32); one rounding errs by at most half of it, relative, the **unit roundoff**
# $2^{-24}$. The cell prints the larger of the two forms' errors in machine epsilons of the
# largest output, and how far the two forms are from each other. The assert allows 8 epsilons; at
# the defaults the printed figure stayed under 3 at seeds 0 to 40 (on a TPU the assert uses the
# suite's chip tolerance: the notes).

# %%
with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):  # float64: the host's
    to64 = [jnp.asarray(np.asarray(arr), jnp.float64) for arr in (q, k, v, g, beta)]
    o_exact = np.asarray(recurrent(*to64)[0])

err_rec = np.abs(np.asarray(o_rec, np.float64) - o_exact).max(axis=(0, 2, 3))
err_chk = np.abs(np.asarray(o_chk, np.float64) - o_exact).max(axis=(0, 2, 3))
scale_o, eps32 = np.abs(o_exact).max(), float(np.finfo(np.float32).eps)
print(f"float32 machine epsilon 2^-23 = {eps32:.1e}; max|o| = {scale_o:.3f}")
largest = max(err_rec.max(), err_chk.max())
worst = largest / scale_o / eps32  # in machine epsilons
print(f"largest error / max|o|: recurrent {err_rec.max() / scale_o:.1e}, chunked "
      f"{err_chk.max() / scale_o:.1e} (the larger: {worst:.1f} eps; absolute {largest:.1e})")
bound = CHIP_FLOAT32_ATOL if jax.default_backend() == "tpu" else 8 * eps32 * scale_o
apart = np.abs(np.asarray(o_rec, np.float64) - np.asarray(o_chk, np.float64)).max() / scale_o
print(f"the two forms from each other / max|o|: {apart:.1e} ({apart / eps32:.1f} eps)")
print(f"bound on {jax.default_backend()}: {bound:.1e} (absolute)")
assert largest < bound

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(10, 3.2))
tokens = np.arange(seq_len)
ax.semilogy(tokens, err_rec, label="kda_recurrent (float32)")
ax.semilogy(tokens, err_chk, label=f"kda_chunked (float32, C={chunk_size})", linestyle="--")
ax.axhline(eps32 * scale_o, color="0.4", linewidth=1, linestyle=":",
           label=r"1 float32 eps $\times$ max$|o|$ (not the bound)")
ax.axhline(bound, color="0.2", linewidth=1, linestyle="-.", label="the assert's bound")
ax.set_title(f"Distance of the float32 forms (on {jax.default_backend()}) from the float64 oracle")
ax.set_xlabel("token position t (tokens)")
ax.set_ylabel("$|o_t - o_t^{\\mathrm{float64}}|$, max over\nbatch, heads, value channels")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: off the curves
viz.show(fig, "00_quickstart_precision")

# %% [markdown]
# ## Summary
#
# - `kda_recurrent`, `kda_chunked` and `kda(..., implementation="chunked")` (gate applied
#   inside) agree to float32 tolerance on outputs and final states, for a length that is not a
#   multiple of the chunk size.
# - Prefill with the chunked form, then `kda_step` per token, reproduces the full forward pass:
#   the `[B, H, K, V]` state is all the kernel carries from token to token.
# - On a CPU the largest error of both float32 forms from the float64 oracle is under 8 float32
#   machine epsilons ($2^{-23}$ each) times the oracle's largest $|o|$ (asserted; section 4 prints
#   this run's figure, and the notes measured it under 3 at the defaults, seeds 0 to 40);
#   on a TPU it is within the suite's chip tolerance (asserted).
#
# Next: notebook 01 derives the recurrence itself from linear attention; notebook 04 builds the
# layer around it.
#
# ## Exercises
#
# Each asks for what this page does not compute, as a function the checker calls on inputs of its
# own; it says right or not, with a hint, never the expected answer. It gives feedback and is no
# proctor: it refuses the shortcuts an honest attempt may take, not deliberate tampering (the
# notes list both). Worked solutions, checked by the test suite: [`notebooks/solutions/ch00.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch00.py).
#
# Both hand your function `read`: for one vector `vec` of $d_k$ numbers (`[K]`), `read(vec)`
# returns $S^\top$ times `vec`, $d_v$ numbers (`[V]`), for a state $S$ (one head, `[K, V]`) it
# hides. **One** read is allowed, so the state cannot be read back. The checker judges only the
# value; derive the vector to read by transposing the step (the worked solution shows the
# derivation). NumPy or `jnp`, no `kda_lib`.
#
# 1. **One token, one read.** Write `output_after_one(read, q, k, v, g, beta)`: the output
#    $\mathbf o_t = S_t^\top \mathbf q / \sqrt{d_k}$ after section 1's step on the hidden $S =
#    S_{t-1}$ (`q, k, g`: `[K]`, `v`: `[V]`, `beta` a number). Which vector must you read?
# 2. **Many tokens, one read.** Now $T$ tokens come after the hidden $S_0$ (`k, g`: `[T, K]`,
#    `v`: `[T, V]`, `beta`: `[T]`, oldest first): `output_after(read, q, k, v, g, beta)`, the
#    output $S_T^\top \mathbf q / \sqrt{d_k}$, reading $S_0$ once. Which token's step meets
#    $\mathbf q$ first? (Notebook 03's chunkwise form does this for every query at once.)

# %%
answer = None  # exercise 1: output_after_one(read, q, k, v, g, beta) -> o [V]
exercises.check("00.1", answer)

# %%
answer = None  # exercise 2: output_after(read, q, k, v, g, beta) -> o [V]
exercises.check("00.2", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (KDA), 2025.
#   [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - S. Yang, B. Wang, Y. Zhang, Y. Shen, Y. Kim, *Parallelizing linear transformers with the
#   delta rule over sequence length* (the chunkwise form), NeurIPS 2024.
#   [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - The KDA kernels of fla ([fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention),
#   `fla/ops/kda/`) and tokamax ([openxla/tokamax](https://github.com/openxla/tokamax)), which
#   `kda(...)` can dispatch to.
