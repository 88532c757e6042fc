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
# **Claim.** The token-by-token recurrence can be regrouped into chunks of `C` tokens. Each
# chunk acts on the state entering it as an affine map `S_out = M S_in + S_ext`, and all the
# maps (and the chunk's own outputs) come from one unit-lower-triangular solve per chunk, the
# WY/UT form, computed for every chunk in parallel with matrix products. Only the small
# `K x K` maps are chained across chunks: sequentially in `T / C` steps, or with an
# associative scan in `log2(T / C)` steps. We derive the map, build it by hand, compose the
# chunks both ways, and check that the result equals the recurrence in float64; then we count
# the cost of each form and time them, alongside softmax attention.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/03_chunkwise_algorithm.ipynb)
#
# CI runs the small defaults of the `parameters` cell below in seconds; `make notebooks
# PARAMS=full` runs the bigger experiment in `notebooks/params/full/03_chunkwise_algorithm.yaml`.

# %% tags=["parameters"]
seq_len: int = 128  # T: tokens in the correctness checks (a multiple of chunk_size)
chunk_size: int = 32  # C: tokens per chunk (a power of two, at least 16)
num_heads: int = 2  # heads in the correctness checks
key_dim: int = 32  # K
value_dim: int = 16  # V (different from K on purpose)
lower_bound: float = -5.0  # safe gate bound used for every gate here (tokamax needs it)
timing_lengths: list = [256, 1024, 4096]  # T values timed live (tokens)
timing_heads: int = 2  # heads in the timing runs (batch 1)
timing_dim: int = 64  # K and V in the timing runs
timing_backward: bool = False  # also time forward + backward (gradient of sum of outputs)
timing_repeats: int = 3  # timed calls per point, after one warm-up call; the median is shown
seed: int = 0  # seed of the one jax.random.key below

# %%
# Setup: install kda_lib when it is missing (e.g. on Colab); a no-op wherever it is importable.
try:
    import kda_lib
except ImportError:
    # %pip install -q git+https://github.com/kda-notebooks/kda-notebooks
    import kda_lib

import pathlib
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from kda_lib import viz
from kda_lib.chunked import chain_states, chunk_affine_maps, compose_affine, unit_lower_inverse
from kda_lib.kernel import l2_normalize
from kda_lib.testing import assert_close

viz.setup_style()
# Draw random numbers with the non-partitionable threefry: on CPU it compiles multi-dimensional
# draws many times faster (seconds per shape otherwise); it only changes which numbers are drawn.
jax.config.update("jax_threefry_partitionable", False)

# %%
# Derived values
assert seq_len % chunk_size == 0, "the hand-built chunks below need T to be a multiple of C"
num_chunks = seq_len // chunk_size
scale = key_dim**-0.5
key = jax.random.key(seed)
key_inputs, key_state, key_timing = jax.random.split(key, 3)


@jax.jit(static_argnums=(1, 2, 3, 4))
def random_inputs(key, seq_len, num_heads, key_dim, value_dim):
    """Batch-1 KDA inputs: unit q/k, raw gate input f, beta in (0, 1), safe-gate parameters."""
    kq, kk, kv, kf, kb, kd = jax.random.split(key, 6)
    shape = (1, seq_len, num_heads, key_dim)
    return dict(
        q=l2_normalize(jax.random.normal(kq, shape)),
        k=l2_normalize(jax.random.normal(kk, shape)),
        v=jax.random.normal(kv, (1, seq_len, num_heads, value_dim)),
        f=jax.random.normal(kf, shape),
        beta=jax.nn.sigmoid(jax.random.normal(kb, (1, seq_len, num_heads))),
        a_log=kda_lib.init_a_log(kd, num_heads, safe_gate=True),
        dt_bias=kda_lib.init_dt_bias(kd, num_heads, key_dim),
    )


x = random_inputs(key_inputs, seq_len, num_heads, key_dim, value_dim)
g32 = kda_lib.kda_gate(x["f"], x["a_log"], x["dt_bias"], lower_bound=lower_bound)
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
# Per token the state update is `S_t = A_t S_{t-1} + beta_t k_t v_t^T` with the
# diagonal-plus-low-rank transition `A_t = (I - beta_t k_t k_t^T) diag(exp g_t)` (notebook 01).
# Composing `C` such steps is still affine in the state that entered the chunk:
#
# `S_out = M S_in + S_ext`, with `M = A_C ... A_1` (`K x K`) and `S_ext` = the state the chunk
# would produce from `S_in = 0` (`K x V`).
#
# The outputs are affine in `S_in` too: `O = Q_eff S_in + O_intra` (`[C, K] @ [K, V]`).
# `kda_lib.chunked.chunk_affine_maps` returns all four for every chunk at once; here we check
# them against the product of transitions and against `kda_recurrent` started from a random
# `S_in`, for the first chunk of head 0.

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

h, n = 0, 0
M, S_ext = maps.transition[0, h, n], maps.state_ext[0, h, n]
product = np.eye(key_dim)
for t in range(chunk_size):
    k_t, g_t, b_t = k[0, t, h], g[0, t, h], beta[0, t, h]
    A_t = (np.eye(key_dim) - b_t * np.outer(k_t, k_t)) @ np.diag(np.exp(g_t))
    product = A_t @ product
assert_close(M, product, name="M = A_C ... A_1")
assert_close(M @ S_in[0, h] + S_ext, s_out[0, h], name="S_out = M S_in + S_ext")
assert_close(maps.q_eff[0, h, n] @ S_in[0, h] + maps.o_intra[0, h, n], o_chunk[0, :, h],
             name="O = Q_eff S_in + O_intra")
print(f"chunk of C = {chunk_size} tokens: M is {M.shape}, S_ext {S_ext.shape}; "
      f"|M|_2 = {np.linalg.norm(M, 2):.3f} (never above 1)")
assert np.linalg.norm(M, 2) <= 1 + 1e-9

# %% [markdown]
# ## 2. Inside a chunk: the WY/UT form
#
# Write `G_t` for the cumulative log decay from the chunk start to token `t` (per channel) and
# `D_t = diag(exp G_t)`. Unrolling the recurrence, each token adds `k_t delta_t^T` (decayed
# to later tokens), where the **pseudo-value** `delta_t = beta_t (v_t - (state before t)^T
# k_t)` depends on the earlier `delta_s` through the key overlaps
#
# `L[t, s] = beta_t k_t^T D_t D_s^{-1} k_s` for `s < t` (strictly lower triangular).
#
# Collecting all `C` of them gives one triangular linear system,
# `(I + L) Delta = diag(beta) V - diag(beta) K_in S_in` with rows `K_in[t] = D_t k_t`, so
#
# `Delta = U - W S_in`, `U = (I + L)^-1 diag(beta) V`, `W = (I + L)^-1 diag(beta) K_in`.
#
# With `K_out[s] = D_C D_s^{-1} k_s` (decay from token `s` to the chunk end) and the causal
# decayed scores `P[t, s] = scale q_t^T D_t D_s^{-1} k_s` (`s <= t`):
#
# `M = D_C - K_out^T W`, `S_ext = K_out^T U`, `Q_eff = scale Q D - P W`, `O_intra = P U`.
#
# Every product here is a dense matrix multiply over the chunk; the only sequential piece,
# the triangular solve, is a `C x C` matrix that `unit_lower_inverse` inverts with matrix
# products. We build everything by hand in float64 (forming `exp(G_t - G_s)` directly, which is
# fine in float64 but overflows in float32 for strong gates; the library never forms it that
# way) and compare with `chunk_affine_maps`.

# %%
qc, kc, vc, gc, bc = (to_chunks(a)[0, h, n] for a in (q, k, v, g, beta))  # one chunk, one head
G = np.cumsum(gc, axis=0)  # [C, K]
ratio = np.exp(G[:, None, :] - G[None, :, :])  # [t, s, K] = D_t D_s^-1 (diagonals)
strict, causal = np.tril(np.ones((chunk_size,) * 2), -1), np.tril(np.ones((chunk_size,) * 2))
L = bc[:, None] * np.einsum("tc,sc,tsc->ts", kc, kc, ratio) * strict
P = scale * np.einsum("tc,sc,tsc->ts", qc, kc, ratio) * causal
K_in, K_out = kc * np.exp(G), kc * np.exp(G[-1] - G)
solve = np.linalg.inv(np.eye(chunk_size) + L)
W, U = solve @ (bc[:, None] * K_in), solve @ (bc[:, None] * vc)
by_hand = {
    "transition M": (np.diag(np.exp(G[-1])) - K_out.T @ W, M),
    "state_ext": (K_out.T @ U, S_ext),
    "q_eff": (scale * qc * np.exp(G) - P @ W, maps.q_eff[0, h, n]),
    "o_intra": (P @ U, maps.o_intra[0, h, n]),
}
for name, (mine, lib) in by_hand.items():
    assert_close(lib, mine, name=name)

with jax.enable_x64(True):
    inv_lib = np.asarray(unit_lower_inverse(jnp.asarray(L)))
    inv_tri = np.asarray(jax.scipy.linalg.solve_triangular(
        jnp.eye(chunk_size) + jnp.asarray(L), jnp.eye(chunk_size), lower=True))
assert_close(inv_lib, solve, name="unit_lower_inverse")
assert_close(inv_tri, solve, name="solve_triangular")
print("WY/UT form by hand == chunk_affine_maps; (I + L)^-1 three ways agree")

# %% [markdown]
# `unit_lower_inverse` avoids a `C`-step row loop: for a strictly lower-triangular `X` of size
# `b`, `X^b = 0`, so the Neumann series `(I + X)^-1 = I - X + X^2 - ...` is finite and equals
# the product `(I - X)(I + X^2)(I + X^4)...` with `log2(b)` factors; blocks of size 16 are
# inverted that way and merged pairwise. The figure shows `L` and `(I + L)^-1 - I` for this
# chunk, both strictly lower triangular. Random unit keys overlap by about `1/sqrt(K)`, so `L`
# is small and `(I + L)^-1 = I - L + L^2 - ...` is close to `I - L`: the right panel is nearly
# the left one with its colours flipped; the higher powers of `L` are the rest.

# %%
block = 16
X = L[:block, :block]
neumann = np.eye(block) - X
power = X
for _ in range(int(np.log2(block)) - 1):
    power = power @ power
    neumann = neumann @ (np.eye(block) + power)
assert_close(neumann, np.linalg.inv(np.eye(block) + X), name="finite Neumann product")
first_order_gap = np.linalg.norm(solve - (np.eye(chunk_size) - L))
assert first_order_gap < np.linalg.norm(L), "(I + L)^-1 is close to I - L for small overlaps"

fig, (ax_l, ax_inv) = plt.subplots(1, 2, figsize=(9, 3.8))
viz.heatmap(ax_l, L, title="L[t, s] = beta_t k_t^T D_t D_s^-1 k_s",
            xlabel="token s in the chunk", ylabel="token t in the chunk", cbar_label="L[t, s]",
            diverging=True)
viz.heatmap(ax_inv, solve - np.eye(chunk_size), title="(I + L)^-1 - I",
            xlabel="token s in the chunk", ylabel="token t in the chunk",
            cbar_label="entry", diverging=True)
fig.suptitle(f"The chunk's triangular system (C = {chunk_size}, head {h}, chunk {n})")
viz.show(fig, "03_triangular_system")

# %% [markdown]
# ## 3. Chaining the chunks: sequentially, or with an associative scan
#
# Applying chunk 1's map then chunk 2's is again an affine map, `(M2 M1, M2 E1 + E2)`
# (`compose_affine`), and this composition is associative. So the states entering the chunks
# can be computed with a plain loop over `N = T / C` chunks (`scan="sequential"`) or with
# `jax.lax.associative_scan` in `log2 N` parallel rounds, at the price of extra `K x K x K`
# products (`scan="associative"`, the default off CPU). Given the entering states, every
# chunk's outputs are `Q_eff S_enter + O_intra`, all chunks in parallel.

# %%
with jax.enable_x64(True):
    all_maps = jax.tree.map(jnp.asarray, maps)  # every chunk and head, from section 1
    chained = {
        mode: jax.tree.map(np.asarray, chain_states(
            all_maps.transition, all_maps.state_ext, jnp.asarray(S_in), mode))
        for mode in ("sequential", "associative")
    }
    triple = [jax.tree.map(lambda a, i=i: a[0, h, i], (all_maps.transition, all_maps.state_ext))
              for i in range(3)] if num_chunks >= 3 else None
    if triple:
        left = compose_affine(compose_affine(triple[0], triple[1]), triple[2])
        right = compose_affine(triple[0], compose_affine(triple[1], triple[2]))
        assert_close(left[0], right[0], name="associativity (M)")
        assert_close(left[1], right[1], name="associativity (E)")
    o_ref, s_ref = kda_lib.kda_recurrent(*(jnp.asarray(a) for a in (q, k, v, g, beta)),
                                         initial_state=jnp.asarray(S_in),
                                         output_final_state=True)
    o_ref, s_ref = np.asarray(o_ref), np.asarray(s_ref)
    chunked = jax.jit(kda_lib.kda_chunked, static_argnames=["chunk_size"])
    o_kda = np.asarray(chunked(*(jnp.asarray(a) for a in (q, k, v, g, beta)),
                               initial_state=jnp.asarray(S_in), chunk_size=chunk_size)[0])
all_maps = jax.tree.map(np.asarray, all_maps)

# a plain Python loop over chunks, as the reader would write it
state, entering = S_in, []
for i in range(num_chunks):
    entering.append(state)
    state = np.einsum("hij,hjv->hiv", all_maps.transition[0, :, i], state[0])[None] \
        + all_maps.state_ext[:, :, i]
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
# Counting multiply-adds as 2 flops, per head and per forward pass (lower-order terms
# dropped; the chunked counts follow `chunk_affine_maps` term by term):
#
# - **recurrent**: `~7 T K V` flops in `T` sequential steps; working memory `K V` (the state).
# - **chunked, sequential scan**:
#   `T (8 C K + 4 C V + C^2 + 2 K^2 + 4 K V + 2 K^2 V / C)` flops in `T / C` steps; working
#   memory `T C + T (K + V) + (T / C)(K^2 + K V)` floats (all chunks in parallel).
# - **chunked, associative scan**: the above `+ (T / C)(4 K^3 + 6 K^2 V)` flops in
#   `log2(T / C)` rounds; memory of the same order.
# - **softmax attention** (causal): `T^2 (K + V)` flops, no sequential dependence; memory
#   `T (K + V)` for keys and values, `+ T^2` for the scores unless fused (flash attention).
#
# Terms of the chunked form: decayed scores `4 C^2 K`, the triangular inverse `~C^3`, `W` and
# `U` `2 C^2 (K + V)`, `Q_eff` and `O_intra` `2 C^2 (K + V)`, the maps `2 C K (K + V)`, the
# inter-chunk output `2 C K V` per chunk, and `2 K^2 V` to step the state per chunk. The
# chunked form does **more** arithmetic than the recurrence, but as large matrix products and
# with `C` times fewer sequential steps, which is what accelerators reward.

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


def cost_table(configs):
    rows = ["| form | " + " | ".join(f"T={T}, C={C}, K={K}, V={V}" for T, C, K, V in configs)
            + " |", "|---|" + "---|" * len(configs)]
    tables = [costs(*c) for c in configs]
    for form in tables[0]:
        cells = [f"{t[form][0] / 1e6:,.1f} MFLOP, {t[form][1]:,.0f} steps" for t in tables]
        rows.append(f"| {form} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


configs = [(seq_len, chunk_size, key_dim, value_dim), (4096, 64, 128, 128), (32768, 64, 128, 128)]
display(Markdown(cost_table(configs)))

# linear vs quadratic growth, and where softmax attention overtakes the chunked form
for T in (1024, 4096):
    small, large = costs(T, 64, 128, 128), costs(2 * T, 64, 128, 128)
    assert np.isclose(large["chunked, sequential"][0], 2 * small["chunked, sequential"][0])
    assert np.isclose(large["softmax attention"][0], 4 * small["softmax attention"][0])
big = costs(4096, 64, 128, 128)
flop_ratio = big["chunked, sequential"][0] / big["recurrent"][0]
assert 1.5 < flop_ratio < 3, "chunked does about twice the recurrence's flops at K = V = 128"
print(f"K = V = 128, C = 64: the chunked form does {flop_ratio:.1f}x the recurrence's flops "
      f"in {big['recurrent'][1] / big['chunked, sequential'][1]:.0f}x fewer sequential steps")
crossover = next(T for T in 2 ** np.arange(6, 20)
                 if costs(T, 64, 128, 128)["softmax attention"][0]
                 > costs(T, 64, 128, 128)["chunked, sequential"][0])
print(f"K = V = 128, C = 64: softmax attention needs more flops than chunked KDA from T = "
      f"{crossover} tokens on")

# %% [markdown]
# ## 5. Measured time against sequence length
#
# Live measurements on this machine, batch 1, `timing_heads` heads, `K = V = timing_dim`,
# safe gate applied inside `kda(...)`: `recurrent` and `chunked` (kda_lib) and
# `tokamax_xla_chunked` (tokamax's pure-JAX chunked form) through `kda_lib.kda`, and causal
# softmax attention (`jax.nn.dot_product_attention`). Each point is the median of
# `timing_repeats` calls after a warm-up call that compiles. Small sizes on a CPU say little
# about accelerators: recorded results from `data/benchmarks/` (written by
# `python -m kda_lib.bench`, possibly on a GPU or TPU) are drawn dashed, labelled with their
# platform; their batch, heads and dimensions are those stored in the JSON file, not
# necessarily the live ones.

# %%
def median_ms(fn, *args, repeats):
    """(median wall time of ``fn(*args)`` in ms, its output), after one untimed warm-up call."""
    out = jax.block_until_ready(fn(*args))  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)), out


def kda_impl(implementation):
    def run(q, k, v, f, beta, a_log):
        return kda_lib.kda(q, k, v, f, beta, a_log=a_log, lower_bound=lower_bound,
                           implementation=implementation)[0]
    return run


def softmax_attention(q, k, v, f, beta, a_log):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


forward = {
    "recurrent": kda_impl("recurrent"),
    "chunked": kda_impl("chunked"),
    "tokamax_xla_chunked": kda_impl("tokamax_xla_chunked"),
    "softmax attention": softmax_attention,
}
try:
    kda_lib.kernel.tokamax_kda_api()
except ImportError as error:  # tokamax is optional outside this repository's environment
    print(f"skipping tokamax_xla_chunked: {error}")
    del forward["tokamax_xla_chunked"]


def with_backward(fn):
    """Gradient of sum(outputs) with respect to q, k and v: one forward + backward pass."""
    return jax.grad(lambda q, k, v, *rest: jnp.sum(fn(q, k, v, *rest)), argnums=(0, 1, 2))


modes = ["fwd", "fwd+bwd"] if timing_backward else ["fwd"]
timings = {mode: {name: [] for name in forward} for mode in modes}
for T in timing_lengths:
    inputs = random_inputs(jax.random.fold_in(key_timing, T), T, timing_heads, timing_dim,
                           timing_dim)
    args = [inputs[name] for name in ("q", "k", "v", "f", "beta", "a_log")]
    for mode in modes:
        outs = {}
        for name, fn in forward.items():
            compiled = jax.jit(fn if mode == "fwd" else with_backward(fn))
            ms, outs[name] = median_ms(compiled, *args, repeats=timing_repeats)
            timings[mode][name].append(ms)
        if mode == "fwd":  # the KDA implementations compute the same thing
            for name in {"chunked", "tokamax_xla_chunked"} & outs.keys():
                assert_close(outs[name], outs["recurrent"], atol=2e-4, rtol=2e-3, name=name)

header = "T (tokens) " + "".join(f"{name:>22s}" for name in forward)
for mode in modes:
    print(f"{mode}, median ms ({jax.default_backend()})\n{header}")
    for i, T in enumerate(timing_lengths):
        print(f"{T:<11d}" + "".join(f"{timings[mode][name][i]:22.2f}" for name in forward))
    for name in forward:
        assert all(np.isfinite(timings[mode][name])) and min(timings[mode][name]) > 0

# %%
candidates = [pathlib.Path("data/benchmarks"), pathlib.Path("../data/benchmarks"),
              pathlib.Path(kda_lib.__file__).resolve().parent.parent / "data" / "benchmarks"]
bench_dir = next((p for p in candidates if p.is_dir()), candidates[-1])
runs, notes = viz.load_benchmark_runs(bench_dir)
for note in notes:
    print("recorded benchmarks:", note)
for run in runs:
    print(f"recorded benchmarks: {run['file']}: {run['label']}, {run['config'] or 'config ?'}")
# kernel-level entries only (kda_lib.bench also times the full layer); its "softmax" is ours
RECORDED = {"recurrent": "recurrent", "chunked": "chunked", "tokamax_xla": "tokamax_xla",
            "tokamax_xla_chunked": "tokamax_xla_chunked", "tokamax_mosaic": "tokamax_mosaic",
            "softmax": "softmax attention"}

colors = dict(zip(forward, viz.CYCLE, strict=False))
fig, axes = plt.subplots(len(modes), 1, figsize=(10, 4.4 * len(modes)), squeeze=False)
for ax, mode in zip(axes[:, 0], modes, strict=True):
    plotted_lengths = set(timing_lengths)
    for name in forward:
        ax.loglog(timing_lengths, timings[mode][name], "o-", color=colors[name],
                  label=f"{name} (live: {jax.default_backend()})")
    for run_index, run in enumerate(runs):
        records = [r for r in run["records"] if r["mode"] == mode and r["impl"] in RECORDED]
        for impl in sorted({r["impl"] for r in records}):
            name = RECORDED[impl]
            points = sorted({int(r["T"]): float(r["median_ms"])
                             for r in records if r["impl"] == impl}.items())
            plotted_lengths.update(t for t, _ in points)
            color = colors.get(name, viz.CYCLE[(len(colors) + run_index) % len(viz.CYCLE)])
            ax.loglog(*zip(*points, strict=True), linestyle=["--", ":", "-."][run_index % 3],
                      marker="s", markersize=3, color=color, label=f"{name} ({run['label']})")
    t_ref = np.array([timing_lengths[0], timing_lengths[-1]], float)
    base = 0.5 * min(series[0] for series in timings[mode].values())  # guides below the data
    ax.loglog(t_ref, base * t_ref / t_ref[0], color="0.6", linewidth=1, label="slope 1 (O(T))")
    ax.loglog(t_ref, base * (t_ref / t_ref[0]) ** 2, color="0.6", linewidth=1, linestyle=":",
              label="slope 2 (O(T^2))")
    ax.set_title(f"Time vs sequence length, {mode} (batch 1, H = {timing_heads}, "
                 f"K = V = {timing_dim})")
    ax.set_xticks(sorted(plotted_lengths), [str(t) for t in sorted(plotted_lengths)])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("median time (ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
viz.show(fig, "03_time_vs_length")

# %%
for mode in modes:
    logs = np.log(np.asarray(timing_lengths, float))
    slopes = {name: np.polyfit(logs, np.log(timings[mode][name]), 1)[0] for name in forward}
    print(f"{mode}: fitted log-log slopes " +
          ", ".join(f"{name} {slope:.2f}" for name, slope in slopes.items()))

# %% [markdown]
# How to read it: on a CPU every form is limited by arithmetic and memory bandwidth, not by
# the number of sequential steps, so in the forward pass the recurrence (fewest flops) is
# competitive and the chunked forms pay for their extra matrix products; softmax attention's
# `T^2` term takes over at long sequences. With `timing_backward=True` (the full parameters)
# the picture changes even on a CPU: differentiating through a `T`-step scan is slow, and the
# chunked forms train several times faster than the recurrence at a few thousand tokens.
# On GPUs and TPUs, where each sequential step costs a kernel launch or a
# loop iteration that leaves most of the chip idle, the chunked forms' `C`-fold fewer steps
# (and the associative scan's `log2`) are what make KDA fast; the recorded results, when
# present, show that regime. Timings are measured, not asserted: they depend on the machine.
#
# ## Summary
#
# - A chunk of `C` tokens is an affine map `S_out = M S_in + S_ext` with
#   `M = A_C ... A_1`, and its outputs are `Q_eff S_in + O_intra` (checked in float64).
# - The WY/UT form gets all four from one unit-lower-triangular solve per chunk, built here by
#   hand and equal to `chunk_affine_maps`; `unit_lower_inverse` matches `inv` and
#   `solve_triangular`.
# - Composing the maps is associative: a sequential loop, `chain_states` in both modes and
#   `kda_chunked` agree with `kda_recurrent` to float64 precision.
# - Costs: recurrent `~7 T K V` flops in `T` steps; chunked about twice the flops for
#   `K = V = 128`, `C = 64`, in `T / C` steps; softmax attention grows as `T^2`.
# - The measured curves show the same picture on this machine; recorded accelerator results
#   (if any) are overlaid with their platform named.
