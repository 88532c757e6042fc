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
# **Claim.** Linear attention stores key/value pairs by adding outer products into a `K x V`
# matrix, so every stored pair leaks into every recall. The delta rule instead writes only the
# part of the value the memory gets wrong: it is one gradient step on the recall error
# `1/2 ||S^T k - v||^2` with learning rate `beta`, and it recalls far more reliably while the
# number of pairs stays below the key dimension `K`. Adding a forget gate gives the gated delta
# rule (one decay per head) and then KDA (one decay per key channel), whose per-token
# transition is a diagonal-plus-low-rank matrix. We build each step as a few lines of NumPy,
# check them against `kda_lib`, and measure recall against the number of stored pairs.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/01_delta_rule.ipynb)
#
# CI runs the small defaults of the `parameters` cell below in seconds; `make notebooks
# PARAMS=full` runs the bigger experiment in `notebooks/params/full/01_delta_rule.yaml`.

# %% tags=["parameters"]
key_dim: int = 32  # K: dimension of keys (and of the memory's rows)
value_dim: int = 32  # V: dimension of values
max_pairs: int = 64  # largest number of key/value pairs stored in the recall experiment
num_seeds: int = 8  # independent draws of keys and values averaged in the recall experiment
toy_len: int = 24  # tokens in the toy-vs-kda_lib comparison
half_life_min: float = 16.0  # tokens: shortest per-channel half-life of the KDA memory
half_life_max: float = 256.0  # tokens: longest per-channel half-life of the KDA memory
seed: int = 0  # seed of the one jax.random.key below

# %%
# Setup: install kda_lib when it is missing (e.g. on Colab); a no-op wherever it is importable.
try:
    import kda_lib
except ImportError:
    # %pip install -q git+https://github.com/kda-notebooks/kda-notebooks
    import kda_lib

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from kda_lib import viz
from kda_lib.testing import assert_close

viz.setup_style()
# Draw random numbers with the non-partitionable threefry: on CPU it compiles multi-dimensional
# draws many times faster (seconds per shape otherwise); it only changes which numbers are drawn.
jax.config.update("jax_threefry_partitionable", False)

# %%
# Derived values
key = jax.random.key(seed)
key_memory, key_delta, key_gate, key_toy, key_recall = jax.random.split(key, 5)


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
# Causal linear attention outputs `o_t = sum_{s <= t} (q_t . k_s) v_s`. Pulling `q_t` out of
# the sum gives `o_t = S_t^T q_t` with the **state** `S_t = sum_{s <= t} k_s v_s^T`, a `K x V`
# matrix updated by one outer product per token: `S_t = S_{t-1} + k_t v_t^T`. The state is a
# memory of key/value pairs; querying it with a stored key `k_j` returns
#
# `S^T k_j = v_j (k_j . k_j) + sum_{i != j} (k_i . k_j) v_i`,
#
# the right value plus **crosstalk** from every other pair. With orthonormal keys the crosstalk
# vanishes, but at most `K` keys can be orthonormal; random unit keys overlap by about
# `1/sqrt(K)` each, so the crosstalk grows like `sqrt((n - 1) / K)` with `n` stored pairs.

# %%
n_demo = key_dim // 2
key_pairs_demo, key_queries, key_ortho = jax.random.split(key_memory, 3)
keys, values = random_pairs(key_pairs_demo, n_demo)
queries = unit_rows(jax.random.normal(key_queries, (n_demo, key_dim)))

# attention form vs state form
causal = np.tril(np.ones((n_demo, n_demo)))
o_attention = ((queries @ keys.T) * causal) @ values
states = np.cumsum(np.einsum("tk,tv->tkv", keys, values), axis=0)  # S_t for every t
o_state = np.einsum("tk,tkv->tv", queries, states)
assert_close(o_state, o_attention, name="state form")

# exact recall with orthonormal keys, crosstalk with random ones
ortho = np.linalg.qr(np.asarray(jax.random.normal(key_ortho, (key_dim, key_dim)), np.float64))[0]
ortho_keys = ortho.T[:n_demo]  # n_demo orthonormal rows
memory = ortho_keys.T @ values
assert_close(ortho_keys @ memory, values, atol=1e-12, name="recall, orthonormal keys")

memory = keys.T @ values  # S = sum_i k_i v_i^T
recalled = keys @ memory  # row j: S^T k_j
overlap = keys @ keys.T
crosstalk = (overlap - np.eye(n_demo)) @ values
assert_close(recalled, values + crosstalk, atol=1e-12, name="crosstalk identity")
rel_error = np.linalg.norm(recalled - values) / np.linalg.norm(values)
print(f"{n_demo} random pairs in K={key_dim}: relative recall error {rel_error:.2f} "
      f"(sqrt((n-1)/K) = {np.sqrt((n_demo - 1) / key_dim):.2f})")
assert rel_error > 0.25, "random keys should interfere"

# %% [markdown]
# ## 2. The delta rule: write only what the memory gets wrong
#
# Before writing `(k_t, v_t)`, read what the memory already returns for `k_t`,
# `v_old = S^T k_t`, and store only the difference, scaled by a write strength `beta_t`:
#
# `S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T`.
#
# This is exactly one step of gradient descent on the recall loss
# `L(S) = 1/2 ||S^T k_t - v_t||^2`, whose gradient is `k_t (S^T k_t - v_t)^T`, with learning
# rate `beta_t`. With a unit key and `beta_t = 1` the step lands on the minimum: right after
# the write the memory returns `v_t` exactly. Writing a new value under an old key
# **replaces** it, where linear attention would return the sum of both.

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
    sgd_step = S0 - beta_demo * np.asarray(jax.grad(recall_loss)(jnp.asarray(S0)))  # float64
assert_close(delta_write(S0, k_new, v_new, beta_demo), sgd_step, name="delta rule = SGD step")

S1 = delta_write(S0, k_new, v_new, 1.0)
assert_close(k_new @ S1, v_new, atol=1e-12, name="exact recall after a beta=1 write")

# overwrite: same key, new value
v_newer = -v_new
linear_memory = np.outer(k_new, v_new) + np.outer(k_new, v_newer)
delta_memory = delta_write(delta_write(np.zeros_like(S0), k_new, v_new, 1.0), k_new, v_newer, 1.0)
assert_close(k_new @ linear_memory, v_new + v_newer, atol=1e-12, name="linear: sum")
assert_close(k_new @ delta_memory, v_newer, atol=1e-12, name="delta: replaced")
print("delta rule = one SGD step on 1/2 |S^T k - v|^2 with learning rate beta: checked")
miss_linear = np.linalg.norm(k_new @ linear_memory - v_newer)
miss_delta = np.linalg.norm(k_new @ delta_memory - v_newer)
print(f"overwrite one key: |recall - new value| = {miss_linear:.2f} (linear attention), "
      f"{miss_delta:.1e} (delta rule)")

# %% [markdown]
# As a map of the state, the delta write is `S_t = (I - beta_t k_t k_t^T) S_{t-1} +
# beta_t k_t v_t^T`. For a unit key, `I - beta k k^T` leaves every direction orthogonal to `k`
# alone and shrinks the `k` direction by `1 - beta`: its eigenvalues are `1` (`K - 1` times) and
# `1 - beta`, so for `beta` in [0, 1] it never amplifies the state.

# %%
transition = np.eye(key_dim) - beta_demo * np.outer(k_new, k_new)
eigenvalues = np.sort(np.linalg.eigvalsh(transition))
assert_close(eigenvalues, np.r_[1 - beta_demo, np.ones(key_dim - 1)], atol=1e-12,
             name="eigenvalues of I - beta k k^T")
print(f"eigenvalues of I - beta k k^T: {eigenvalues[0]:.2f} once, 1.00 x {key_dim - 1}")

# %% [markdown]
# ## 3. Forgetting: scalar decay, then one decay per channel
#
# A memory that only overwrites cannot clear what is no longer relevant. The **gated delta
# rule** decays the whole state by a scalar `alpha_t = exp(g_t)` in (0, 1] before the write.
# **KDA** makes the decay per key channel, `diag(exp(g_t))` with `g_t` in `R^K`, `g_t <= 0`,
# so some channels keep memories for thousands of tokens while others turn over in a few:
#
# `S_t = (I - beta_t k_t k_t^T) diag(exp g_t) S_{t-1} + beta_t k_t v_t^T`.
#
# The transition `A_t = (I - beta_t k_t k_t^T) D_t = D_t - beta_t k_t (D_t k_t)^T` is
# **diagonal plus rank one**: cheap to apply, and with `||k_t|| = 1` its spectral norm is at
# most 1. `kda_lib.kda_step` is this update followed by the read `o_t = scale * S_t^T q_t`.

# %%
keys_g = jax.random.split(key_gate, 3)
g_t = -np.asarray(jax.random.uniform(keys_g[0], (key_dim,), maxval=0.5), np.float64)
(k_t,), (v_t,) = random_pairs(keys_g[1], 1)
q_t = unit_rows(jax.random.normal(keys_g[2], (key_dim,)))
decay = np.diag(np.exp(g_t))
A_t = (np.eye(key_dim) - beta_demo * np.outer(k_t, k_t)) @ decay
assert_close(A_t, decay - beta_demo * np.outer(k_t, decay @ k_t), atol=1e-12,
             name="diagonal plus rank one")
assert np.linalg.norm(A_t, 2) <= 1 + 1e-12, "the KDA transition never amplifies the state"



def lib_step(S, q, k, v, g, beta):
    """kda_lib.kda_step on one head in float64 (adds and removes the B = H = 1 axes)."""
    with jax.enable_x64(True):
        as_batch = lambda x: jnp.asarray(x, jnp.float64)[None, None]  # noqa: E731
        S, o = kda_lib.kda_step(as_batch(S), as_batch(q), as_batch(k), as_batch(v),
                                as_batch(g), jnp.full((1, 1), beta, jnp.float64))
        return np.asarray(S[0, 0]), np.asarray(o[0, 0])


S_next, o_next = lib_step(S0, q_t, k_t, v_t, g_t, beta_demo)
assert_close(S_next, A_t @ S0 + beta_demo * np.outer(k_t, v_t), name="kda_step state")
assert_close(o_next, key_dim**-0.5 * q_t @ S_next, name="kda_step read")

# the gated delta rule is KDA with the same decay in every channel: decay, then delta write
g_scalar = g_t[0]
gated = delta_write(np.exp(g_scalar) * S0, k_t, v_t, beta_demo)
S_uniform, _ = lib_step(S0, q_t, k_t, v_t, np.full(key_dim, g_scalar), beta_demo)
assert_close(S_uniform, gated, name="gated delta rule = KDA with uniform decay")
print(f"|A_t|_2 = {np.linalg.norm(A_t, 2):.3f} <= 1; kda_step matches the matrix form, and "
      "with one decay for all channels it is the gated delta rule")

# %% [markdown]
# ## 4. The whole recurrence in six lines
#
# Everything above fits in one loop. This toy is the mathematical definition `kda_lib`
# implements (per head, with a query scale `K^-1/2` by default); we run it in float64 and
# check it against `kda_lib.kda_recurrent` under `jax.enable_x64`, with the gate computed by
# `kda_lib.kda_gate` from random raw inputs, for two heads.

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


num_heads = 2
ks = jax.random.split(key_toy, 7)
shape = (1, toy_len, num_heads, key_dim)
q = unit_rows(jax.random.normal(ks[0], shape))
k = unit_rows(jax.random.normal(ks[1], shape))
v = np.asarray(jax.random.normal(ks[2], (1, toy_len, num_heads, value_dim)), np.float64)
g = np.asarray(
    kda_lib.kda_gate(
        jax.random.normal(ks[3], shape),
        kda_lib.init_a_log(ks[4], num_heads),
        kda_lib.init_dt_bias(ks[5], num_heads, key_dim),
    ),
    np.float64,
)
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
# ## 5. How many pairs fit? Recall error against the number of stored pairs
#
# Store `n` random pairs (unit keys, values of norm about 1) one token at a time, then query
# the final memory with every stored key and measure the relative recall error
# `||S^T k_j - v_j||^2 / ||v_j||^2`, averaged over pairs and over `num_seeds` draws. Three
# memories: linear attention (`S += k v^T`), the delta rule (`beta = 1`, no decay) and KDA
# (`beta = 1`, per-channel decay with half-lives log-uniform in
# [`half_life_min`, `half_life_max`] tokens). One pass over each sequence gives the memory
# after every prefix, so all `n` come from the same runs.

# %%
def recall_errors(states, keys, values):
    """err[n, j]: relative error recalling pair j from the memory after n + 1 writes."""
    recalled = np.einsum("nkv,jk->njv", states, keys)
    return np.sum((recalled - values[None]) ** 2, -1) / np.sum(values**2, -1)[None]


key_pairs, key_life = jax.random.split(key_recall)
all_keys, all_values = random_pairs(key_pairs, max_pairs, batch=(num_seeds,))
log_life = jax.random.uniform(key_life, (num_seeds, key_dim), minval=np.log(half_life_min),
                              maxval=np.log(half_life_max))
g_channels = np.log(0.5) / np.exp(np.asarray(log_life, np.float64))  # per step, <= 0

stored = np.tril(np.ones((max_pairs, max_pairs)))  # stored[n, j]: pair j is in memory n
curves = {"linear attention": [], "delta rule": [], "KDA": []}
by_age = {name: [] for name in curves}
ones = np.ones(max_pairs)
for s in range(num_seeds):
    keys_s, values_s = all_keys[s], all_values[s]
    no_decay = np.zeros((max_pairs, key_dim))
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

# %%
n_pairs = np.arange(1, max_pairs + 1)
fig, (ax_n, ax_age) = plt.subplots(1, 2, figsize=(10, 3.8))
styles = {"linear attention": "-", "delta rule": "--", "KDA": "-."}
for name, curve in curves.items():
    ax_n.plot(n_pairs, curve, styles[name], label=name)
    ax_age.plot(np.arange(max_pairs), by_age[name], styles[name], label=name)
ax_n.axvline(key_dim, color="0.4", linewidth=1, linestyle=":")
ax_n.annotate(f"n = K = {key_dim}", (key_dim, ax_n.get_ylim()[1] * 0.95), xytext=(4, 0),
              textcoords="offset points", va="top", fontsize=9, color="0.3")
ax_n.set_title("Recall error vs pairs stored")
ax_n.set_xlabel("stored key/value pairs n")
ax_n.set_ylabel("mean |S^T k - v|^2 / |v|^2")
ax_n.legend(loc="upper left")
ax_age.axhline(1.0, color="0.4", linewidth=1, linestyle=":")
ax_age.annotate("error 1 = recalls nothing", (0, 1.0), xytext=(0, 4),
                textcoords="offset points", ha="left", fontsize=9, color="0.3")
ax_age.legend(loc="lower right")
ax_age.set_title(f"After {max_pairs} writes: error by age of the pair")
ax_age.set_xlabel("age of the pair (writes since it was stored)")
ax_age.set_ylabel("|S^T k - v|^2 / |v|^2")
fig.suptitle(f"Associative recall, K = V = {key_dim}, mean over {num_seeds} seeds")
viz.show(fig, "01_recall_vs_pairs")

# %%
lin, delta, kda_curve = curves["linear attention"], curves["delta rule"], curves["KDA"]
upto_k = slice(1, min(key_dim, max_pairs))  # n = 2 .. K (n = 1 is exact for all three)
assert np.all(delta[upto_k] < lin[upto_k]), "delta rule should beat linear attention for n <= K"
assert max(lin[0], delta[0], kda_curve[0]) < 1e-12, "one pair is recalled exactly"
if max_pairs >= 2 * key_dim:
    assert kda_curve[-1] < delta[-1], "beyond capacity, forgetting beats interference"
at_k = min(key_dim, max_pairs) - 1
print(f"n = {at_k + 1}: linear {lin[at_k]:.2f}, delta {delta[at_k]:.2f}, KDA {kda_curve[at_k]:.2f}")
print(f"n = {max_pairs}: linear {lin[-1]:.2f}, delta {delta[-1]:.2f}, KDA {kda_curve[-1]:.2f}")

# %% [markdown]
# Reading the figure: linear attention's error grows like `(n - 1) / K` from the first
# overlapping pair on; the delta rule recalls the newest pairs exactly and stays well below it
# up to `n = K`, after which it must overwrite older pairs too. KDA's decay (half-lives of at
# least `half_life_min` tokens here) barely changes the recall of recent pairs; beyond capacity
# it lets old pairs fade to
# "recalls nothing" (error 1) instead of leaving them as interference (error above 1), so its
# average error ends lowest. In a trained model the gates choose, per channel and per token,
# how long to remember; notebook 02 looks at those gates.
#
# ## Summary
#
# - Linear attention's state `S = sum k v^T` is an associative memory whose recall of pair `j`
#   carries crosstalk `sum_{i != j} (k_i . k_j) v_i` (identity checked).
# - The delta rule writes `beta k (v - S^T k)^T`: one SGD step on `1/2 ||S^T k - v||^2`
#   (checked with `jax.grad`); it recalls the newest pair exactly and overwrites old values.
# - Gated delta rule = scalar decay; KDA = per-channel decay, a diagonal-plus-rank-one
#   transition with spectral norm at most 1; `kda_step` is exactly that update and read.
# - A six-line NumPy recurrence equals `kda_lib.kda_recurrent` in float64.
# - Recall: the delta rule beats linear attention for every `n <= K`; beyond capacity KDA's
#   forgetting gives the lowest error.
