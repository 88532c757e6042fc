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
# **Claim.** Cut the sequence into chunks of $C$ tokens. What the tokens of a chunk write into
# the state follows from one $C \times C$ unit-lower-triangular system, solved for all chunks at
# once with matrix products; between chunks only the state travels. The result equals the
# recurrence (checked in float64); it pays on GPUs and TPUs because $T$ dependent matrix-vector
# steps become $T / C$ steps of matrix products. Kernel internals (fla, tokamax) are in DESIGN's
# [engineering notes on the chunkwise kernels](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/DESIGN.md#engineering-notes-the-chunkwise-kernels-from-notebook-03).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/03_chunkwise_algorithm.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).
# CI runs the small defaults of the `parameters` cell below; `make notebooks PARAMS=full` runs
# `notebooks/params/full/03_chunkwise_algorithm.yaml`.

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
import functools

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.lab import at_scale, costs
from kda_lib.lab.measure import xla_cost
from kda_lib.ops.chunked import chain_states, chunk_affine_maps, unit_lower_inverse
from kda_lib.teaching import chunkwise, viz
from kda_lib.teaching.exercises import check
from kda_lib.testing import assert_close, random_kda_inputs

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
assert seq_len % chunk_size == 0, "the chunks below need T to be a multiple of C"
num_chunks = seq_len // chunk_size
scale = key_dim**-0.5
key = jax.random.key(seed)
key_inputs, key_state, key_timing = jax.random.split(key, 3)
x = random_kda_inputs(key_inputs, 1, seq_len, num_heads, key_dim, value_dim, gate="raw")
key_a, key_dt = jax.random.split(jax.random.fold_in(key_inputs, 1))
a_log = kda_lib.init_a_log(key_a, num_heads, safe_gate=True)  # the gates of a new layer
dt_bias = kda_lib.init_dt_bias(key_dt, num_heads, key_dim)
g32 = kda_lib.kda_gate(x["g"], a_log, dt_bias, lower_bound=lower_bound)  # raw input x["g"]
q, k, v, g, beta = (np.asarray(a, np.float64) for a in (x["q"], x["k"], x["v"], g32, x["beta"]))
S_in = np.asarray(jax.random.normal(key_state, (1, num_heads, key_dim, value_dim)), np.float64)
# (float64 NumPy copies: everything below is checked in float64)


def to_chunks(a):
    """[1, T, H, ...] -> [1, H, N, C, ...], the layout of kda_lib.ops.chunked.chunk_affine_maps."""
    return np.moveaxis(a.reshape(1, num_chunks, chunk_size, num_heads, *a.shape[3:]), 3, 1)


# %% [markdown]
# ## 1. The picture: chunks in parallel, the state in sequence
#
# The recurrence updates one $d_k \times d_v$ state per token: $T$ steps, each waiting for the
# last, each a matrix-vector product too small to keep a chip's matrix units busy. The chunked
# form (left) computes all that does not need the state entering a chunk (the triangular
# blocks) for **all chunks at once**; then $T / C$ steps carry the state from chunk to chunk,
# two matrix products each. Right: the rounds of another way to chain chunks (section 4).
# Section 2 does it by hand on three tokens; section 3 derives the symbols in the boxes.

# %% tags=["hide-input"]
viz.show(viz.chunk_dataflow(num_chunks, chunk_size, scan_maps=max(num_chunks, 16)), "03_dataflow")

# %% [markdown]
# ## 2. One chunk by hand: $C = 3$ tokens, $d_k = d_v = 2$
#
# Keys $\mathbf k_1 = (1, 0)$, $\mathbf k_2 = (0.6, 0.8)$, $\mathbf k_3 = (0, 1)$; values
# $\mathbf v_1 = (1, 0)$, $\mathbf v_2 = (0, 1)$, $\mathbf v_3 = (1, 1)$; every $\beta_t = 0.5$;
# decay $D_t = \operatorname{diag}(1, 0.5)$; an empty entering state; and (here only) the read
# $\mathbf o_t = S_t^\top \mathbf q_t$ with $\mathbf q_t = (1, 1)$, no $1/\sqrt{d_k}$.
#
# **Token by token** (notebook 01), token $t$ decays the state and writes the error of its
# prediction, the **pseudo-value** $\boldsymbol\delta_t = \beta_t \big(\mathbf v_t -
# (D_t S_{t-1})^\top \mathbf k_t\big)$: $S_t = D_t S_{t-1} + \mathbf k_t \boldsymbol\delta_t^\top$.
# Token 1 finds nothing, $\boldsymbol\delta_1 = 0.5\,(1, 0) = (0.5, 0)$; token 2 predicts
# $0.6 \cdot (0.5, 0) = (0.3, 0)$, so $\boldsymbol\delta_2 = 0.5\,\big((0, 1) - (0.3, 0)\big) =
# (-0.15, 0.5)$; token 3 must wait for both.
#
# **All three at once.** A prediction sees the earlier writes only through key overlaps decayed
# from token $s$ to token $t$, $L_{ts} = \beta_t\, \mathbf k_t^\top D_t \cdots D_{s+1}
# \mathbf k_s$: $L_{21} = 0.5 \cdot 0.6 = 0.3$, $L_{31} = 0$ (orthogonal keys),
# $L_{32} = 0.5 \cdot 0.5 \cdot 0.8 = 0.2$. The pseudo-values solve one triangular system with
# no state in it, by forward substitution:
#
# $$
# \begin{pmatrix} 1 & & \\ 0.3 & 1 & \\ 0 & 0.2 & 1 \end{pmatrix}
# \begin{pmatrix} \boldsymbol\delta_1^\top \\ \boldsymbol\delta_2^\top \\
#   \boldsymbol\delta_3^\top \end{pmatrix}
# = 0.5 \begin{pmatrix} 1 & 0 \\ 0 & 1 \\ 1 & 1 \end{pmatrix},
# \qquad \boldsymbol\delta_3 = 0.5\,(1, 1) - 0.2\, \boldsymbol\delta_2 = (0.53, 0.4) .
# $$
#
# Then the state and outputs are products over the chunk: $S_3 = \overrightarrow K^\top \Delta$
# ($\overrightarrow K$: rows $D_3 \cdots D_{s+1} \mathbf k_s$, keys decayed to the chunk end)
# and $O = P \Delta$ (causal decayed scores $P_{ts} = \mathbf q_t^\top D_t \cdots D_{s+1}
# \mathbf k_s$, $s \le t$), checked below against `kda_recurrent`.

# %%
k3 = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])  # rows are tokens
v3 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
q3, beta3 = np.ones((3, 2)), np.full(3, 0.5)
keep = np.array([1.0, 0.5])  # the diagonal of D_t, the same at every token
S, deltas, outs = np.zeros((2, 2)), [], []
for t in range(3):  # the recurrence
    S = keep[:, None] * S  # decay
    deltas.append(beta3[t] * (v3[t] - S.T @ k3[t]))  # correct the predicted value
    S = S + np.outer(k3[t], deltas[-1])  # write
    outs.append(S.T @ q3[t])  # read
    print(f"token {t + 1}: delta = {np.round(deltas[-1], 4)}, S = {np.round(S, 4).tolist()}")
assert np.allclose(deltas, [[0.5, 0.0], [-0.15, 0.5], [0.53, 0.4]])

# %%
lag = np.subtract.outer(np.arange(3), np.arange(3))  # t - s
between = keep ** np.maximum(lag, 0)[..., None]  # [t, s, channel]: decay after s through t
L3 = np.tril(beta3[:, None] * np.einsum("tc,sc,tsc->ts", k3, k3, between), -1)
assert np.allclose(L3, [[0, 0, 0], [0.3, 0, 0], [0, 0.2, 0]])
Delta3 = np.linalg.solve(np.eye(3) + L3, beta3[:, None] * v3)  # (I + L) Delta = diag(beta) V
K_out3 = k3 * keep ** (2 - np.arange(3))[:, None]  # rows D_3 ... D_{s+1} k_s
P3 = np.tril(np.einsum("tc,sc,tsc->ts", q3, k3, between))
S3, O3 = K_out3.T @ Delta3, P3 @ Delta3
print(f"L = {L3.tolist()}\nDelta = {np.round(Delta3, 4).tolist()}\n"
      f"S_3 = K_out^T Delta = {np.round(S3, 4).tolist()}\nO = P Delta = {np.round(O3, 4).tolist()}")
with jax.enable_x64(True):
    o3, s3 = kda_lib.kda_recurrent(*(jnp.asarray(a)[None, :, None] for a in (
        q3, k3, v3, np.tile(np.log(keep), (3, 1)), beta3)), scale=1.0, output_final_state=True)
for got, want in ((Delta3, deltas), (S3, S), (O3, outs), (O3, o3[0, :, 0]), (S3, s3[0, 0])):
    assert_close(got, np.asarray(want), atol=1e-14, name="one chunk by hand")

# %% [markdown]
# ## 3. The general chunk in five steps
#
# Now any $C$, $d_k$, $d_v$, and a state $S_0$ entering the chunk. With $\Gamma_t = D_t \cdots
# D_1 = \operatorname{diag}(e^{\boldsymbol\gamma_t})$, the decay from the chunk start to token
# $t$ ($\boldsymbol\gamma_t = \mathbf g_1 + \dots + \mathbf g_t$), $D_t \cdots D_{s+1} =
# \Gamma_t \Gamma_s^{-1}$. Each step is checked in float64 on chunk 0 of head 0 of the inputs
# above, against the recurrence run through it (keeping each $S_t$ and $\boldsymbol\delta_t$).
#
# **Step 1: unroll** $S_t = D_t S_{t-1} + \mathbf k_t \boldsymbol\delta_t^\top$:
# $S_t = \Gamma_t S_0 + \sum_{s \le t} \Gamma_t \Gamma_s^{-1}\, \mathbf k_s
# \boldsymbol\delta_s^\top$.
#
# **Step 2: a triangular system.** Put the unrolled $S_{t-1}$ into $\boldsymbol\delta_t$
# ($D_t \Gamma_{t-1} = \Gamma_t$, diagonal): $\boldsymbol\delta_t = \beta_t \mathbf v_t -
# \beta_t S_0^\top (\Gamma_t \mathbf k_t) - \sum_{s < t} L_{ts} \boldsymbol\delta_s$ with
# $L_{ts} = \beta_t\, \mathbf k_t^\top \Gamma_t \Gamma_s^{-1} \mathbf k_s$ (section 2's $L$).
# Stacked, with $\overleftarrow K$ the keys decayed from the chunk start to their token (rows
# $\Gamma_t \mathbf k_t$): $(I + L)\, \Delta = \operatorname{diag}(\boldsymbol\beta)\, V -
# \operatorname{diag}(\boldsymbol\beta)\, \overleftarrow K S_0$.

# %%
h, i = 0, 0  # head 0, chunk 0
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
strict = np.tril(np.ones((chunk_size, chunk_size)), -1)
L = bc[:, None] * np.einsum("tc,sc,tsc->ts", kc, kc, ratio) * strict
K_in = kc * np.exp(gamma)  # rows Gamma_t k_t
rhs = bc[:, None] * vc - bc[:, None] * (K_in @ S_in[0, h])
assert_close((np.eye(chunk_size) + L) @ Delta, rhs, atol=1e-12, name="step 2: (I + L) Delta")
print("steps 1 and 2 checked")

# %% [markdown]
# **Step 3: the UT transform.** $I + L$ is unit lower triangular, hence invertible, and does not
# depend on $S_0$: one solve per chunk gives the pseudo-values for **any** entering state,
#
# $$
# \Delta = \tilde V - \tilde K S_0, \qquad
# \tilde V = (I + L)^{-1} \operatorname{diag}(\boldsymbol\beta) V, \qquad
# \tilde K = (I + L)^{-1} \operatorname{diag}(\boldsymbol\beta) \overleftarrow K
# $$
#
# (`U`, `W` in the WY literature and the code; `unit_lower_inverse` inverts with matmuls only).
#
# **Step 4: the chunk's affine map.** Step 1 at $t = C$, with $\overrightarrow K$ the keys
# decayed from their token to the chunk end (rows $\Gamma_C \Gamma_s^{-1} \mathbf k_s$), then
# step 3:
#
# $$
# S_C = \Gamma_C S_0 + \overrightarrow K^\top \Delta
#   = \underbrace{\big(\Gamma_C - \overrightarrow K^\top \tilde K\big)}_{M_{[i]}} S_0
#   + \underbrace{\overrightarrow K^\top \tilde V}_{E_{[i]}} .
# $$
#
# $M_{[i]}$, the product of notebook 01's transitions $M_t = (I - \beta_t \mathbf k_t \mathbf
# k_t^\top) D_t = D_t - \beta_t \mathbf k_t (D_t \mathbf k_t)^\top$ (diagonal plus rank one), is
# in **WY form** (Bischof and Van Loan): a diagonal minus $\overrightarrow K^\top \tilde K$, of
# rank $\le \min(C, d_k)$. The cell also checks `kda_lib`'s `chunk_affine_maps`.

# %%
solve = np.linalg.inv(np.eye(chunk_size) + L)
U, W = solve @ (bc[:, None] * vc), solve @ (bc[:, None] * K_in)  # V~ and K~
assert_close(U - W @ S_in[0, h], Delta, atol=1e-12, name="step 3: Delta = V~ - K~ S_0")
with jax.enable_x64(True):
    assert_close(unit_lower_inverse(jnp.asarray(L)), solve, name="unit_lower_inverse")
    maps = jax.tree.map(np.asarray, jax.jit(chunk_affine_maps, static_argnames=["scale"])(
        *(jnp.asarray(to_chunks(a)) for a in (q, k, v, g, beta)), scale=scale))
M, E = maps.transition[0, h, i], maps.state_ext[0, h, i]
K_out = kc * np.exp(gamma[-1] - gamma)  # rows Gamma_C Gamma_s^-1 k_s
assert_close(np.exp(gamma[-1])[:, None] * S_in[0, h] + K_out.T @ Delta, states[-1], atol=1e-12,
             name="step 4: S_C = Gamma_C S_0 + K_out^T Delta")
assert_close(np.diag(np.exp(gamma[-1])) - K_out.T @ W, M, name="step 4: M = Gamma_C - K_out^T K~")
_ = assert_close(K_out.T @ U, E, name="step 4: E = K_out^T V~")

# %%
product = np.eye(key_dim)
for t in range(chunk_size):
    D_t = np.diag(np.exp(gc[t]))
    M_t = (np.eye(key_dim) - bc[t] * np.outer(kc[t], kc[t])) @ D_t
    assert_close(M_t, D_t - bc[t] * np.outer(kc[t], D_t @ kc[t]), atol=1e-14, name="DPLR")
    product = M_t @ product
assert_close(M, product, name="M = M_C ... M_1")
rank = np.linalg.matrix_rank(K_out.T @ W)
print(f"steps 3 and 4 checked; M == chunk_affine_maps == M_C ... M_1; rank of K_out^T K~ = "
      f"{rank} (C = {chunk_size}, d_k = {key_dim})")

# %% [markdown]
# **Step 5: the outputs.** Put step 1 into the read $\mathbf o_t = S_t^\top \mathbf q_t /
# \sqrt{d_k}$, with the causal decayed scores $P_{ts} = \mathbf q_t^\top \Gamma_t \Gamma_s^{-1}
# \mathbf k_s / \sqrt{d_k}$ ($s \le t$) and $\overleftarrow Q$ (rows $\Gamma_t \mathbf q_t$):
#
# $$
# O = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S_0 + P \Delta
#   = \underbrace{\big(\tfrac{1}{\sqrt{d_k}} \overleftarrow Q
#   - P \tilde K\big)}_{Q^{\text{eff}}} S_0 + \underbrace{P \tilde V}_{O^{\text{intra}}} .
# $$

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
# ## 4. The whole forward pass in one function
#
# Steps 3 to 5 give everything a chunk needs from the state $S$ entering it: its pseudo-values
# $\Delta = \tilde V - \tilde K S$, its outputs $O = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S +
# P \Delta$ and the state it passes on, $S' = \Gamma_C S + \overrightarrow K^\top \Delta$. Loop
# over the chunks and that is the whole algorithm, for one head, in plain `jax.numpy`. Its
# `where` keeps every exponent $\le 0$; the square masked afterwards ($\infty \cdot 0$ above the
# diagonal) and the one-product factorisation $(Q \odot e^{\boldsymbol\gamma}) (K \odot
# e^{-\boldsymbol\gamma})^\top$ overflow in float32 for strong decay (tested in
# `tests/teaching/test_notebook_claims.py`; kernels' way around it is in DESIGN's notes).

# %%
def kda_chunked_readable(q, k, v, g, beta, S, C):
    """KDA forward for one head, chunk by chunk (T a multiple of C). q, k, g: [T, d_k];
    v: [T, d_v]; beta: [T]; S: [d_k, d_v], the state before token 1. Returns (O [T, d_v], S)."""
    scale = k.shape[1] ** -0.5
    causal = jnp.tril(jnp.ones((C, C), bool))  # s <= t
    outputs = []
    for start in range(0, len(k), C):  # T / C sequential steps
        qc, kc, vc, gc, bc = (a[start:start + C] for a in (q, k, v, g, beta))
        gamma = jnp.cumsum(gc, axis=0)  # log decay from the chunk start through token t
        exponent = jnp.where(causal[..., None], gamma[:, None] - gamma[None], -jnp.inf)
        decay = jnp.exp(exponent)  # [t, s, d_k]: Gamma_t / Gamma_s where s <= t, else 0
        P = scale * jnp.einsum("tc,sc,tsc->ts", qc, kc, decay)  # causal decayed scores
        L = jnp.tril(bc[:, None] * jnp.einsum("tc,sc,tsc->ts", kc, kc, decay), -1)
        solve = functools.partial(jax.scipy.linalg.solve_triangular, jnp.eye(C) + L, lower=True)
        K_tilde = solve(bc[:, None] * kc * jnp.exp(gamma))  # (I + L)^-1 diag(beta) K_in
        V_tilde = solve(bc[:, None] * vc)  # (I + L)^-1 diag(beta) V
        Delta = V_tilde - K_tilde @ S  # pseudo-values, given the entering state
        outputs.append(scale * (qc * jnp.exp(gamma)) @ S + P @ Delta)
        K_out = kc * jnp.exp(gamma[-1] - gamma)  # keys decayed from their token to the end
        S = jnp.exp(gamma[-1])[:, None] * S + K_out.T @ Delta
    return jnp.concatenate(outputs), S


# %% [markdown]
# Only the three lines with `S` depend on the state; everything else can be computed for all
# chunks at once. The cell runs the function on every head (`jax.vmap`) and checks it against
# the recurrence and against `kda_lib`'s `kda_chunked`, all in float64.

# %%
with jax.enable_x64(True):
    per_head = jax.vmap(functools.partial(kda_chunked_readable, C=chunk_size),
                        in_axes=(1, 1, 1, 1, 1, 0), out_axes=(1, 0))
    inputs64 = [jnp.asarray(a) for a in (q, k, v, g, beta)]
    o_read, s_read = per_head(*(a[0] for a in inputs64), jnp.asarray(S_in[0]))
    o_ref, s_ref = kda_lib.kda_recurrent(*inputs64, initial_state=jnp.asarray(S_in),
                                         output_final_state=True)
    o_kda, s_kda = kda_lib.kda_chunked(*inputs64, initial_state=jnp.asarray(S_in),
                                       output_final_state=True, chunk_size=chunk_size)
errors = [assert_close(got, want[0], name=f"readable vs {name}") for got, want, name in (
    (o_read, o_ref, "kda_recurrent"), (s_read, s_ref, "kda_recurrent"),
    (o_read, o_kda, "kda_chunked"), (s_read, s_kda, "kda_chunked"))]
print(f"T = {seq_len}, C = {chunk_size}, {num_heads} heads, float64: max |diff| to kda_recurrent "
      f"{max(errors[:2]):.1e}, to kda_chunked {max(errors[2:]):.1e}")

# %% [markdown]
# **The library's form.** `kda_lib.kda_chunked` computes the same for speed and training:
# $(I + L)^{-1}$ by matmuls, float32 scores with no exponent above 0, a `lax.scan` building each
# chunk's state-free lines in its step (`scan="streaming"`, the CPU default; `"sequential"`
# builds all chunks' first), hand-written gradients, segments. **Chaining by maps:** step 4's
# maps compose associatively, $S \mapsto M_{[2]} M_{[1]} S + (M_{[2]} E_{[1]} + E_{[2]})$, so
# `lax.associative_scan` finds every entering state in $2 \log_2 N - 1$ rounds ($N = T / C$;
# `scan="associative"`, the default off CPU) at the price of $d_k \times d_k$ products; context
# parallelism composes them across devices (notebook 05). Checked, rounds counted on the scan:

# %%
with jax.enable_x64(True):
    entering, final = chain_states(*(jnp.asarray(a) for a in (
        maps.transition, maps.state_ext, S_in)))
    o_maps = jnp.einsum("bhnck,bhnkv->bhncv", maps.q_eff, entering) + maps.o_intra
assert_close(final, s_ref, name="associative scan: final state")
assert_close(np.moveaxis(np.asarray(o_maps), 1, 3).reshape(o_ref.shape), o_ref, name="outputs")
for n in sorted({num_chunks, 16, 64} - {1}):
    rounds, j = costs.associative_scan_rounds(n), int(np.log2(n))
    assert len(rounds) == 2 * j - 1 and sum(rounds) == 2 * n - 2 - j, (n, rounds)
    print(f"N = {n:2d} maps: {len(rounds)} rounds, {sum(rounds)} compositions (a loop: {n - 1})")

# %% [markdown]
# ## 5. What it costs, counted on one basis at a time
#
# Flops per head, a multiply-add counted as 2; a ratio compares two counts of one kind only.
# **Matrix products**: every `dot_general` of the traced program, loop trip counts included
# (`costs.matmul_flops`), equal to `kda_lib.lab.costs`' term-by-term count (asserted): per chunk
# the scores $2 C (C - 1) d_k$, the inverse ($1.375\, C^3$ at $C = 64$, asserted below),
# $\tilde K$, $\tilde V$ $2 C^2 (d_k + d_v)$, the state pass $4 C d_k d_v$, the outputs
# $2 C d_k d_v + 2 C^2 d_v$.
# **XLA's cost analysis** adds every elementwise operation (recomputed ones included) but
# counts a loop's body once, so it is taken on one chunk ($T = C$) and one step (`kda_step`).
# **Per state entry** a recurrence step is 4 flops in matrix products ($\mathbf k^\top S$,
# $S^\top \mathbf q$), 7 by hand for all its work (plus 1 to decay, 2 to write), and about 8 in
# XLA's count, the figure notebook 05 uses (XLA counts the decay in both fusions that recompute
# it). At Kimi Linear's head size, $d_k = d_v = 128$, and $C = 64$:

# %%
x_small = [jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta)]
for scan in ("streaming", "sequential", "associative"):  # term-by-term count == traced
    traced = costs.matmul_flops(lambda *a, scan=scan: kda_lib.kda_chunked(
        *a, chunk_size=chunk_size, scan=scan)[0], *x_small)
    assert traced == num_heads * costs.chunked_flops(seq_len, chunk_size, key_dim, value_dim, scan)
d, C64 = 128, 64
one = random_kda_inputs(key_timing, 1, C64, 1, d, gate="raw")
args = [one["q"], one["k"], one["v"], -jax.nn.softplus(one["g"]), one["beta"],
        jnp.ones((1, 1, d, d))]  # ..., the entering state
chunk = lambda *a: kda_lib.kda_chunked(*a[:5], initial_state=a[5], output_final_state=True,
                                        scan="sequential")
xla = lambda fn, *a: xla_cost(jax.jit(fn).lower(*a).compile())["flops"]

# %%
per_token = {  # basis: (recurrence, chunked) per token
    "matrix products (traced)": (
        costs.matmul_flops(lambda *a: kda_lib.kda_recurrent(*a[:5])[0], *args) / C64,
        costs.matmul_flops(chunk, *args) / C64),
    "XLA's cost analysis": (xla(kda_lib.kda_step, args[5], *(a[:, 0] for a in args[:5])),
                            xla(chunk, *args) / C64)}
(mm_rec, mm_chunk), (xla_rec, xla_chunk) = per_token.values()
assert mm_rec == 4 * d * d and mm_chunk == costs.chunked_flops(C64, C64, d, d) / C64
assert costs.recurrent_flops(1, d, d) == 7 * d * d and 8 * d * d <= xla_rec < 8 * d * d + 20 * d
assert 2.5 < mm_chunk / mm_rec < 2.7 and 1.4 < xla_chunk / xla_rec < 1.7
display(Markdown("| flops per token and head | recurrence | per state entry | chunked | chunked /"
                 " recurrence |\n|---|---|---|---|---|\n" + "\n".join(
                     f"| {basis} | {r:,.0f} | {r / d**2:.2f} | {c:,.0f} | {c / r:.2f} |"
                     for basis, (r, c) in per_token.items())))

# %% [markdown]
# **Against the paper's count.** The Kimi Linear report counts the chunkwise form's flops in its
# Eq. 13, for a single attention head (its efficiency section; see the References); read as
# $6 d^2 + 3 C d + C^2$ per token ($d$ the head size $d_k = d_v$) it gives 126,976 at
# $d = 128$, $C = 64$, against our 169,216 in matrix products. The cell groups our terms the
# same way.

# %%
terms = costs.chunk_terms(C64, d, d)  # matrix-product flops of one chunk, by term
assert terms["inverse"] == 1.375 * C64**3  # the inverse's cost quoted in section 5
ours = {"d^2": (terms["state"] + 2 * C64 * d * d) / C64,  # state pass, and reading S
        "C d": (terms["scores"] + terms["wu"] + 2 * C64 * C64 * d) / C64,  # + in-chunk outputs
        "C^2": terms["inverse"] / C64}  # the triangular inverse
paper = {"d^2": 6 * d**2, "C d": 3 * C64 * d, "C^2": C64**2}
assert sum(paper.values()) == 126_976 and sum(ours.values()) == mm_chunk == 169_216
assert ours["d^2"] == paper["d^2"] and ours["C d"] > 2 * paper["C d"]
per_C = {c: costs.chunked_flops(4096, c, d, d) / 4096 for c in (16, 32, 64, 128, 256)}
assert list(per_C.values()) == sorted(per_C.values())  # more flops per token as C grows
display(Markdown("| per token | ours | Eq. 13 | difference |\n|---|---|---|---|\n" + "\n".join(
    f"| ${n}$ terms | {ours[n]:,.0f} | {paper[n]:,.0f} | {ours[n] - paper[n]:+,.0f} |"
    for n in ours) + f"\n\nThe $d^2$ terms agree (the state pass and the read of the entering "
    f"state). Of the {sum(ours.values()) - sum(paper.values()):,.0f} flops between the totals, "
    f"{ours['C d'] - paper['C d']:,.0f} are in the $C d$ terms, where we count $(8 C - 2) d$ (the "
    f"decayed scores $2 (C - 1) d$, $\\tilde K$ and $\\tilde V$ $4 C d$, the in-chunk outputs "
    f"$2 C d$) and Eq. 13 has $3 C d$; the rest is the inverse, {ours['C^2']:,.0f} against "
    f"$C^2$ = {paper['C^2']:,.0f}. Per token, our count grows with $C$: " + ", ".join(
        f"$C$ = {c}: {f:,.0f}" for c, f in per_C.items()) + ". By flops alone the smallest chunk "
    "would win; section 6 shows why time does not."))

# %% [markdown]
# ## 6. Why $C = 64$: time on an H100
#
# Flops are not time. A chip runs at most its peak flop rate and moves at most its memory
# bandwidth; a kernel takes about the longer of the two (the roofline model). Take the NVIDIA
# H100 SXM's dense bf16 tensor-core peak and HBM bandwidth as `at_scale.CHIPS` records them from
# NVIDIA's product page (printed below), and model a chunk of one head as passes that keep
# 2-byte numbers in HBM (`chunkwise.chunk_bytes`): inputs read and outputs written,
# $C (3 d_k + 2 d_v + 1)$ numbers; the two $C \times C$ matrices ($P$, $(I + L)^{-1}$), $\tilde
# K$ and $\tilde V$ written and read back, $2 (2 C^2 + C (d_k + d_v))$; the entering state
# written and read back, $2 d_k d_v$. Per token the state's share falls as $1/C$, the $C \times
# C$ matrices' grows as $C$: bytes are least at $C^\ast = \sqrt{d_k d_v / 2}$.

# %%
chip = at_scale.CHIPS["H100 SXM"]
print(f"{chip.name}: {chip.peak_flops / 1e12:.0f} TFLOP/s, {chip.hbm_bandwidth / 1e12:.2f} TB/s "
      f"(source: {chip.source})")
roof = chunkwise.roofline(per_C, d, d, chip)  # C -> (compute, memory, roofline, sum) per token
best = min(r[2] for r in roof.values())
assert roof[64][2] < 1.01 * best and roof[128][2] < 1.01 * best and roof[16][2] > 1.5 * best
assert min(roof, key=lambda c: roof[c][3]) == 64 and all(r[1] > r[0] for r in roof.values())
viz.show(chunkwise.roofline_figure(roof, chip, d), "03_roofline_chunk_size")
display(Markdown(
    "Per token and head: " + ", ".join(f"$C$ = {c}: {roof[c][2] * 1e9:.2f} ns" for c in roof)
    + f" (roofline). All memory-bound: {per_C[64] / (chunkwise.chunk_bytes(64, d, d) / 64):.0f} "
    f"flop/byte at $C$ = 64 against a ridge of {chip.ridge:.0f}. With bytes least at $C^\\ast$ = "
    f"{np.sqrt(d * d / 2):.1f}, $C$ = 64 and 128 tie, {roof[16][2] / roof[64][2]:.2f}x faster "
    "than $C$ = 16 (state traffic); without overlap $C$ = 64 wins on its fewer flops. A model "
    "(real kernels fuse some passes), but the reason holds: small chunks pay for moving the "
    "state, large ones for their $C \\times C$ blocks, and 64 sits between."))

# %% [markdown]
# ## 7. Measured time on this machine
#
# Batch 1, `timing_heads` heads, $d_k = d_v$ = `timing_dim`: the recurrence, `kda_lib`'s and
# tokamax's pure-JAX chunked forms (`kda_lib.kda`) and causal softmax attention; medians of
# `timing_repeats` calls after a compiling warm-up. The table is this run's and is not
# asserted: CPU timings depend on the machine and its load, and a CPU has no matrix units for
# the chunked form to fill. An accelerator's side is section 6's model; DESIGN's notes read the
# recorded CPU run, where forward plus backward the recurrence is several times slower.

# %%
modes = ["fwd", "fwd+bwd"] if timing_backward else ["fwd"]
timings = chunkwise.time_forms(chunkwise.kda_forms(lower_bound), timing_lengths, key=key_timing,
                               heads=timing_heads, dim=timing_dim, modes=modes,
                               repeats=timing_repeats)
display(Markdown(chunkwise.timing_markdown(timings, timing_lengths, jax.default_backend())))
for mode in modes:
    viz.show(viz.time_vs_length(timing_lengths, timings[mode], [], mode=mode,
                                live_title=f"live: {jax.default_backend()}, {mode}, B=1, "
                                           f"H={timing_heads}, K=V={timing_dim}"),
             f"03_time_vs_length_{mode}")

# %% [markdown]
# ## Summary
#
# - A chunk's pseudo-values solve one unit-lower-triangular system (by hand at $C = 3$, then in
#   five float64-checked steps): $\Delta = \tilde V - \tilde K S_{\text{in}}$, and the chunk is
#   the affine map $M_{[i]} S_{\text{in}} + E_{[i]}$, $M_{[i]} = \Gamma_C - \overrightarrow
#   K^\top \tilde K$: a diagonal minus a matrix of rank $\le \min(C, d_k)$ (the WY form).
# - The whole forward pass is one short function, equal to `kda_recurrent` and `kda_chunked` in
#   float64; the maps also chain by `lax.associative_scan` ($2 \log_2 N - 1$ rounds).
# - On one counting basis at a time the chunked form does more flops than the recurrence, in
#   $T / C$ instead of $T$ steps; against the paper's Eq. 13 the $C d$ and $C^2$ terms differ.
# - Time, not flops, sets $C$: on an H100 SXM (a roofline model) small chunks pay for moving the
#   state, large ones for their $C \times C$ blocks; in this model $C = 64$ and $C = 128$ tie at
#   the minimum (bytes least near $\sqrt{d_k d_v / 2}$), so it does not single out the $C = 64$
#   that the paper and fla use.
#
# ## Exercises
#
# Each exercise cell leaves `answer = None` for you; `check` says whether your answer is right
# without showing the expected one. Worked solutions are in [`notebooks/solutions/ch03.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch03.py).
#
# The checkers call your functions on chunks of their own, accept float32 or float64, NumPy or
# `jnp`, and refuse any answer that runs `kda_lib` code.

# %% [markdown]
# 1. **No decay.** With $\mathbf g = 0$, $\Gamma_t = I$ and $\overleftarrow K = \overrightarrow K
#    = K$. Write `wy_factor(k, beta)` returning the chunk's $\tilde K$ $[C, d_k]$ of step 3
#    (keys `k` $[C, d_k]$, `beta` $[C]$); check on `kc`, `bc` that $I - K^\top \tilde K$ (step
#    4) is the product of the $I - \beta_t \mathbf k_t \mathbf k_t^\top$. The checker also
#    tries $C > d_k$, where $\tilde K$ cannot be read back from that product.

# %%
answer = None  # a function wy_factor(k, beta) -> K~ [C, d_k]
check("03.1", answer)

# %% [markdown]
# 2. **Gated DeltaNet's chunk scores.** With one decay per head, $\mathbf g_t = g_t \mathbf 1$,
#    $\Gamma_t = e^{\gamma_t} I$ leaves the inner product, and the decayed scores are plain
#    scores times one $C \times C$ mask, $P^{\text{GDN}} = \tfrac{1}{\sqrt{d_k}} (Q K^\top) \odot
#    \mathcal D$ with $\mathcal D_{ts} = e^{\gamma_t - \gamma_s}$ for $s \le t$ (per-channel decay
#    has a different mask per channel). Write `gdn_scores(q, k, g, scale)` for one chunk (`g`
#    $[C]$, one log decay per token) with no exponent above 0 ever formed, not even one masked
#    afterwards. The checker runs it at $C = 64$ with strong decay too, where such an exponent
#    overflows, and watches every exponent your function forms (`np.exp`, `np.power`,
#    `math.exp`, and `jnp`'s exponentials, jitted or not).

# %%
answer = None  # a function gdn_scores(q, k, g, scale) -> P [C, C]
check("03.2", answer)

# %% [markdown]
# ## References
#
# - S. Yang, B. Wang, Y. Zhang, Y. Shen, Y. Kim, *Parallelizing linear transformers with the
#   delta rule over sequence length* (DeltaNet's chunkwise WY form), NeurIPS 2024.
#   [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta rule*,
#   ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (KDA's chunkwise
#   algorithm with per-channel decay; section 6.3, Eq. 13: the flop count), 2025.
#   [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - C. Bischof, C. Van Loan, *The WY representation for products of Householder matrices*, SIAM
#   J. Sci. Stat. Comput. 8(1), 1987. [doi:10.1137/0908009](https://doi.org/10.1137/0908009)
# - T. Joffrain, T. M. Low, E. S. Quintana-Ortí, R. van de Geijn, F. G. Van Zee, *Accumulating
#   Householder transformations, revisited* (the UT transform), ACM TOMS 32(2), 2006.
#   [doi:10.1145/1141885.1141886](https://doi.org/10.1145/1141885.1141886)
# - G. E. Blelloch, *Prefix sums and their applications*, 1990. [CMU-CS-90-190](https://www.cs.cmu.edu/~guyb/papers/Ble93.pdf)
