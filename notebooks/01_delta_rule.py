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
# # 01 · From linear attention to Kimi Delta Attention
#
# **Claim.** Linear attention stores key/value pairs by adding outer products into a $d_k \times
# d_v$ matrix, so every stored pair whose key overlaps the query leaks into its recall; random keys
# always overlap. The delta rule writes only what the memory gets wrong: one gradient step on the
# recall error $\tfrac12\lVert S^\top \mathbf k - \mathbf v\rVert^2$ with learning rate $\beta$. At
# $\beta = 1$ it recalls the newest pair exactly; averaged over draws it recalls better than linear
# attention from two pairs on, though one pass cannot store them all. A forget gate gives the gated
# delta rule (one decay per head) and KDA (one per key channel). Each step is derived, checked in
# float64, and built in NumPy against `kda_lib`.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/01_delta_rule.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).

# %% tags=["parameters"]
key_dim: int = 32  # d_k: dimension of keys (and of the memory's rows)
value_dim: int = 32  # d_v: dimension of values
max_pairs: int = 64  # largest number of key/value pairs stored in the recall experiment
num_seeds: int = 8  # independent draws of keys and values averaged in the recall experiments
toy_len: int = 24  # tokens in the toy-vs-kda_lib comparison
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
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.teaching import exercises, recall, viz
from kda_lib.testing import assert_close

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
key = jax.random.key(seed)
key_memory, key_delta, key_gate, key_toy, key_recall = jax.random.split(key, 5)
key_sweep = jax.random.fold_in(key_delta, 1)  # section 3's pairs


def unit_rows(x):
    """Rows scaled to unit L2 norm (float64 NumPy)."""
    return (x := np.asarray(x, np.float64)) / np.linalg.norm(x, axis=-1, keepdims=True)


def random_pairs(key, num, *, batch=()):
    """``num`` unit-norm keys ``[*batch, num, K]`` and values ``[*batch, num, V]`` of norm ~1."""
    key_k, key_v = jax.random.split(key)
    keys = unit_rows(jax.random.normal(key_k, (*batch, num, key_dim)))
    values = np.asarray(jax.random.normal(key_v, (*batch, num, value_dim)), np.float64)
    return keys, values / np.sqrt(value_dim)


# %% [markdown]
# ## 1. Linear attention is an associative memory
#
# Causal linear attention outputs $\mathbf o_t = \sum_{s \le t} (\mathbf q_t^\top \mathbf k_s)\,
# \mathbf v_s$; move each scalar behind its vector and the sum inside:
#
# $$
# \begin{align*}
# \mathbf o_t &= \sum_{s \le t} \mathbf v_s\, (\mathbf k_s^\top \mathbf q_t)
#   = \Big(\sum_{s \le t} \mathbf v_s \mathbf k_s^\top\Big) \mathbf q_t = S_t^\top \mathbf q_t,
# \qquad S_t = \sum_{s \le t} \mathbf k_s \mathbf v_s^\top = S_{t-1} + \mathbf k_t \mathbf v_t^\top.
# \end{align*}
# $$
#
# The **state** $S_t$ ($d_k \times d_v$) grows by one outer product per token. Read back with its
# stored keys, a memory of $d_k / 2$ pairs recalls with scatter if the keys overlap, exactly if not:

# %%
n_demo = key_dim // 2
key_pairs_demo, key_queries, key_ortho = jax.random.split(key_memory, 3)
keys, values = random_pairs(key_pairs_demo, n_demo)
queries = unit_rows(jax.random.normal(key_queries, (n_demo, key_dim)))
states = np.cumsum(np.einsum("tk,tv->tkv", keys, values), axis=0)  # S_t for every t
assert_close(np.einsum("tk,tkv->tv", queries, states), np.tril(queries @ keys.T) @ values,
             atol=1e-12, name="o_t = S_t^T q_t (state form = attention form)")
ortho = np.linalg.qr(np.asarray(jax.random.normal(key_ortho, (key_dim, key_dim)), np.float64))[0]
ortho_keys = ortho.T[:n_demo]  # n_demo orthonormal rows: exact recall
assert_close(ortho_keys @ (ortho_keys.T @ values), values, atol=1e-12, name="orthonormal keys")
recalled = keys @ (keys.T @ values)  # row j: S^T k_j with S = sum_j' k_j' v_j'^T
crosstalk = (keys @ keys.T - np.eye(n_demo)) @ values
assert_close(recalled, values + crosstalk, atol=1e-12, name="value + crosstalk")
rel_error = np.linalg.norm(recalled - values) / np.linalg.norm(values)
print(f"{n_demo} random pairs in d_k = {key_dim}: relative recall error {rel_error:.2f} "
      f"(sqrt((n-1)/d_k) = {np.sqrt((n_demo - 1) / key_dim):.2f})")
assert key_dim < 16 or rel_error > 0.25, "keys interfere"  # each draw at d_k >= 16, not 4, 8: notes

# %% tags=["hide-input"]
fig, (ax_overlap, ax_recall) = plt.subplots(1, 2, figsize=(9.5, 3.6))
viz.heatmap(ax_overlap, np.where(np.eye(n_demo) > 0, np.nan, keys @ keys.T), diverging=True,
            xlabel="stored pair", ylabel="recalled pair", cbar_label="key overlap", cmap=plt.
            get_cmap(viz.DIVERGING_CMAP).with_extremes(bad="0.55"), title="Overlaps (grey: 1)")
for got, style, label in ((recalled, ".", f"random unit keys (error {rel_error:.2f})"), (
        ortho_keys @ (ortho_keys.T @ values), "x", "orthonormal keys (exact)")):
    ax_recall.plot(values.ravel(), got.ravel(), style, ms=4, label=f"{n_demo} {label}")
ax_recall.set(title=f"Recall from one memory, $d_k$ = {key_dim}", xlabel="stored value entry",
              ylabel="recalled entry")
ax_recall.legend(fontsize=8)
viz.show(fig, "01_crosstalk")

# %% [markdown]
# Why: a stored key gives
#
# $$
# S^\top \mathbf k_j = \sum_{j'} \mathbf v_{j'}\, (\mathbf k_{j'}^\top \mathbf k_j)
#   = \underbrace{\mathbf v_j \lVert \mathbf k_j \rVert^2}_{\text{the value}}
#   + \underbrace{\sum_{j'\ne j} \mathbf k_{j'}^\top\mathbf k_j\,\mathbf v_{j'}}_{\text{crosstalk}}.
# $$
#
# Orthonormal keys (at most $d_k$) leave none. For random unit keys $\mathbb E[(\mathbf k_{j'}^\top
# \mathbf k_j)^2] = 1/d_k$, the $n - 1$ terms uncorrelated: the crosstalk's squared size is about
# $\frac{n-1}{d_k}\lVert\mathbf v\rVert^2$, the relative error $\sqrt{(n-1)/d_k}$ (printed above).
#
# ## 2. The delta rule: write only what the memory gets wrong
#
# Ask the memory what it returns for the new key, $S^\top \mathbf k_t$, and store only the
# difference to the new value, scaled by a write strength $\beta_t$:
#
# $$
# S_t = S_{t-1} + \beta_t\, \mathbf k_t\, \big(\mathbf v_t - S_{t-1}^\top \mathbf k_t\big)^\top .
# $$
#
# **This is one gradient step.** Take the recall loss of the new pair and differentiate it
# entry by entry ($c$ indexes key channels, $e$ value channels):
#
# $$
# \begin{align*}
# \mathcal L(S) &= \tfrac12 \lVert S^\top \mathbf k - \mathbf v \rVert^2
#   = \tfrac12 \sum_{e} \Big(\sum_{c} S_{ce}\, k_c - v_e\Big)^2 \\
# \frac{\partial \mathcal L}{\partial S_{ce}} &= k_c \Big(\sum_{c'} S_{c'e}\, k_{c'} - v_e\Big)
#   = k_c\, \big(S^\top \mathbf k - \mathbf v\big)_e \\
# \nabla_S \mathcal L &= \mathbf k\, \big(S^\top \mathbf k - \mathbf v\big)^\top \\
# S - \beta\, \nabla_S \mathcal L
#   &= S + \beta\, \mathbf k\, \big(\mathbf v - S^\top \mathbf k\big)^\top .
# \end{align*}
# $$
#
# The last line is the delta rule, learning rate $\beta$ (checked in float64 against `jax.grad`).

# %%
def delta_write(S, k, v, beta):
    """One delta-rule write (NumPy): S + beta * k (v - S^T k)^T."""
    return S + beta * np.outer(k, v - k @ S)


(key_s0, key_new), beta_demo = jax.random.split(key_delta), 0.7
S0 = np.asarray(jax.random.normal(key_s0, (key_dim, value_dim)), np.float64) / key_dim
(k_new,), (v_new,) = random_pairs(key_new, 1)
with jax.enable_x64(True):
    recall_loss = lambda S: 0.5 * jnp.sum((S.T @ k_new - v_new) ** 2)  # noqa: E731
    grad = np.asarray(jax.grad(recall_loss)(jnp.asarray(S0)))  # float64
assert_close(grad, np.outer(k_new, k_new @ S0 - v_new), atol=1e-12, name="grad = k (S^T k - v)^T")
assert_close(delta_write(S0, k_new, v_new, beta_demo), S0 - beta_demo * grad, atol=1e-12,
             name="delta rule = SGD step")
print("delta rule = one SGD step with learning rate beta (float64)")

# %% [markdown]
# **What one write does to the recall of its own key.** Multiply the update by the unit
# $\mathbf k_t$ ($\mathbf k_t^\top \mathbf k_t = 1$) and subtract $\mathbf v_t$:
#
# $$
# S_t^\top \mathbf k_t - \mathbf v_t = S_{t-1}^\top \mathbf k_t - \mathbf v_t
#   + \beta_t\, \big(\mathbf v_t - S_{t-1}^\top \mathbf k_t\big)\, (\mathbf k_t^\top \mathbf k_t)
#   = (1 - \beta_t)\, \big(S_{t-1}^\top \mathbf k_t - \mathbf v_t\big) .
# $$
#
# The error shrinks by $1 - \beta_t$; at $\beta_t = 1$ a new value under an old key **replaces**
# it exactly (linear attention returns the sum).

# %%
err_before, err_after = k_new @ S0 - v_new, k_new @ delta_write(S0, k_new, v_new, beta_demo) - v_new
assert_close(err_after, (1 - beta_demo) * err_before, atol=1e-12, name="error x (1 - beta)")
v_newer = -v_new  # overwrite: same key, new value
linear_memory = np.outer(k_new, v_new) + np.outer(k_new, v_newer)
delta_memory = delta_write(delta_write(np.zeros_like(S0), k_new, v_new, 1.0), k_new, v_newer, 1.0)
assert_close(k_new @ linear_memory, v_new + v_newer, atol=1e-12, name="linear: sum")
_ = assert_close(k_new @ delta_memory, v_newer, atol=1e-12, name="delta: replaced")

# %% [markdown]
# ## 3. Why one pass cannot store $n$ overlapping pairs
#
# The write of pair $t$ also changes what the memory returns for an **earlier** key
# $\mathbf k_j$. Multiply the update by $\mathbf k_j$ instead of $\mathbf k_t$:
#
# $$
# S_t^\top \mathbf k_j - S_{t-1}^\top \mathbf k_j
#   = \beta_t\, (\mathbf k_t^\top \mathbf k_j)\, \big(\mathbf v_t - S_{t-1}^\top \mathbf k_t\big) .
# $$
#
# Unless $\mathbf k_t \perp \mathbf k_j$, a write that corrects anything moves pair $j$'s recall.
# Storing $n \le d_k$ pairs with independent keys solves $n$ equations $\mathbf k_j^\top S = \mathbf
# v_j^\top$; one pass with $\beta = 1$ is one sweep of **Kaczmarz's method**, an equation at a time:
# exact only for orthogonal keys (generic values); more sweeps converge ($n = d_k / 2$ below).

# %%
pair_keys, pair_values = random_pairs(key_sweep, key_dim // 2)
S_prev = delta_write(np.zeros((key_dim, value_dim)), pair_keys[0], pair_values[0], beta_demo)
S_next = delta_write(S_prev, pair_keys[1], pair_values[1], beta_demo)
correction = pair_values[1] - pair_keys[1] @ S_prev
assert_close(pair_keys[0] @ (S_next - S_prev),
             beta_demo * (pair_keys[1] @ pair_keys[0]) * correction, atol=1e-12,
             name="disturbance of an earlier key")


def sweep(S, keys, values):
    """One pass of the delta rule (beta = 1) over every pair: one Kaczmarz sweep."""
    for k_j, v_j in zip(keys, values, strict=True):
        S = delta_write(S, k_j, v_j, 1.0)
    return S


empty = np.zeros((key_dim, value_dim))
_ = assert_close(ortho_keys @ sweep(empty, ortho_keys, pair_values), pair_values, atol=1e-12,
                 name="orthogonal keys: one sweep recalls every pair")

# %%
S_sweep, sweep_errors, size = empty, [], np.linalg.norm(pair_values)
for _ in range(500):  # geometric, slow where two keys nearly coincide (exercise 2)
    S_sweep = sweep(S_sweep, pair_keys, pair_values)
    sweep_errors.append(np.linalg.norm(pair_keys @ S_sweep - pair_values) / size)
print(f"{len(pair_keys)} pairs, d_k = {key_dim}: relative error after 1 sweep {sweep_errors[0]:.3f}"
      f", 10: {sweep_errors[9]:.1e}, 500: {sweep_errors[-1]:.1e}")
if key_dim >= 16:  # every draw measured at d_k = 16 and 32 passes, with margin; not 4, 8: notes
    assert sweep_errors[0] > 0.05 and sweep_errors[-1] < 1e-9, "one sweep misses; many converge"

# %% [markdown]
# ## 4. Forgetting: scalar decay, then one decay per channel
#
# Collecting the terms in $S_{t-1}$, the delta rule is $S_t = (I - \beta_t \mathbf k_t \mathbf
# k_t^\top) S_{t-1} + \beta_t \mathbf k_t \mathbf v_t^\top$. For a unit key, $I - \beta \mathbf k
# \mathbf k^\top$ multiplies $\mathbf k$ by $1 - \beta$ and leaves the orthogonal directions alone:
# for $\beta \in [0, 1]$ it never amplifies the state, and it removes only what the state holds
# along the key being written: what lies orthogonal to every later key stays for ever, nothing fades
# with time alone. The **gated delta rule** scales the state by $\alpha_t = e^{g_t} \in (0, 1]$
# before the write; **KDA** decays each key channel on its own, $D_t = \operatorname{diag}(e^{
# \mathbf g_t})$, $\mathbf g_t \le 0$: one head keeps some channels long while others turn over
# fast (notebook 02; against one decay per head: the notes). Decay first, then the delta write:
#
# $$
# \begin{align*}
# S_t &= D_t S_{t-1} + \beta_t \mathbf k_t \big(\mathbf v_t - (D_t S_{t-1})^\top \mathbf k_t
#   \big)^\top = \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) D_t\, S_{t-1}
#   + \beta_t \mathbf k_t \mathbf v_t^\top = M_t S_{t-1} + E_t , \\
# M_t &= D_t - \beta_t\, \mathbf k_t (D_t \mathbf k_t)^\top \qquad (\mathbf k_t \mathbf
#   k_t^\top D_t = \mathbf k_t (D_t \mathbf k_t)^\top \text{ since } D_t = D_t^\top).
# \end{align*}
# $$
#
# The transition $M_t$ is **diagonal plus rank one**: cheap to apply, with spectral norm at most
# $\lVert I - \beta_t \mathbf k_t \mathbf k_t^\top \rVert_2\, \lVert D_t \rVert_2 \le 1$.
# KDA reads $\mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k}$ (section 1's read, scaled as softmax
# attention scales; the layer's RMSNorm undoes it; [why `kda_lib` keeps it](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/DESIGN.md#engineering-notes-the-query-scale-and-the-recall-error-from-notebook-01)).

# %%
keys_g = jax.random.split(key_gate, 3)
g_t = -np.asarray(jax.random.uniform(keys_g[0], (key_dim,), maxval=0.5), np.float64)
(k_t,), (v_t,) = random_pairs(keys_g[1], 1)
erase, decay = np.eye(key_dim) - beta_demo * np.outer(k_t, k_t), np.diag(np.exp(g_t))
assert_close(np.linalg.eigvalsh(erase), np.r_[1 - beta_demo, np.ones(key_dim - 1)], atol=1e-12,
             name="eigenvalues of I - beta k k^T")  # eigvalsh sorts them: 1 - beta first
M_t = erase @ decay
assert_close(M_t, decay - beta_demo * np.outer(k_t, decay @ k_t), atol=1e-12,
             name="diagonal plus rank one")
assert_close(delta_write(decay @ S0, k_t, v_t, beta_demo),
             M_t @ S0 + beta_demo * np.outer(k_t, v_t), atol=1e-12, name="decay, then write")
assert np.linalg.norm(M_t, 2) <= 1 + 1e-12, "the KDA transition never amplifies the state"
print(f"|M_t|_2 = {np.linalg.norm(M_t, 2):.3f} <= 1")

# %% [markdown]
# ## 5. KDA in NumPy: three lines per token
#
# `toy_kda` is section 4's update token by token (decay, delta write, read), checked against
# `kda_recurrent` in float64. Its relatives are the same $S_t = M_t S_{t-1} + E_t$ with another
# $M_t$, $E_t$ ($\alpha$: one decay per head; each row checked against `kda_lib` in the [notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-01)):
#
# | model | $M_t$ | $E_t$ |
# |---|---|---|
# | linear attention; Mamba2; GLA | $I$; $\alpha I$; $D$ | $\mathbf k \mathbf v^\top$ |
# | DeltaNet | $I - \beta \mathbf k \mathbf k^\top$ | $\beta \mathbf k \mathbf v^\top$ |
# | Gated DeltaNet | $\alpha(I - \beta\mathbf k \mathbf k^\top)$ | $\beta\mathbf k \mathbf v^\top$ |
# | KDA | $(I - \beta \mathbf k \mathbf k^\top) D$ | $\beta \mathbf k \mathbf v^\top$ |

# %%
def toy_kda(q, k, v, g, beta, scale):
    """KDA, one head, float64: q, k, g [T, K], v [T, V], beta [T] -> outputs, states [T, K, V]."""
    S = np.zeros((k.shape[1], v.shape[1]))
    outputs, states = [], []
    for q_t, k_t, v_t, g_t, b_t in zip(q, k, v, g, beta, strict=True):
        S = np.exp(g_t)[:, None] * S  # forget, channel by channel
        S = S + b_t * np.outer(k_t, v_t - k_t @ S)  # delta rule: write the error
        outputs.append(scale * q_t @ S)  # read after write
        states.append(S)
    return np.array(outputs), np.array(states)


# %%
num_heads, ks = 2, jax.random.split(key_toy, 5)
shape = (1, toy_len, num_heads, key_dim)
q, k = unit_rows(jax.random.normal(ks[0], shape)), unit_rows(jax.random.normal(ks[1], shape))
v = np.asarray(jax.random.normal(ks[2], (1, toy_len, num_heads, value_dim)), np.float64)
beta = np.asarray(jax.random.uniform(ks[3], (1, toy_len, num_heads)), np.float64)
g_channel = -np.asarray(jax.random.uniform(ks[4], shape, maxval=4 / toy_len), np.float64)
with jax.enable_x64(True):
    inputs = (jnp.asarray(a) for a in (q, k, v, g_channel, beta))
    o_lib = np.asarray(kda_lib.kda_recurrent(*inputs)[0])
for h in range(num_heads):
    o_toy = toy_kda(*(x[0, :, h] for x in (q, k, v, g_channel, beta)), scale=key_dim**-0.5)[0]
    assert_close(o_toy, o_lib[0, :, h], atol=1e-12, name=f"toy_kda, head {h}")
print(f"toy_kda == kda_lib.kda_recurrent (float64, {toy_len} tokens, {num_heads} heads)")

# %% [markdown]
# ## 6. How many pairs fit? Recall error against the number of stored pairs
#
# Store $n$ random pairs token by token, query with every stored key, and average $\lVert S^\top
# \mathbf k_j - \mathbf v_j\rVert^2 / \lVert \mathbf v_j\rVert^2$ over pairs and `num_seeds` draws
# (linear attention; delta rule, $\beta = 1$, no decay). Returning $\mathbf 0$ scores $1$.

# %%
all_keys, all_values = random_pairs(key_recall, max_pairs, batch=(num_seeds,))
ones, no_decay = np.ones(max_pairs), np.zeros((max_pairs, key_dim))
errs = {"linear attention": [], "delta rule": []}  # per seed: [memory after n + 1 writes, pair]
for keys_s, values_s in zip(all_keys, all_values, strict=True):
    linear_states = np.cumsum(np.einsum("tk,tv->tkv", keys_s, values_s), axis=0)
    delta_states = toy_kda(keys_s, keys_s, values_s, no_decay, ones, 1.0)[1]
    for name, states in zip(errs, (linear_states, delta_states), strict=True):
        errs[name].append(recall.recall_errors(states, keys_s, values_s))
stored = np.tril(np.ones((max_pairs, max_pairs)))  # stored[n, j]: pair j is in memory n
curves = {n: np.mean([(e * stored).sum(1) / stored.sum(1) for e in errs[n]], 0) for n in errs}
by_seed = {n: np.array([e[-1, ::-1] for e in errs[n]]) for n in errs}  # [seed, age], newest first
by_age = {n: by_seed[n].mean(0) for n in errs}
law = np.arange(max_pairs) / key_dim * value_dim / (value_dim - 2 if value_dim > 2 else np.nan)

# %% tags=["hide-input"]
viz.show(recall.plot_recall_vs_pairs(curves, by_age, key_dim=key_dim, law=law, by_age_seeds=by_seed,
         title=f"Associative recall, $d_k = d_v = {key_dim}$, mean over {num_seeds} seeds"),
         "01_recall_vs_pairs")

# %%
lin, delta_curve = curves["linear attention"], curves["delta rule"]
expected = law[at_k := min(key_dim, max_pairs) - 1]  # (n - 1) / d_k d_v / (d_v - 2) at n = d_k
newest, second = by_age["delta rule"][:2]
old_delta, old_lin = (float(by_age[k][max_pairs // 2:].mean()) for k in reversed(by_age))
assert newest < 1e-12, "beta = 1: the newest pair is recalled exactly"
below = int(np.sum(delta_curve[1:] < lin[1:]))  # n = 2 .. max_pairs
display(Markdown(f"Mean errors at $n = 1$: {lin[0]:.0e} and {delta_curve[0]:.0e} (rounding); at "
    f"$n = d_k = {at_k + 1}$: {lin[at_k]:.2f} (linear attention; expected {expected:.2f}), "
    f"{delta_curve[at_k]:.2f} (delta rule); at $n = {max_pairs}$: {lin[-1]:.2f}, "
    f"{delta_curve[-1]:.2f}. The delta rule's mean is the lower at {below} of the {max_pairs - 1} "
    f"sizes from $n = 2$ on. Delta rule, all written: newest pair {newest:.0e}, the one before "
    f"{second:.3f}; older half {old_delta:.2f} (linear attention {old_lin:.2f})."))

# %% [markdown]
# Linear attention's squared error grows like $\frac{n-1}{d_k} \frac{d_v}{d_v - 2}$ (dotted; the
# factor, $\mathbb E[1/\lVert\mathbf v\rVert^2]$ for Gaussian values of mean square norm 1, is too
# small for the mean printed at $n = d_k$ to show: the notes). The delta rule recalls the newest
# pair exactly (asserted) and, averaged over seeds, better than linear attention at every $n$ from 2
# on, not at zero (section 3): printed above (single seeds can lose: the notes). Beyond $n = d_k$
# (more pairs than $d_k$ rows can hold exactly) the older half ends above 1, worse than returning
# $\mathbf 0$ (printed; right panel: means of `num_seeds` draws, zig-zagging by seed noise, with
# bands of one standard error; dotted: linear attention's expectation, alike at every age).
#
# ## Summary
#
# - Linear attention recalls with crosstalk; the delta rule writes $\beta \mathbf k (\mathbf v -
#   S^\top \mathbf k)^\top$, one SGD step, and overwrites; one pass is one Kaczmarz sweep.
# - KDA's transition $(I - \beta \mathbf k \mathbf k^\top) D_t$ is diagonal plus rank one, of
#   norm at most 1; `toy_kda` writes it in three lines per token, equal to `kda_lib`.
# - Averaged over draws the delta rule recalls better than linear attention from two pairs on.
#
# ## Exercises
#
# Derive each as a formula (NumPy or `jnp`, no `kda_lib`). The checkers judge values only, so a
# simulation of the memory in enough digits would pass too; that is not the exercise. Worked
# solutions: [`notebooks/solutions/ch01.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch01.py).
#
# 1. **Partial writes with a forget gate.** Into an empty memory, repeatedly: decay the state by
#    $\alpha \in (0, 1]$ (section 4), then write the unit-key pair $(\mathbf k, \mathbf v)$ with
#    strength $\beta \in (0, 1]$. The recall $S^\top \mathbf k = \zeta \mathbf v$ tends to
#    $\zeta_\infty \mathbf v$: by what factor $\lambda$ does a step shrink the gap? Does the memory
#    hold $\mathbf v$ if $\alpha < 1$? Write `write_map(beta, alpha) -> (lam, zeta_inf)`, for
#    numbers and for arrays of them. The checker tries $\beta$ near $10^{-9}$, as a float32 gate
#    can make it ($10^{10}$ steps; a float32 $\lambda$ leaves $1 - \lambda$ no digits).
# 2. **How fast do sweeps converge? Two keys.** Sweep two pairs with unit keys of overlap $\mu =
#    \mathbf k_1^\top \mathbf k_2$ (pair 1, then pair 2, $\beta = 1$, from $S = 0$). Follow both
#    recall errors $S^\top \mathbf k_j - \mathbf v_j$ through a sweep (section 3's disturbance
#    formula): `sweep_error(mu, v1, v2, m) -> e`, pair 1's error after $m$ sweeps, right at $m =
#    0$, $\mu = 0, \pm 1$, $\lvert\mu\rvert < 10^{-6}$, and thousands of sweeps at $\mu \approx 1$.

# %%
answer = None  # exercise 1: a function write_map(beta, alpha) -> (lam, zeta_inf)
exercises.check("01.1", answer)
answer = None  # exercise 2: a function sweep_error(mu, v1, v2, m) -> e [V]
exercises.check("01.2", answer)

# %% [markdown]
# ## References
#
# - A. Katharopoulos et al., *Transformers are RNNs* (linear attention), ICML 2020. [arXiv:2006.16236](https://arxiv.org/abs/2006.16236)
# - I. Schlag et al., *Linear transformers are secretly fast weight programmers*, ICML 2021. [arXiv:2102.11174](https://arxiv.org/abs/2102.11174)
# - S. Yang et al., *Parallelizing linear transformers with the delta rule* (DeltaNet), 2024. [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - S. Yang et al., *Gated Delta Networks*, ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - Kimi Team, *Kimi Linear* (KDA), 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - T. Strohmer, R. Vershynin, *A randomized Kaczmarz algorithm* (2009). [arXiv:math/0702226](https://arxiv.org/abs/math/0702226)
# - fla's KDA reference, `fla/ops/kda/naive.py`: [fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention)
