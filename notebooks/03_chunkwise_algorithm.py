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
# parallel with matrix products. Only the small $d_k \times d_k$ maps are chained across chunks:
# sequentially in $T / C$ steps, or with an associative scan in $\lceil\log_2(T / C)\rceil$
# rounds. We derive the map in five steps, each checked in float64, build it by hand, compose
# the chunks both ways, and check that the result equals the recurrence; then we count the cost
# of each form and time them, alongside softmax attention.
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
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import kda_lib.notebook
from kda_lib import viz
from kda_lib.chunked import chain_states, chunk_affine_maps, compose_affine, unit_lower_inverse
from kda_lib.measure import median_ms
from kda_lib.testing import assert_close, random_kda_inputs

kda_lib.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.notebook.setup()

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
    """[1, T, H, ...] -> [1, H, N, C, ...], the layout of kda_lib.chunked.chunk_affine_maps."""
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
# $O \in \mathbb R^{C \times d_v}$. `kda_lib.chunked.chunk_affine_maps` returns all four for every
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
# Stack the rows: with $\overleftarrow K$ the keys decayed to the chunk start (rows
# $\Gamma_t \mathbf k_t$) and $L$ strictly lower triangular,
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
# decayed to the chunk end (rows $\Gamma_C \Gamma_s^{-1} \mathbf k_s$), then step 3:
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
# **Step 5: the outputs.** The read is $\mathbf o_t = S_t^\top \mathbf q_t / \sqrt{d_k}$. Put in
# step 1 and collect the causal decayed scores
# $P_{ts} = \mathbf q_t^\top \Gamma_t \Gamma_s^{-1} \mathbf k_s / \sqrt{d_k}$ ($s \le t$) and the
# queries decayed to the chunk start, $\overleftarrow Q$ (rows $\Gamma_t \mathbf q_t$):
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
# products. (Forming $e^{\boldsymbol\gamma_t - \boldsymbol\gamma_s}$ directly, as here, is fine
# in float64 but overflows in float32 for strong gates; the library never forms it that way.)

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
# ## 3. Chaining the chunks: sequentially, or with an associative scan
#
# Applying chunk 1's map and then chunk 2's is again an affine map,
#
# $$
# S \mapsto M_{[2]} (M_{[1]} S + E_{[1]}) + E_{[2]}
#   = \underbrace{M_{[2]} M_{[1]}}_{\text{new } M}\, S
#   + \underbrace{M_{[2]} E_{[1]} + E_{[2]}}_{\text{new } E}
# $$
#
# (`compose_affine`), and this composition is associative. So the states entering the chunks
# can be computed with a plain loop over $N = T / C$ chunks (`scan="sequential"`) or with
# `jax.lax.associative_scan` in $\lceil \log_2 N \rceil$ parallel rounds, at the price of extra
# $d_k \times d_k \times d_k$ products (`scan="associative"`, the default off CPU). Given the
# entering states, every chunk's outputs are $Q^{\text{eff}} S_{\text{enter}} + O^{\text{intra}}$,
# all chunks in parallel.

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
    chunked = jax.jit(kda_lib.kda_chunked, static_argnames=["chunk_size"])
    o_kda = np.asarray(chunked(*inputs64, initial_state=jnp.asarray(S_in),
                               chunk_size=chunk_size)[0])
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
err = assert_close(o_kda, o_ref, name="kda_chunked")
print(f"kda_chunked (scan={kda_lib.chunked.default_scan_mode()!r} by default on "
      f"{jax.default_backend()}) vs kda_recurrent, float64: max |diff| = {err:.1e}")
print(f"{num_chunks} chunks: {num_chunks} sequential steps, or "
      f"{int(np.ceil(np.log2(num_chunks)))} associative-scan rounds")

# %% [markdown]
# ## 4. What each form costs
#
# Counting multiply-adds as 2 flops, per head and per forward pass (lower-order terms dropped;
# the chunked counts follow `chunk_affine_maps` term by term):
#
# - **recurrent**: $\approx 7\, T d_k d_v$ flops in $T$ sequential steps; working memory
#   $d_k d_v$ floats (the state).
# - **chunked, sequential scan**:
#   $T\big(8 C d_k + 4 C d_v + C^2 + 2 d_k^2 + 4 d_k d_v + 2 d_k^2 d_v / C\big)$ flops in
#   $T / C$ steps; working memory $T C + T(d_k + d_v) + \frac{T}{C}(d_k^2 + d_k d_v)$ floats
#   (all chunks in parallel).
# - **chunked, associative scan**: the above $+\ \frac{T}{C}\big(4 d_k^3 + 6 d_k^2 d_v\big)$
#   flops in $\lceil\log_2(T / C)\rceil$ rounds; memory of the same order.
# - **softmax attention** (causal): $T^2 (d_k + d_v)$ flops, no sequential dependence; memory
#   $T(d_k + d_v)$ for keys and values, $+\,T^2$ for the scores unless fused (flash attention).
#
# The chunked terms: decayed scores $4 C^2 d_k$, the triangular inverse $\approx C^3$,
# $\tilde K$ and $\tilde V$ $2 C^2 (d_k + d_v)$, $Q^{\text{eff}}$ and $O^{\text{intra}}$
# $2 C^2 (d_k + d_v)$, the maps $2 C d_k (d_k + d_v)$, the inter-chunk output $2 C d_k d_v$ per
# chunk, and $2 d_k^2 d_v$ to step the state per chunk. The chunked form does **more**
# arithmetic than the recurrence, but as large matrix products and with $C$ times fewer
# sequential steps, which is what accelerators reward.

# %%
def costs(T, C, K, V):
    """Forward flops and sequential steps per head for each form (dict of (flops, steps))."""
    chunks = T / C
    chunked = T * (8 * C * K + 4 * C * V + C**2 + 2 * K**2 + 4 * K * V + 2 * K**2 * V / C)
    return {
        "recurrent": (7 * T * K * V, T),
        "chunked, sequential": (chunked, chunks),
        "chunked, associative": (chunked + chunks * (4 * K**3 + 6 * K**2 * V),
                                 np.ceil(np.log2(max(chunks, 1)))),
        "softmax attention": (T**2 * (K + V), 1),
    }


# %%
def cost_table(configs):
    rows = ["| form | " + " | ".join(f"T={T}, C={C}, K={K}, V={V}" for T, C, K, V in configs)
            + " |", "|---|" + "---|" * len(configs)]
    tables = [costs(*c) for c in configs]
    for form in tables[0]:
        cells = [f"{t[form][0] / 1e6:,.1f} MFLOP, {t[form][1]:,.0f} "
                 f"step{'' if t[form][1] == 1 else 's'}" for t in tables]
        rows.append(f"| {form} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


configs = [(seq_len, chunk_size, key_dim, value_dim), (4096, 64, 128, 128), (32768, 64, 128, 128)]
display(Markdown(cost_table(configs)))

# %%
for T in (1024, 4096):  # linear vs quadratic growth
    small, large = costs(T, 64, 128, 128), costs(2 * T, 64, 128, 128)
    assert np.isclose(large["chunked, sequential"][0], 2 * small["chunked, sequential"][0])
    assert np.isclose(large["softmax attention"][0], 4 * small["softmax attention"][0])
big = costs(4096, 64, 128, 128)
flop_ratio = big["chunked, sequential"][0] / big["recurrent"][0]
assert 1.5 < flop_ratio < 3, "chunked does about twice the recurrence's flops at K = V = 128"
crossover = next(T for T in 2 ** np.arange(6, 20)
                 if costs(T, 64, 128, 128)["softmax attention"][0]
                 > costs(T, 64, 128, 128)["chunked, sequential"][0])
display(Markdown(
    f"At $d_k = d_v = 128$, $C = 64$, $T = 4096$ the chunked form does {flop_ratio:.1f}x the "
    f"recurrence's flops in {big['recurrent'][1] / big['chunked, sequential'][1]:.0f}x fewer "
    f"sequential steps; softmax attention needs more flops than chunked KDA from $T = "
    f"{crossover}$ tokens on."))

# %% [markdown]
# ## 5. Measured time against sequence length
#
# Live measurements on this machine, batch 1, `timing_heads` heads, $d_k = d_v$ =
# `timing_dim`, safe gate applied inside `kda(...)`: `recurrent` and `chunked` (kda_lib) and
# `tokamax_xla_chunked` (tokamax's pure-JAX chunked form) through `kda_lib.kda`, and causal
# softmax attention (`jax.nn.dot_product_attention`). Each point is the median of
# `timing_repeats` calls after a warm-up call that compiles (`kda_lib.measure.median_ms`).
# Recorded results from `data/benchmarks/` (written by `python -m kda_lib.bench`, possibly on a
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
runs, notes = viz.load_benchmark_runs()
for note in notes:
    print("recorded benchmarks:", note)
# kernel-level entries only (kda_lib.bench also times the full layer); its "softmax" is ours
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
# How to read it: on a CPU every form is limited by arithmetic and memory bandwidth, not by
# the number of sequential steps, so in the forward pass the recurrence (fewest flops) is
# competitive and the chunked forms pay for their extra matrix products; softmax attention's
# $T^2$ term takes over at long sequences. With `timing_backward=True` (the full parameters)
# differentiating through a $T$-step scan is slow, and the recorded CPU run shows the chunked
# form training faster than the recurrence. On GPUs and TPUs, where each sequential step costs
# a kernel launch or a loop iteration that leaves most of the chip idle, the chunked forms'
# $C$-fold fewer steps (and the associative scan's $\log_2$) are what make KDA fast. Timings are
# measured, not asserted: they depend on the machine.
#
# ## Summary
#
# - A chunk of $C$ tokens is an affine map
#   $S_{\text{out}} = M_{[i]} S_{\text{in}} + E_{[i]}$ with $M_{[i]} = M_C \cdots M_1$, and its
#   outputs are $Q^{\text{eff}} S_{\text{in}} + O^{\text{intra}}$ (checked in float64).
# - Five derived steps (unroll, triangular system, UT transform, chunk map, outputs), each
#   checked in float64, give all four from one unit-lower-triangular solve per chunk, equal to
#   `chunk_affine_maps`; `unit_lower_inverse` matches `inv` and `solve_triangular`.
# - Composing the maps is associative: a sequential loop, `chain_states` in both modes and
#   `kda_chunked` agree with `kda_recurrent` to float64 precision.
# - Costs: recurrent $\approx 7 T d_k d_v$ flops in $T$ steps; chunked about twice the flops
#   at $d_k = d_v = 128$, $C = 64$, in $T / C$ steps; softmax attention grows as $T^2$.
# - Live timings on this machine and recorded runs are drawn side by side, each with its sizes.
#
# ## Exercises
#
# 1. **One token per chunk.** With $C = 1$ the chunk map must be the token's own transition.
#    Check that `chunk_affine_maps` on chunks of one token returns $M_t$ and $E_t$.
# 2. **No decay.** With $\mathbf g = 0$, $\Gamma_t = I$ and $\overleftarrow K = \overrightarrow K
#    = K$. Build $M_{[i]}$ by hand from step 4 for a chunk without decay and compare with the
#    product of the $I - \beta_t \mathbf k_t \mathbf k_t^\top$.
# 3. **Flops vs chunk size.** Using `costs`, find the chunk size in $\{16, 32, 64, 128, 256\}$
#    that minimises the chunked (sequential) flops at $T = 4096$, $d_k = d_v = 128$.
#
# The solutions below are hidden in the rendered page; they run (and assert) in CI.

# %% tags=["solution", "hide-input"]
# 1: C = 1, the first token of head 0
with jax.enable_x64(True):
    one = jax.tree.map(np.asarray, chunk_affine_maps(
        *(jnp.asarray(a[:, :1, :1, None]) for a in (q, k, v, g, beta)), scale=scale))
k0, b0 = k[0, 0, 0], beta[0, 0, 0]
M_0 = (np.eye(key_dim) - b0 * np.outer(k0, k0)) @ np.diag(np.exp(g[0, 0, 0]))
assert_close(one.transition[0, 0, 0], M_0, name="exercise 1: M_t")
assert_close(one.state_ext[0, 0, 0], b0 * np.outer(k0, v[0, 0, 0]), name="exercise 1: E_t")
# 2: no decay, step 4 by hand
L0 = bc[:, None] * (kc @ kc.T) * strict
W0 = np.linalg.solve(np.eye(chunk_size) + L0, bc[:, None] * kc)
plain = np.eye(key_dim)
for t in range(chunk_size):
    plain = (np.eye(key_dim) - bc[t] * np.outer(kc[t], kc[t])) @ plain
assert_close(np.eye(key_dim) - kc.T @ W0, plain, atol=1e-10, name="exercise 2")
# 3: the flop-optimal chunk size
best_C = min((16, 32, 64, 128, 256),
             key=lambda C: costs(4096, C, 128, 128)["chunked, sequential"][0])
assert best_C == 64, best_C
print(f"exercises 1-3: solutions checked (flop-optimal chunk size {best_C})")

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
