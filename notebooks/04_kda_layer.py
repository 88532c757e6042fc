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
# # 04 · The KDA layer: from hidden states to hidden states
#
# **Claim.** The recurrence of notebooks 01-03 is the middle of a layer mapping hidden states
# $\mathbf x_t \in \mathbb R^d$ to $\mathbf y_t \in \mathbb R^d$, between linear projections, a
# short causal convolution with SiLU on $\mathbf q, \mathbf k, \mathbf v$, an L2 norm on $\mathbf q,
# \mathbf k$, a sigmoid for $\beta$, a low-rank forget gate and an output gate with a per-head
# RMSNorm. Built from these parts in one short function, it equals `kda_lib.KimiDeltaAttention` to
# float32 tolerance; then every shape, the parameters beside softmax attention, and what each part
# is for (three of them taken away).
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/04_kda_layer.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).

# %% tags=["parameters"]
batch: int = 2  # sequences per batch
seq_len: int = 48  # tokens per sequence
hidden_size: int = 64  # d: model width
num_heads: int = 2  # H
head_dim: int = 16  # d_k and d_v per head
conv_size: int = 4  # w: short-conv width, at least 1 (section 4 takes the conv away itself)
gate_rank: int = 8  # r: rank of the forget- and output-gate projections
big_hidden: int = 2048  # d of the realistic layer whose parameters are counted (not built)
big_heads: int = 16  # H of that layer (d_k and d_v are big_hidden / big_heads)
ablation_draws: int = 8  # section 4's ablation: layers drawn at initialisation, each on its own x
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
# Imports; kda_lib.teaching.notebook.setup() applies the settings every notebook shares.
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from IPython.display import Markdown, display

import kda_lib.teaching.notebook
from kda_lib.teaching import exercises, explain, layer_diagram, viz
from kda_lib.testing import assert_close, float32_tolerance

kda_lib.teaching.notebook.check_parameters(globals(), zero_ok={"seed"})  # types, ranges by name
kda_lib.teaching.notebook.setup()

# %%
key_layer, key_x, _ = jax.random.split(jax.random.key(seed), 3)
layer_seed = int(jax.random.randint(key_layer, (), 0, 2**31 - 1))
config = kda_lib.KDAConfig(hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim,
                           conv_size=conv_size, forget_gate_rank=gate_rank,
                           output_gate_rank=gate_rank)
layer = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(layer_seed))
x = jax.random.normal(key_x, (batch, seq_len, hidden_size))
H, K, V = num_heads, head_dim, head_dim

# %% [markdown]
# ## 1. The layer: a picture, then the equations
#
# One token's way through the layer (our drawing of the layer the paper describes in §4): six
# projections of $\mathbf x_t$, the recurrence in the middle, the output norm and gate after it;
# under an arrow, the numbers it carries a token ($H d_k$: $d_k$ for each of the $H$ heads).

# %% tags=["hide-input"]
viz.show(layer_diagram.draw_kda_layer(), "04_layer_diagram")

# %% [markdown]
# The tokens are the rows of $X \in \mathbb R^{T \times d}$; here a token's vectors are **rows**,
# as in the code (`x @ W`): $\mathbf x_t W_q$ stands for $\mathbf x_t^\top W_q$. Per head $h$ (the
# projections' outputs cut into $H$ slices of $d_k$ or $d_v$ channels):
#
# $$
# \begin{align*}
# \mathbf q_t &= \operatorname{L2}\big(\operatorname{SiLU}(\operatorname{conv}_q(X W_q)_t)\big),
# \qquad
# \mathbf k_t = \operatorname{L2}\big(\operatorname{SiLU}(\operatorname{conv}_k(X W_k)_t)\big),
# \qquad
# \mathbf v_t = \operatorname{SiLU}(\operatorname{conv}_v(X W_v)_t), \\
# \mathbf g_t &= -a_h \operatorname{softplus}\big(\mathbf x_t W_f^{\downarrow} W_f^{\uparrow}
#   + \mathbf b\big), \qquad \beta_t = \sigma(\mathbf x_t W_\beta),
# \qquad \mathbf o_t = \text{KDA}(\mathbf q, \mathbf k, \mathbf v, \mathbf g, \beta)_t, \\
# \mathbf z_t &= \mathbf x_t W_z^{\downarrow} W_z^{\uparrow} + \mathbf b_z, \qquad
# \mathbf y_t = \Big[\operatorname{RMSNorm}_{\boldsymbol\eta}(\mathbf o_t^{(h)}) \odot
#   \sigma(\mathbf z_t^{(h)})\Big]_{h = 1..H}\, W_o .
# \end{align*}
# $$
#
# The parts, one line each:
# - **projections**: matrices (`x @ W`, `layer.q_proj(x)`: `nnx.Linear`), no bias but $\mathbf b_z$:
#   $W_q, W_k$: $d \to H d_k$, $W_v$: $d \to H d_v$, $W_\beta$: $d \to H$ (a $\beta$ a head), $W_o$:
#   $H d_v \to d$; each gate two in a row, $d \to r \to H d_k$ (`f_proj`), $H d_v$ (`g_proj`);
# - **short causal convolution** per channel, $w$ taps, $\boldsymbol\kappa_{w-1-\nu}$ on the input
#   $\nu$ tokens back: $\operatorname{conv}(\Xi)_t = \sum_{\nu=0}^{w-1} \boldsymbol\kappa_{w-1-\nu}
#   \odot \boldsymbol\xi_{t-\nu}$ (zeros before the first token), then
#   $\operatorname{SiLU}(\xi) = \xi\, \sigma(\xi)$;
# - **L2 norm** $\operatorname{L2}(\boldsymbol\xi) = \boldsymbol\xi /
#   \sqrt{\lVert \boldsymbol\xi\rVert^2 + \epsilon_{\text{L2}}}$, $\epsilon_{\text{L2}} = 10^{-6}$;
# - **gate**: the softplus gate of notebook 02 (or the safe gate with `lower_bound`), its input
#   through a rank-$r$ bottleneck $W_f^{\downarrow} \in \mathbb R^{d \times r}$,
#   $W_f^{\uparrow} \in \mathbb R^{r \times H d_k}$;
# - **per-head RMSNorm** $\operatorname{RMSNorm}_{\boldsymbol\eta}(\mathbf o) = \mathbf o \odot
#   \boldsymbol\eta / \sqrt{\tfrac{1}{d_v} \sum_e o_e^2 + \epsilon_{\text{RMS}}}$,
#   $\epsilon_{\text{RMS}}$ = `norm_eps` (not $\epsilon_{\text{L2}}$), one $\boldsymbol\eta \in
#   \mathbb R^{d_v}$ shared by the heads.
#
# The function below is these equations with the layer's own parameters: the conv (kernel `[w,
# channels]`), the L2 norm and the gate in float64 NumPy; the recurrence is `kda_recurrent` (01-03).

# %%
def conv(xi, kernel):  # [B, T, channels], [w, channels]: sum_nu kappa_{w-1-nu} xi_{t-nu}
    xi, kernel = np.asarray(xi, np.float64), np.asarray(kernel, np.float64)
    padded = np.pad(xi, ((0, 0), (len(kernel) - 1, 0), (0, 0)))
    return sum(kappa * padded[:, j:j + xi.shape[1]] for j, kappa in enumerate(kernel))


l2 = lambda xi, eps_l2=1e-6: xi / np.sqrt(np.sum(xi**2, -1, keepdims=True) + eps_l2)


# %%
def layer_from_parts(layer, x):
    """The KDA layer written out part by part; returns every intermediate (batch-first)."""
    (B, T, _), kda_ = x.shape, layer.config
    H, K, V = kda_.num_heads, kda_.head_dim, kda_.value_dim

    def stream(proj, conv_, dim, norm=lambda xi: xi):  # projection, conv, SiLU, (L2), heads
        xi = conv(proj(x), conv_.kernel[...])
        return jnp.asarray(norm((xi / (1 + np.exp(-xi))).reshape(B, T, H, dim)), jnp.float32)

    p = dict(q=stream(layer.q_proj, layer.q_conv1d, K, l2),
             k=stream(layer.k_proj, layer.k_conv1d, K, l2),
             v=stream(layer.v_proj, layer.v_conv1d, V),
             f=layer.f_proj(x).reshape(B, T, H, K), beta=jax.nn.sigmoid(layer.b_proj(x)))
    f, b = np.asarray(p["f"], np.float64), np.asarray(layer.dt_bias[...]).reshape(H, K)
    p["g"] = -np.exp(np.asarray(layer.A_log[...], np.float64))[:, None] * np.logaddexp(0, f + b)
    p["o"], p["state"] = kda_lib.kda_recurrent(p["q"], p["k"], p["v"], jnp.float32(p["g"]),
                                               p["beta"], output_final_state=True)
    p["z"] = layer.g_proj(x).reshape(B, T, H, V)
    rms = jnp.sqrt(jnp.mean(p["o"] ** 2, axis=-1, keepdims=True) + kda_.norm_eps)
    p["gated"] = p["o"] / rms * layer.o_norm[...] * jax.nn.sigmoid(p["z"])
    p["y"] = layer.o_proj(p["gated"].reshape(B, T, H * V))
    return p


# %%
parts = layer_from_parts(layer, x)  # not jitted: the conv and L2 norm run in NumPy
y_layer = nnx.jit(lambda m, x: m(x))(layer, x)
err = assert_close(parts["y"], y_layer, **float32_tolerance(1e-5, 1e-4), name="parts == layer")
print(f"layer built from its parts vs kda_lib.KimiDeltaAttention: max |diff| {err:.1e} "
      f"(max |y| {float(jnp.abs(y_layer).max()):.2f})")

# %% [markdown]
# ## 2. Shapes, part by part
#
# Every array of the forward pass above, at this notebook's sizes (read off the arrays):

# %%
rows = [("x", "layer input", "B, T, d", x),
        ("q, k", "after conv, SiLU, L2 norm", "B, T, H, K", parts["q"]),
        ("v", "after conv, SiLU", "B, T, H, V", parts["v"]),
        ("f", "raw gate input (rank-r projection)", "B, T, H, K", parts["f"]),
        ("g", "log decay per channel, <= 0", "B, T, H, K", parts["g"]),
        ("beta", "write strength", "B, T, H", parts["beta"]),
        ("o", "recurrence output", "B, T, H, V", parts["o"]),
        ("S_T", "final state", "B, H, K, V", parts["state"]),
        ("z", "output-gate logits", "B, T, H, V", parts["z"]),
        ("y", "layer output", "B, T, d", parts["y"])]
table = ["| array | what | axes | shape here |", "| --- | --- | --- | --- |"]
for name, what, axes, a in rows:
    assert len(axes.split(", ")) == a.ndim, name
    table.append(f"| `{name}` | {what} | `[{axes}]` | `{tuple(a.shape)}` |")
display(Markdown("\n".join(table)))
assert parts["q"].shape == (batch, seq_len, H, K) and parts["state"].shape == (batch, H, K, V)

# %% [markdown]
# ## 3. Parameters, beside softmax attention
#
# Counted from the layer's arrays, against the formula per part; softmax attention with the same
# heads has only $W_q, W_k, W_v, W_o$: $d\,H(2 d_k + d_v) + H d_v\, d$. This page's layer and a
# realistic one ($d$ = `big_hidden`, $H$ = `big_heads`, $r = d_v$ as fla; `nnx.eval_shape`).

# %%
def kda_parameters(d, H, K, V, r, w):
    """Formula per part (fla's names); r None = full-rank gates."""
    gate = (lambda out: d * out) if r is None else (lambda out: d * r + r * out)
    return {"q_proj, k_proj": 2 * d * H * K, "v_proj": d * H * V,
            "conv (q, k, v)": w * H * (2 * K + V), "f_proj": gate(H * K),
            "b_proj": d * H, "g_proj (+ bias)": gate(H * V) + H * V,
            "A_log, dt_bias": H + H * K, "o_norm": V, "o_proj": H * V * d}


counted = lambda module: sum(a.size for a in jax.tree.leaves(nnx.state(module, nnx.Param)))
big_k = big_hidden // big_heads  # d_k = d_v, and the gates' rank r
big = kda_lib.KDAConfig(hidden_size=big_hidden, num_heads=big_heads, head_dim=big_k,
                        forget_gate_rank=big_k, output_gate_rank=big_k)
big_layer = nnx.eval_shape(lambda: kda_lib.KimiDeltaAttention(big, rngs=nnx.Rngs(0)))
sizes = {"this notebook": (hidden_size, H, K, V, gate_rank, conv_size, layer),
         f"d = {big_hidden}, H = {big_heads}": (big_hidden, big_heads, big.head_dim,
                                                big.value_dim, big.forget_gate_rank, 4, big_layer)}
counts = {}
for label, (d, h, k_, v_, r, w, module) in sizes.items():
    formula = kda_parameters(d, h, k_, v_, r, w)
    assert counted(module) == sum(formula.values()), (label, counted(module), formula)
    counts[label] = formula | {"KDA layer": sum(formula.values()),
                               "softmax attention": d * h * (2 * k_ + v_) + h * v_ * d}

# %%
table = ["| part | " + " | ".join(counts) + " |", "| --- |" + " ---: |" * len(counts)]
for part in next(iter(counts.values())):
    bold = "**" if part in ("KDA layer", "softmax attention") else ""
    table.append(f"| {bold}{part}{bold} | " + " | ".join(f"{c[part]:,}" for c in counts.values())
                 + " |")
display(Markdown("\n".join(table)))
ratio = {label: c["KDA layer"] / c["softmax attention"] for label, c in counts.items()}
display(Markdown("The KDA layer has " + ", ".join(f"{r:.2f}x ({n})" for n, r in ratio.items())
                 + " the parameters of softmax attention with the same heads."))
assert 1 < ratio[f"d = {big_hidden}, H = {big_heads}"] < 1.6

# %% [markdown]
# At realistic sizes the same four $d \times H d_k$ matrices as attention dominate: the gates go
# through rank-$r$ bottlenecks, the convolutions have $w$ taps per channel (where the rest goes:
# the [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md#notebook-04)).
#
# ## 4. What each part is for (three parts taken away)
#
# ### The L2 norm and the $\beta$ sigmoid keep the transition non-expansive
# That is, $\lVert M_t\rVert_2 \le 1$: $I - \beta \mathbf k \mathbf k^\top$ has the eigenvalue $1 -
# \beta \lVert\mathbf k\rVert^2$ along $\mathbf k$ and 1 orthogonal to it: all in $(0, 1]$ for
# $\lVert\mathbf k\rVert = 1$ and $\beta \in (0, 1)$. If $\beta \lVert \mathbf k\rVert^2 \notin [0,
# 2]$ one is outside $[-1, 1]$ and stretches a state's part along $\mathbf k$; the two parts rule
# that out (the paper's L2Norm, §4). Four ways, one function each, on every head of `ablation_draws`
# layers at init (each with its own $\mathbf x$): as built; keys not normalised at this $d_k$; the
# same at $d_k$ = 128; and $\beta = \mathbf x_t W_\beta$ without the sigmoid. The bottom row's state
# (no write, no decay: `explain.growth`) passes $\lVert S_0\rVert_F$ only through an eigenvalue
# outside $[-1, 1]$. Its log axis: growths compound with $T$ (the table gives the largest and its
# log over $T$), wide keys' over twice as fast as without the sigmoid.

# %%
def as_built(layer, x, head):  # the recurrence's inputs k, v, g, beta: row 0, one head, float64
    p = layer_from_parts(layer, x)
    return [np.asarray(p[name][0, :, head], np.float64) for name in ("k", "v", "g", "beta")]


def no_l2_norm(layer, x, head):  # keys after the conv and SiLU, not normalised
    return [np.asarray(layer.project(x).k[0, :, head], np.float64), *as_built(layer, x, head)[1:]]


def no_beta_sigmoid(layer, x, head):  # beta = x_t W_beta, not squashed
    return [*as_built(layer, x, head)[:3], np.asarray(layer.b_proj(x)[0, :, head], np.float64)]


# %%
wide_k, widths = 128, sorted({K, 64, 128})  # the third column's d_k; the width table's
wide = f"no L2 norm, d_k = {wide_k}"  # the third column
ways = {"as built": (as_built, K), f"no L2 norm, d_k = {K}": (no_l2_norm, K),  # way: (part, d_k)
        wide: (no_l2_norm, wide_k), "no sigmoid on beta": (no_beta_sigmoid, K)}
runs, draws, inputs = explain.ablation(ways, config, x, layer_seed, draws=ablation_draws,
                                       seed=seed, widths=widths)  # draw 0: this page's layer, x
grows = {way: np.array([np.mean(r[way][0] > 1 + 1e-6) for r in runs]) for way in ways}  # a head
kept = {way: np.array([r[way][1].max() for r in runs]) for way in ways}  # max ||S_t|| / ||S_0||
table = [r"| way | $M_t$ expanding: all (a head: least .. most) | heads above $\lVert S_0\rVert_F$ "
         r"| largest $\lVert S_t\rVert_F / \lVert S_0\rVert_F$ | its log / $T$ |",
         "| --- |" + " ---: |" * 4]
for way, share in grows.items():
    top, above = kept[way].max(), f"{np.sum(kept[way] > 1)} of {len(runs)}"
    ratio = f"{top:.3g} | {np.log(top) / seq_len:.3f}" if top > 1 else "stays ≤ 1 | -"
    table.append(f"| {way} | {share.mean():.0%} ({share.min():.0%} .. {share.max():.0%}) | "
                 f"{above} | {ratio} |")
display(Markdown("\n".join(table)))
assert grows["as built"].max() == 0 and 0.3 < grows["no sigmoid on beta"].mean() < 0.7, "expands"
assert np.mean(kept["no sigmoid on beta"] > 1) > 0.5, "grows"
assert grows[wide].mean() > 0.8 and np.mean(kept[wide] > 1) > 0.9, "wide keys expand"
assert np.log(kept[wide].max()) > 2 * np.log(kept["no sigmoid on beta"].max()), "compounds faster"

# %%
raw = np.concatenate([np.asarray(d[K].b_proj(inputs[i])[0]).ravel() for i, d in enumerate(draws)])
print(f"no sigmoid: beta < 0 at {np.mean(raw < 0):.0%}, beta > 2 at {np.mean(raw > 2):.0%}")
assert 0.3 < np.mean(raw < 0) < 0.7
law = {n: (np.sum(np.square(np.asarray(p.k, np.float64)), -1), np.asarray(p.beta)) for n, p in
       ((n, m.project(x)) for n, m in draws[0].items())}  # d_k: (||k_t||^2, beta_t), no L2 norm
expand = {width: np.mean(np.prod(law[width], 0) > 2) for width in widths}  # beta ||k_t||^2 > 2
for width in widths:
    print(f"d_k = {width}: mean ||k_t||^2 / d_k {law[width][0].mean() / width:.3f}, median beta "
          f"{np.median(law[width][1]):.2f}, beta ||k_t||^2 > 2 at {expand[width]:.0%}")
assert all(0.05 < law[n][0].mean() / n < 0.2 for n in widths), "||k_t||^2 in proportion to d_k"
assert all(np.diff(list(expand.values())) > 0) and expand[64] > 0.5 and expand[128] > 0.8
viz.show(viz.ablation_norms(runs), "04_ablation_norms")  # the plotting: kda_lib/teaching/viz.py

# %% [markdown]
# As built, no transition expands. Without the sigmoid, $\beta = \mathbf x_t W_\beta < 0$ at about
# half the tokens, where the eigenvalue $1 - \beta$ along $\mathbf k_t$ exceeds 1: about half of all
# transitions expand, the state grows past $S_0$ in most heads. Without the L2 norm it depends on
# the width: a raw key's mean square per channel is within 0.05 to 0.2 at each width (asserted), so
# $\beta \lVert\mathbf k_t\rVert^2 > 2$ at a share of tokens that grows with $d_k$, most at 64 and
# 128 (third column: most transitions expand, the state grows in nearly all heads). Counted: the
# table ($\lVert M_t\rVert_2 > 1$, decay included) and the $\beta < 0$ line on row 0 of every draw;
# the width lines on the page's layer and $\mathbf x$, every row, no decay.
#
# ### The short convolution lets one write bind two tokens
# Associative recall needs the layer to store "value of token $t$ under the key of token $t - 1$" in
# a single write. Without the convolution the key of token $t$'s write is a function of $\mathbf
# x_t$ alone (shown below). Recall without it is not run here; notebook 08 (section 5) runs the
# attention analogue, one layer on MQAR with and without a short conv (Zoology, Arora et al.). With
# it, $\mathbf k_t$ sees $\mathbf x_{t-w+1}, \dots, \mathbf x_t$: its Jacobian shows it.

# %%
def key_reach(module):  # |d k_t / d x_s| summed over channels, every s (t = t_probe, row 0)
    jac = jax.jit(jax.jacobian(lambda x: module.project(x).k[0, t_probe]))(x[:1])  # [H,K,1,T,d]
    return np.abs(np.asarray(jac)).sum(axis=(0, 1, 2, 4))


t_probe = seq_len // 2
no_conv = kda_lib.KimiDeltaAttention(dataclasses.replace(config, conv_size=0),
                                     rngs=nnx.Rngs(layer_seed))
reach = {"with conv": key_reach(layer), "without conv": key_reach(no_conv)}
for name, r in reach.items():
    print(f"{name}: k_t depends on tokens {np.flatnonzero(r).tolist()} (t = {t_probe})")
window = list(range(t_probe - conv_size + 1, t_probe + 1))
assert np.flatnonzero(reach["with conv"]).tolist() == window
assert np.flatnonzero(reach["without conv"]).tolist() == [t_probe]

# %% [markdown]
# ### The low-rank gates: a parameter choice
# Both gates go through rank-$r$ bottlenecks ($r = d_k$ in the paper), so by construction the raw
# gate input $\mathbf x_t W_f^{\downarrow} W_f^{\uparrow}$ of all tokens spans at most $r$ of $H
# d_k$ dimensions (printed). For the output gate the paper (§4, after Eq. 10) reports performance
# comparable to full-rank gating (not tested here).
#
# ### The RMSNorm and output gate: the output's scale (and, per the paper, the attention sink)
# The RMSNorm divides a head's output by $\sqrt{\operatorname{ms}(\mathbf o) +
# \epsilon_{\text{RMS}}}$ ($\operatorname{ms}$: mean square over the channels) and multiplies
# channel $e$ by $\eta_e$ (1 at init): the RMS becomes $\sqrt{\operatorname{ms}(\mathbf o) /
# (\operatorname{ms}(\mathbf o) + \epsilon_{\text{RMS}})}$, below 1, within 0.5% of 1 once
# $\operatorname{ms}(\mathbf o) \ge 100\epsilon_{\text{RMS}}$ (scaled up, below). At init $\mathbf
# o$ is tiny (RMS printed): the norm raises it, a little below 1 at the median, far below at the
# lowest. The gate $\sigma(\mathbf z_t) \in (0, 1)$ scales each channel down, never to 0; its
# purpose, per the paper (§4, after Eq. 10), is alleviating the attention sink, after Qiu et al.
# (references), whose sigmoid gate after softmax attention mitigated it (not tested here).

# %%
f_rank = np.linalg.matrix_rank(np.asarray(parts["f"][0]).reshape(seq_len, H * K), tol=1e-4)
print(f"gate input over {seq_len} tokens: rank {f_rank} of {H * K} dimensions (<= r = {gate_rank})")
assert f_rank == min(gate_rank, seq_len, H * K)
ms, eps_rms = np.mean(np.square(np.asarray(parts["o"], float)), -1), config.norm_eps  # [B, T, H]
norm = lambda o: kda_lib.ops.norms.gated_rms_norm(o, layer.o_norm[...], parts["z"])
rms_after = lambda o: np.sqrt(np.mean(np.square(norm(o) / jax.nn.sigmoid(parts["z"])), -1))
rms_init = rms_after(parts["o"])  # the library's norm, gate divided out; then o scaled up
rms_grown = rms_after(parts["o"] * np.float32(np.sqrt(100 * eps_rms / ms.min())))
print(f"RMS of o {np.sqrt(ms.min()):.1e} .. {np.sqrt(ms.max()):.1e} (ms(o) < 100 eps_rms at "
      f"{np.mean(ms < 100 * eps_rms):.0%}); after the norm {rms_init.min():.2f} (median "
      f"{np.median(rms_init):.3f}) .. {rms_init.max():.3f}; o scaled up >= {rms_grown.min():.4f}")
assert np.mean(ms < 100 * eps_rms) > 0.5 and 0.9 < np.median(rms_init) < np.sqrt(100 / 101)
assert rms_init.min() < 0.5, "the lowest RMS far below 1"
assert np.all(rms_init > np.sqrt(ms)), "the norm raises every head's RMS at init"

# %% [markdown]
# ## Summary
#
# - Built from its parts, the layer equals `KimiDeltaAttention`; at realistic sizes it has slightly
#   more parameters than softmax attention (the ratio: section 3), and a fixed-size state, no KV
#   cache (decoding: 07).
# - As built no transition expands ($\lVert M_t\rVert_2 \le 1$); without the $\beta$ sigmoid about
#   half do and a state with no write or decay grows in most heads; without the L2 norm most do at
#   $d_k$ = 128, fewer the narrower the keys. Without the conv a key sees its own token only; the
#   gate's input has rank $r$; the RMSNorm raises the tiny init outputs to RMS near 1 (median above
#   0.9), under 0.5 only where $\operatorname{ms}(\mathbf o) < \epsilon_{\text{RMS}} / 3$.
#
# ## Exercises
#
# Each asks for what this page does not compute (NumPy or `jnp`, no `kda_lib`); solutions: [`notebooks/solutions/ch04.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch04.py).
# 1. **The gate input for a half-life.** Held at a raw input $f$, channel $c$ of head $h$ keeps
#    $e^{g}$ of its state a token, $g = -a_h \operatorname{softplus}(f + b_c)$, half after $t_{1/2}$
#    tokens. (a) Derive $f$ in closed form for a wanted (real) $t_{1/2}$: `gate_input_for(half_life,
#    a_log, dt_bias) -> f` (`[H, K]` but `a_log [H]`, the layer's `A_log`), judged by `kda_lib`'s
#    gate in float64: half-lives of 0.3 to $10^4$ tokens, each to a relative $10^{-5}$. (b) The same
#    for the safe gate $g = g_{\min} \sigma(a_h (f + b_c))$: `safe_gate_input_for(half_life,
#    lower_bound, a_log, dt_bias) -> f`. At which $t_{1/2}$ does your closed form's $f$ go to
#    $\infty$, and which $t_{1/2}$ have no real $f$? `inf` there.
# 2. **The RMSNorm's backward pass.** Derive the gradient of `(dn * n).sum()`, `n` $=
#    \operatorname{RMSNorm}_{\boldsymbol\eta}(\mathbf o)$, in $\mathbf o$: `rmsnorm_backward(o, eta,
#    dn, eps)` (`o, dn`: rows of $d_v$; `eta [V]`). Why is it orthogonal to $\mathbf o$ at `eps` $=
#    0$? No autodiff; the last trial has $d_v > 10^4$, within 5 s (no $d_v \times d_v$ Jacobian).
# 3. **What the layer keeps between decode steps.** Decoding brings one token a call (notebook 07).
#    Which parts of section 1 look back past the new token, and how much of their past do they need?
#    Write `decode_cache_numbers(d, H, d_k, d_v, w) -> int`, the numbers the layer as built caches
#    per sequence ($w = 0$: no convolution), judged against its `init_cache` at drawn sizes.

# %%
answer = None  # exercise 1a: gate_input_for(half_life, a_log, dt_bias) -> f [H, K]
exercises.check("04.1", answer)
answer = None  # exercise 1b: safe_gate_input_for(half_life, lower_bound, a_log, dt_bias) -> f
exercises.check("04.1b", answer)
answer = None  # exercise 2: rmsnorm_backward(o, eta, dn, eps) -> do
exercises.check("04.2", answer)
answer = None  # exercise 3: decode_cache_numbers(d, H, d_k, d_v, w) -> int
exercises.check("04.3", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture* (the KDA layer),
#   2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: improving Mamba2 with delta rule*
#   (the layer design KDA extends), ICLR 2025. [arXiv:2412.06464](https://arxiv.org/abs/2412.06464)
# - S. Yang et al., *Parallelizing linear transformers with the delta rule over sequence length*
#   (L2-normalised keys, short convs), NeurIPS 2024. [arXiv:2406.06484](https://arxiv.org/abs/2406.06484)
# - S. Arora et al., *Zoology: measuring and improving recall in efficient language models*
#   (why short convolutions help recall), 2023. [arXiv:2312.04927](https://arxiv.org/abs/2312.04927)
# - Z. Qiu et al., *Gated attention for large language models: non-linearity, sparsity, and
#   attention-sink-free* (the output gate), NeurIPS 2025. [arXiv:2505.06708](https://arxiv.org/abs/2505.06708)
# - B. Zhang, R. Sennrich, *Root mean square layer normalization*, NeurIPS 2019. [arXiv:1910.07467](https://arxiv.org/abs/1910.07467)
# - fla's layer, `fla/layers/kda.py`: [fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention)
