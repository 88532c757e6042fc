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
# # 02 · Gating and decay: what KDA remembers, and for how long
#
# **Claim.** KDA's forget gate turns a raw per-channel input into a log-space decay `g <= 0`
# with three parameters: `dt_bias` shifts the operating point of each channel, `A = exp(A_log)`
# sets each head's rate, and the safe gate's `lower_bound` caps how much one token can erase.
# At initialisation the per-channel half-lives span more than two orders of magnitude (from
# under a token to hundreds of tokens), so one head holds short- and long-term memories side by
# side. The delta rule keeps the state's norm bounded where linear attention's grows without
# limit, and a KDA head is, for fixed queries, keys and gates, a causal `T x T` linear mixing
# of the values, like attention but with signed weights. Every statement is checked below.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/02_gating_and_decay.ipynb)
#
# CI runs the small defaults of the `parameters` cell below in seconds; `make notebooks
# PARAMS=full` runs the bigger experiment in `notebooks/params/full/02_gating_and_decay.yaml`.

# %% tags=["parameters"]
num_heads: int = 4  # heads whose gate parameters are drawn at initialisation
key_dim: int = 64  # K: channels per head (one decay rate each)
seq_len: int = 96  # tokens in the decay figures (the state-norm run is 4x longer)
lower_bound: float = -5.0  # safe gate: the most negative log decay per token, in [-5, 0)
beta_value: float = 0.9  # write strength beta for the state-norm and mixing-matrix examples
gate_input_std: float = 1.0  # std of the random raw gate input f (stands in for f_proj(x))
mix_len: int = 48  # tokens in the mixing-matrix example
vocab_size: int = 8  # distinct tokens (keys) in the mixing-matrix example
softmax_temperature: float = 0.1  # softmax attention scores are q.k / temperature
interactive: bool = True  # add ipywidgets sliders when ipywidgets is available
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
from kda_lib.kernel import l2_normalize
from kda_lib.testing import assert_close

viz.setup_style()
# Draw random numbers with the non-partitionable threefry: on CPU it compiles multi-dimensional
# draws many times faster (seconds per shape otherwise); it only changes which numbers are drawn.
jax.config.update("jax_threefry_partitionable", False)

# %%
# Derived values
value_dim = key_dim  # V = K in every example here
assert mix_len <= seq_len, "the mixing-matrix example reuses the first mix_len gate values"
key = jax.random.key(seed)
key_a_log, key_dt, key_f, key_stream, key_state = jax.random.split(key, 5)
LN2 = float(np.log(2.0))


def half_life(g):
    """Tokens until a channel with per-token log decay g keeps half of what it stored."""
    return LN2 / np.maximum(-np.asarray(g, np.float64), 1e-30)


# %% [markdown]
# ## 1. Two gate functions
#
# The layer projects each token to a raw gate input `f` (`[B, T, H, K]`), adds a learned
# per-channel bias and activates it into a log decay, with `A = exp(A_log)` per head:
#
# - **softplus gate** (`lower_bound=None`): `g = -A * softplus(f + dt_bias)`. Unbounded below:
#   a large input can wipe a channel in one token.
# - **safe gate** (`lower_bound` in [-5, 0)): `g = lower_bound * sigmoid(A * (f + dt_bias))`.
#   One token can remove at most a fraction `1 - exp(lower_bound)` of a channel.
#
# `dt_bias` moves the curve left and right (which inputs count as "forget"), `A_log` stretches
# it (softplus: vertically; safe gate: horizontally), `lower_bound` sets the safe gate's floor.

# %%
x = np.linspace(-8.0, 8.0, 401, dtype=np.float32)
f_line = jnp.asarray(x)[None, :, None, None]  # [B=1, T=401, H=1, K=1]


def gate_curve(a_log, bound=None, bias=0.0):
    """kda_gate applied to the line of inputs x, for one head and channel."""
    g = kda_lib.kda_gate(f_line, jnp.array([a_log], jnp.float32),
                         jnp.array([bias], jnp.float32), lower_bound=bound)
    return np.asarray(g[0, :, 0, 0])


fig, (ax_sp, ax_safe) = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
for a in (1.0, 4.0, 16.0):
    ax_sp.plot(x, gate_curve(np.log(a)), label=f"A = {a:g}")
ax_sp.plot(x, gate_curve(0.0, bias=2.0), linestyle="--", label="A = 1, dt_bias = +2")
ax_sp.set_ylim(-20, 1)
ax_sp.set_title("Softplus gate  g = -A softplus(f + dt_bias)")
for bound, a in ((lower_bound, 1.0), (lower_bound, 4.0), (-1.0, 1.0)):
    ax_safe.plot(x, gate_curve(np.log(a), bound), label=f"bound {bound:g}, A = {a:g}")
ax_safe.plot(x, gate_curve(0.0, lower_bound, bias=2.0), linestyle="--",
             label=f"bound {lower_bound:g}, A = 1, dt_bias = +2")
ax_safe.axhline(lower_bound, color="0.4", linewidth=1, linestyle=":")
ax_safe.set_title("Safe gate  g = bound * sigmoid(A (f + dt_bias))")
for ax in (ax_sp, ax_safe):
    ax.set_xlabel("raw gate input f (dt_bias = 0 unless stated)")
    ax.set_ylabel("log decay per token g")
ax_sp.legend(loc="lower left", fontsize=8)
ax_safe.legend(loc="center left", bbox_to_anchor=(0.58, 0.5), fontsize=8)
viz.show(fig, "02_gate_functions")

# %%
# the curves are the formulas, g <= 0 everywhere, the safe gate never goes below its bound
softplus = np.logaddexp(0.0, x.astype(np.float64))
assert_close(gate_curve(np.log(4.0)), -4.0 * softplus, name="softplus gate")
sigmoid = 1.0 / (1.0 + np.exp(-4.0 * x.astype(np.float64)))
assert_close(gate_curve(np.log(4.0), lower_bound), lower_bound * sigmoid, name="safe gate")
assert gate_curve(np.log(16.0)).max() <= 0 and gate_curve(0.0, lower_bound).max() <= 0
assert gate_curve(np.log(16.0), lower_bound).min() >= lower_bound
assert gate_curve(0.0)[-1] < lower_bound, "the softplus gate is unbounded below"
# dt_bias is a shift of the input axis
n_shift = round(2.0 / float(x[1] - x[0]))  # grid points in a shift of 2
shifted = gate_curve(0.0, lower_bound, bias=2.0)
_ = assert_close(shifted[:-n_shift], gate_curve(0.0, lower_bound)[n_shift:], atol=1e-5,
                 name="dt_bias shifts the input axis")

# %% [markdown]
# ## 2. Half-lives at initialisation
#
# `init_a_log` draws `A` uniformly in [1, 16] per head; `init_dt_bias` draws
# `dt = softplus(dt_bias)` log-uniformly in [1e-3, 1e-1] per channel. For a zero raw input the
# softplus gate then decays channel `c` of head `h` by `g = -A_h dt_c` per token, a
# **half-life** of `ln 2 / (A_h dt_c)` tokens: between `ln 2 / 1.6 = 0.4` and `ln 2 / 1e-3 =
# 693` tokens. The safe gate starts from `A_log = 0` (A = 1) and the same `dt_bias`, so
# `g = lower_bound * sigmoid(dt_bias) = lower_bound * (1 - exp(-dt))` (because
# `exp(dt_bias) = exp(dt) - 1`), almost `lower_bound * dt`: at init the safe gate behaves like
# a softplus gate with `A = |lower_bound|`.

# %%
a_log_sp = kda_lib.init_a_log(key_a_log, num_heads)
a_log_safe = kda_lib.init_a_log(key_a_log, num_heads, safe_gate=True)
dt_bias = kda_lib.init_dt_bias(key_dt, num_heads, key_dim)
zero_f = jnp.zeros((1, 1, num_heads, key_dim))
g0_sp = np.asarray(kda_lib.kda_gate(zero_f, a_log_sp, dt_bias)[0, 0])  # [H, K]
g0_safe = np.asarray(kda_lib.kda_gate(zero_f, a_log_safe, dt_bias, lower_bound=lower_bound)[0, 0])

dt = np.logaddexp(0.0, np.asarray(dt_bias, np.float64))  # softplus(dt_bias)
assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 1e-1 * (1 + 1e-4), "dt in [1e-3, 1e-1]"
assert np.all((np.exp(a_log_sp) >= 1) & (np.exp(a_log_sp) <= 16)), "A in [1, 16]"
assert_close(g0_sp, -np.exp(np.asarray(a_log_sp))[:, None] * dt.reshape(num_heads, key_dim),
             rtol=1e-5, name="g = -A dt at f = 0")
assert_close(g0_safe, lower_bound * -np.expm1(-dt).reshape(num_heads, key_dim), rtol=1e-5,
             name="safe gate at init = lower_bound (1 - exp(-dt))")
life_sp, life_safe = half_life(g0_sp), half_life(g0_safe)
assert life_sp.min() >= LN2 / 1.6 * (1 - 1e-4) and life_sp.max() <= LN2 / 1e-3 * (1 + 1e-4)
assert life_sp.max() / life_sp.min() > 100, "init half-lives span over two orders of magnitude"
for name, life in (("softplus gate", life_sp), ("safe gate", life_safe)):
    print(f"{name:13s}: half-lives from {life.min():6.2f} to {life.max():6.1f} tokens "
          f"(median {np.median(life):5.1f}) over {life.size} channels")

bins = np.geomspace(0.2, 2e3, 41)
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.hist(life_sp.ravel(), bins=bins, histtype="step", linewidth=2,
        label="softplus gate (A_log = log U(1, 16))")
ax.hist(life_safe.ravel(), bins=bins, histtype="step", linewidth=2, linestyle="--",
        label=f"safe gate (A_log = 0, lower_bound = {lower_bound:g})")
for bound_life in (LN2 / 1.6, LN2 / 1e-3):
    ax.axvline(bound_life, color="0.5", linewidth=1, linestyle=":")
ax.annotate("softplus range at init", (LN2 / 1.6, 0.97), xycoords=("data", "axes fraction"),
            xytext=(4, 0), textcoords="offset points", va="top", fontsize=9, color="0.3")
ax.set_xscale("log")
ax.yaxis.get_major_locator().set_params(integer=True)
ax.set_ylim(0, 1.35 * ax.get_ylim()[1])  # room for the legend
ax.set_title(f"Per-channel half-lives at init, zero gate input ({num_heads} heads x {key_dim} "
             "channels)")
ax.set_xlabel("half-life (tokens, log scale)")
ax.set_ylabel("channels")
ax.legend(loc="upper right")
viz.show(fig, "02_half_lives_at_init")

# %% [markdown]
# ## 3. Cumulative decay over a sequence
#
# What a channel stored at token 0 is still there at token `t` with weight
# `exp(g_1 + ... + g_t)`. With a random raw input `f` (standing in for the projection of real
# tokens) the per-token decays fluctuate around the init values. In each panel a row is one
# channel of one head (sorted by its half-life at init) and the colour is the log10 of the
# fraction retained since token 0: long-memory channels stay bright for the whole sequence,
# fast ones are gone within a few tokens. The head with the largest `A` forgets fastest. The
# safe gate looks like the softplus gate with `A = |lower_bound|` (section 2) and, unlike it,
# can never drop below `lower_bound * t`.

# %%
f = gate_input_std * jax.random.normal(key_f, (1, seq_len, num_heads, key_dim))
g_sp = np.asarray(kda_lib.kda_gate(f, a_log_sp, dt_bias)[0], np.float64)  # [T, H, K]
g_safe = np.asarray(kda_lib.kda_gate(f, a_log_safe, dt_bias, lower_bound=lower_bound)[0],
                    np.float64)
rates = np.exp(np.asarray(a_log_sp, np.float64))
slow, fast = int(np.argmin(rates)), int(np.argmax(rates))
panels = [
    (f"softplus gate, head {slow} (A = {rates[slow]:.1f})", g_sp[:, slow], life_sp[slow]),
    (f"softplus gate, head {fast} (A = {rates[fast]:.1f})", g_sp[:, fast], life_sp[fast]),
    (f"safe gate, head {slow} (A = 1, bound {lower_bound:g})", g_safe[:, slow], life_safe[slow]),
]
floor = -6.0
fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
for i, (ax, (title, g_head, life)) in enumerate(zip(axes, panels, strict=True)):
    log10_kept = np.cumsum(g_head[:, np.argsort(life)[::-1]], axis=0).T / np.log(10)  # [K, T]
    image = viz.heatmap(ax, np.maximum(log10_kept, floor), title=title,
                        xlabel="tokens since the write (tokens)",
                        ylabel="channel (longest memory on top)" if i == 0 else "",
                        cbar_label="", vmin=floor, vmax=0.0, colorbar=False,
                        extent=(0.5, seq_len + 0.5, key_dim - 0.5, -0.5))
fig.colorbar(image, ax=axes, shrink=0.9, label="log10 fraction retained")
fig.suptitle(f"Cumulative decay exp(g_1 + ... + g_t) per channel, f ~ N(0, {gate_input_std:g}^2)")
viz.show(fig, "02_cumulative_decay")

kept_sp, kept_safe = np.exp(np.cumsum(g_sp, 0)), np.exp(np.cumsum(g_safe, 0))
for kept in (kept_sp, kept_safe):
    assert np.all(np.diff(kept, axis=0) <= 0) and kept.max() <= 1.0, "retention only shrinks"
steps = np.arange(1, seq_len + 1)[:, None, None]
assert np.all(np.cumsum(g_safe, 0) >= lower_bound * steps - 1e-9), "safe gate floor"
assert np.median(life_sp[fast]) < np.median(life_sp[slow]), "larger A forgets faster"

# %% [markdown]
# ## 4. The state's norm over a sequence
#
# Linear attention adds `k v^T` forever, so `||S_t||_F` grows like `sqrt(t)` for random
# inputs. The delta rule writes only the recall error, so the state stops growing once it is
# "full" (its `||S||` settles at the size of about `K` stored pairs), and decay shrinks it
# further. We run `kda_lib.kda_step` in a `lax.scan`, recording `||S_t||_F` after each token,
# with random unit keys, unit-variance values and `beta = beta_value`.

# %%
@jax.jit
def state_norms(k, v, g, beta):
    """||S_t||_F after every token for one head: k, g [T, K]; v [T, V]; beta [T]."""

    def step(state, x):
        k_t, v_t, g_t, b_t = (y[None, None] for y in x)  # add B = H = 1
        state, _ = kda_lib.kda_step(state, k_t, k_t, v_t, g_t, b_t)
        return state, jnp.linalg.norm(state)

    state0 = jnp.zeros((1, 1, k.shape[-1], v.shape[-1]))
    return jax.lax.scan(step, state0, (k, v, g, beta))[1]


norm_len = 4 * seq_len
key_k, key_v, key_fn = jax.random.split(key_state, 3)
k_rand = l2_normalize(jax.random.normal(key_k, (norm_len, key_dim)))
v_rand = jax.random.normal(key_v, (norm_len, value_dim))
f_long = gate_input_std * jax.random.normal(key_fn, (1, norm_len, num_heads, key_dim))
g_long_sp = kda_lib.kda_gate(f_long, a_log_sp, dt_bias)[0, :, 0]
g_long_safe = kda_lib.kda_gate(f_long, a_log_safe, dt_bias, lower_bound=lower_bound)[0, :, 0]
betas = jnp.full((norm_len,), beta_value)
norms = {
    "linear attention": np.linalg.norm(
        np.cumsum(np.einsum("tk,tv->tkv", k_rand, v_rand), axis=0), axis=(1, 2)),
    "delta rule (no decay)": np.asarray(
        state_norms(k_rand, v_rand, jnp.zeros_like(g_long_sp), betas)),
    "KDA, softplus gate": np.asarray(state_norms(k_rand, v_rand, g_long_sp, betas)),
    "KDA, safe gate": np.asarray(state_norms(k_rand, v_rand, g_long_safe, betas)),
}
fig, ax = plt.subplots(figsize=(8, 3.4))
tokens = np.arange(1, norm_len + 1)
for (name, n), style in zip(norms.items(), ("-", "--", "-.", ":"), strict=True):
    ax.plot(tokens, n, style, label=name)
ax.plot(tokens, np.sqrt(tokens * value_dim), color="0.5", linewidth=1,
        label="sqrt(t V)  (random walk)")
ax.set_title(f"State norm over a sequence (K = V = {key_dim}, beta = {beta_value:g}, head 0)")
ax.set_xlabel("token t (tokens)")
ax.set_ylabel("|S_t|_F")
ax.legend(loc="upper left")
viz.show(fig, "02_state_norm")

lin, delta = norms["linear attention"], norms["delta rule (no decay)"]
quarter = norm_len // 4
assert 1.6 < lin[-1] / lin[quarter - 1] < 2.5, "linear attention grows like sqrt(t)"
assert delta[-1] < 0.5 * lin[-1], "the delta rule keeps the state far smaller"
assert delta[-1] / delta[norm_len // 2 - 1] < 1.2, "the delta rule's state has stopped growing"
for name in ("KDA, softplus gate", "KDA, safe gate"):
    assert norms[name][-1] <= delta[-1], f"{name}: with these gates the state ends smaller"
print(", ".join(f"{name}: {n[-1]:.1f}" for name, n in norms.items()), f"at t = {norm_len}")

# %% [markdown]
# ## 5. A KDA head as a T x T mixing matrix
#
# For fixed `q, k, g, beta` the recurrence is linear in the values, and every value channel
# goes through the same map, so `o = A v` for one lower-triangular `A` (`[T, T]`): `A[t, s]` is
# how much `v_s` contributes to `o_t`. `kda_lib.viz.kda_mixing_matrix` reads it off by feeding
# one-hot values; we check it against `jax.jacobian`. To make both matrices readable the
# tokens come from a small vocabulary (`q_t = k_t` = the token's unit embedding): softmax
# attention spreads its weight over **every** earlier occurrence of the current token, while
# KDA's delta rule mostly reads the **latest** one (each write of a key overwrites the last,
# with weight `beta`, `beta (1 - beta)`, ... on older copies), with small signed corrections and
# the gates fading old writes (we use the slowest head's decays from section 3). We pass
# `scale=1` so the entries read as recall weights. The diagonal (`A[t, t] = beta`) is left off
# the colour scale so the rest is visible.

# %%
key_tok, key_emb, key_fm = jax.random.split(key_stream, 3)
tokens_ids = jax.random.randint(key_tok, (mix_len,), 0, vocab_size)
embedding = l2_normalize(jax.random.normal(key_emb, (vocab_size, key_dim)))
q_mix = k_mix = embedding[tokens_ids]  # [T, K]
g_mix = jnp.asarray(g_sp[:mix_len, slow], jnp.float32)  # slowest head's decays (section 3)
beta_mix = jnp.full((mix_len,), beta_value)

mixing = jax.jit(viz.kda_mixing_matrix, static_argnames=["scale"])
A = np.asarray(mixing(q_mix, k_mix, g_mix, beta_mix, scale=1.0))
v_probe = jax.random.normal(key_fm, (mix_len, 1))


def one_channel(v_col):
    o, _ = kda_lib.kda_recurrent(q_mix[None, :, None], k_mix[None, :, None],
                                 v_col[None, :, None], g_mix[None, :, None],
                                 beta_mix[None, :, None], scale=1.0)
    return o[0, :, 0, 0]


jac = np.asarray(jax.jacobian(one_channel)(v_probe)[:, :, 0])
assert_close(A, jac, atol=1e-5, name="mixing matrix = d o / d v")
assert_close(A @ np.asarray(v_probe[:, 0]), one_channel(v_probe), atol=1e-5, name="o = A v")
assert np.all(np.triu(A, 1) == 0), "causal: o_t never sees v_s for s > t"

P = np.asarray(viz.softmax_attention_matrix(q_mix, k_mix, scale=1 / softmax_temperature))
off_diagonal = np.abs(np.tril(A, -1)).max()
soft_max = float(np.tril(P, -1).max())
fig, (ax_kda, ax_soft) = plt.subplots(1, 2, figsize=(10, 4.2))
viz.heatmap(ax_kda, A, title="KDA head: o = A v (signed)", xlabel="source token s",
            ylabel="output token t", cbar_label="A[t, s] (diagonal off scale)", diverging=True,
            vmin=-off_diagonal, vmax=off_diagonal)
viz.heatmap(ax_soft, P, title=f"Causal softmax attention, temperature {softmax_temperature:g}",
            xlabel="source token s", ylabel="output token t",
            cbar_label="weight (diagonal off scale)", vmin=0.0, vmax=soft_max)
fig.suptitle(f"Token stream over a vocabulary of {vocab_size} tokens, q_t = k_t, "
             f"beta = {beta_value:g}")
viz.show(fig, "02_mixing_matrices")

# %%
ids = np.asarray(tokens_ids)
t_last = mix_len - 1
same = np.flatnonzero(ids[: t_last] == ids[t_last])  # earlier occurrences of the last token
if same.size >= 2:
    latest, older = same[-1], same[:-1]
    print(f"last token: softplus-gate KDA weight {A[t_last, latest]:.3f} on its latest earlier "
          f"occurrence, max {np.abs(A[t_last, older]).max():.3f} on older ones; softmax "
          f"{P[t_last, latest]:.3f} vs {P[t_last, older].max():.3f}")
    assert P[t_last, older].max() > 0.5 * P[t_last, latest], "softmax spreads over repeats"
assert np.all(P >= 0) and (A < -1e-3).any(), "softmax weights are >= 0; KDA's can be negative"
_ = assert_close(P.sum(axis=1), np.ones(mix_len), atol=1e-5, name="softmax rows sum to 1")

# %% [markdown]
# ## 6. Explore: move the gate parameters yourself
#
# `plot_gate_explorer` recomputes the three views above for one head with **one** shared
# `A_log`, `dt_bias`, `lower_bound` and `beta` (the random gate input `f` still varies by
# channel and token). The notebook calls it directly; with `interactive=True` and ipywidgets
# installed, sliders below drive the same function (the sliders need a live notebook; papermill
# and the rendered HTML show the direct call).

# %%
def plot_gate_explorer(a_log=0.0, dt_bias_value=-6.0, bound=-5.0, beta=0.9, gate="safe"):
    """Cumulative decay, mixing matrix and state norm of one head for the given gate settings.

    gate: "safe" (uses ``bound``) or "softplus" (ignores it).
    """
    f_head = f[:, :, slow : slow + 1]  # [1, T, 1, K] raw gate input of one head
    g = kda_lib.kda_gate(f_head, jnp.array([a_log], jnp.float32),
                         jnp.full((key_dim,), dt_bias_value, jnp.float32),
                         lower_bound=bound if gate == "safe" else None)[0, :, 0]  # [T, K]
    b = jnp.full((seq_len,), beta)
    matrix = np.asarray(mixing(q_mix, k_mix, g[:mix_len], b[:mix_len], scale=1.0))
    norm = np.asarray(state_norms(k_rand[:seq_len], v_rand[:seq_len], g, b))
    assert np.isfinite(matrix).all() and np.isfinite(norm).all()
    log10_kept = np.cumsum(np.asarray(g, np.float64), axis=0).T / np.log(10)
    life = half_life(np.median(np.asarray(g), axis=0))

    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(13, 3.6),
                                        gridspec_kw={"width_ratios": [1.1, 1.1, 1]})
    fig.get_layout_engine().set(wspace=0.06)
    off_diagonal = max(float(np.abs(np.tril(matrix, -1)).max()), 1e-6)
    viz.heatmap(ax0, np.maximum(log10_kept[np.argsort(life)[::-1]], floor),
                title="Cumulative decay", xlabel="tokens since the write (tokens)",
                ylabel="channel (longest memory on top)", cbar_label="log10 fraction retained",
                vmin=floor, vmax=0.0)
    viz.heatmap(ax1, matrix, title="Mixing matrix A", xlabel="source token s",
                ylabel="output token t", cbar_label="A[t, s] (diagonal off scale)",
                diverging=True, vmin=-off_diagonal, vmax=off_diagonal)
    ax2.plot(np.arange(1, seq_len + 1), norm)
    ax2.set_title("State norm")
    ax2.set_xlabel("token t (tokens)")
    ax2.set_ylabel("|S_t|_F")
    detail = f", lower_bound {bound:g}" if gate == "safe" else ""
    fig.suptitle(f"{gate} gate: A_log {a_log:g}, dt_bias {dt_bias_value:g}{detail}, "
                 f"beta {beta:g}; median half-life {np.median(life):.1f} tokens")
    viz.show(fig, "02_gate_explorer")


plot_gate_explorer(a_log=0.0, dt_bias_value=-6.0, bound=lower_bound, beta=beta_value, gate="safe")

# %%
if interactive:
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        widgets = None
        print("ipywidgets is not installed: no sliders (the figure above is the default view)")
    if widgets is not None:
        sliders = {
            "a_log": widgets.FloatSlider(value=0.0, min=-2.0, max=3.0, step=0.1,
                                         description="A_log"),
            "dt_bias_value": widgets.FloatSlider(value=-6.0, min=-10.0, max=4.0, step=0.25,
                                                 description="dt_bias"),
            "bound": widgets.FloatSlider(value=lower_bound, min=-5.0, max=-0.1, step=0.1,
                                         description="lower_bound"),
            "beta": widgets.FloatSlider(value=beta_value, min=0.0, max=1.0, step=0.05,
                                        description="beta"),
            "gate": widgets.Dropdown(options=["safe", "softplus"], value="safe",
                                     description="gate"),
        }
        view = widgets.interactive_output(plot_gate_explorer, sliders)
        display(widgets.VBox([widgets.HBox(list(sliders.values())[:3]),
                              widgets.HBox(list(sliders.values())[3:]), view]))

# %% [markdown]
# ## Summary
#
# - `kda_gate` is `-A softplus(f + dt_bias)` (unbounded) or
#   `lower_bound * sigmoid(A (f + dt_bias))` (each token erases at most `1 - e^lower_bound`);
#   both are `<= 0`, `dt_bias` shifts the input axis and `A_log` scales it.
# - At init (`A` in [1, 16], `dt` log-uniform in [1e-3, 1e-1]) half-lives span about 0.4 to
#   700 tokens, so every head mixes fast and slow memories; the safe gate starts slower.
# - Retention only shrinks over time, and never faster than `lower_bound` per token with the
#   safe gate.
# - Linear attention's state grows like `sqrt(t)`; the delta rule's stops growing, and decay
#   keeps it smaller still.
# - A KDA head is a causal, signed `T x T` mixing of the values (checked against
#   `jax.jacobian`); on repeated tokens it reads the latest occurrence where softmax
#   attention averages all of them.
