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
# **Claim.** One idea: KDA's forget gate, and what it makes a head remember, for how long.
#
# - The gate turns a raw per-channel input $\mathbf f_t$ into a log-space decay $\mathbf g_t \le
#   0$: the bias $\mathbf b$ (`dt_bias`) shifts each channel's operating point, the rate $a_h$
#   (`A_log`) sets each head's speed, the safe gate's floor $g_{\min}$ (`lower_bound`) caps what
#   one token can erase.
# - At initialisation every head mixes short- and long-lived channels: inside a head the
#   half-lives span one to two orders of magnitude (the range of $\tau$); $a_h$ divides them all.
#   Section 3 pictures one head beside a scalar gate, which gives all its channels one memory;
#   section 4 lets you move the gate's parameters and watch what a head keeps.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/02_gating_and_decay.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).

# %% tags=["parameters"]
num_heads: int = 4  # heads whose gate parameters are drawn at initialisation
key_dim: int = 64  # K: channels per head (one decay rate each; at least 32: section 3)
seq_len: int = 96  # tokens in the explorer's figure (section 4)
lower_bound: float = -5.0  # safe gate: the most negative log decay per token, in [-5, 0)
gate_input_std: float = 1.0  # std of the random raw gate input f (stands in for f_proj(x))
interactive: bool = True  # add ipywidgets sliders when ipywidgets is available
seed: int = 0  # seed of the one jax.random.key below


# %% tags=["hide-input"]
# Install what is missing (Colab, a fresh VM; 1 to 3 minutes): see the notebook notes.
import importlib.util
import os
import runpy
import subprocess
import sys

NEEDED = ("kda_lib", "jax", "flax", "optax", "numpy", "matplotlib", "ipywidgets")
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
import numpy as np

import kda_lib.teaching.notebook
from kda_lib.teaching import exercises, gates, viz
from kda_lib.testing import assert_close, relative_l2

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
# on the host's CPU: the asserts hold formulas to float32's rounding, a TPU's softplus is 1.6e-4 off
kda_lib.teaching.notebook.setup(on_host=True)

# %%
assert key_dim >= 32, "key_dim: at least 32 (section 3's over-one-decade spread per head)"
key = jax.random.key(seed)
key_a_log, key_dt, key_f = jax.random.split(key, 3)
LN2 = float(np.log(2.0))
A_RANGE, DT_RANGE = (1.0, 16.0), (1e-3, 1e-1)  # init_a_log and init_dt_bias draw from these

def half_life(g):
    """Tokens until a channel with per-token log decay g keeps half of what it stored."""
    return LN2 / np.maximum(-np.asarray(g, np.float64), 1e-30)


def first_half(g):
    """g [T, K] -> the first token at which each channel keeps half or less (inf: none does)."""
    kept_half = np.cumsum(g, axis=0) <= -LN2
    return np.where(kept_half.any(axis=0), kept_half.argmax(axis=0) + 1.0, np.inf)


# %% [markdown]
# ## 1. Why a forget gate
#
# The delta rule (notebook 01) overwrites only along the key it writes: what an earlier context
# stored along other directions stays. Below, $n = d_k / 4$ pairs of a context A, then $n$ of a
# context B (random unit keys, strong writes: $\beta$ printed, one $g_t$ for all channels) under
# three gates: none, a constant decay, one closing once at the switch ($g = -5$ on B's first
# token, as a token-driven gate can learn). Once B has begun, A is over: a query with one of A's
# keys should read nothing, and whatever it reads of A's values is an error ("stale": its size
# relative to A's values, 1 for reading them in full). That is the cost of not forgetting: with
# no gate over half of A stays. It is not B's recall: with no gate B's error stays below 1.25
# times that of "B alone" (B written into an empty state). A constant decay leaves less of A but
# fades B (B's error above B alone's); the switch gate removes A (stale below 1%) and leaves B's
# error within 1% of B alone's (each printed; asserted).

# %%
rng, n, runs, beta_pairs = np.random.default_rng(seed), key_dim // 4, {}, 0.9  # n pairs: A, B
pair_k, pair_v = rng.normal(size=(2, 2 * n, key_dim))
pair_k /= np.linalg.norm(pair_k, axis=1, keepdims=True)  # unit keys

def recalled(g, values):  # every key's read of the last state: S = D S + beta k (v - k^T D S)
    S = np.zeros((key_dim, key_dim))
    for k_t, v_t, g_t in zip(pair_k, values, g, strict=True):
        S = np.exp(g_t) * S
        S += beta_pairs * np.outer(k_t, v_t - k_t @ S)
    return pair_k @ S


# %%
for name, g in (("no gate", np.zeros(2 * n)), ("constant g = -0.1", np.full(2 * n, -0.1)),
                ("g = -5 at the switch only", -5.0 * (np.arange(2 * n) == n))):
    a_only = recalled(g, pair_v * (np.arange(2 * n) < n)[:, None])  # S is linear in v: A's share
    runs[name] = (np.linalg.norm(a_only[:n]) / np.linalg.norm(pair_v[:n]),
                  relative_l2(recalled(g, pair_v)[n:], pair_v[n:]))
    print(f"beta {beta_pairs}, {name}: A's keys read {runs[name][0]:.3f} of A's values (stale; "
          f"right: 0), B's error {runs[name][1]:.3f}")
(stale_0, err_0), (stale_c, err_c), (stale_s, err_s) = runs.values()
b_alone = recalled(np.zeros(2 * n), pair_v * (np.arange(2 * n) >= n)[:, None])[n:]  # A writes 0s
err_alone = relative_l2(b_alone, pair_v[n:])
print(f"B alone, empty state: B's error {err_alone:.3f}; switch gate / alone - 1: "
      f"{err_s / err_alone - 1:+.1e}")
assert stale_0 > 0.5 and err_0 < 1.25 * err_alone, runs  # A stays; B barely worse than alone
assert stale_c < stale_0 and err_c > err_alone, runs  # a constant decay: less of A, B fades
assert stale_s < 0.01 and abs(err_s - err_alone) < 0.01 * err_alone, runs  # A gone, B as alone

# %% [markdown]
# ## 2. Two gate functions
#
# The layer projects each token to a raw gate input $\mathbf f_t \in \mathbb R^{d_k}$ per head
# (`f: [B, T, H, K]`), adds a learned per-channel bias $\mathbf b$ and activates the sum into a
# log decay, with the rate $a_h = e^{\mathtt{A\_log}_h}$ of head $h$:
#
# $$
# \text{softplus gate: } \mathbf g_t = -a_h \operatorname{softplus}(\mathbf f_t + \mathbf b), \qquad
# \text{safe gate: } \mathbf g_t = g_{\min}\, \sigma\big(a_h (\mathbf f_t + \mathbf b)\big), \quad
# g_{\min} \in [-5, 0).
# $$
#
# The softplus gate (`lower_bound=None`) is unbounded below: one token can wipe a channel. The
# safe gate stays above $g_{\min}$: one token removes at most $1 - e^{g_{\min}}$ of a channel.
# $\mathbf b$ shifts the curve (which inputs count as "forget"), $a_h$ scales it (softplus gate:
# the output, by $a_h$; safe gate: channel $c$'s input axis, by $1/a_h$ about $f_c = -b_c$).

# %%
x = np.linspace(-8.0, 8.0, 401, dtype=np.float32)
f_line = jnp.asarray(x)[None, :, None, None]  # [B=1, T=401, H=1, K=1]


def gate_curve(a_log, bound=None, bias=0.0):
    """kda_gate applied to the line of inputs x, for one head and channel."""
    g = kda_lib.kda_gate(f_line, jnp.array([a_log], jnp.float32),
                         jnp.array([bias], jnp.float32), lower_bound=bound)
    return np.asarray(g[0, :, 0, 0])


# %% tags=["hide-input"]
viz.show(gates.plot_gate_functions(x, gate_curve, lower_bound), "02_gate_functions")

# %%
# the curves are the formulas, g <= 0 everywhere, the safe gate never goes below its bound
softplus = np.logaddexp(0.0, x.astype(np.float64))
assert_close(gate_curve(np.log(4.0)), -4.0 * softplus, name="softplus gate")
sigmoid = 1.0 / (1.0 + np.exp(-4.0 * x.astype(np.float64)))
assert_close(gate_curve(np.log(4.0), lower_bound), lower_bound * sigmoid, name="safe gate")
assert gate_curve(np.log(16.0)).max() <= 0 and gate_curve(0.0, lower_bound).max() <= 0
assert gate_curve(np.log(16.0), lower_bound).min() >= lower_bound
assert gate_curve(0.0)[-1] < lower_bound, "the softplus gate is unbounded below"
assert_close(gate_curve(np.log(4.0)), 4.0 * gate_curve(0.0), name="softplus: a scales g")
mid = np.arange(150, 251)  # x in [-2, 2], where 4 x is on the grid too (index 200 is x = 0)
assert_close(gate_curve(np.log(4.0), lower_bound)[mid], gate_curve(0.0, lower_bound)[
    200 + 4 * (mid - 200)], atol=1e-5, name="safe gate: a scales the input axis")
n_shift = round(2.0 / float(x[1] - x[0]))  # grid points in a shift of 2: b shifts the input axis
shifted = gate_curve(0.0, lower_bound, bias=2.0)
_ = assert_close(shifted[:-n_shift], gate_curve(0.0, lower_bound)[n_shift:], atol=1e-5,
                 name="dt_bias shifts the input axis")

# %% [markdown]
# ## 3. Half-lives at initialisation
#
# `init_a_log` draws a rate $a_h$ per head and `init_dt_bias` a bias $\mathbf b$ per channel. The
# picture first: what the initialised head with the smallest $a_h$ keeps of each channel over the
# tokens of a random raw input $\mathbf f$ (left: one row per channel, the longest half-life at
# init on top), beside a scalar gate (right: Gated DeltaNet's one decay $\alpha_t = e^{g_t}$ for
# all channels of a head, with the same $a_h$, the head's median time step and one raw input per
# token, channel 0's); a white dot marks where a channel first keeps half or less. Inside one KDA
# head the channels first keep half at tokens over a factor of 10 apart, or never within the
# tokens drawn (printed; asserted): short and long memories side by side. The scalar gate gives
# every channel the same memory. Part of that spread is the random input's: at $\mathbf f = 0$
# the same head's channels first keep half at other tokens (printed); the spread the
# initialisation alone sets is that of the zero-input half-lives, below.

# %%
a_log_sp = kda_lib.init_a_log(key_a_log, num_heads)  # [H]: log a_h
dt_bias = kda_lib.init_dt_bias(key_dt, num_heads, key_dim)  # [H * K]: b
a_h = np.exp(np.asarray(a_log_sp, np.float64))
tau = np.logaddexp(0.0, np.asarray(dt_bias, np.float64)).reshape(num_heads, key_dim)
slow = int(np.argmin(a_h))  # the head whose channels keep longest
f_head = gate_input_std * jax.random.normal(key_f, (1, seq_len, 1, key_dim))  # raw gate input
g_kda = kda_lib.kda_gate(f_head, a_log_sp[slow, None], dt_bias.reshape(num_heads, key_dim)[slow])
b_scalar = jnp.log(jnp.expm1(jnp.median(jnp.asarray(tau[slow], jnp.float32))))  # softplus^-1
g_scalar = kda_lib.kda_gate(f_head[..., :1], a_log_sp[slow, None], b_scalar[None])  # [1, T, 1, 1]
panels = [(f"KDA: one decay per channel (head {slow}, $a_h$ = {a_h[slow]:.1f})",
           np.asarray(g_kda[0, :, 0]), LN2 / tau[slow]),  # rows sorted by half-life at init
          ("scalar gate (GDN): one decay per head", np.repeat(np.asarray(g_scalar[0, :, 0]),
                                                               key_dim, axis=1), np.ones(key_dim))]
halving, halving_scalar = first_half(panels[0][1]), first_half(panels[1][1])
at_zero = first_half(np.broadcast_to(-a_h[slow] * tau[slow], panels[0][1].shape))  # f = 0
never = np.isinf([*halving, *at_zero, *halving_scalar]).any()  # some channel never keeps half
print(f"KDA head {slow}: its channels first keep half between token {halving.min():.0f} and "
      f"{halving.max():.0f}, at f = 0 between token {at_zero.min():.0f} and "
      f"{at_zero.max():.0f}; scalar gate: every channel at token {halving_scalar[0]:.0f}"
      + (f" (inf: not within {seq_len} tokens)" if never else ""))
assert halving.max() > 10 * halving.min(), "one KDA head: memories over a factor of 10 apart"

# %% tags=["hide-input"]
viz.show(gates.plot_cumulative_decay(panels, floor=-6.0, title=(
    f"What an initialised head keeps of each channel ({seq_len} tokens of random gate input, std "
    f"{gate_input_std:g})")), "02_retention_at_init")

# %% [markdown]
# Now the algebra. `init_a_log` draws $a_h$ uniformly in $[1, 16]$ per head; `init_dt_bias` draws
# the time step $\boldsymbol\tau = \operatorname{softplus}(\mathbf b)$ log-uniformly in
# $[10^{-3}, 10^{-1}]$ per channel. For a zero raw input the softplus gate then decays channel $c$
# of head $h$ by $g = -a_h \tau_c$ per token, a **half-life**
#
# $$
# t_{1/2} = \frac{\ln 2}{a_h \tau_c} \in \Big[\frac{\ln 2}{16 \cdot 10^{-1}},\
#   \frac{\ln 2}{1 \cdot 10^{-3}}\Big] \text{ tokens}.
# $$
#
# The safe gate starts from `A_log = 0` ($a_h = 1$) and the same $\mathbf b$. Since $e^{b_c} =
# e^{\tau_c} - 1$ (the inverse softplus), $\sigma(b_c) = \frac{e^{b_c}}{1 + e^{b_c}} = 1 -
# e^{-\tau_c}$, so its initial decay is $g = g_{\min}(1 - e^{-\tau_c}) \approx g_{\min} \tau_c$
# (half-lives within 6% for $\tau_c \le 0.1$; asserted): at initialisation the safe gate behaves
# like a softplus gate with $a_h = \lvert g_{\min} \rvert$. Inside a head only $\tau$ varies: a
# spread of at most 100x, over 10x for $d_k \ge 32$ (32 log-uniform draws span under one decade of
# the two with chance below $10^{-8}$); at equal $\tau$ the half-life scales as $1/a_h$.

# %%
a_log_safe = kda_lib.init_a_log(key_a_log, num_heads, safe_gate=True)
zero_f = jnp.zeros((1, 1, num_heads, key_dim))
g0_sp = np.asarray(kda_lib.kda_gate(zero_f, a_log_sp, dt_bias)[0, 0])  # [H, K]
g0_safe = np.asarray(kda_lib.kda_gate(zero_f, a_log_safe, dt_bias, lower_bound=lower_bound)[0, 0])
assert tau.min() >= DT_RANGE[0] * (1 - 1e-4) and tau.max() <= DT_RANGE[1] * (1 + 1e-4)
assert np.all((a_h >= A_RANGE[0]) & (a_h <= A_RANGE[1])), "a in [1, 16]"
assert_close(g0_sp, -a_h[:, None] * tau, rtol=1e-5, name="g = -a tau at f = 0")
assert_close(g0_safe, lower_bound * -np.expm1(-tau), rtol=1e-5, name="g_min (1 - exp(-tau))")
life_sp, life_safe = half_life(g0_sp), half_life(g0_safe)
bounds = (LN2 / (A_RANGE[1] * DT_RANGE[1]), LN2 / (A_RANGE[0] * DT_RANGE[0]))
assert bounds[0] * (1 - 1e-4) <= life_sp.min() and life_sp.max() <= bounds[1] * (1 + 1e-4)
assert_close(life_sp * a_h[:, None], LN2 / tau, rtol=1e-5, name="half-life = ln 2 / (a_h tau)")
per_head = life_sp.max(axis=1) / life_sp.min(axis=1)  # within a head only tau varies: <= 100x
assert per_head.max() <= 100 * (1 + 1e-4), "inside a head: at most the range of tau"
assert per_head.min() > 10, "over one decade: needs key_dim >= 32 (P(fail) < 1e-8 per head)"
assert_close(life_safe, LN2 / (-lower_bound * tau), atol=0, rtol=0.06, name="safe ~ a_h = |g_min|")
print(f"possible at init, zero gate input: {bounds[0]:.2f} to {bounds[1]:.0f} tokens; drawn: "
      + "; ".join(f"{gate} gate {life.min():.2f} to {life.max():.1f} (median {np.median(life):.1f})"
                  for gate, life in (("softplus", life_sp), ("safe", life_safe))) + "\nsoftplus, "
      + "spread in each head (a_h): " + ", ".join(map("{:.0f}x ({:.2f})".format, per_head, a_h)))

# %% tags=["hide-input"]
viz.show(gates.plot_half_lives(
    {r"softplus gate ($a_h \sim U(1, 16)$)": life_sp,
     f"safe gate ($a_h = 1$, $g_{{\\min}} = {lower_bound:g}$)": life_safe}, bounds,
    title=f"Per-channel half-lives at init, zero gate input ({num_heads} heads x {key_dim} "
          "channels)"), "02_half_lives_at_init")

# %% [markdown]
# ## 4. Explore: move the gate parameters yourself
#
# `kda_lib.teaching.gates.explore` redraws section 3's picture for one head whose channels share
# one rate $a_h$, one bias $b$ ($\mathbf b = b\,\mathbf 1$) and $g_{\min}$, so that only the random
# input $\mathbf f$ (section 3's) sets them apart: what the head keeps of each channel over the
# tokens, $e^{g_1 + \dots + g_t}$ (down to $10^{-6}$), channels sorted by the token at which each
# first keeps half or less (latest on top): sliders with `interactive=True` in a live notebook
# with ipywidgets, else drawn once. Its title gives $a_h$ (with `A_log`), the half-life at
# $\mathbf f = 0$ and the measured median halving token: the median over the channels of the
# token at which each first keeps half. At these settings ($b = -3 < 0$) random inputs make the
# head forget sooner than $\mathbf f = 0$ would: the median channel halves no later than a
# channel with $\mathbf f = 0$ (both tokens printed; asserted where the $\mathbf f = 0$ token lies
# within the tokens drawn). That needs $b < 0$: $\sigma$ is convex below its midpoint and concave
# above it, so a symmetric input raises the safe gate's mean rate where $b < 0$ and lowers it
# where $b > 0$. Move $b$ above 0 and the mean rate's order reverses: at $b = +1$, $g_{\min} =
# -0.1$ (same $a_h$) the median channel halves no sooner than a channel with $\mathbf f = 0$
# (printed; asserted), and at the page's input std (1) the mean rate is below the rate at
# $\mathbf f = 0$ (printed). Random inputs raise the softplus gate's mean rate at every $b$ (it
# is convex everywhere). Proofs, and counts over fresh draws of $\mathbf f$: the notebook notes.
#
# What a head then does with what it keeps, a $T \times T$ mixing of the values set by these
# decays, is derived in exercise 2 and pictured in the
# [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-02).

# %%
explorer = dict(a_log=0.5, dt_bias_value=-3.0, bound=lower_bound, gate="safe")  # b < 0
seen = gates.explore(dict(f_head=f_head, floor=-6.0), explorer,
                     interactive=kda_lib.teaching.notebook.interactive(interactive))
halved_at_zero = np.ceil(seen["half_life_at_zero"])  # where a channel with f = 0 keeps half
print(f"halved: the median channel at token {seen['measured']:.0f}, a channel with f = 0 at "
      f"token {halved_at_zero:.0f} (its half-life {seen['half_life_at_zero']:.1f}, rounded up)")
assert seen["measured"] <= halved_at_zero or halved_at_zero > seq_len, seen["measured"]
above = gates.measure(f_head, **{**explorer, "dt_bias_value": 1.0, "bound": -0.1})  # b > 0
above_at_zero = np.ceil(above["half_life_at_zero"])
print(f"b = +1, g_min = -0.1: the median channel at token {above['measured']:.0f}, a channel with "
      f"f = 0 at token {above_at_zero:.0f}; mean rate {above['mean_rate']:.4f}, at f = 0 "
      f"{above['rate_at_zero']:.4f}")
assert above["measured"] >= above_at_zero, above["measured"]  # reversed: no sooner than f = 0

# %% [markdown]
# ## Summary
#
# - `kda_gate` is $-a_h \operatorname{softplus}(\mathbf f + \mathbf b)$ (unbounded) or
#   $g_{\min}\, \sigma\big(a_h (\mathbf f + \mathbf b)\big)$ (a token erases at most $1 -
#   e^{g_{\min}}$): $\mathbf b$ shifts the input axis, $a_h$ scales it (safe) or the output.
# - At init the half-lives inside every head span one to two decades (the range of $\tau$) and
#   scale as $1/a_h$ between heads: every KDA head mixes fast and slow memories, where a scalar
#   gate gives all channels of a head one.
# - Without a gate an old context's pairs stay (the delta rule erases only along new keys); a
#   gate that closes at the switch removes them, the new ones recalled as well (section 1).
#
# ## Exercises
#
# 1. **How likely is a narrow head?** Section 3's half-lives span over a decade in each head but
#    for a chance below $10^{-8}$ at $d_k = 32$. Derive it: `spread_below(d_k, ratio, width)`, the
#    chance that a head's $d_k$ time steps, drawn log-uniformly over a range `width` wide (largest
#    over smallest: 100 for `init_dt_bias`), span less than `ratio` (largest over smallest, above
#    1). The checker also asks about a head of one channel and about a `ratio` of `width` or more.
#    Some chances are below $10^{-12}$, where no sampling reaches.
# 2. **An older occurrence.** For fixed $\mathbf q, \mathbf k, \mathbf g, \beta$ a head's read is
#    linear in the values. Unroll section 1's step, $S_t = M_t S_{t-1} + \beta_t \mathbf k_t
#    \mathbf v_t^\top$ with $M_t = (I - \beta_t \mathbf k_t \mathbf k_t^\top) D_t$ and $D_t =
#    \operatorname{diag}(e^{\mathbf g_t})$, from $S_0 = 0$: $S_t = \sum_{s \le t} M_t \cdots
#    M_{s+1}\, \beta_s \mathbf k_s \mathbf v_s^\top$. Read with scale 1, $\mathbf o_t = S_t^\top
#    \mathbf q_t$ (the kernel also divides by $\sqrt{d_k}$); then $\mathbf o_t = \sum_s \Omega_{ts}
#    \mathbf v_s$ with $\Omega_{ts} = \beta_s \mathbf q_t^\top M_t \cdots M_{s+1} \mathbf k_s$, one
#    $T \times T$ mixing matrix for every value channel. A unit key $\mathbf k$ ($\mathbf q_t =
#    \mathbf k_t$) written at $s$ and again at $t$ only, with one $\beta$, gets $\Omega_{ts} =
#    \beta (1 - \beta)\, \mathbf k^\top D_t \cdots D_{s+1} \mathbf k$, since $\mathbf k^\top (I -
#    \beta \mathbf k \mathbf k^\top) = (1 - \beta) \mathbf k^\top$. Now it is written at $s$, again
#    at $s'$ ($s < s' < t$) and at $t$, the tokens in between not writing. The weight on the
#    **older** one is $\Omega_{ts} = \psi_1\, \mathbf k^\top D_t \cdots D_{s+1} \mathbf k + \psi_2\,
#    (\mathbf k^\top D_t \cdots D_{s'+1} \mathbf k)(\mathbf k^\top D_{s'} \cdots D_{s+1} \mathbf
#    k)$: derive the coefficients, `older_weight(beta) -> (psi1, psi2)`, as formulas in $\beta$
#    that also work on a NumPy array of $\beta$ (the checker judges values only, and also tries
#    $\beta$ near $10^{-15}$, where coefficients measured from float64 matrices are rounding
#    noise). Is it $\beta(1-\beta)^2$ times the decay, as with one decay for all channels?
#
# NumPy or `jnp`, no `kda_lib` and no scipy. Worked solutions: [`notebooks/solutions/ch02.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch02.py).

# %%
answer = None  # exercise 1: a function spread_below(d_k, ratio, width) -> a probability
exercises.check("02.1", answer)

# %%
answer = None  # exercise 2: a function older_weight(beta) -> (psi1, psi2)
exercises.check("02.2", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear* (KDA's per-channel gate), 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks* (the scalar gate), ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - A. Gu, T. Dao, *Mamba* (the softplus time step and its initialisation), 2023. [arXiv:2312.00752](https://arxiv.org/abs/2312.00752)
# - fla's gate functions, `fla/ops/kda/gate.py`: [fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention)
