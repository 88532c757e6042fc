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
# **Claim.** Linear attention stores key/value pairs by adding outer products into a
# $d_k \times d_v$ matrix, so every stored pair leaks into every recall. The delta rule writes
# only the part of the value the memory gets wrong: it is one gradient step on the recall error
# $\tfrac12\lVert S^\top \mathbf k - \mathbf v\rVert^2$ with learning rate $\beta$. It recalls the
# newest pair exactly, and its average recall error stays below linear attention's for every
# number of pairs up to the key dimension $d_k$; one pass cannot store them all, because each
# write disturbs the earlier keys it overlaps. Adding a forget gate gives the gated delta rule
# (one decay per head) and then KDA (one decay per key channel), whose per-token transition is
# a diagonal-plus-rank-one matrix. Each step is derived on paper, checked in float64, and built
# as a few lines of NumPy that are checked against `kda_lib`.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/01_delta_rule.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults of the `parameters` cell below; `make notebooks PARAMS=full` runs
# the bigger experiment in `notebooks/params/full/01_delta_rule.yaml`.

# %% tags=["parameters"]
key_dim: int = 32  # K: dimension of keys (and of the memory's rows)
value_dim: int = 32  # V: dimension of values
max_pairs: int = 64  # largest number of key/value pairs stored in the recall experiment
num_seeds: int = 8  # independent draws of keys and values averaged in the recall experiment
toy_len: int = 24  # tokens in the toy-vs-kda_lib comparison
half_life_min: float = 16.0  # tokens: shortest per-channel half-life of the KDA memory
half_life_max: float = 256.0  # tokens: longest per-channel half-life of the KDA memory
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
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.teaching import exercises, viz
from kda_lib.testing import assert_close

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
# Derived values
key = jax.random.key(seed)
key_memory, key_delta, key_gate, key_toy, key_recall = jax.random.split(key, 5)
key_sweep = jax.random.fold_in(key_delta, 1)  # section 3's pairs


def unit_rows(x):
    """Rows scaled to unit L2 norm (float64 NumPy)."""
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


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
# \mathbf v_s$. A scalar times a vector can be written as the vector times the scalar, and the
# sum can be moved inside:
#
# $$
# \begin{align*}
# \mathbf o_t &= \sum_{s \le t} \mathbf v_s\, (\mathbf k_s^\top \mathbf q_t)
#   = \Big(\sum_{s \le t} \mathbf v_s \mathbf k_s^\top\Big) \mathbf q_t
#   = S_t^\top \mathbf q_t,
# \qquad S_t = \sum_{s \le t} \mathbf k_s \mathbf v_s^\top
#   = S_{t-1} + \mathbf k_t \mathbf v_t^\top .
# \end{align*}
# $$
#
# The **state** $S_t$ is a $d_k \times d_v$ memory of key/value pairs, updated by one outer
# product per token. Querying it with a stored key $\mathbf k_j$ gives
#
# $$
# S^\top \mathbf k_j = \sum_i \mathbf v_i\, (\mathbf k_i^\top \mathbf k_j)
#   = \underbrace{\mathbf v_j \lVert \mathbf k_j \rVert^2}_{\text{the value}}
#   + \underbrace{\sum_{i \ne j} (\mathbf k_i^\top \mathbf k_j)\, \mathbf v_i}_{\text{crosstalk}} .
# $$
#
# With orthonormal keys the crosstalk vanishes, but at most $d_k$ keys can be orthonormal. For
# random unit keys $\mathbb E[(\mathbf k_i^\top \mathbf k_j)^2] = 1/d_k$, and the $n - 1$ terms are
# uncorrelated, so the crosstalk's squared size is about $\frac{n-1}{d_k}\lVert\mathbf v\rVert^2$:
# the relative recall error grows like $\sqrt{(n-1)/d_k}$ with $n$ stored pairs. Here and in
# section 3 the relative error is a **ratio of norms**, $\lVert R - V\rVert_F / \lVert V\rVert_F$
# with the recalls $R$ and the values $V$ of all pairs as rows; section 6 uses its **square**,
# per pair.

# %%
n_demo = key_dim // 2
key_pairs_demo, key_queries, key_ortho = jax.random.split(key_memory, 3)
keys, values = random_pairs(key_pairs_demo, n_demo)
queries = unit_rows(jax.random.normal(key_queries, (n_demo, key_dim)))

# attention form vs state form (float64)
causal = np.tril(np.ones((n_demo, n_demo)))
o_attention = ((queries @ keys.T) * causal) @ values
states = np.cumsum(np.einsum("tk,tv->tkv", keys, values), axis=0)  # S_t for every t
o_state = np.einsum("tk,tkv->tv", queries, states)
assert_close(o_state, o_attention, atol=1e-12, name="o_t = S_t^T q_t")

# exact recall with orthonormal keys, crosstalk with random ones
ortho = np.linalg.qr(np.asarray(jax.random.normal(key_ortho, (key_dim, key_dim)), np.float64))[0]
ortho_keys = ortho.T[:n_demo]  # n_demo orthonormal rows
assert_close(ortho_keys @ (ortho_keys.T @ values), values, atol=1e-12, name="orthonormal keys")
memory = keys.T @ values  # S = sum_i k_i v_i^T
recalled = keys @ memory  # row j: S^T k_j
crosstalk = (keys @ keys.T - np.eye(n_demo)) @ values
assert_close(recalled, values + crosstalk, atol=1e-12, name="value + crosstalk")
rel_error = np.linalg.norm(recalled - values) / np.linalg.norm(values)
print(f"{n_demo} random pairs in d_k = {key_dim}: relative recall error {rel_error:.2f} "
      f"(sqrt((n-1)/d_k) = {np.sqrt((n_demo - 1) / key_dim):.2f})")
assert rel_error > 0.25, "random keys should interfere"

# %% [markdown]
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
# The last line is the delta rule with learning rate $\beta$. The first code cell checks the
# third line against `jax.grad` and the fourth against the update, in float64.

# %%
def delta_write(S, k, v, beta):
    """One delta-rule write (NumPy): S + beta * k (v - S^T k)^T."""
    return S + beta * np.outer(k, v - k @ S)


key_s0, key_new = jax.random.split(key_delta)
S0 = np.asarray(jax.random.normal(key_s0, (key_dim, value_dim)), np.float64) / key_dim
(k_new,), (v_new,) = random_pairs(key_new, 1)
beta_demo = 0.7

with jax.enable_x64(True):
    recall_loss = lambda S: 0.5 * jnp.sum((S.T @ k_new - v_new) ** 2)  # noqa: E731
    grad = np.asarray(jax.grad(recall_loss)(jnp.asarray(S0)))  # float64
assert_close(grad, np.outer(k_new, k_new @ S0 - v_new), atol=1e-12, name="grad = k (S^T k - v)^T")
sgd_step = S0 - beta_demo * grad
assert_close(delta_write(S0, k_new, v_new, beta_demo), sgd_step, atol=1e-12,
             name="delta rule = SGD step")
print("gradient and delta rule = one SGD step with learning rate beta: checked in float64")

# %% [markdown]
# **What one write does to the recall of its own key.** Multiply the update by $\mathbf k_t$
# (unit length, $\mathbf k_t^\top \mathbf k_t = 1$) and subtract $\mathbf v_t$:
#
# $$
# \begin{align*}
# S_t^\top \mathbf k_t &= S_{t-1}^\top \mathbf k_t
#   + \beta_t\, \big(\mathbf v_t - S_{t-1}^\top \mathbf k_t\big)\,
#     (\mathbf k_t^\top \mathbf k_t) \\
# S_t^\top \mathbf k_t - \mathbf v_t
#   &= (1 - \beta_t)\, \big(S_{t-1}^\top \mathbf k_t - \mathbf v_t\big) .
# \end{align*}
# $$
#
# The error on the written key shrinks by the factor $1 - \beta_t$; with $\beta_t = 1$ the memory
# returns $\mathbf v_t$ exactly. Writing a new value under an old key therefore **replaces** it,
# where linear attention returns the sum of both.

# %%
err_before, err_after = k_new @ S0 - v_new, k_new @ delta_write(S0, k_new, v_new, beta_demo) - v_new
assert_close(err_after, (1 - beta_demo) * err_before, atol=1e-12, name="error x (1 - beta)")
S1 = delta_write(S0, k_new, v_new, 1.0)
assert_close(k_new @ S1, v_new, atol=1e-12, name="exact recall after a beta = 1 write")

v_newer = -v_new  # overwrite: same key, new value
linear_memory = np.outer(k_new, v_new) + np.outer(k_new, v_newer)
delta_memory = delta_write(delta_write(np.zeros_like(S0), k_new, v_new, 1.0), k_new, v_newer, 1.0)
assert_close(k_new @ linear_memory, v_new + v_newer, atol=1e-12, name="linear: sum")
assert_close(k_new @ delta_memory, v_newer, atol=1e-12, name="delta: replaced")
miss_linear = np.linalg.norm(k_new @ linear_memory - v_newer)
miss_delta = np.linalg.norm(k_new @ delta_memory - v_newer)
print(f"overwrite one key: |recall - new value| = {miss_linear:.2f} (linear attention), "
      f"{miss_delta:.1e} (delta rule)")

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
# Unless $\mathbf k_t \perp \mathbf k_j$, every later write moves pair $j$'s recall by its key
# overlap times the later write's correction, and the delta rule never goes back to repair
# pair $j$. Storing $n$ pairs means solving the $n$ linear equations
# $\mathbf k_j^\top S = \mathbf v_j^\top$ (one per pair) for $S$. With $n \le d_k$ linearly
# independent keys an exact solution exists (for example $S = K^{+} V$, with the keys as the rows
# of $K$ and $K^{+}$ its pseudo-inverse), but one pass of the delta rule with $\beta = 1$ is one
# sweep of **Kaczmarz's method**, which projects onto one equation at a time. One sweep solves
# the system only when the keys are orthogonal; repeated sweeps converge to a solution. With
# $n > d_k$ pairs the equations outnumber the unknowns per value channel and no $S$ recalls them
# all. The cell checks the disturbance formula, then sweeps $n = d_k / 2$ pairs repeatedly.

# %%
pair_keys, pair_values = random_pairs(key_sweep, key_dim // 2)
S_prev = delta_write(np.zeros((key_dim, value_dim)), pair_keys[0], pair_values[0], beta_demo)
S_next = delta_write(S_prev, pair_keys[1], pair_values[1], beta_demo)
correction = pair_values[1] - pair_keys[1] @ S_prev
_ = assert_close(pair_keys[0] @ (S_next - S_prev),
                 beta_demo * (pair_keys[1] @ pair_keys[0]) * correction, atol=1e-12,
                 name="disturbance of an earlier key")


# %%
def sweep(S, keys, values):
    """One pass of the delta rule (beta = 1) over every pair: one Kaczmarz sweep."""
    for k_j, v_j in zip(keys, values, strict=True):
        S = delta_write(S, k_j, v_j, 1.0)
    return S


S_sweep, sweep_errors = np.zeros((key_dim, value_dim)), []
for _ in range(100):
    S_sweep = sweep(S_sweep, pair_keys, pair_values)
    sweep_errors.append(np.linalg.norm(pair_keys @ S_sweep - pair_values)
                        / np.linalg.norm(pair_values))
print(f"{len(pair_keys)} pairs, d_k = {key_dim}: relative recall error after 1 sweep "
      f"{sweep_errors[0]:.3f}, after 10 {sweep_errors[9]:.1e}, after 100 {sweep_errors[-1]:.1e}")
assert sweep_errors[0] > 0.05 and sweep_errors[-1] < 1e-9, "one sweep misses; many converge"
too_many_keys, too_many_values = random_pairs(key_sweep, 2 * key_dim)
best = np.linalg.lstsq(too_many_keys, too_many_values, rcond=None)[0]  # the best S possible
assert np.linalg.norm(too_many_keys @ best - too_many_values) > 0.1, "n > d_k: no exact S"

# %% [markdown]
# **The update as a map of the state.** Collecting the terms in $S_{t-1}$:
#
# $$
# S_t = \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) S_{t-1}
#   + \beta_t \mathbf k_t \mathbf v_t^\top .
# $$
#
# For a unit key, $I - \beta \mathbf k \mathbf k^\top$ leaves every direction orthogonal to
# $\mathbf k$ alone and multiplies $\mathbf k$ by $1 - \beta$: its eigenvalues are $1$ ($d_k - 1$
# times) and $1 - \beta$, so for $\beta \in [0, 1]$ it never amplifies the state.

# %%
transition = np.eye(key_dim) - beta_demo * np.outer(k_new, k_new)
eigenvalues = np.sort(np.linalg.eigvalsh(transition))
assert_close(eigenvalues, np.r_[1 - beta_demo, np.ones(key_dim - 1)], atol=1e-12,
             name="eigenvalues of I - beta k k^T")
print(f"eigenvalues of I - beta k k^T: {eigenvalues[0]:.2f} once, 1.00 x {key_dim - 1}")

# %% [markdown]
# ## 4. Forgetting: scalar decay, then one decay per channel
#
# A memory that only overwrites cannot clear what is no longer relevant. The **gated delta
# rule** multiplies the whole state by a scalar $\alpha_t = e^{g_t} \in (0, 1]$ before the write.
# **KDA** makes the decay per key channel, $D_t = \operatorname{diag}(e^{\mathbf g_t})$ with
# $\mathbf g_t \in \mathbb R^{d_k}$, $\mathbf g_t \le 0$, so one head can keep some channels for
# hundreds of tokens while others turn over in a few. At initialisation the longest half-life
# is $\ln 2 / (1 \cdot 10^{-3}) \approx 693$ tokens (smallest rate $a_h = 1$ times smallest time
# step $\tau = 10^{-3}$, notebook 02); longer memories must be learned (a code cell below
# prints the longest half-life drawn over 64 heads; nothing here is trained). Decay first, then
# the delta write on the decayed state:
#
# $$
# \begin{align*}
# S_t &= D_t S_{t-1}
#   + \beta_t \mathbf k_t \big(\mathbf v_t - (D_t S_{t-1})^\top \mathbf k_t\big)^\top \\
#   &= \big(I - \beta_t \mathbf k_t \mathbf k_t^\top\big) D_t\, S_{t-1}
#   + \beta_t \mathbf k_t \mathbf v_t^\top
#   = M_t S_{t-1} + E_t , \\
# M_t &= D_t - \beta_t\, \mathbf k_t (D_t \mathbf k_t)^\top
#   \qquad (\mathbf k_t \mathbf k_t^\top D_t = \mathbf k_t (D_t \mathbf k_t)^\top
#   \text{ since } D_t = D_t^\top).
# \end{align*}
# $$
#
# The transition $M_t$ is **diagonal plus rank one**: cheap to apply. Its spectral norm is at
# most
# $\lVert I - \beta_t \mathbf k_t \mathbf k_t^\top \rVert_2\, \lVert D_t \rVert_2 \le 1 \cdot 1$.
# `kda_lib.kda_step` is this update followed by the read $\mathbf o_t = S_t^\top \mathbf q_t /
# \sqrt{d_k}$.
#
# **Why $1/\sqrt{d_k}$ on a unit query?** In softmax attention the scale keeps the scores
# $\mathbf q^\top \mathbf k$ of vectors with unit-variance entries at variance about 1. Here
# $\lVert\mathbf q_t\rVert = \lVert\mathbf k_t\rVert = 1$, so $|\mathbf q^\top\mathbf k| \le 1$
# already and the scale only shrinks every output of the head by the same factor $\sqrt{d_k}$.
# It is kept because fla's KDA kernels apply it by default (`scale=None` means $d_k^{-1/2}$) and
# `kda_lib` matches them, so a model trained with fla computes the same outputs here; the
# paper's Eq. (1) writes $\mathbf o_t = S_t^\top \mathbf q_t$ without it. In the layer
# (notebook 04) a per-head RMSNorm follows the read, and
# $\operatorname{RMSNorm}(c\,\mathbf o) = \operatorname{RMSNorm}(\mathbf o)$ for every $c > 0$
# (exactly for $\epsilon = 0$), so there the scale changes nothing but the norm's
# $\epsilon$ margin. The second cell below checks both facts in float64.

# %%
keys_g = jax.random.split(key_gate, 3)
g_t = -np.asarray(jax.random.uniform(keys_g[0], (key_dim,), maxval=0.5), np.float64)
(k_t,), (v_t,) = random_pairs(keys_g[1], 1)
q_t = unit_rows(jax.random.normal(keys_g[2], (key_dim,)))
decay = np.diag(np.exp(g_t))
M_t = (np.eye(key_dim) - beta_demo * np.outer(k_t, k_t)) @ decay
assert_close(M_t, decay - beta_demo * np.outer(k_t, decay @ k_t), atol=1e-12,
             name="diagonal plus rank one")
assert_close(delta_write(decay @ S0, k_t, v_t, beta_demo),
             M_t @ S0 + beta_demo * np.outer(k_t, v_t), atol=1e-12, name="decay, then write")
assert np.linalg.norm(M_t, 2) <= 1 + 1e-12, "the KDA transition never amplifies the state"

# %%
# the longest half-life at initialisation: a_h >= 1 (init_a_log), tau >= 1e-3 (init_dt_bias)
life_bound = np.log(2) / (1.0 * 1e-3)
a_init = np.exp(np.asarray(kda_lib.init_a_log(keys_g[0], 64), np.float64))  # 64 heads
tau_init = np.logaddexp(0.0, np.asarray(kda_lib.init_dt_bias(keys_g[1], 64, key_dim), np.float64))
life_init = np.log(2) / (a_init[:, None] * tau_init.reshape(64, key_dim))
assert life_init.max() <= life_bound * (1 + 1e-4) and round(life_bound) == 693
print(f"half-lives at init over 64 heads x {key_dim} channels: {life_init.min():.2f} to "
      f"{life_init.max():.0f} tokens (bound ln 2 / 1e-3 = {life_bound:.0f})")


def lib_step(S, q, k, v, g, beta):
    """kda_lib.kda_step on one head in float64 (adds and removes the B = H = 1 axes)."""
    with jax.enable_x64(True):
        as_batch = lambda x: jnp.asarray(x, jnp.float64)[None, None]  # noqa: E731
        S, o = kda_lib.kda_step(as_batch(S), as_batch(q), as_batch(k), as_batch(v),
                                as_batch(g), jnp.full((1, 1), beta, jnp.float64))
        return np.asarray(S[0, 0]), np.asarray(o[0, 0])


# %%
S_next, o_next = lib_step(S0, q_t, k_t, v_t, g_t, beta_demo)
assert_close(S_next, M_t @ S0 + beta_demo * np.outer(k_t, v_t), name="kda_step state")
assert_close(o_next, key_dim**-0.5 * q_t @ S_next, name="kda_step read")
assert abs(q_t @ k_t) <= 1, "unit query and key: the score is a cosine, in [-1, 1]"
rms_normed = lambda o: o / np.sqrt(np.mean(o**2))  # noqa: E731  (RMSNorm with eps = 0)
assert_close(rms_normed(o_next), rms_normed(q_t @ S_next), atol=1e-12,
             name="RMSNorm removes the 1/sqrt(d_k)")
raw = np.asarray(jax.random.normal(jax.random.fold_in(key_gate, 9), (2, 4096, key_dim)), np.float64)
scaled_var = np.var(np.sum(raw[0] * raw[1], -1) / np.sqrt(key_dim))
assert 0.9 < scaled_var < 1.1, "softmax's scale: q.k / sqrt(d_k) has variance about 1"

# the gated delta rule is KDA with the same decay in every channel: decay, then delta write
g_scalar = g_t[0]
gated = delta_write(np.exp(g_scalar) * S0, k_t, v_t, beta_demo)
S_uniform, _ = lib_step(S0, q_t, k_t, v_t, np.full(key_dim, g_scalar), beta_demo)
assert_close(S_uniform, gated, name="gated delta rule = KDA with uniform decay")
print(f"|M_t|_2 = {np.linalg.norm(M_t, 2):.3f} <= 1; kda_step matches the matrix form, and "
      "with one decay for all channels it is the gated delta rule")

# %% [markdown]
# ## 5. The whole recurrence in six lines
#
# Everything above fits in one loop. This toy is the mathematical definition `kda_lib`
# implements (per head, with the query scaled by $1/\sqrt{d_k}$ by default); we run it in
# float64 and check it against `kda_lib.kda_recurrent` under `jax.enable_x64`, with the gate
# computed by `kda_lib.kda_gate` from random raw inputs, for two heads.

# %%
def toy_kda(q, k, v, g, beta, scale):
    """One head in float64 NumPy. q, k, g: [T, K]; v: [T, V]; beta: [T].

    Returns the outputs [T, V] and the state after every token [T, K, V].
    """
    S = np.zeros((k.shape[1], v.shape[1]))
    outputs, states = [], []
    for q_t, k_t, v_t, g_t, b_t in zip(q, k, v, g, beta, strict=True):
        S = np.exp(g_t)[:, None] * S  # forget, channel by channel
        S = S + b_t * np.outer(k_t, v_t - k_t @ S)  # delta rule: write the error
        outputs.append(scale * q_t @ S)  # read after write
        states.append(S)
    return np.array(outputs), np.array(states)


# %%
num_heads = 2
ks = jax.random.split(key_toy, 7)
shape = (1, toy_len, num_heads, key_dim)
q = unit_rows(jax.random.normal(ks[0], shape))
k = unit_rows(jax.random.normal(ks[1], shape))
v = np.asarray(jax.random.normal(ks[2], (1, toy_len, num_heads, value_dim)), np.float64)
a_log, dt_bias = kda_lib.init_a_log(ks[4], num_heads), kda_lib.init_dt_bias(ks[5], num_heads,
                                                                            key_dim)
g = np.asarray(kda_lib.kda_gate(jax.random.normal(ks[3], shape), a_log, dt_bias), np.float64)
beta = np.asarray(jax.nn.sigmoid(jax.random.normal(ks[6], (1, toy_len, num_heads))), np.float64)

with jax.enable_x64(True):
    o_lib, state_lib = kda_lib.kda_recurrent(
        *(jnp.asarray(x) for x in (q, k, v, g, beta)), output_final_state=True
    )
    o_lib, state_lib = np.asarray(o_lib), np.asarray(state_lib)
for h in range(num_heads):
    o_toy, states_toy = toy_kda(q[0, :, h], k[0, :, h], v[0, :, h], g[0, :, h], beta[0, :, h],
                                scale=key_dim**-0.5)
    assert_close(o_lib[0, :, h], o_toy, name=f"head {h} outputs")
    assert_close(state_lib[0, h], states_toy[-1], name=f"head {h} final state")
print(f"toy == kda_lib.kda_recurrent (float64, {toy_len} tokens, {num_heads} heads)")

# %% [markdown]
# ## 6. How many pairs fit? Recall error against the number of stored pairs
#
# Store $n$ random pairs (unit keys, values of norm about 1) one token at a time, then query the
# final memory with every stored key and measure the relative recall error
# $\lVert S^\top \mathbf k_j - \mathbf v_j\rVert^2 / \lVert \mathbf v_j\rVert^2$, averaged over
# pairs and over `num_seeds` draws: the **squared** norm ratio, per pair (sections 1 and 3
# printed the plain ratio over all pairs). An error of $1$ is what a memory that returns
# $\mathbf 0$ scores. With the recall $\mathbf r = S^\top \mathbf k_j$, expanding
# $\lVert\mathbf r - \mathbf v\rVert^2 = \lVert\mathbf r\rVert^2 - 2\,\mathbf r^\top\mathbf v
# + \lVert\mathbf v\rVert^2$ shows that the error exceeds 1 **exactly when
# $\lVert\mathbf r\rVert^2 > 2\,\mathbf r^\top \mathbf v$**: when the recall points away from
# the value ($\mathbf r^\top\mathbf v < 0$), but also when it points at it and is too long
# ($\mathbf r = 3\mathbf v$ scores 4). Either way it is worse than returning nothing (checked
# in the first cell below). Three memories: linear attention
# ($S \mathrel{+}= \mathbf k \mathbf v^\top$), the delta rule ($\beta = 1$, no decay) and KDA
# ($\beta = 1$, per-channel decay with half-lives log-uniform in
# [`half_life_min`, `half_life_max`] tokens). One pass over each sequence gives the memory after
# every prefix, so all $n$ come from the same runs.

# %%
def recall_errors(states, keys, values):
    """err[n, j]: relative error recalling pair j from the memory after n + 1 writes."""
    recalled = np.einsum("nkv,jk->njv", states, keys)
    return np.sum((recalled - values[None]) ** 2, -1) / np.sum(values**2, -1)[None]


# error > 1 exactly when |r|^2 > 2 r.v: r = 3v scores 4 while pointing at v
v_x = random_pairs(key_recall, 1)[1]  # [1, V]
err_3v = recall_errors(3 * v_x[None], np.ones((1, 1)), v_x)[0, 0]  # one memory, K = 1, key 1
assert np.isclose(err_3v, 4.0, atol=1e-12)
along, off = (np.asarray(x, np.float64) for x in jax.random.uniform(
    jax.random.fold_in(key_recall, 1), (2, 1000, 1), minval=-1.0, maxval=3.0))
noise = np.asarray(jax.random.normal(jax.random.fold_in(key_recall, 2), (1000, value_dim)))
r_x = along * v_x + np.abs(off) * noise / np.sqrt(value_dim)  # recalls around the line of v
err_x = np.sum((r_x - v_x) ** 2, -1) / np.sum(v_x**2)
assert np.array_equal(err_x > 1, np.sum(r_x**2, -1) > 2 * r_x @ v_x[0])
toward = (err_x > 1) & (r_x @ v_x[0] > 0)  # worse than 0, yet pointing at v
assert toward.any() and ((err_x > 1) & (r_x @ v_x[0] < 0)).any()
print(f"r = 3v: error {err_3v:.1f}; error > 1 <=> |r|^2 > 2 r.v on {len(r_x)} random recalls "
      f"({np.mean(err_x > 1):.0%} above 1, {np.mean(toward):.0%} of all with r.v > 0)")


# %%
key_pairs, key_life = jax.random.split(key_recall)
all_keys, all_values = random_pairs(key_pairs, max_pairs, batch=(num_seeds,))
log_life = jax.random.uniform(key_life, (num_seeds, key_dim), minval=np.log(half_life_min),
                              maxval=np.log(half_life_max))
g_channels = np.log(0.5) / np.exp(np.asarray(log_life, np.float64))  # per step, <= 0
stored = np.tril(np.ones((max_pairs, max_pairs)))  # stored[n, j]: pair j is in memory n
curves = {"linear attention": [], "delta rule": [], "KDA": []}
by_age = {name: [] for name in curves}
ones, no_decay = np.ones(max_pairs), np.zeros((max_pairs, key_dim))
for s in range(num_seeds):
    keys_s, values_s = all_keys[s], all_values[s]
    memories = {
        "linear attention": np.cumsum(np.einsum("tk,tv->tkv", keys_s, values_s), axis=0),
        "delta rule": toy_kda(keys_s, keys_s, values_s, no_decay, ones, 1.0)[1],
        "KDA": toy_kda(keys_s, keys_s, values_s, np.tile(g_channels[s], (max_pairs, 1)), ones,
                       1.0)[1],
    }
    for name, states in memories.items():
        err = recall_errors(states, keys_s, values_s)
        curves[name].append((err * stored).sum(1) / stored.sum(1))
        by_age[name].append(err[-1, ::-1])  # after all writes, newest pair first
curves = {name: np.mean(c, axis=0) for name, c in curves.items()}
by_age = {name: np.mean(c, axis=0) for name, c in by_age.items()}

# %% tags=["hide-input"]
n_pairs = np.arange(1, max_pairs + 1)
fig, (ax_n, ax_age) = plt.subplots(1, 2, figsize=(10, 3.8))
styles = {"linear attention": "-", "delta rule": "--", "KDA": "-."}
for name, curve in curves.items():
    ax_n.plot(n_pairs, curve, styles[name], label=name)
    ax_age.plot(np.arange(max_pairs), by_age[name], styles[name], label=name)
ax_n.axvline(key_dim, color="0.4", linewidth=1, linestyle=":")
ax_n.annotate(f"$n = d_k = {key_dim}$", (key_dim, 0.02), xycoords=("data", "axes fraction"),
              xytext=(4, 0), textcoords="offset points", fontsize=9, color="0.3")
ax_n.set(title="Recall error vs pairs stored", xlabel="stored key/value pairs $n$",
         ylabel=r"mean $\|S^\top k - v\|^2 / \|v\|^2$")
ax_n.legend(loc="upper left")
ax_age.axhline(1.0, color="0.4", linewidth=1, linestyle=":")
ax_age.annotate("error 1: what returning 0 scores", (max_pairs - 1, 1.0), xytext=(0, -12),
                textcoords="offset points", ha="right", fontsize=9, color="0.3")
ax_age.legend(loc="lower right")
ax_age.set(title=f"After {max_pairs} writes: error by age of the pair",
           xlabel="age of the pair (writes since it was stored)",
           ylabel=r"$\|S^\top k - v\|^2 / \|v\|^2$")
fig.suptitle(f"Associative recall, $d_k = d_v = {key_dim}$, mean over {num_seeds} seeds")
viz.show(fig, "01_recall_vs_pairs")

# %%
lin, delta, kda_curve = curves["linear attention"], curves["delta rule"], curves["KDA"]
upto_k = slice(1, min(key_dim, max_pairs))  # n = 2 .. d_k (n = 1 is exact for all three)
assert np.all(delta[upto_k] < lin[upto_k]), "delta rule should beat linear attention for n <= K"
assert max(lin[0], delta[0], kda_curve[0]) < 1e-12, "one pair is recalled exactly"
at_k = min(key_dim, max_pairs) - 1
assert abs(lin[at_k] - at_k / key_dim) < 0.3 * at_k / key_dim, "linear: about (n - 1) / d_k"
old = slice(max_pairs // 2, None)  # the older half of the pairs, after all writes
old_error = {name: float(by_age[name][old].mean()) for name in by_age}
beyond = max_pairs >= 2 * key_dim
if beyond:
    assert kda_curve[-1] < delta[-1], "beyond capacity, KDA's decay lowers the mean error"
    assert min(old_error["delta rule"], old_error["KDA"]) > 1, "old pairs: worse than nothing"
display(Markdown(
    f"At $n = d_k = {at_k + 1}$ the mean errors are linear attention {lin[at_k]:.2f}, delta "
    f"rule {delta[at_k]:.2f}, KDA {kda_curve[at_k]:.2f}; at $n = {max_pairs}$ they are "
    f"{lin[-1]:.2f}, {delta[-1]:.2f} and {kda_curve[-1]:.2f}. The older half of the pairs "
    f"ends at {old_error['linear attention']:.2f}, {old_error['delta rule']:.2f} and "
    f"{old_error['KDA']:.2f}: "
    + ("above 1 for every memory, so an old pair is not forgotten cleanly but recalled as "
       "interference." if min(old_error.values()) > 1 else "see the right panel.")))

# %% [markdown]
# Reading the figure: linear attention's error grows like $(n-1)/d_k$ from the first
# overlapping pair on. The delta rule recalls the newest pairs exactly and stays below linear
# attention up to $n = d_k$, but not at zero: each write disturbs the older pairs it overlaps
# (section 3), so a one-pass memory holds fewer than $d_k$ random pairs well. Beyond capacity
# the old pairs of both delta-rule memories end with errors above 1 (the right panel): what
# they return for an old key is mostly the residue of later writes, worse than returning
# nothing. KDA's decay, with half-lives of at least `half_life_min` tokens here, is too slow to
# clear them in `max_pairs` writes; it barely changes the recent pairs and lowers the mean a
# little. In a trained model the gates choose, per channel and per token, how long to remember;
# notebook 02 looks at those gates.
#
# ## Summary
#
# - Linear attention's state $S = \sum \mathbf k \mathbf v^\top$ is an associative memory whose
#   recall of pair $j$ carries crosstalk $\sum_{i \ne j} (\mathbf k_i^\top \mathbf k_j)\mathbf v_i$
#   (identity checked).
# - The delta rule writes $\beta \mathbf k (\mathbf v - S^\top \mathbf k)^\top$: one SGD step on
#   $\tfrac12 \lVert S^\top \mathbf k - \mathbf v\rVert^2$ (derived, checked with `jax.grad`); it
#   shrinks the written key's error by $1 - \beta$ and overwrites old values.
# - One pass is one Kaczmarz sweep: each write disturbs earlier overlapping keys, so one pass
#   does not store $n \le d_k$ random pairs exactly; repeated sweeps do (checked).
# - Gated delta rule = scalar decay; KDA = per-channel decay, a diagonal-plus-rank-one
#   transition $M_t$ with spectral norm at most 1; `kda_step` is exactly that update and read.
# - A six-line NumPy recurrence equals `kda_lib.kda_recurrent` in float64.
# - Recall: the delta rule beats linear attention for every $n \le d_k$ (asserted); the numbers
#   above come from this run.
#
# ## Exercises
#
# 1. **Partial writes.** Write the same pair $(\mathbf k, \mathbf v)$ `writes` times with
#    strength $\beta$ into an empty memory. From section 2's error formula, derive the fraction
#    of $\mathbf v$ the memory returns for $\mathbf k$ and write it as a function
#    `recalled_fraction(beta, writes)`; the checker tries values of its own.
# 2. **Orthogonal keys do not interfere; others do.** Write `one_pass(keys, values)`: the
#    memory $S$ `[K, V]` after one delta-rule pass ($\beta = 1$, in order, from $S = 0$) over
#    the pairs `keys [n, K]` (unit rows), `values [n, V]`. Try it on `(ortho_keys_ex,
#    values_ex)`: every pair comes back. The checker also runs it on generic unit keys, where
#    one pass recalls only the newest pair exactly, so a linear solve is not an answer.
# 3. **Negative eigenvalues.** fla's `allow_neg_eigval` lets $\beta \in [0, 2]$. Write
#    `eigenvalues(beta, k)` returning the eigenvalues of $I - \beta \mathbf k \mathbf k^\top$
#    for a unit $\mathbf k$, and show on paper that the spectral norm stays at most 1, so the
#    state still cannot blow up.
# 4. **Derive and implement the gated delta rule's step.** Gated DeltaNet is KDA with one decay
#    $\alpha_t \in (0, 1]$ for the whole head, $D_t = \alpha_t I$. From section 4's derivation,
#    write its update as a transition times $S_{t-1}$ plus a write, then implement
#    `gdn_step(S, k, v, alpha, beta)` in NumPy (float64; `S: [K, V]`, `k: [K]` unit, `v: [V]`).
#    The checker compares it with `kda_lib.kda_step` at equal decay in every channel.
#
# Each cell below says whether your answer is right without showing the expected one; worked
# solutions (with the derivations) are in `notebooks/solutions/ch01.py`.

# %%
answer = None  # exercise 1: a function recalled_fraction(beta, writes) -> a number
exercises.check("01.1", answer)

# %%
ortho_keys_ex, values_ex = ortho.T, random_pairs(key_ortho, key_dim)[1]  # [K, K], [K, V]
answer = None  # exercise 2: a function one_pass(keys, values) -> the memory S [K, V]
exercises.check("01.2", answer)

# %%
answer = None  # exercise 3: a function eigenvalues(beta, k) -> the K eigenvalues
exercises.check("01.3", answer, key_dim=key_dim)

# %%
answer = None  # exercise 4: a function gdn_step(S, k, v, alpha, beta) -> the next state [K, V]
exercises.check("01.4", answer, key_dim=key_dim, value_dim=value_dim)

# %% [markdown]
# ## References
#
# - A. Katharopoulos, A. Vyas, N. Pappas, F. Fleuret, *Transformers are RNNs: fast
#   autoregressive transformers with linear attention*, ICML 2020.
#   [arXiv:2006.16236](https://arxiv.org/abs/2006.16236)
# - I. Schlag, K. Irie, J. Schmidhuber, *Linear transformers are secretly fast weight
#   programmers*, ICML 2021 (the delta rule as a fast-weight update).
#   [arXiv:2102.11174](https://arxiv.org/abs/2102.11174)
# - S. Yang, B. Wang, Y. Zhang, Y. Shen, Y. Kim, *Parallelizing linear transformers with the
#   delta rule over sequence length* (DeltaNet), NeurIPS 2024.
#   [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta
#   rule*, ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (KDA), 2025.
#   [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - T. Strohmer, R. Vershynin, *A randomized Kaczmarz algorithm with exponential convergence*,
#   2009 (Kaczmarz's method). [arXiv:math/0702226](https://arxiv.org/abs/math/0702226)
# - fla's reference implementation of KDA:
#   [fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention)
#   (`fla/ops/kda/naive.py`).
