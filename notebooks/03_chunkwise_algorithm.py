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
# # 03 · The chunkwise algorithm: KDA with matrix multiplies
#
# **Claim.** The token-by-token recurrence can be regrouped into chunks of $C$ tokens. Each
# chunk acts on the state entering it as an affine map
# $S_{\text{out}} = M_{[i]} S_{\text{in}} + E_{[i]}$, and the map and the chunk's own outputs come
# from one unit-lower-triangular solve per chunk (the WY/UT form), computed for every chunk in
# parallel with matrix products. Across chunks only the state travels: `kda_lib`'s default
# pass corrects each chunk's values with the state entering it and updates the state, two
# matrix products per chunk in $T / C$ sequential steps, without forming any
# $d_k \times d_k$ map; the maps serve the associative scan (about $2 \log_2(T / C)$ rounds)
# and context parallelism (notebook 05). We derive the map in five steps, each checked in
# float64, build it by hand, chain the chunks three ways, and check that the result equals the
# recurrence; then we count the cost of each form against XLA's own count, see why kernels cut
# chunks into 16-token sub-chunks, and time the forms alongside softmax attention.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/03_chunkwise_algorithm.ipynb)
#
# Symbols follow the notation table,
# [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults of the `parameters` cell below; `make notebooks PARAMS=full` runs
# the bigger experiment in `notebooks/params/full/03_chunkwise_algorithm.yaml`.

# %% tags=["parameters"]
seq_len: int = 128  # T: tokens in the correctness checks (a multiple of chunk_size)
chunk_size: int = 32  # C: tokens per chunk (a power of two, at least 16)
num_heads: int = 2  # heads in the correctness checks
key_dim: int = 32  # K
value_dim: int = 16  # V (different from K on purpose)
lower_bound: float = -5.0  # safe gate bound used for every gate here (tokamax needs it)
timing_lengths: list = [256, 1024]  # T values timed live (tokens)
timing_heads: int = 2  # heads in the timing runs (batch 1)
timing_dim: int = 64  # K and V in the timing runs
timing_backward: bool = False  # also time forward + backward (gradient of sum of outputs)
timing_repeats: int = 3  # timed calls per point, after one warm-up call; the median is shown
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
from kda_lib.lab.measure import median_ms
from kda_lib.lab.records import load_benchmark_runs, load_recorded
from kda_lib.ops import costs
from kda_lib.ops.chunked import chain_states, chunk_affine_maps, compose_affine, unit_lower_inverse
from kda_lib.teaching import viz
from kda_lib.teaching.exercises import check
from kda_lib.testing import assert_close, random_kda_inputs

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
# Derived values
assert seq_len % chunk_size == 0, "the hand-built chunks below need T to be a multiple of C"
num_chunks = seq_len // chunk_size
scale = key_dim**-0.5
key = jax.random.key(seed)
key_inputs, key_state, key_timing = jax.random.split(key, 3)
x = random_kda_inputs(key_inputs, 1, seq_len, num_heads, key_dim, value_dim, gate="raw")
key_a, key_dt = jax.random.split(jax.random.fold_in(key_inputs, 1))
a_log = kda_lib.init_a_log(key_a, num_heads, safe_gate=True)  # the gates of a new layer
dt_bias = kda_lib.init_dt_bias(key_dt, num_heads, key_dim)
g32 = kda_lib.kda_gate(x["g"], a_log, dt_bias, lower_bound=lower_bound)  # raw input x["g"]
# float64 NumPy copies: everything below is checked in float64
q, k, v, g, beta = (np.asarray(a, np.float64) for a in (x["q"], x["k"], x["v"], g32, x["beta"]))
S_in = np.asarray(jax.random.normal(key_state, (1, num_heads, key_dim, value_dim)), np.float64)


def to_chunks(a):
    """[1, T, H, ...] -> [1, H, N, C, ...], the layout of kda_lib.ops.chunked.chunk_affine_maps."""
    a = a.reshape(1, num_chunks, chunk_size, num_heads, *a.shape[3:])
    return np.moveaxis(a, 3, 1)


# %% [markdown]
# ## 1. A chunk is an affine map of the state
#
# Per token the state update is $S_t = M_t S_{t-1} + E_t$ with the diagonal-plus-rank-one
# transition $M_t = (I - \beta_t \mathbf k_t \mathbf k_t^\top) D_t$ and the write
# $E_t = \beta_t \mathbf k_t \mathbf v_t^\top$ (notebook 01). Composing $C$ such steps is still
# affine in the state $S_0 = S_{\text{in}}$ that entered the chunk:
#
# $$
# S_C = \underbrace{M_C \cdots M_1}_{M_{[i]}\ (d_k \times d_k)} S_{\text{in}}
#   + \underbrace{\textstyle\sum_{t=1}^{C} M_C \cdots M_{t+1} E_t}_{E_{[i]}\ (d_k \times d_v)} ,
# $$
#
# and $E_{[i]}$ is the state the chunk would produce from $S_{\text{in}} = 0$. The outputs are
# affine in $S_{\text{in}}$ too: $O = Q^{\text{eff}} S_{\text{in}} + O^{\text{intra}}$ with
# $O \in \mathbb R^{C \times d_v}$. `kda_lib.ops.chunked.chunk_affine_maps` returns all four for
# every
# chunk at once; here we check them against the product of transitions and against
# `kda_recurrent` started from a random $S_{\text{in}}$, for the first chunk of head 0.

# %%
with jax.enable_x64(True):
    maps = jax.jit(chunk_affine_maps, static_argnames=["scale"])(
        *(jnp.asarray(to_chunks(a)) for a in (q, k, v, g, beta)), scale=scale)
    maps = jax.tree.map(np.asarray, maps)  # ChunkMaps(transition, state_ext, q_eff, o_intra)
    first = slice(0, chunk_size)
    o_chunk, s_out = kda_lib.kda_recurrent(
        *(jnp.asarray(a[:, first]) for a in (q, k, v, g, beta)),
        initial_state=jnp.asarray(S_in), output_final_state=True,
    )
    o_chunk, s_out = np.asarray(o_chunk), np.asarray(s_out)

h, i = 0, 0  # head 0, chunk 0
M, E = maps.transition[0, h, i], maps.state_ext[0, h, i]
product = np.eye(key_dim)
for t in range(chunk_size):
    k_t, g_t, b_t = k[0, t, h], g[0, t, h], beta[0, t, h]
    product = (np.eye(key_dim) - b_t * np.outer(k_t, k_t)) @ np.diag(np.exp(g_t)) @ product
assert_close(M, product, name="M = M_C ... M_1")
assert_close(M @ S_in[0, h] + E, s_out[0, h], name="S_out = M S_in + E")
assert_close(maps.q_eff[0, h, i] @ S_in[0, h] + maps.o_intra[0, h, i], o_chunk[0, :, h],
             name="O = Q_eff S_in + O_intra")
print(f"chunk of C = {chunk_size} tokens: M is {M.shape}, E {E.shape}; "
      f"|M|_2 = {np.linalg.norm(M, 2):.3f} (never above 1)")
assert np.linalg.norm(M, 2) <= 1 + 1e-9

# %% [markdown]
# ## 2. Inside a chunk: deriving the WY/UT form in five steps
#
# Number the chunk's tokens $t = 1, \dots, C$ and write $\Gamma_t = D_t D_{t-1} \cdots D_1 =
# \operatorname{diag}(e^{\boldsymbol\gamma_t})$ for the decay from the chunk start to token $t$
# ($\boldsymbol\gamma_t = \mathbf g_1 + \dots + \mathbf g_t$). Every step below is followed by a
# float64 check on the first chunk of head 0. The cell first runs the recurrence through the
# chunk, keeping each state $S_t$ and each **pseudo-value**
# $\boldsymbol\delta_t = \beta_t\big(\mathbf v_t - (D_t S_{t-1})^\top \mathbf k_t\big)$, what
# token $t$ really writes: $S_t = D_t S_{t-1} + \mathbf k_t \boldsymbol\delta_t^\top$.
#
# **Step 1: unroll.** Apply $S_t = D_t S_{t-1} + \mathbf k_t \boldsymbol\delta_t^\top$ repeatedly;
# a write at token $s$ is decayed by $D_t \cdots D_{s+1} = \Gamma_t \Gamma_s^{-1}$ by token $t$:
#
# $$
# S_t = \Gamma_t S_0
#   + \sum_{s \le t} \Gamma_t \Gamma_s^{-1}\, \mathbf k_s \boldsymbol\delta_s^\top .
# $$

# %%
qc, kc, vc, gc, bc = (to_chunks(a)[0, h, i] for a in (q, k, v, g, beta))  # one chunk, one head
S_t, states, deltas = S_in[0, h], [], []
for t in range(chunk_size):  # the recurrence, keeping the pseudo-values
    decayed = np.exp(gc[t])[:, None] * S_t
    deltas.append(bc[t] * (vc[t] - kc[t] @ decayed))
    S_t = decayed + np.outer(kc[t], deltas[-1])
    states.append(S_t)
Delta = np.array(deltas)  # [C, V], row t = delta_t
gamma = np.cumsum(gc, axis=0)  # [C, K], row t = gamma_t
ratio = np.exp(gamma[:, None, :] - gamma[None, :, :])  # [t, s, K]: diagonal of Gamma_t Gamma_s^-1
causal = np.tril(np.ones((chunk_size, chunk_size)))
for t in (0, chunk_size // 2, chunk_size - 1):
    unrolled = np.exp(gamma[t])[:, None] * S_in[0, h] + np.einsum(
        "s,sc,sv->cv", causal[t], ratio[t] * kc, Delta)
    assert_close(unrolled, states[t], atol=1e-12, name=f"step 1: unrolled S_{t + 1}")
print("step 1 checked: S_t = Gamma_t S_0 + sum_s Gamma_t Gamma_s^-1 k_s delta_s^T")

# %% [markdown]
# **Step 2: a triangular system.** Put the unrolled $S_{t-1}$ into the definition of
# $\boldsymbol\delta_t$ (note $D_t \Gamma_{t-1} = \Gamma_t$, and $\Gamma_t$ is diagonal):
#
# $$
# \begin{align*}
# \boldsymbol\delta_t &= \beta_t \mathbf v_t - \beta_t \Big(\Gamma_t S_0
#   + \sum_{s < t} \Gamma_t \Gamma_s^{-1} \mathbf k_s \boldsymbol\delta_s^\top\Big)^\top
#   \mathbf k_t \\
# &= \beta_t \mathbf v_t - \beta_t S_0^\top (\Gamma_t \mathbf k_t)
#   - \sum_{s < t}
#   \underbrace{\beta_t\, \mathbf k_t^\top \Gamma_t \Gamma_s^{-1} \mathbf k_s}_{L_{ts}}
#   \boldsymbol\delta_s .
# \end{align*}
# $$
#
# Stack the rows: with $\overleftarrow K$ the keys decayed from the chunk start to their token
# (rows $\Gamma_t \mathbf k_t$) and $L$ strictly lower triangular,
#
# $$
# (I + L)\, \Delta = \operatorname{diag}(\boldsymbol\beta)\, V
#   - \operatorname{diag}(\boldsymbol\beta)\, \overleftarrow K S_0 .
# $$

# %%
strict = np.tril(np.ones((chunk_size, chunk_size)), -1)
L = bc[:, None] * np.einsum("tc,sc,tsc->ts", kc, kc, ratio) * strict
K_in = kc * np.exp(gamma)  # rows Gamma_t k_t
rhs = bc[:, None] * vc - bc[:, None] * (K_in @ S_in[0, h])
assert_close((np.eye(chunk_size) + L) @ Delta, rhs, atol=1e-12, name="step 2: (I + L) Delta")
print("step 2 checked: (I + L) Delta = diag(beta) V - diag(beta) K_in S_0")

# %% [markdown]
# **Step 3: the UT transform.** $I + L$ is unit lower triangular, hence invertible, and its
# inverse does not depend on $S_0$. Solving once per chunk gives the pseudo-values for **any**
# entering state:
#
# $$
# \Delta = \tilde V - \tilde K S_0, \qquad
# \tilde V = (I + L)^{-1} \operatorname{diag}(\boldsymbol\beta) V, \qquad
# \tilde K = (I + L)^{-1} \operatorname{diag}(\boldsymbol\beta) \overleftarrow K .
# $$
#
# (The WY literature and `kda_lib`'s code call $\tilde V$ and $\tilde K$ `U` and `W`.)

# %%
solve = np.linalg.inv(np.eye(chunk_size) + L)
U, W = solve @ (bc[:, None] * vc), solve @ (bc[:, None] * K_in)  # V~ and K~
assert_close(U - W @ S_in[0, h], Delta, atol=1e-12, name="step 3: Delta = V~ - K~ S_0")
with jax.enable_x64(True):
    inv_lib = np.asarray(unit_lower_inverse(jnp.asarray(L)))
    inv_tri = np.asarray(jax.scipy.linalg.solve_triangular(
        jnp.eye(chunk_size) + jnp.asarray(L), jnp.eye(chunk_size), lower=True))
assert_close(inv_lib, solve, name="unit_lower_inverse")
assert_close(inv_tri, solve, name="solve_triangular")
print("step 3 checked; (I + L)^-1 three ways agree")

# %% [markdown]
# **Step 4: the chunk's affine map.** Step 1 at $t = C$, with $\overrightarrow K$ the keys
# decayed from their token to the chunk end (rows $\Gamma_C \Gamma_s^{-1} \mathbf k_s$), then
# step 3:
#
# $$
# \begin{align*}
# S_C &= \Gamma_C S_0 + \overrightarrow K^\top \Delta
#   = \Gamma_C S_0 + \overrightarrow K^\top (\tilde V - \tilde K S_0) \\
# &= \underbrace{\big(\Gamma_C - \overrightarrow K^\top \tilde K\big)}_{M_{[i]}} S_0
#   + \underbrace{\overrightarrow K^\top \tilde V}_{E_{[i]}} .
# \end{align*}
# $$

# %%
K_out = kc * np.exp(gamma[-1] - gamma)  # rows Gamma_C Gamma_s^-1 k_s
assert_close(np.exp(gamma[-1])[:, None] * S_in[0, h] + K_out.T @ Delta, states[-1], atol=1e-12,
             name="step 4: S_C = Gamma_C S_0 + K_out^T Delta")
assert_close(np.diag(np.exp(gamma[-1])) - K_out.T @ W, M, name="step 4: M = Gamma_C - K_out^T K~")
assert_close(K_out.T @ U, E, name="step 4: E = K_out^T V~")
print("step 4 checked: M and E by hand == chunk_affine_maps")

# %% [markdown]
# $M_{[i]} = \Gamma_C - \overrightarrow K^\top \tilde K$ is the **WY representation** (Bischof
# and Van Loan; step 3's triangular solve is its UT-transform variant): a product of $C$
# rank-one updates of the identity, $\prod_t (I - \beta_t \mathbf k_t \mathbf k_t^\top)$,
# written as the identity minus one matrix of rank at most $C$,
# $\overrightarrow K^\top \tilde K$, applied with two matrix products instead of $C$ vector
# steps. Decay turns the identity into the diagonal $\Gamma_C$: diagonal minus low rank
# (exercise 2 is the case $\mathbf g = 0$). Each token's transition is diagonal plus rank one,
# $M_t = (I - \beta_t \mathbf k_t \mathbf k_t^\top) D_t
# = D_t - \beta_t \mathbf k_t (D_t \mathbf k_t)^\top$, both low-rank vectors built from the key
# (checked below): the Kimi Linear paper calls KDA's transition a specialised variant of
# diagonal-plus-low-rank (DPLR) matrices and reports that the specialisation substantially
# reduces computation compared with the general DPLR formulation.

# %%
D_t = np.diag(np.exp(gc[0]))  # token 1's decay
assert_close((np.eye(key_dim) - bc[0] * np.outer(kc[0], kc[0])) @ D_t,
             D_t - bc[0] * np.outer(kc[0], D_t @ kc[0]), atol=1e-14, name="M_t is DPLR")
print("M_t = D_t - beta_t k_t (D_t k_t)^T checked")

# %% [markdown]
# **Step 5: the outputs.** The read is $\mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k}$. Put in
# step 1 and collect the causal decayed scores
# $P_{ts} = \mathbf q_t^\top \Gamma_t \Gamma_s^{-1} \mathbf k_s / \sqrt{d_k}$ ($s \le t$) and the
# queries decayed from the chunk start to their token, $\overleftarrow Q$ (rows
# $\Gamma_t \mathbf q_t$):
#
# $$
# \begin{align*}
# \mathbf o_t &= \tfrac{1}{\sqrt{d_k}} S_0^\top \Gamma_t \mathbf q_t
#   + \sum_{s \le t} P_{ts}\, \boldsymbol\delta_s
# \quad\Longrightarrow\quad
# O = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S_0 + P \Delta
#   = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S_0 + P (\tilde V - \tilde K S_0) \\
# &\Longrightarrow\quad O = \underbrace{\big(\tfrac{1}{\sqrt{d_k}} \overleftarrow Q
#   - P \tilde K\big)}_{Q^{\text{eff}}} S_0 + \underbrace{P \tilde V}_{O^{\text{intra}}} .
# \end{align*}
# $$
#
# Every product here is a dense matrix multiply over the chunk; the only sequential piece, the
# triangular solve, is a $C \times C$ matrix that `unit_lower_inverse` inverts with matrix
# products.

# %%
P = scale * np.einsum("tc,sc,tsc->ts", qc, kc, ratio) * causal
Q_in = qc * np.exp(gamma)  # rows Gamma_t q_t
outputs_chunk = np.array([scale * s_t.T @ q_t for s_t, q_t in zip(states, qc, strict=True)])
assert_close(scale * Q_in @ S_in[0, h] + P @ Delta, outputs_chunk, atol=1e-12,
             name="step 5: O = Q_in S_0 / sqrt(d_k) + P Delta")
assert_close(scale * Q_in - P @ W, maps.q_eff[0, h, i], name="step 5: Q_eff")
assert_close(P @ U, maps.o_intra[0, h, i], name="step 5: O_intra")
print("step 5 checked: Q_eff and O_intra by hand == chunk_affine_maps")

# %% [markdown]
# **What overflows.** The cells above form $e^{\boldsymbol\gamma_t - \boldsymbol\gamma_s}$ as one
# exponential of a difference. Where it is used, $s \le t$, the exponent is $\le 0$, so it
# cannot overflow (at worst it underflows to 0, where the true value is below float32's range
# anyway). Two other ways of computing the same scores do overflow in float32, whose largest
# number is $e^{88.7}$ (float64's is $e^{709.8}$, which is why the float64 cells above may
# compute the whole square and mask it):
#
# - **the factorisation** that makes $P$ one matrix product,
#   $P = \tfrac{1}{\sqrt{d_k}} (Q \odot e^{\boldsymbol\gamma})
#   (K \odot e^{-\boldsymbol\gamma})^\top$:
#   $e^{-\boldsymbol\gamma_s}$ passes $e^{88.7}$ once a channel has decayed by more than that
#   since the chunk start, and $e^{\boldsymbol\gamma_t}$ underflows to 0, so entries become
#   $\infty$ or $0 \cdot \infty = $ NaN;
# - **the full square, masked afterwards**: above the diagonal ($s > t$) the exponent is
#   positive, $e^{\boldsymbol\gamma_t - \boldsymbol\gamma_s}$ overflows to $\infty$, and the
#   causal mask multiplies it by 0: NaN.
#
# The cell shows both, in float32, at the safe gate's floor ($g = $ `lower_bound` in every
# channel, every token), after checking the factorisation itself in float64 on this chunk,
# where it is exact. Section 4 shows how kernels keep the one-matmul form anyway.

# %%
log_max32 = float(np.log(np.finfo(np.float32).max))  # exp overflows above this
assert 88.7 < log_max32 < 88.8 and 709.7 < np.log(np.finfo(np.float64).max) < 709.8
assert np.isfinite(ratio).all()  # the float64 square above, upper triangle included
gam32 = jnp.cumsum(jnp.full((chunk_size, 1), lower_bound, jnp.float32), axis=0)  # gamma_t
direct32 = np.asarray(jnp.exp(gam32 - gam32.T))  # [t, s]: exp(gamma_t - gamma_s)
factored32 = np.asarray(jnp.exp(gam32) * jnp.exp(-gam32).T)  # exp(gamma_t) * exp(-gamma_s)
masked32 = np.asarray(jnp.exp(gam32 - gam32.T) * jnp.tril(jnp.ones((chunk_size, chunk_size))))
P_factored = scale * (qc * np.exp(gamma)) @ (kc * np.exp(-gamma)).T * causal  # float64: fine
assert_close(P_factored, P, atol=1e-12, name="the factorisation, in float64")
below = causal.astype(bool)
assert np.isfinite(direct32[below]).all(), "s <= t: exponent <= 0, never overflows"
assert not np.isfinite(factored32[below]).all() and np.isnan(masked32).any()
print(f"float32 exp overflows above {log_max32:.2f}; g = {lower_bound} per token, C = "
      f"{chunk_size}: direct (s <= t) all finite; factorised: "
      f"{np.isinf(factored32[below]).sum()} inf and {np.isnan(factored32[below]).sum()} NaN of "
      f"{below.sum()} causal entries; masked full square: {np.isnan(masked32).sum()} NaN")

# %% [markdown]
# **Scalar decay (Gated DeltaNet) against per-channel decay.** With one decay per head,
# $\mathbf g_t = g_t \mathbf 1$, every $\Gamma_t = e^{\gamma_t} I$ is a scalar and leaves the
# inner product: $\mathbf q_t^\top \Gamma_t \Gamma_s^{-1} \mathbf k_s = e^{\gamma_t - \gamma_s}\,
# \mathbf q_t^\top \mathbf k_s$. The decayed scores are then plain scores times one
# $C \times C$ (over a sequence, $T \times T$) mask, as softmax attention applies its causal
# mask:
#
# $$
# P^{\text{GDN}} = \tfrac{1}{\sqrt{d_k}} (Q K^\top) \odot \mathcal D, \qquad
# L^{\text{GDN}} = \operatorname{diag}(\boldsymbol\beta) (K K^\top)
#   \odot \mathcal D_{\text{strict}},
# \qquad \mathcal D_{ts} = e^{\gamma_t - \gamma_s}\ (s \le t),
# $$
#
# one matmul and one elementwise mask whose exponents are all $\le 0$: no factorisation, nothing
# to overflow. With per-channel decay the factor sits inside the sum over channels,
# $P_{ts} = \sum_c q_{tc} k_{sc} e^{\gamma_{tc} - \gamma_{sc}}$: a different mask per channel,
# so no single $C \times C$ mask exists, and a matmul needs the factorisation above. The cell
# builds GDN's mask form and checks it in float64 against the per-channel formula with every
# channel given the same decay, and against `kda_recurrent`.

# %%
g_scalar = gc.mean(axis=1)  # one decay per token for the whole head
gamma_s = np.cumsum(g_scalar)
mask_D = np.exp(gamma_s[:, None] - gamma_s[None, :]) * causal  # the C x C decay mask
P_gdn = scale * (qc @ kc.T) * mask_D
L_gdn = bc[:, None] * (kc @ kc.T) * mask_D * strict
ratio_s = np.exp(np.cumsum(np.repeat(g_scalar[:, None], key_dim, 1), 0)[:, None] -
                 np.cumsum(np.repeat(g_scalar[:, None], key_dim, 1), 0)[None])
assert_close(P_gdn, scale * np.einsum("tc,sc,tsc->ts", qc, kc, ratio_s) * causal, name="GDN P")
assert_close(L_gdn, bc[:, None] * np.einsum("tc,sc,tsc->ts", kc, kc, ratio_s) * strict,
             name="GDN L")
W_g = np.linalg.solve(np.eye(chunk_size) + L_gdn, bc[:, None] * kc * np.exp(gamma_s)[:, None])
U_g = np.linalg.solve(np.eye(chunk_size) + L_gdn, bc[:, None] * vc)
o_gdn = scale * (qc * np.exp(gamma_s)[:, None]) @ S_in[0, h] + P_gdn @ (U_g - W_g @ S_in[0, h])
with jax.enable_x64(True):
    o_gdn_ref = np.asarray(kda_lib.kda_recurrent(*(jnp.asarray(a)[None, :, None] for a in (
        qc, kc, vc, np.repeat(g_scalar[:, None], key_dim, 1), bc)),
        initial_state=jnp.asarray(S_in[:, h:h + 1]))[0])[0, :, 0]
assert_close(o_gdn, o_gdn_ref, atol=1e-12, name="GDN chunk outputs vs kda_recurrent")
print("GDN's chunk form (one C x C mask) == per-channel form with equal channels == recurrence")

# %% [markdown]
# `unit_lower_inverse` avoids a $C$-step row loop. For a strictly lower-triangular $X$ of size
# $b$, $X^b = 0$, so the Neumann series is finite and factors into $\log_2 b$ products:
#
# $$
# (I + X)^{-1} = I - X + X^2 - \dots \pm X^{b-1} = (I - X)(I + X^2)(I + X^4) \cdots (I + X^{b/2}) .
# $$
#
# Blocks of size 16 are inverted that way and merged pairwise. The figure shows $L$ and
# $(I + L)^{-1} - I$ for this chunk, both strictly lower triangular. Random unit keys overlap by
# about $1/\sqrt{d_k}$, so $L$ is small and $(I + L)^{-1} \approx I - L$: the right panel is
# nearly the left one with its colours flipped; the higher powers of $L$ are the rest.

# %%
block = 16
X = L[:block, :block]
neumann, power = np.eye(block) - X, X
for _ in range(int(np.log2(block)) - 1):
    power = power @ power
    neumann = neumann @ (np.eye(block) + power)
assert_close(neumann, np.linalg.inv(np.eye(block) + X), name="finite Neumann product")
first_order_gap = np.linalg.norm(solve - (np.eye(chunk_size) - L))
assert first_order_gap < np.linalg.norm(L), "(I + L)^-1 is close to I - L for small overlaps"

# %% tags=["hide-input"]
fig, (ax_l, ax_inv) = plt.subplots(1, 2, figsize=(9, 3.8))
viz.heatmap(ax_l, L, title=r"$L_{ts} = \beta_t k_t^\top \Gamma_t \Gamma_s^{-1} k_s$",
            xlabel="token s in the chunk", ylabel="token t in the chunk", cbar_label="$L_{ts}$",
            diverging=True)
viz.heatmap(ax_inv, solve - np.eye(chunk_size), title="$(I + L)^{-1} - I$",
            xlabel="token s in the chunk", ylabel="token t in the chunk",
            cbar_label="entry", diverging=True)
fig.suptitle(f"The chunk's triangular system (C = {chunk_size}, head {h}, chunk {i})")
viz.show(fig, "03_triangular_system")

# %% [markdown]
# ## 3. Chaining the chunks: the state pass, or an associative scan over the maps
#
# Given the state $S$ entering a chunk, steps 3 to 5 give everything the chunk needs: its
# pseudo-values are its values corrected by that state, $\Delta = \tilde V - \tilde K S$ (step
# 3), it passes on $S' = \Gamma_C S + \overrightarrow K^\top \Delta$ (step 4) and outputs
# $O = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S + P \Delta$ (step 5). That is **`kda_lib`'s
# sequential pass** (`kda_chunked(scan="sequential")`, the default on CPU): one step per chunk,
# two products of $C d_k d_v$ multiply-adds each ($\tilde K S$ and
# $\overrightarrow K^\top \Delta$), no $d_k \times d_k$ map ever formed, and after the loop the
# outputs of all chunks in one batched product. Exercise 3 asks you to write it.
#
# The maps $(M_{[i]}, E_{[i]})$ of section 1 are for chaining chunks **without** waiting for
# the state. Applying chunk 1's map and then chunk 2's is again an affine map,
#
# $$
# S \mapsto M_{[2]} (M_{[1]} S + E_{[1]}) + E_{[2]}
#   = \underbrace{M_{[2]} M_{[1]}}_{\text{new } M}\, S
#   + \underbrace{M_{[2]} E_{[1]} + E_{[2]}}_{\text{new } E}
# $$
#
# (`compose_affine`), and this composition is associative, so `jax.lax.associative_scan` can
# compute every prefix map in a logarithmic number of rounds of independent compositions
# (`scan="associative"`, the default off CPU), at the price of $d_k \times d_k$ products;
# context parallelism composes the same maps across devices (notebook 05). The cells chain the
# chunks by a plain loop over the maps, by `chain_states` in both modes and by `kda_chunked`'s
# sequential pass, each checked against `kda_recurrent` in float64 (`tests/ops/test_chunked.py`
# checks `kda_chunked`'s associative mode).

# %%
with jax.enable_x64(True):
    all_maps = jax.tree.map(jnp.asarray, maps)  # every chunk and head, from section 1
    chained = {mode: jax.tree.map(np.asarray, chain_states(
        all_maps.transition, all_maps.state_ext, jnp.asarray(S_in), mode))
        for mode in ("sequential", "associative")}
    if num_chunks >= 3:
        triple = [(all_maps.transition[0, h, n], all_maps.state_ext[0, h, n]) for n in range(3)]
        left = compose_affine(compose_affine(triple[0], triple[1]), triple[2])
        right = compose_affine(triple[0], compose_affine(triple[1], triple[2]))
        assert_close(left[0], right[0], name="associativity (M)")
        assert_close(left[1], right[1], name="associativity (E)")
    inputs64 = [jnp.asarray(a) for a in (q, k, v, g, beta)]
    o_ref, s_ref = (np.asarray(a) for a in kda_lib.kda_recurrent(
        *inputs64, initial_state=jnp.asarray(S_in), output_final_state=True))
    chunked = jax.jit(kda_lib.kda_chunked, static_argnames=["chunk_size", "scan"])
    o_kda = np.asarray(chunked(*inputs64, initial_state=jnp.asarray(S_in),
                               chunk_size=chunk_size, scan="sequential")[0])
all_maps = jax.tree.map(np.asarray, all_maps)

# %%
state, entering = S_in, []  # a plain Python loop over chunks, as the reader would write it
for n in range(num_chunks):
    entering.append(state)
    state = (np.einsum("hij,hjv->hiv", all_maps.transition[0, :, n], state[0])[None]
             + all_maps.state_ext[:, :, n])
entering = np.stack(entering, axis=2)  # [1, H, N, K, V]
for mode, (enter, final) in chained.items():
    assert_close(enter, entering, name=f"{mode}: entering states")
    assert_close(final, s_ref, name=f"{mode}: final state")
outputs = np.einsum("bhnck,bhnkv->bhncv", all_maps.q_eff, entering) + all_maps.o_intra
outputs = np.moveaxis(outputs, 1, 3).reshape(o_ref.shape)
assert_close(outputs, o_ref, name="chunked outputs, hand-chained")
err = assert_close(o_kda, o_ref, name="kda_chunked(scan='sequential')")
print(f"kda_chunked, the sequential pass (default on {jax.default_backend()}: "
      f"{kda_lib.ops.chunked.default_scan_mode()!r}) vs kda_recurrent, float64: max |diff| = "
      f"{err:.1e}; chain_states in both modes == the loop over the maps")

# %% [markdown]
# **How many rounds.** `lax.associative_scan` (`_scan` in jax's
# `jax/_src/lax/control_flow/loops.py`) is the recursive odd-even scan: one round composes
# neighbouring pairs, the half-length sequence is scanned recursively, and one more round
# composes each odd prefix with the next element to fill in the even positions. For
# $N$ a power of two that is $\log_2 N$ rounds down and $\log_2 N - 1$ back up,
# $2 \log_2 N - 1$ rounds, with $N - 1$ compositions down and $N - 1 - \log_2 N$ up:
# $2N - 2 - \log_2 N$ in all, about twice the $N - 1$ of a loop. The cell counts them on the
# scan itself, tracing it with a combine function that records its calls
# (`kda_lib.ops.costs.associative_scan_rounds`), and the figure draws the whole dataflow.

# %%
for n in sorted({num_chunks, 16, 64} - {1}):
    rounds = costs.associative_scan_rounds(n)
    j = int(np.log2(n))
    assert len(rounds) == 2 * j - 1 and sum(rounds) == 2 * n - 2 - j, (n, rounds)
    print(f"N = {n:2d} maps: {len(rounds)} rounds, compositions per round {rounds} "
          f"(total {sum(rounds)}; a loop: {n - 1} steps)")

# %% tags=["hide-input"]
# the scan panel draws at least 16 maps, so that its rounds are visible at the CI sizes too
viz.show(viz.chunk_dataflow(num_chunks, chunk_size, scan_maps=max(num_chunks, 16)), "03_dataflow")

# %% [markdown]
# ## 4. What each form costs, and why $C = 64$
#
# Counting multiply-adds as 2 flops, per head and per forward pass, matrix products only
# (`kda_lib.ops.costs`, term by term from `kda_lib.ops.chunked`):
#
# - **recurrent**: $\approx 7\, T d_k d_v$ flops in $T$ sequential steps (decay the state
#   $d_k d_v$, $\mathbf k^\top S$ $2 d_k d_v$, write $2 d_k d_v$, read $2 d_k d_v$: all its work,
#   elementwise included); working memory $d_k d_v$ floats (the state).
# - **chunked, sequential pass** (the default on CPU), per chunk: the decayed scores
#   $2 C (C - 1) d_k$ (rows $\mathbf q$ and $\mathbf k$; only the strictly lower blocks of the
#   merge are multiplied), the triangular inverse $\tfrac23 (C^3 - 256\, C) + 3072\, C$ (its
#   pairwise merges and its 16-token blocks, for $C \ge 16$), $\tilde K$ and $\tilde V$
#   $2 C^2 (d_k + d_v)$, the state pass $4 C d_k d_v$, the outputs $2 C d_k d_v + 2 C^2 d_v$.
#   Per token that is about $4 C (d_k + d_v) + 6 d_k d_v + \tfrac23 C^2$ in $T / C$ steps;
#   working memory
#   $T C + T(d_k + d_v)$ floats plus one state.
# - **chunked, associative scan**: the same scores, inverse, $\tilde K$ and $\tilde V$, plus
#   the maps ($Q^{\text{eff}}, O^{\text{intra}}$: $2 C^2 (d_k + d_v)$; $M, E$:
#   $2 C d_k (d_k + d_v)$), $2N - 2 - \log_2 N$ compositions of $2 d_k^2 (d_k + d_v)$ each, and
#   applying the prefix maps ($2 d_k^2 d_v + 2 C d_k d_v$ per chunk), in $2 \log_2 N - 1$
#   rounds; memory $+\,\frac{T}{C}(d_k^2 + d_k d_v)$ floats for the maps.
# - **softmax attention** (causal, computing only the causal half): $T^2 (d_k + d_v)$ flops, no
#   sequential dependence; memory $T(d_k + d_v)$, $+\,T^2$ for the scores unless fused (flash
#   attention).
#
# The first cell checks the count against the programs: the matrix products traced from
# `kda_chunked` in both modes (`costs.matmul_flops`, loop trip counts included) must equal it
# exactly, and XLA's cost analysis of the compiled program, over one chunk of
# $C = 64$, $d_k = d_v = 128$, must be close. XLA counts every elementwise operation as well
# (decay factors, masks, including those its fusions recompute), and a loop's body once,
# whatever its trip count: hence one chunk.

# %%
assert all(costs.inverse_flops(C) == 2 * (C**3 - 256 * C) // 3 + 3072 * C
           for C in (16, 32, 64, 128, 256))
x_small = [jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta)]
for scan in ("sequential", "associative"):
    traced = costs.matmul_flops(lambda *a, scan=scan: kda_lib.kda_chunked(
        *a, chunk_size=chunk_size, scan=scan)[0], *x_small)
    counted = num_heads * costs.chunked_flops(seq_len, chunk_size, key_dim, value_dim, scan)
    assert traced == counted, (scan, traced, counted)
one = random_kda_inputs(key_timing, 1, 64, 1, 128, gate="raw")
one_args = [one[n] for n in ("q", "k", "v")] + [-jax.nn.softplus(one["g"]), one["beta"],
                                                jnp.ones((1, 1, 128, 128))]
xla = jax.jit(lambda q, k, v, g, b, s: kda_lib.kda_chunked(
    q, k, v, g, b, initial_state=s, output_final_state=True, scan="sequential")).lower(
    *one_args).compile().cost_analysis()["flops"]
ours = costs.chunked_flops(64, 64, 128, 128)
approx = 4 * 64 * (128 + 128) + 6 * 128 * 128 + 2 * 64**2 / 3  # the per-token estimate
assert abs(approx / (ours / 64) - 1) < 0.03
assert 1.0 <= xla / ours <= 1.3, xla / ours
print(f"matmul flops traced == counted (both modes, T = {seq_len}); one chunk at C = 64, "
      f"K = V = 128: counted {ours / 1e6:.2f} MFLOP, XLA {xla / 1e6:.2f} MFLOP "
      f"({xla / ours:.2f}x: elementwise work)")

# %%
def form_costs(T, C, K, V):
    """Forward flops and sequential steps per head for each form (dict of (flops, steps))."""
    n = T // C
    return {
        "recurrent": (costs.recurrent_flops(T, K, V), T),
        "chunked, sequential": (costs.chunked_flops(T, C, K, V), n),
        "chunked, associative": (costs.chunked_flops(T, C, K, V, "associative"),
                                 costs.associative_scan_schedule(n)[0]),
        "softmax attention": (costs.attention_flops(T, K, V), 1),
    }


# %%
def cost_table(configs):
    rows = ["| form | " + " | ".join(f"T={T}, C={C}, K={K}, V={V}" for T, C, K, V in configs)
            + " |", "|---|" + "---|" * len(configs)]
    tables = [form_costs(*c) for c in configs]
    for form in tables[0]:
        cells = [f"{t[form][0] / 1e6:,.1f} MFLOP, {t[form][1]:,.0f} "
                 f"step{'' if t[form][1] == 1 else 's'}" for t in tables]
        rows.append(f"| {form} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


configs = [(seq_len, chunk_size, key_dim, value_dim), (4096, 64, 128, 128), (32768, 64, 128, 128)]
display(Markdown(cost_table(configs)))

# %%
for T in (1024, 4096):  # linear vs quadratic growth
    small, large = form_costs(T, 64, 128, 128), form_costs(2 * T, 64, 128, 128)
    assert np.isclose(large["chunked, sequential"][0], 2 * small["chunked, sequential"][0])
    assert np.isclose(large["softmax attention"][0], 4 * small["softmax attention"][0])
big = form_costs(4096, 64, 128, 128)
flop_ratio = big["chunked, sequential"][0] / big["recurrent"][0]
assoc_ratio = big["chunked, associative"][0] / big["recurrent"][0]
assert 1.3 < flop_ratio < 1.6 and assoc_ratio > 2 * flop_ratio
crossover = next(T for T in 2 ** np.arange(6, 20)
                 if form_costs(T, 64, 128, 128)["softmax attention"][0]
                 > form_costs(T, 64, 128, 128)["chunked, sequential"][0])
display(Markdown(
    f"At $d_k = d_v = 128$, $C = 64$, $T = 4096$ the sequential pass does {flop_ratio:.2f}x "
    f"the recurrence's flops in {big['recurrent'][1] / big['chunked, sequential'][1]:.0f}x "
    f"fewer sequential steps ({flop_ratio * xla / ours:.2f}x with its elementwise work counted "
    f"as XLA counts it at one chunk); the associative scan does {assoc_ratio:.1f}x (its "
    f"$d_k \\times d_k$ compositions) in {big['chunked, associative'][1]:.0f} rounds. Softmax "
    f"attention needs more flops than the sequential pass from $T = {crossover}$ tokens on."))

# %% [markdown]
# **Flops against chunk size.** Per token, every term of the sequential pass grows with $C$
# except the state pass ($4 d_k d_v$ whatever $C$): with no $d_k \times d_k$ map to amortise,
# nothing rewards a big chunk, and the flop-optimal chunk is not 64 (asserted). $C = 64$ is a
# hardware choice: $T / C$ sequential steps, each a kernel launch or loop iteration, favour
# large chunks; tensor cores and TPU MXUs need matrix tiles of at least 16 rows, best 64 to 128,
# to run near their peak; and the
# chunk's triangular work must fit the fast on-chip memory. fla's KDA intra-chunk kernel
# accepts $C = 32$ or $64$ only (`chunk_kda_fwd_intra` in `fla/ops/kda/chunk_intra.py`).

# %%
per_token = {C: costs.chunked_flops(4096, C, 128, 128) / 4096 for C in (16, 32, 64, 128, 256)}
sizes = list(per_token)
assert all(per_token[a] < per_token[b] for a, b in zip(sizes, sizes[1:], strict=False))
assert min(per_token, key=per_token.get) != 64
print("sequential pass, flops per token at K = V = 128: "
      + ", ".join(f"C = {C}: {f / 1e3:.0f}k" for C, f in per_token.items()))

# %% [markdown]
# ### Why kernels use 16-token sub-chunks, and why the safe gate's floor is $-5$
#
# A matmul over the chunk needs the factorised decay of the note after step 5, a row factor
# times a column factor, $e^{\boldsymbol\gamma_t - \boldsymbol\gamma_{t_0}} \cdot
# e^{\boldsymbol\gamma_{t_0} - \boldsymbol\gamma_s}$ for some reference token $t_0$, and float32's
# `exp` overflows above $88.7$. Split the chunk of 64 into sub-chunks of 16 tokens:
#
# - **off-diagonal sub-blocks** (rows $t$ in a later sub-chunk, keys $s$ in an earlier one):
#   with $t_0$ at the first token of the later sub-chunk (the boundary), $t \ge t_0 > s$, both
#   exponents are $\le 0$, both factors $\le 1$, and the block is one matmul for any gate;
# - **diagonal sub-blocks**: $t$ and $s$ fall on both sides of any $t_0$, so one factor is
#   $\ge 1$; the safe gate's floor $g \ge -5$ bounds it by $e^{5 \cdot 16} = e^{80} < e^{88.7}$,
#   so a diagonal block too is one $16 \times 16$ matmul (the "M=16" tensor-core tile of fla's
#   docstring below), its upper triangle selected away afterwards (a select, not a multiply
#   by 0).
#
# What the kernels do, read in their source: fla's Triton kernels
# ([fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention),
# `fla/ops/kda/chunk_intra.py`, read at commit `bc3b101`) cut the chunk into sub-chunks of
# `BC = 16`; the off-diagonal
# blocks (`chunk_kda_fwd_kernel_inter_solve_fused`) take the reference at the later sub-chunk's
# first token; with `safe_gate=True` each diagonal block is one `tl.dot`
# (`chunk_kda_fwd_kernel_intra_sub_chunk`) with the reference in the sub-chunk's middle (token
# 8, so each factor stays below $e^{40}$); without it the diagonal blocks are computed pair by
# pair from exponent differences (`chunk_kda_fwd_intra_token_parallel`). fla's docstring for
# `safe_gate` (`fla/ops/kda/chunk.py`) says it enables "M=16 TensorCore acceleration" and
# recommends `lower_bound = -5`. tokamax's Mosaic TPU kernel (in the tokamax 0.0.17 package
# this project installs, `tokamax/_src/ops/kda/pallas_mosaic_tpu_fwd_kernel.py`; the
# openxla/tokamax snapshot we could read holds only KDA's API) computes each block of 16 query
# rows against all keys up to the block's end in one matmul, with one reference for the whole
# row block, in its middle when the safe gate is on (its first token otherwise); it zeroes the
# exponents of the keys past the block before `exp2`, and its `mosaic` implementation requires
# `lower_bound`. There the off-diagonal blocks rely on the floor too: rows before the middle
# get factors above 1.
#
# `kda_lib`'s own merge (`_decayed_scores` in `kda_lib/ops/chunked.py`) takes the boundary
# reference at every level, down to sub-blocks of one token (1 + 1, 2 + 2, ..., 32 + 32): every
# product it forms is an off-diagonal block with both factors $\le 1$, and the diagonal's ratio
# is 1, so no exponent is ever positive and no floor is needed; the price is $\log_2 C$ levels
# of small batched products instead of a few $16 \times 16$ tiles. The cell shows the
# overflow at the floor, and `kda_chunked` in float32 with every gate of this notebook
# multiplied by ten, far below the floor (the strongest is printed).

# %%
for span in (16, 64):  # the key factor exp(gamma_t0 - gamma_s), s >= t0, at the floor
    exponents = -lower_bound * np.arange(span)  # gamma_t0 - gamma_s = 5 (s - t0)
    factor = np.asarray(jnp.exp(jnp.asarray(exponents, jnp.float32)))
    finite = bool(np.isfinite(factor).all())
    assert finite == (span == 16) and (exponents.max() < log_max32) == finite
    print(f"span {span:2d} tokens at g = {lower_bound}: largest exponent "
          f"{exponents.max():.0f} (limit {log_max32:.2f}), "
          + ("all finite" if finite else f"inf from token {np.argmax(~np.isfinite(factor))}"))
g_strong = 10 * g32  # far below the floor: a 16-token factorisation would overflow here
assert float(g_strong.min()) < 3 * lower_bound
o32 = jax.jit(kda_lib.kda_chunked, static_argnames=["chunk_size"])(
    x["q"], x["k"], x["v"], g_strong, x["beta"], chunk_size=chunk_size)[0]
with jax.enable_x64(True):
    o64 = kda_lib.kda_recurrent(*(jnp.asarray(a, jnp.float64) for a in (
        x["q"], x["k"], x["v"], g_strong, x["beta"])))[0]
err = assert_close(o32, o64, atol=1e-4, rtol=1e-4, name="float32 chunked, strong gate")
print(f"kda_chunked, float32, gates down to {float(g_strong.min()):.1f} per token: finite, "
      f"max |diff| to the float64 recurrence {err:.1e}")


# %% [markdown]
# ## 5. Measured time against sequence length
#
# Live measurements on this machine, batch 1, `timing_heads` heads, $d_k = d_v$ =
# `timing_dim`, safe gate applied inside `kda(...)`: `recurrent` and `chunked` (kda_lib) and
# `tokamax_xla_chunked` (tokamax's pure-JAX chunked form) through `kda_lib.kda`, and causal
# softmax attention (`jax.nn.dot_product_attention`). Each point is the median of
# `timing_repeats` calls after a warm-up call that compiles (`kda_lib.lab.measure.median_ms`).
# Recorded results from `data/benchmarks/` (written by `python -m kda_lib.lab.bench`, possibly on a
# GPU or TPU) are drawn in panels of their own, titled with their platform and sizes: they were
# measured at other sizes and cannot be read off the live panel's axis.

# %%
def kda_form(implementation):
    def run(q, k, v, f, beta, a_log, dt_bias):
        return kda_lib.kda(q, k, v, f, beta, a_log=a_log, dt_bias=dt_bias,
                           lower_bound=lower_bound, implementation=implementation)[0]
    return run


forms = {name: kda_form(name) for name in ("recurrent", "chunked", "tokamax_xla_chunked")}
forms["softmax attention"] = lambda q, k, v, *gates: jax.nn.dot_product_attention(
    q, k, v, is_causal=True)


def with_backward(fn):
    """Gradient of sum(outputs) with respect to q, k and v: one forward + backward pass."""
    return jax.grad(lambda q, k, v, *rest: jnp.sum(fn(q, k, v, *rest)), argnums=(0, 1, 2))


# %%
modes = ["fwd", "fwd+bwd"] if timing_backward else ["fwd"]
timings = {mode: {name: [] for name in forms} for mode in modes}
for T in timing_lengths:
    inputs = random_kda_inputs(jax.random.fold_in(key_timing, T), 1, T, timing_heads,
                               timing_dim, gate="raw")
    args = [inputs[name] for name in ("q", "k", "v", "g", "beta", "a_log", "dt_bias")]
    for mode in modes:
        outs = {}
        for name, fn in forms.items():
            compiled = jax.jit(fn if mode == "fwd" else with_backward(fn))
            ms, outs[name] = median_ms(compiled, *args, repeats=timing_repeats)
            timings[mode][name].append(ms)
        if mode == "fwd":  # the KDA implementations compute the same thing
            for name in {"chunked", "tokamax_xla_chunked"} & outs.keys():
                assert_close(outs[name], outs["recurrent"], atol=2e-4, rtol=2e-3, name=name)
for mode in modes:
    print(f"{mode}, median ms ({jax.default_backend()})\nT (tokens) "
          + "".join(f"{name:>22s}" for name in forms))
    for n, T in enumerate(timing_lengths):
        print(f"{T:<11d}" + "".join(f"{timings[mode][name][n]:22.2f}" for name in forms))
    assert all(np.isfinite(ms).all() and min(ms) > 0 for ms in timings[mode].values())

# %% tags=["hide-input"]
runs, notes = load_benchmark_runs()
for note in notes:
    print("recorded benchmarks:", note)
# kernel-level entries only (kda_lib.lab.bench also times the full layer); its "softmax" is ours
RECORDED = {"recurrent": "recurrent", "chunked": "chunked", "tokamax_xla": "tokamax_xla",
            "tokamax_xla_chunked": "tokamax_xla_chunked", "tokamax_mosaic": "tokamax_mosaic",
            "softmax": "softmax attention"}
for mode in modes:
    fig = viz.time_vs_length(timing_lengths, timings[mode], runs, mode=mode, names=RECORDED,
                             live_title=f"live: {jax.default_backend()}, {mode}\nB=1, "
                                        f"H={timing_heads}, K=V={timing_dim}, float32")
    fig.suptitle(f"Time vs sequence length, {mode}: live (left), recorded (right, own sizes)")
    viz.show(fig, f"03_time_vs_length_{mode}")

# %%
slopes = {mode: {name: np.polyfit(np.log(timing_lengths), np.log(timings[mode][name]), 1)[0]
                 for name in forms} for mode in modes}
for mode in modes:
    print(f"{mode}: fitted log-log slopes " +
          ", ".join(f"{name} {slope:.2f}" for name, slope in slopes[mode].items()))
live_fastest = {mode: min(forms, key=lambda n: timings[mode][n][-1]) for mode in modes}
display(Markdown("At the longest live length, $T = " + f"{timing_lengths[-1]}$, the fastest "
                 "form is " + "; ".join(f"`{live_fastest[m]}` ({m})" for m in modes) + "."))

# %% [markdown]
# How to read it: softmax attention's $T^2$ term takes over at long sequences. Whether the
# recurrence's fewer flops win depends on what a sequential step costs, and the recorded CPU run
# (`data/benchmarks/cpu-2026-12-01.json`, printed below) shows that on a CPU too it costs a
# lot. In the forward pass the chunked form and the recurrence run about even; forward plus
# backward, the recurrence is several times slower although the programs' matrix products
# (traced at the recorded sizes) are several times fewer for it. That gap is a sequential-step
# cost: the backward pass walks $T$ dependent steps of small $d_k \times d_v$ updates, each
# with its loop overhead and its saved state to re-read, which its few flops cannot hide; the
# chunked form takes $T / C$ steps of large products. On GPUs and TPUs, where each step is a
# kernel launch or a loop iteration that leaves most of the chip idle, the step count matters
# more still. Live timings are measured, not asserted: they depend on the machine.

# %%
recorded = load_recorded("benchmarks", "cpu-2026-12-01.json")
conf, rec = recorded["config"], {(r["impl"], r["T"], r["mode"]): r
                                 for r in recorded["records"]}
x_rec = random_kda_inputs(key_timing, conf["batch"], 1024, conf["heads"], conf["key_dim"],
                          conf["value_dim"], gate="raw")
args_rec = [x_rec["q"], x_rec["k"], x_rec["v"], -jax.nn.softplus(x_rec["g"]), x_rec["beta"]]
traced_fb = {impl: costs.matmul_flops(jax.grad(lambda *a, impl=impl: jnp.sum(kda_lib.kda(
    *a, implementation=impl)[0]), argnums=range(5)), *args_rec)
    for impl in ("recurrent", "chunked")}
for T in (256, 1024):
    print(f"recorded, T = {T}: forward chunked/recurrent "
          f"{rec['chunked', T, 'fwd']['median_ms'] / rec['recurrent', T, 'fwd']['median_ms']:.2f}"
          f"; fwd+bwd recurrent {rec['recurrent', T, 'fwd+bwd']['median_ms']:.0f} ms, chunked "
          f"{rec['chunked', T, 'fwd+bwd']['median_ms']:.0f} ms")
print(f"fwd+bwd matrix flops traced at T = 1024 (B=1, H={conf['heads']}, K=V={conf['key_dim']}): "
      f"recurrent {traced_fb['recurrent'] / 1e6:.0f} MFLOP, chunked "
      f"{traced_fb['chunked'] / 1e6:.0f} MFLOP (the file's XLA count for the recurrence, "
      f"{rec['recurrent', 1024, 'fwd+bwd']['flops'] / 1e6:.1f} MFLOP, has its loop body once)")
slow = rec["recurrent", 1024, "fwd+bwd"]["median_ms"] / rec["chunked", 1024, "fwd+bwd"]["median_ms"]
assert slow > 3 and traced_fb["recurrent"] * 3 < traced_fb["chunked"]

# %% [markdown]
# ## Summary
#
# - A chunk of $C$ tokens is an affine map
#   $S_{\text{out}} = M_{[i]} S_{\text{in}} + E_{[i]}$ with $M_{[i]} = M_C \cdots M_1$, and its
#   outputs are $Q^{\text{eff}} S_{\text{in}} + O^{\text{intra}}$ (checked in float64).
# - Five derived steps (unroll, triangular system, UT transform, chunk map, outputs), each
#   checked in float64, give all four from one unit-lower-triangular solve per chunk, equal to
#   `chunk_affine_maps`; $M_{[i]}$ is the WY form, diagonal minus rank $C$. With a scalar decay
#   (Gated DeltaNet) the decay is one $C \times C$ mask; per-channel decay needs the
#   factorisation that overflows in float32 unless it is bounded.
# - Across chunks `kda_lib` carries only the state (values corrected by it, then the update),
#   no $d_k \times d_k$ map; the maps serve `lax.associative_scan` ($2 \log_2 N - 1$ rounds,
#   $2N - 2 - \log_2 N$ compositions) and context parallelism. Every chaining agrees with
#   `kda_recurrent` to float64 precision.
# - Costs (matrix products, checked against the traced programs and XLA): the sequential pass
#   does about half again the recurrence's flops at $d_k = d_v = 128$, $C = 64$ (printed in
#   section 4) in $T / C$ steps, the associative scan several times more; softmax attention
#   grows as $T^2$.
#   $C = 64$ is not the flop optimum but a hardware choice, and 16-token sub-chunks with the
#   safe gate's floor of $-5$ keep the kernels' factorised exponents below float32's limit.
# - The recorded CPU run shows sequential steps costing time on a CPU too (fwd+bwd); live
#   timings on this machine and recorded runs are drawn side by side, each with its sizes.
#
# ## Exercises
#
# Each exercise cell leaves `answer = None` for you; `check` says whether your answer is right
# without showing the expected one. Worked solutions are in `notebooks/solutions/ch03.py`.
#
# 1. **One token per chunk.** With $C = 1$ a chunk's map is the token's own. Write
#    `token_map(k, g, beta, v)` returning $(M_t, E_t)$, the token's map $S \mapsto M_t S + E_t$
#    (`k, g` $[d_k]$, `v` $[d_v]$, float64 NumPy), from the recurrence and without
#    `chunk_affine_maps`; compare it yourself with `chunk_affine_maps` on a one-token chunk.

# %%
answer = None  # a function token_map(k, g, beta, v) -> (M [K, K], E [K, V])
check("03.1", answer)

# %% [markdown]
# 2. **No decay.** With $\mathbf g = 0$, $\Gamma_t = I$ and $\overleftarrow K = \overrightarrow K
#    = K$. Write `wy_factor(k, beta)` returning the chunk's $\tilde K$ $[C, d_k]$ of step 2
#    (keys `k` $[C, d_k]$, `beta` $[C]$); check on the chunk `kc`, `bc` that
#    $I - K^\top \tilde K$ (step 4) equals the product of the
#    $I - \beta_t \mathbf k_t \mathbf k_t^\top$. The checker also tries $C > d_k$, where
#    $\tilde K$ cannot be read back from that product.

# %%
answer = None  # a function wy_factor(k, beta) -> K~ [C, d_k]
check("03.2", answer)

# %% [markdown]
# 3. **The sequential pass without $d_k \times d_k$ maps.** Write
#    `state_pass(w, u, q_in, k_out, attn_qk, keep, s0)` for one head: chunk-major NumPy arrays
#    (`w` $= \tilde K$, `q_in` $= \overleftarrow Q$, `k_out` $= \overrightarrow K$,
#    $[N, C, d_k]$; `u` $= \tilde V$ $[N, C, d_v]$; `attn_qk` $[N, C, C]$ $= P$; `keep`
#    $[N, d_k]$ = the diagonal of $\Gamma_C$) and the initial state $[d_k, d_v]$, returning the
#    outputs $[T, d_v]$ and the final state, from the three equations of section 3 (`q_in` is
#    unscaled, as there). The checker runs it on chunks it builds with `kda_lib.ops.chunked`
#    and compares with the recurrence in float64.

# %%
answer = None  # a function state_pass(w, u, q_in, k_out, attn_qk, keep, s0) -> (O, S)
check("03.3", answer)

# %% [markdown]
# 4. **Gated DeltaNet's chunk scores.** Write `gdn_scores(q, k, g, scale)` for one chunk with one
#    log decay per token (`g` $[C]$): the causal decayed scores $P^{\text{GDN}}$ as $q k^\top$
#    times one $C \times C$ mask, with no exponent above 0 ever formed. The checker also runs
#    it at $C = 64$ with strong decay, where such an exponent overflows float64.

# %%
answer = None  # a function gdn_scores(q, k, g, scale) -> P [C, C]
check("03.4", answer)

# %% [markdown]
# ## References
#
# - S. Yang, B. Wang, Y. Zhang, Y. Shen, Y. Kim, *Parallelizing linear transformers with the
#   delta rule over sequence length* (DeltaNet's chunkwise WY form), NeurIPS 2024.
#   [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta rule*
#   (the gated chunkwise form), ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (KDA's chunkwise
#   algorithm with per-channel decay), 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - C. Bischof, C. Van Loan, *The WY representation for products of Householder matrices*, SIAM
#   J. Sci. Stat. Comput. 8(1), 1987. [doi:10.1137/0908009](https://doi.org/10.1137/0908009)
# - T. Joffrain, T. M. Low, E. S. Quintana-Ortí, R. van de Geijn, F. G. Van Zee, *Accumulating
#   Householder transformations, revisited* (the UT transform), ACM TOMS 32(2), 2006.
#   [doi:10.1145/1141885.1141886](https://doi.org/10.1145/1141885.1141886)
# - G. E. Blelloch, *Prefix sums and their applications*, 1990 (the associative scan).
#   [CMU-CS-90-190](https://www.cs.cmu.edu/~guyb/papers/Ble93.pdf)
# - Kernels: fla's `fla/ops/kda/` ([fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention))
#   and tokamax's KDA ([openxla/tokamax](https://github.com/openxla/tokamax)).
