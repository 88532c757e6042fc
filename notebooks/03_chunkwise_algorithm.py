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
# **Claim.** Cut the sequence into chunks of $C$ tokens. What a chunk's tokens write into the state
# follows from one $C \times C$ unit-lower-triangular system, solved for all chunks at once with
# matrix products; between chunks only the state travels. The result equals the recurrence (checked
# in float64). $T$ dependent matrix-vector steps become $T / C$, the rest matrix products ($C \times
# C$, $C \times d_k$: a chip's matrix units' work), at more flops a token than the recurrence's $6
# d_k d_v$ (both counted in section 5). Speed: timed on this machine, not ranked.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/03_chunkwise_algorithm.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).

# %% tags=["parameters"]
seq_len: int = 128  # T: tokens in the correctness checks (a multiple of chunk_size)
chunk_size: int = 32  # C: tokens per chunk (a power of two, at least 16; T / C: any count)
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
# Install what is missing (Colab, a fresh VM; 1 to 3 minutes): see the notebook notes.
import importlib.util
import os
import runpy
import subprocess
import sys

NEEDED = ("kda_lib", "jax", "flax", "optax", "numpy", "matplotlib", "tokamax")
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
import functools

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.lab import costs
from kda_lib.ops.chunked import chunk_affine_maps, unit_lower_inverse
from kda_lib.teaching import chunkwise, viz
from kda_lib.teaching.exercises import check
from kda_lib.testing import assert_close, random_kda_inputs

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()

# %%
assert seq_len % chunk_size == 0, "the chunks below need T to be a multiple of C"
num_chunks, scale = seq_len // chunk_size, key_dim**-0.5
key_inputs, key_state, key_timing = jax.random.split(jax.random.key(seed), 3)
x = random_kda_inputs(key_inputs, 1, seq_len, num_heads, key_dim, value_dim, gate="raw")
key_a, key_dt = jax.random.split(jax.random.fold_in(key_inputs, 1))
a_log = kda_lib.init_a_log(key_a, num_heads, safe_gate=True)  # the gates of a new layer
dt_bias = kda_lib.init_dt_bias(key_dt, num_heads, key_dim)
g32 = kda_lib.kda_gate(x["g"], a_log, dt_bias, lower_bound=lower_bound)  # raw input x["g"]
q, k, v, g, beta = (np.asarray(a, np.float64) for a in (x["q"], x["k"], x["v"], g32, x["beta"]))
S_in = np.asarray(jax.random.normal(key_state, (1, num_heads, key_dim, value_dim)), np.float64)
to_chunks = lambda a: np.moveaxis(  # [1, T, H, ...] -> [1, H, N, C, ...], chunk_affine_maps' layout
    a.reshape(1, num_chunks, chunk_size, num_heads, *a.shape[3:]), 3, 1)

# %% [markdown]
# ## 1. The idea: chunks in parallel, the state in sequence
#
# The recurrence: $T$ steps, each waiting for the last, each a matrix-vector product too small for a
# chip's matrix units. **Warm-up**, linear attention ($S_t = S_{t-1} + \mathbf k_t \mathbf
# v_t^\top$, $\mathbf o_t = S_t^\top \mathbf q_t$): a chunk (rows: its tokens) entered with the
# state $S_{\text{in}}$ gives $O = \operatorname{tril}(Q K^\top) V + Q S_{\text{in}}$ (scores of
# $s > t$ zeroed) and hands on $S_{\text{in}} + K^\top V$: products only (checked below). The delta
# rule writes, for $\mathbf v_t$, a pseudo-value depending on the earlier ones: a triangular system.
#
# So the chunked form cuts the tokens into chunks of $C$: what a chunk needs without its entering
# state is computed for **all chunks at once** (triangles: $C \times C$ intra-chunk products); then
# $T / C$ steps carry the state $S_{[i]}$ into chunk $i$ (boxes). The figure's symbols, defined
# below: $\Delta$ (section 2); $\tilde K$, $\tilde V$, $\Gamma_C$, $K_{\text{out}} =
# \overrightarrow K$, $P$, $Q_{\text{in}} = \overleftarrow Q$ (section 3, steps 3 to 5).

# %%
h, i = 0, 0  # head 0, chunk 0 (here and in section 3)
qc, kc, vc, gc, bc = (to_chunks(a)[0, h, i] for a in (q, k, v, g, beta))  # one chunk, one head
S_w = S_in[0, h] + np.cumsum(kc[:, :, None] * vc[:, None], axis=0)  # S_t = S_{t-1} + k_t v_t^T
assert_close(np.tril(qc @ kc.T) @ vc + qc @ S_in[0, h], np.einsum("tk,tkv->tv", qc, S_w),
             atol=1e-12, name="warm-up: O = tril(Q K^T) V + Q S_in, o_t = S_t^T q_t")
assert_close(S_in[0, h] + kc.T @ vc, S_w[-1], atol=1e-12, name="warm-up: S_in + K^T V")
viz.show(viz.chunk_dataflow(num_chunks, chunk_size), "03_dataflow")

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
# \begin{pmatrix} 1 & & \\ 0.3 & 1 & \\ 0 & 0.2 & 1 \end{pmatrix} \begin{pmatrix}
# \boldsymbol\delta_1^\top \\ \boldsymbol\delta_2^\top \\ \boldsymbol\delta_3^\top \end{pmatrix} =
# 0.5 \begin{pmatrix} 1 & 0 \\ 0 & 1 \\ 1 & 1 \end{pmatrix}, \qquad \boldsymbol\delta_3 = 0.5\,(1,
# 1) - 0.2\, \boldsymbol\delta_2 = (0.53, 0.4) .
# $$
#
# Then the state and outputs are products over the chunk: $S_3 = \overrightarrow K^\top \Delta$
# ($\overrightarrow K$: rows $D_3 \cdots D_{s+1} \mathbf k_s$, keys decayed to the chunk end) and
# $O = \sqrt{d_k}\, P \Delta$ (this read lacks $1/\sqrt{d_k}$; $P_{ts} = \mathbf q_t^\top D_t \cdots
# D_{s+1} \mathbf k_s / \sqrt{d_k}$, $s \le t$: causal decayed scores), checked below.

# %%
k3, v3 = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]), np.array([[1.0, 0], [0, 1], [1, 1]])
q3, beta3, keep = np.ones((3, 2)), np.full(3, 0.5), np.array([1.0, 0.5])  # keep: diagonal of D_t
S, deltas, outs = np.zeros((2, 2)), [], []
for t in range(3):  # the recurrence
    S = keep[:, None] * S  # decay
    deltas.append(beta3[t] * (v3[t] - S.T @ k3[t]))  # correct the predicted value
    S = S + np.outer(k3[t], deltas[-1])  # write
    outs.append(S.T @ q3[t])  # read
    print(f"token {t + 1}: delta = {np.round(deltas[-1], 4)}, S = {np.round(S, 4).tolist()}")
assert np.allclose(deltas, [[0.5, 0.0], [-0.15, 0.5], [0.53, 0.4]])

# %%
between = keep ** np.tril(np.arange(3)[:, None] - np.arange(3))[..., None]  # [t, s, c]: keep^(t-s)
L3 = np.tril(beta3[:, None] * np.einsum("tc,sc,tsc->ts", k3, k3, between), -1)
assert np.allclose(L3, [[0, 0, 0], [0.3, 0, 0], [0, 0.2, 0]])
Delta3 = np.linalg.solve(np.eye(3) + L3, beta3[:, None] * v3)  # (I + L) Delta = diag(beta) V
K_out3 = k3 * keep ** (2 - np.arange(3))[:, None]  # rows D_3 ... D_{s+1} k_s
P3 = np.tril(np.einsum("tc,sc,tsc->ts", q3, k3, between))  # sqrt(d_k) P
S3, O3 = K_out3.T @ Delta3, P3 @ Delta3
print(f"L = {L3.tolist()}\nDelta = {np.round(Delta3, 4).tolist()}\nS_3 = K_out^T Delta = "
      f"{np.round(S3, 4).tolist()}\nO = sqrt(d_k) P Delta = {np.round(O3, 4).tolist()}")
with jax.enable_x64(True):
    o3, s3 = kda_lib.kda_recurrent(*(jnp.asarray(a)[None, :, None] for a in (
        q3, k3, v3, np.tile(np.log(keep), (3, 1)), beta3)), scale=1.0, output_final_state=True)
for got, want in ((Delta3, deltas), (S3, S), (O3, outs), (O3, o3[0, :, 0]), (S3, s3[0, 0])):
    assert_close(got, np.asarray(want), atol=1e-14, name="one chunk by hand")

# %% [markdown]
# ## 3. The general chunk in five steps
#
# Now any $C$, $d_k$, $d_v$ and an entering state $S_{\text{in}}$ (the first token's $S_{t-1}$).
# With $\Gamma_t = D_t \cdots D_1 = \operatorname{diag}(e^{\boldsymbol\gamma_t})$ the decay from the
# chunk start to token $t$ ($\boldsymbol\gamma_t = \mathbf g_1 + \dots + \mathbf g_t$), $D_t \cdots
# D_{s+1} = \Gamma_t \Gamma_s^{-1}$, formed for $s \le t$ only: above the diagonal its exponent is
# positive and, for a steep gate (falling 800 over the chunk), overflows even in float64 (counted
# below), so it is masked before `exp`. Each step is checked in float64 on chunk 0, head 0.
#
# **Step 1: unroll** $S_t = D_t S_{t-1} + \mathbf k_t \boldsymbol\delta_t^\top$ to the chunk start:
#
# $$
# S_t = \Gamma_t S_{\text{in}} + \sum_{s \le t} \Gamma_t \Gamma_s^{-1}\, \mathbf k_s
# \boldsymbol\delta_s^\top .
# $$
#
# **Step 2: a triangular system.** Put step 1's $S_{t-1}$ in $\boldsymbol\delta_t$ and stack ($D_t
# \Gamma_{t-1} = \Gamma_t$; $L$: section 2's; $\overleftarrow K$: rows $\Gamma_t \mathbf k_t$):
#
# $$
# \boldsymbol\delta_t + \sum_{s < t} L_{ts} \boldsymbol\delta_s = \beta_t \big(\mathbf v_t -
# S_{\text{in}}^\top \Gamma_t \mathbf k_t\big), \qquad (I + L)\, \Delta =
# \operatorname{diag}(\boldsymbol\beta) \big(V - \overleftarrow K S_{\text{in}}\big) .
# $$

# %%
S_t, states, deltas = S_in[0, h], [], []
for t in range(chunk_size):  # the recurrence, keeping the pseudo-values
    decayed = np.exp(gc[t])[:, None] * S_t
    deltas.append(bc[t] * (vc[t] - kc[t] @ decayed))
    S_t = decayed + np.outer(kc[t], deltas[-1])
    states.append(S_t)
Delta, gamma = np.array(deltas), np.cumsum(gc, axis=0)  # [C, V], [C, K]: rows delta_t, gamma_t
causal = np.tril(np.ones((chunk_size, chunk_size)))  # ratio[t, s]: Gamma_t / Gamma_s, 0 above
ratio = np.exp(np.where(causal[..., None] > 0, gamma[:, None] - gamma[None], -np.inf))  # <= 0
for t in (0, chunk_size // 2, chunk_size - 1):
    assert_close(np.exp(gamma[t])[:, None] * S_in[0, h] + (ratio[t] * kc).T @ Delta,  # s <= t
                 states[t], atol=1e-12, name=f"step 1: unrolled S_{t + 1}")
L = np.tril(bc[:, None] * np.einsum("tc,sc,tsc->ts", kc, kc, ratio), -1)
K_in = kc * np.exp(gamma)  # rows Gamma_t k_t
rhs = bc[:, None] * (vc - K_in @ S_in[0, h])  # diag(beta) (V - K_in S_in)
assert_close((np.eye(chunk_size) + L) @ Delta, rhs, atol=1e-12, name="step 2: (I + L) Delta")
nan = chunkwise.masked_overflow(chunk_size, fall=800.0)  # a gate falling by 800 over the chunk
print(f"steps 1 and 2 checked; steep gate, entries above the diagonal masked after exp: "
      f"{nan['float64']} (float64), {nan['float32']} (float32) NaN; before: {nan['before']}")
assert nan["before"] == 0 and 0 < nan["float64"] < nan["float32"]

# %% [markdown]
# **Why a product of transitions stays thin: the WY form.** Without decay (superscript 0), each of
# notebook 01's transitions adds one outer product to the product before it (induction from
# $\tilde{\mathbf k}^0_1 = \beta_1 \mathbf k_1$):
#
# $$
# (I - \beta_t \mathbf k_t \mathbf k_t^\top) \Big(I - \sum_{s < t} \mathbf k_s
# \tilde{\mathbf k}_s^{0\top}\Big) = I - \sum_{s \le t} \mathbf k_s \tilde{\mathbf k}_s^{0\top},
# \qquad \tilde{\mathbf k}^0_t = \beta_t \Big(\mathbf k_t - \sum_{s < t} (\mathbf k_t^\top
# \mathbf k_s)\, \tilde{\mathbf k}^0_s\Big) .
# $$
#
# Stacked ($\tilde K^0$: rows $\tilde{\mathbf k}_t^{0\top}$), the product of $C$ factors is $I -
# K^\top \tilde K^0$ with $(I + L^0) \tilde K^0 = \operatorname{diag}(\boldsymbol\beta) K$
# ($L^0_{ts} = \beta_t \mathbf k_t^\top \mathbf k_s$, $s < t$: step 2's $L$ without decays). So $I$
# minus the product has rank $\le C$, kept in $2 C d_k$ numbers, not $d_k^2$ (fewer for $C <
# d_k/2$); checked on $d_k/4$ tokens. Step 3's $\tilde K$ is $\tilde K^0$ with decays.

# %%
thin = max(1, min(chunk_size, key_dim // 4))  # fewer tokens than d_k: the factors are thin
kt, bt = kc[:thin], bc[:thin]  # chunk 0 of head 0, its first tokens, decays left out
L0 = np.tril(bt[:, None] * (kt @ kt.T), -1)  # L without the decays
K0_tilde = np.linalg.solve(np.eye(thin) + L0, bt[:, None] * kt)
product = np.eye(key_dim)
for k_t, b_t in zip(kt, bt, strict=True):
    product = (np.eye(key_dim) - b_t * np.outer(k_t, k_t)) @ product
assert_close(product, np.eye(key_dim) - kt.T @ K0_tilde, atol=1e-12, name="I - K^T K~^0")
print(f"first {thin} tokens: I - product = K^T ({key_dim} x {thin}) K~^0 ({thin} x {key_dim}), "
      f"rank {np.linalg.matrix_rank(np.eye(key_dim) - product)}")  # <= thin: the assert above
viz.show(viz.wy_factors(np.eye(key_dim) - product, kt, K0_tilde), "03_wy_form")

# %% [markdown]
# **Step 3: the UT transform** (Joffrain et al.'s name: one small triangular matrix inverted instead
# of the $C$ factors multiplied; lower here, as the newest factor stands on the left). $I + L$ is
# unit lower triangular and free of $S_{\text{in}}$: one solve serves **any** entering state,
#
# $$
# \Delta = \tilde V - \tilde K S_{\text{in}}, \qquad \tilde V = (I + L)^{-1}
# \operatorname{diag}(\boldsymbol\beta) V, \qquad \tilde K = (I + L)^{-1}
# \operatorname{diag}(\boldsymbol\beta) \overleftarrow K
# $$
#
# **Step 4: the chunk's affine map.** Step 1 at $t = C$, with $\overrightarrow K$ the keys
# decayed from their token to the chunk end (rows $\Gamma_C \Gamma_s^{-1} \mathbf k_s$), step 3:
#
# $$
# S_C = \Gamma_C S_{\text{in}} + \overrightarrow K^\top \Delta = \underbrace{\big(\Gamma_C -
# \overrightarrow K^\top \tilde K\big)}_{M_{[i]}} S_{\text{in}} + \underbrace{\overrightarrow K^\top
# \tilde V}_{E_{[i]}} .
# $$
#
# $M_{[i]}$, the product of notebook 01's transitions $M_t = (I - \beta_t \mathbf k_t \mathbf
# k_t^\top) D_t$ (diagonal plus rank one), is in **WY form** (Bischof and Van Loan): a diagonal
# minus $\overrightarrow K^\top \tilde K$ (checked, with `kda_lib`'s `chunk_affine_maps`).

# %%
solve = np.linalg.inv(np.eye(chunk_size) + L)  # kda_lib's unit_lower_inverse: by products only
U, W = solve @ (bc[:, None] * vc), solve @ (bc[:, None] * K_in)  # V~ and K~
assert_close(U - W @ S_in[0, h], Delta, atol=1e-12, name="step 3: Delta = V~ - K~ S_in")
with jax.enable_x64(True):
    assert_close(unit_lower_inverse(jnp.asarray(L)), solve, name="unit_lower_inverse")
    maps = jax.tree.map(np.asarray, jax.jit(chunk_affine_maps, static_argnames=["scale"])(
        *(jnp.asarray(to_chunks(a)) for a in (q, k, v, g, beta)), scale=scale))
M, K_out = maps.transition[0, h, i], kc * np.exp(gamma[-1] - gamma)  # rows Gamma_C / Gamma_s k_s
assert_close(np.exp(gamma[-1])[:, None] * S_in[0, h] + K_out.T @ Delta, states[-1], atol=1e-12,
             name="step 4: S_C = Gamma_C S_in + K_out^T Delta")
assert_close(np.diag(np.exp(gamma[-1])) - K_out.T @ W, M, name="step 4: M = Gamma_C - K_out^T K~")
assert_close(K_out.T @ U, maps.state_ext[0, h, i], name="step 4: E = K_out^T V~")
transitions = [(np.eye(key_dim) - b_t * np.outer(k_t, k_t)) * np.exp(g_t)  # 01's M_t, D_t right
               for k_t, g_t, b_t in zip(kc, gc, bc, strict=True)]  # (I - beta_t k_t k_t^T) D_t
assert_close(M, np.linalg.multi_dot(transitions[::-1]), name="M = M_C ... M_1")  # newest left
print("steps 3 and 4 checked; M == chunk_affine_maps == M_C ... M_1")

# %% [markdown]
# **Step 5: the outputs.** Step 1 in the read $\mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k}$,
# then step 3 ($\overleftarrow Q$: rows $\Gamma_t \mathbf q_t$; $P$: section 2's causal scores):
#
# $$
# O = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S_{\text{in}} + P \Delta = \underbrace{\big(
# \tfrac{1}{\sqrt{d_k}} \overleftarrow Q - P \tilde K\big)}_{Q^{\text{eff}}} S_{\text{in}} +
# \underbrace{P \tilde V}_{O^{\text{intra}}} .
# $$

# %%
P, Q_in = scale * np.einsum("tc,sc,tsc->ts", qc, kc, ratio) * causal, qc * np.exp(gamma)
outputs_chunk = np.array([scale * s_t.T @ q_t for s_t, q_t in zip(states, qc, strict=True)])
assert_close(scale * Q_in @ S_in[0, h] + P @ Delta, outputs_chunk, atol=1e-12,
             name="step 5: O = Q_in S_in / sqrt(d_k) + P Delta")
assert_close(scale * Q_in - P @ W, maps.q_eff[0, h, i], name="step 5: Q_eff")
_ = assert_close(P @ U, maps.o_intra[0, h, i], name="step 5: O_intra")  # == chunk_affine_maps

# %% [markdown]
# ## 4. The whole forward pass in one function
#
# Steps 3 to 5 give all a chunk needs from its entering state $S_{\text{in}}$ (`S`): $\Delta =
# \tilde V - \tilde K S_{\text{in}}$, $O = \tfrac{1}{\sqrt{d_k}} \overleftarrow Q S_{\text{in}} + P
# \Delta$, the state passed on $\Gamma_C S_{\text{in}} + \overrightarrow K^\top \Delta$ (section 1's
# boxes). Looped over the chunks, one head, plain `jax.numpy`, one triangular matrix a chunk, two
# right-hand sides; `where` keeps every exponent $\le 0$ (section 3).

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


# %%
# Only the lines with `S` need the state; the rest could run for all chunks at once. All heads:
with jax.enable_x64(True):
    per_head = jax.vmap(functools.partial(kda_chunked_readable, C=chunk_size),
                        in_axes=(1, 1, 1, 1, 1, 0), out_axes=(1, 0))
    inputs64 = [jnp.asarray(a) for a in (q, k, v, g, beta)]
    o_read, s_read = per_head(*(a[0] for a in inputs64), jnp.asarray(S_in[0]))
    init = dict(initial_state=jnp.asarray(S_in), output_final_state=True)
    o_ref, s_ref = kda_lib.kda_recurrent(*inputs64, **init)
    o_kda, s_kda = kda_lib.kda_chunked(*inputs64, **init, chunk_size=chunk_size)
errors = [assert_close(got, want[0], name=f"readable vs {name}") for got, want, name in (
    (o_read, o_ref, "kda_recurrent"), (s_read, s_ref, "kda_recurrent"),
    (o_read, o_kda, "kda_chunked"), (s_read, s_kda, "kda_chunked"))]
print(f"T = {seq_len}, C = {chunk_size}, {num_heads} heads, float64: max |diff| to kda_recurrent "
      f"{max(errors[:2]):.1e}, to kda_chunked {max(errors[2:]):.1e}")

# %% [markdown]
# ## 5. Dependent steps, flops, and time on this machine
#
# **What the chunked form buys: fewer steps that wait for each other** (the longest `lax.scan` of
# the programs `kda_lib.kda` traces at the timed lengths), and the share of its flops that need no
# state (scores, inverse, $\tilde K$, $\tilde V$: work for all chunks at once). **What it costs**,
# timed here (batch 1, medians of `timing_repeats` calls), not ranked: at these sizes a call's fixed
# cost can dominate its time. Flops a token at $d_k = d_v = d$ (2 a multiply-add; decays left out:
# notebook 10): the recurrence $6 d^2$ ($\mathbf k^\top S$, $S^\top \mathbf q$, $\mathbf k
# \boldsymbol\delta^\top$); `kda_chunked`'s matrix products the same $6 d^2$ ($\tilde K S$,
# $\overleftarrow Q S$, $\overrightarrow K^\top \Delta$) plus $2 d (C - 1)$ ($P$, $L$ below the
# diagonal; $P$'s diagonal, $2 d$ a token, is elementwise there, not counted) $+ 4 C d$ ($\tilde K$,
# $\tilde V$) $+ 2 C d$ ($P \Delta$) $+ \tfrac23 (C^2 - 4)$ (inverse): more, every term being
# positive (the paper's Eq. 13 counts otherwise: [notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-03)).

# %%
modes, forms = ["fwd", "fwd+bwd"][:1 + timing_backward], chunkwise.kda_forms(lower_bound)
for T, recurrent, chunked, C_run, free in chunkwise.step_counts(
        forms, timing_lengths, key=key_timing, heads=timing_heads, dim=timing_dim):
    print(f"T = {T:,}: recurrence {recurrent:,} dependent steps (matrix-vector); chunked "
          f"{chunked:,} (products of C = {C_run} rows), {free:.0%} of its flops state-free")
    assert recurrent == T and chunked * C_run == T and C_run > 1
timings = chunkwise.time_forms(forms, timing_lengths, key=key_timing, heads=timing_heads,
                               dim=timing_dim, modes=modes, repeats=timing_repeats)
display(Markdown(chunkwise.timing_markdown(timings, timing_lengths, dim=timing_dim)))
for C, d in ((C, d) for C in (16, 32, 64, 128) for d in (timing_dim, 128)):  # the formula above
    extra = 2 * d * (C - 1) + 4 * C * d + 2 * C * d + 2 * (C**2 - 4) // 3  # each term > 0
    assert costs.chunked_flops(C, C, d, d) / C == 6 * d * d + extra, (C, d)

# %% [markdown]
# ## Summary
#
# - A chunk's pseudo-values solve one unit-lower-triangular system (by hand at $C = 3$, then in five
#   float64-checked steps): $\Delta = \tilde V - \tilde K S_{\text{in}}$; the chunk is the affine
#   map $M_{[i]} S_{\text{in}} + E_{[i]}$ (WY form; the maps also chain by `lax.associative_scan`:
#   notes, notebook 05). The forward pass is one short function, equal to `kda_recurrent` and
#   `kda_chunked` in float64: $T / C$ dependent steps instead of $T$, at more flops (both counted).
#
# ## Exercises
#
# `check` judges the values your function returns on chunks drawn afresh at each call (float32
# or float64, NumPy or `jnp`; no `kda_lib`). Worked solutions: [`notebooks/solutions/ch03.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch03.py).
#
# 1. **Backward through a chunk.** The gradient of the state entering a chunk, from $\mathrm dS_C$
#    (the chunk's own reads left out), runs back token by token, $\mathrm dS_{t-1} = M_t^\top
#    \mathrm dS_t = D_t (I - \beta_t \mathbf k_t \mathbf k_t^\top) \mathrm dS_t$: token $t$ erases
#    its backward pseudo-value $\boldsymbol\delta'_t = \beta_t \mathrm dS_t^\top \mathbf k_t$, then
#    decays. *Given* (steps 1 to 3 mirrored): $\mathrm dS_{\text{in}} = \Gamma_C \mathrm dS_C -
#    \overleftarrow K^\top \Delta'$ (rows ${\boldsymbol\delta'_t}^\top$), $\Delta' = \tilde K'
#    \mathrm dS_C$, $(I + L') \tilde K' =$ `rhs`, $L'$ strictly triangular, free of $\mathrm dS_C$.
#    *Derive*: is $L'$ upper or lower? Which decays and $\beta$ multiply $\mathbf k_t^\top \mathbf
#    k_s$ in it? What is `rhs`? *Return* from `wy_backward_system(k, g, beta)` (`k`, `g` $[C, d_k]$,
#    `beta` $[C]$) `lhs` $= I + L'$ $[C, C]$ exactly (unit diagonal, no row scaled or combined) and
#    `rhs` $[C, d_k]$; tried also: $C \gtrless d_k$, bursts overflowing $e^{-\boldsymbol\gamma_t}$.
# 2. **Two chunks as one.** From chunk $i$'s factors ($\tilde K_{[i]}$, $\tilde V_{[i]}$,
#    $\overrightarrow K_{[i]}$, log decay across it $\boldsymbol\gamma_{C,[i]}$ $[d_k]$) and chunk
#    $i + 1$'s ($\tilde K_{[i+1]}$, $\tilde V_{[i+1]}$, from its own start; the lengths may differ),
#    derive the pair's $\tilde K$, $\tilde V$ as one chunk's: `merge_chunks(K_tilde_i, V_tilde_i,
#    K_out_i, gamma_i, K_tilde_next, V_tilde_next) -> (K_tilde, V_tilde)`, against step 3 on both.

# %%
answer = None  # a function wy_backward_system(k, g, beta) -> (lhs [C, C], rhs [C, d_k])
check("03.1", answer)
answer = None  # a function merge_chunks(...) -> (K_tilde, V_tilde), arguments as above
check("03.2", answer)

# %% [markdown]
# ## References
#
# - S. Yang et al., *Parallelizing linear transformers with the delta rule over sequence length*,
#   NeurIPS 2024. [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - Kimi Team, *Kimi Linear* (KDA's chunkwise algorithm; section 6.3, Eq. 13: flops), 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - C. Bischof, C. Van Loan, *The WY representation for products of Householder matrices*, 1987. [doi:10.1137/0908009](https://doi.org/10.1137/0908009)
# - T. Joffrain et al., *Accumulating Householder transformations, revisited* (UT transform), 2006. [doi:10.1145/1141885.1141886](https://doi.org/10.1145/1141885.1141886)
# - G. E. Blelloch, *Prefix sums and their applications* (Synthesis of Parallel Algorithms), 1993. [PDF](https://www.cs.cmu.edu/~guyb/papers/Ble93.pdf)
