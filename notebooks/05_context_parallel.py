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
# # 05 · Context parallelism: split the sequence, pass the state, get the same answer
#
# **Claim.** A KDA layer can run with its sequence split over $R$ devices, its recurrence computing
# what one device computes to float32 rounding (below $10^{-5}$: outputs and gradients in section
# 3, and the same per-rank code on one device, its ranks a `vmap` axis, in section 6), while the
# devices exchange two small things: the $w - 1$ tokens before each slice (the short
# convolution's *halo*, notebook 04) and one affine summary $S \mapsto M^{(\rho)} S + E^{(\rho)}$
# of each slice's effect on the state. Neither grows with the sequence length $T$; gathering the
# sequence does (section 5, read off the compiled program). Without 2 accelerators: simulated CPUs.
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/kda-notebooks/kda-notebooks/blob/main/notebooks/05_context_parallel.ipynb)
#
# Symbols: [`docs/NOTATION.md`](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTATION.md).

# %% tags=["parameters"]
num_devices: int = 4  # context-parallel ranks R (simulated CPU devices without accelerators)
batch: int = 1  # sequences per batch
seq_len: int = 64  # tokens T, split evenly over the ranks
num_heads: int = 2  # heads H
key_dim: int = 16  # K per head
value_dim: int = 16  # V per head
hidden_size: int = 32  # model width of the layer whose traffic section 5 reads
conv_size: int = 4  # short-conv width w; the halo is w - 1 tokens
implementation: str = "recurrent"  # kernel each rank runs locally (recurrent or chunked)
traffic_lengths: list[int] = [64, 256, 1024]  # T at which the compiled programs are inspected
traffic_max_len: int = 1048576  # longest T of the analytic traffic curves
seed: int = 0  # seed of the one jax.random.key below


# %%
# Simulated devices must be requested before jax is first imported (your own XLA_FLAGS win).
import os
import sys

if "jax" not in sys.modules:
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = (
            f"{_flags} --xla_force_host_platform_device_count={num_devices}".strip()
        )
else:
    print("jax was imported before this cell: the simulated device count cannot change now")

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
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

import kda_lib.teaching.notebook
from kda_lib.parallel.context_parallel import halo_exchange, kda_context_parallel, shard_as
from kda_lib.teaching import context_parallel as cpt
from kda_lib.teaching import explain, viz
from kda_lib.testing import relative_l2

kda_lib.teaching.notebook.check_parameters(globals())  # each parameter's type and range, by name
kda_lib.teaching.notebook.setup()  # float32 matmuls at "highest": differences below are CP's

# %%
accelerators = [d for d in jax.devices() if d.platform != "cpu"]
pool = accelerators if len(accelerators) >= 2 else jax.devices("cpu")
ranks = min(num_devices, len(pool))
assert ranks >= 2, (f"context parallelism needs at least 2 devices, found {len(pool)}: restart "
                    "the kernel so the device cell runs before jax is imported")
total_len = ranks * -(-seq_len // ranks)  # T: seq_len rounded up to a multiple of the ranks
local_len = total_len // ranks
halo = conv_size - 1
mesh = jax.make_mesh((ranks,), ("context",), axis_types=(jax.sharding.AxisType.Explicit,),
                     devices=pool[:ranks])
SEQ = PartitionSpec(None, "context")  # arrays [B, T, ...] split along T
key = jax.random.key(seed)
key_inputs, key_state, key_cotangent, key_layer, key_vmap = jax.random.split(key, 5)
layer_seed = int(jax.random.randint(key_layer, (), 0, 2**31 - 1))
print(f"{ranks} {'simulated ' * (pool[0].platform == 'cpu')}{pool[0].platform} devices (asked for "
      f"{num_devices}); T = {total_len} tokens, {local_len} per rank; halo {halo} tokens")
for r, device in enumerate(mesh.devices.flat):
    print(f"rank {r}: {device} -> tokens {r * local_len + 1}..{(r + 1) * local_len} (from 1)")

# %% [markdown]
# ## 1. Devices and the halo
#
# A `jax.sharding.Mesh` names the device axis the sequence is split over, `"context"`;
# `jax.shard_map` hands each rank its $T / R$ consecutive tokens (printed above). The short
# convolution at a rank's first token needs the $w - 1$ tokens before it, which the rank before
# holds: one `ppermute` down the chain (rank 0 receives zeros). The picture: where the tokens go
# (halo hatched), and the summaries of section 2. Below, the exchange checked: rank $\rho$
# receives the $w - 1$ positions (numbered from 1) before its slice, rank 0 zeros.

# %% tags=["hide-input"]
viz.show(viz.draw_context_parallel(ranks, local_len, halo), "05_split_and_halo")

# %%
positions = jnp.arange(1, total_len + 1, dtype=jnp.float32)[None, :, None]  # [1, T, 1]
exchange = jax.shard_map(lambda z: halo_exchange(z, axis_name="context", halo_size=halo),
                         mesh=mesh, in_specs=SEQ, out_specs=SEQ)
with_halo = np.asarray(jax.jit(lambda z: exchange(shard_as(z, mesh, SEQ)))(positions))
with_halo = with_halo.reshape(ranks, local_len + halo)
padded = np.concatenate([np.zeros(halo), np.arange(1, total_len + 1)])
for r in range(ranks):  # rank r holds the halo, then its own slice
    np.testing.assert_array_equal(with_halo[r], padded[r * local_len: halo + (r + 1) * local_len])
    print(f"rank {r} receives positions {with_halo[r, :halo].astype(int).tolist()}")

# %% [markdown]
# ## 2. A slice is an affine map of the state that enters it
#
# Per token $S_t = M_t S_{t-1} + E_t$, $M_t = (I - \beta_t \mathbf k_t \mathbf k_t^\top) D_t$,
# $E_t = \beta_t \mathbf k_t \mathbf v_t^\top$ (notebook 01), so a slice is affine in the state
# that enters it: $S_{\text{out}} = M^{(\rho)} S_{\text{in}} + E^{(\rho)}$, $M^{(\rho)}$ the
# product of its $M_t$. One kernel run computes both: run the slice from the augmented state
# $[\,I \mid 0\,]$ ($d_k \times (d_k + d_v)$) with values $[\,\mathbf 0 \mid \mathbf v_t\,]$. The
# update acts on each column of the state alone; the first $d_k$ columns get zero values, so only
# the $M_t$ act on them (the delta correction $-\beta_t \mathbf k_t \mathbf k_t^\top D_t S$ is
# part of $M_t$) and they end at $M^{(\rho)}$; the last $d_v$ start at $0$ and end at $E^{(\rho)}$:
#
# $$\big[\, I \mid 0 \,\big] \;\xrightarrow{\text{slice}}\; \big[\, M^{(\rho)} \mid E^{(\rho)}
# \,\big].$$
#
# Below we fold the summaries ($S^{(0)} = 0$, $S^{(\rho)} = M^{(\rho - 1)} S^{(\rho - 1)} +
# E^{(\rho - 1)}$) and compare with the state one device reaches at each slice boundary. The
# slice's outputs are affine in $S^{(\rho)}$ as well, $O = Q^{\text{eff}} S^{(\rho)} +
# O^{\text{intra}}$ (notebook 03's form for a chunk), and the same run outputs $[\,Q^{\text{eff}}
# \mid O^{\text{intra}}\,]$ (checked below against one device); the product $Q^{\text{eff}}
# S^{(\rho)}$ is $d_k d_v$ multiply-adds a token, $2 d_k d_v$ flops: counted, not measured.

# %%
# q, k, v, g, beta [B, T, ...], g from notebook 04's gate as the layer is initialised
inputs = tuple(cpt.layer_inputs(key_inputs, batch, total_len, num_heads, key_dim, value_dim)
               .values())
kernel = jax.jit(kda_lib.kda, static_argnames=("output_final_state", "implementation"))
slices = lambda r: [x[:, r * local_len: (r + 1) * local_len] for x in inputs]  # rank r's slice


def slice_summary(q, k, v, g, beta):
    """(M, E, [Q_eff | O_intra]) of one slice: a run from [I | 0] with values [0 | v]."""
    eye = jnp.broadcast_to(jnp.eye(key_dim), (batch, num_heads, key_dim, key_dim))
    start = jnp.concatenate([eye, jnp.zeros((batch, num_heads, key_dim, value_dim))], -1)
    v_aug = jnp.concatenate([jnp.zeros(v.shape[:-1] + (key_dim,)), v], -1)
    out, final = kernel(q, k, v_aug, g, beta, initial_state=start, output_final_state=True,
                        implementation=implementation)
    return final[..., :key_dim], final[..., key_dim:], out


# %%
summaries = [slice_summary(*slices(r)) for r in range(ranks)]
state = jnp.zeros((batch, num_heads, key_dim, value_dim))
folded = []
for m, e, _ in summaries:
    folded.append(state)  # the state entering this slice
    state = jnp.einsum("bhij,bhjv->bhiv", m, state) + e
folded.append(state)
boundary_errors = []  # the single-device state at each slice boundary: run the prefix
for r in range(1, ranks + 1):
    prefix = [x[:, : r * local_len] for x in inputs]
    _, truth = kernel(*prefix, output_final_state=True, implementation=implementation)
    boundary_errors.append(relative_l2(folded[r], truth))
print("relative error of the folded state at each boundary:",
      ", ".join(f"{e:.1e}" for e in boundary_errors))
assert max(boundary_errors) < 1e-5

# %%
# affine, not just at zero: any incoming state maps through the same (M, E)
s_in = jax.random.normal(key_state, (batch, num_heads, key_dim, value_dim))
_, s_out = kernel(*slices(1), initial_state=s_in, output_final_state=True,
                  implementation=implementation)
m1, e1, _ = summaries[1]
assert relative_l2(jnp.einsum("bhij,bhjv->bhiv", m1, s_in) + e1, s_out) < 1e-5
# and the carried state matters: a slice run from zero instead gives visibly other outputs
o_one = np.split(np.asarray(kernel(*inputs, implementation=implementation)[0]), ranks, axis=1)
carried = relative_l2(kernel(*slices(1), implementation=implementation)[0], o_one[1])
print(f"slice 1 run from a zero state instead of the carried one: {carried:.0%} off")
assert carried > 0.05
read = [relative_l2(out[..., key_dim:] + jnp.einsum("bthi,bhiv->bthv", out[..., :key_dim], s), o)
        for (_, _, out), s, o in zip(summaries, folded[:-1], o_one, strict=True)]  # O_intra + ..
print(f"outputs read off the summary pass vs one device, largest relative error {max(read):.1e}")
assert max(read) < 1e-5
norms = np.asarray(explain.state_norms(*(x[0, :, 0] for x in inputs[1:])))  # sequence 0, head 0
boundaries = np.arange(1, ranks + 1) * local_len
folded_norms = [float(jnp.linalg.norm(s[0, 0])) for s in folded[1:]]
assert np.allclose(folded_norms, norms[boundaries - 1], rtol=1e-4)

# %% tags=["hide-input"]
viz.show(cpt.plot_folded_states(norms, boundaries, folded_norms), "05_folded_states")

# %% [markdown]
# ## 3. The kernel: context parallel == one device, outputs and gradients
#
# `kda_context_parallel` does section 2 inside `shard_map` (section 1's halo is the layer's,
# section 5), in steps:
#
# 1. **Summary pass.** Every rank, at once, runs the kernel over its slice from $[\,I \mid 0\,]$:
#    its summary $(M^{(\rho)}, E^{(\rho)})$.
# 2. **All-gather.** The ranks exchange the summaries (LASP-2's one all-gather of states; for the
#    delta rule the summary is affine, not additive); every rank waits here for the slowest.
# 3. **Fold.** Every rank folds all $R$ gathered summaries in order and keeps the state after the
#    first $\rho$, $S^{(\rho)}$ ($S^{(0)} = 0$); the last gives the final state.
# 4. **Output pass.** Each rank reruns its slice from $S^{(\rho)}$ and writes its outputs.
#
# We compare the sharded result with one device's, slice by slice: the outputs, and the
# gradients of a random projection of the outputs with respect to every input, which flow back
# through the all-gather.

# %%
cp_kernel = jax.shard_map(
    lambda *a: kda_context_parallel(*a, axis_name="context", implementation=implementation)[0],
    mesh=mesh, in_specs=(SEQ,) * 5, out_specs=SEQ)
cp = jax.jit(lambda *a: cp_kernel(*(shard_as(x, mesh, SEQ) for x in a)))
one = jax.jit(lambda *a: kda_lib.kda(*a, implementation=implementation)[0])
cotangent = jax.random.normal(key_cotangent, inputs[2].shape)
loss = lambda fn: lambda *a: jnp.sum(fn(*a) * cotangent)  # a random projection of fn's output
per_rank = lambda a, b: [relative_l2(x, y) for x, y in zip(  # the error of each rank's slice
    np.split(np.asarray(a), ranks, axis=1), np.split(np.asarray(b), ranks, axis=1), strict=True)]

# %%
grad_all = lambda fn: jax.jit(jax.grad(loss(fn), argnums=tuple(range(5))))  # noqa: E731
with jax.default_device(pool[0]):
    kernel_errors = {"o": per_rank(cp(*inputs), one(*inputs))} | {
        name: per_rank(a, b) for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"),
                                                   grad_all(cp)(*inputs), grad_all(one)(*inputs),
                                                   strict=True)}
for name, errors in kernel_errors.items():
    print(f"{name:6s} relative error per rank: " + "  ".join(f"{e:.1e}" for e in errors))
kernel_worst = max(max(e) for e in kernel_errors.values())
print(f"largest: {kernel_worst:.1e} (float32 rounding; asserted below 1e-5)")
assert kernel_worst < 1e-5

# %% tags=["hide-input"]
viz.show(cpt.plot_rank_errors(kernel_errors, 1e-5, "Kernel: context parallel vs one device, "
                              "per rank's slice"), "05_kernel_errors")

# %% [markdown]
# ## 4. Who waits for whom, and what it costs
#
# The schedule of section 3 (for the layer, the halo first), per rank: each runs its slice twice,
# on $d_k + d_v$ value columns (summary) and on $d_v$ (output), about three slices' flops at
# $d_k = d_v$ (box widths: XLA's flop counts of the recurrent step), plus the fold: at most about
# $R / 3$ times faster than one device. The rerun is a choice: section 2's run also gives the
# outputs, for fewer flops (the notes). At the toy defaults the fold costs about a slice: a
# speed-up of about 1, not $R / 3$ (printed); longer slices shrink its share.

# %%
path = cpt.critical_path(ranks, local_len, key_dim, value_dim)  # flops per sequence and head
passes = (path["summary"] + path["output"]) / path["output"]  # in slices: (d_k + 2 d_v) / d_v
fold, speedup = path["fold"] / path["output"], path["one_device"] / path["rank"]
print(f"each rank: {passes:.2f} slices' flops in two passes, the fold {fold:.2f}; speed-up over "
      f"one device {speedup:.2f}x (R / 3 = {ranks / 3:.2f})")
assert abs(passes / ((key_dim + 2 * value_dim) / value_dim) - 1) < 0.05
viz.show(cpt.draw_critical_path(ranks, halo, path), "05_critical_path")

# %% [markdown]
# ## 5. Bytes moved: passing summaries vs gathering the sequence
#
# The obvious alternative: every rank gathers the whole sequence ($\mathbf q, \mathbf k,
# \mathbf v, \mathbf g, \beta$) and runs it. Per rank, with 4-byte floats:
#
# $$
# \begin{align*}
# \text{gather the sequence:}&\quad \tfrac{R - 1}{R}\, B\, T\, H\, (3 d_k + d_v + 1) \cdot 4
#   \text{ bytes, linear in } T, \\
# \text{state passing (kernel):}&\quad (R - 1)\, B\, H\, d_k (d_k + d_v) \cdot 4 \text{ bytes}, \\
# \text{state passing + halo (layer):}&\quad \text{the above} + (w - 1)\, B\, H\, (2 d_k + d_v)
#   \cdot 4 \text{ bytes}.
# \end{align*}
# $$
#
# Passing summaries costs the same at every $T$; gathering sends more once
# $T > R\, d_k (d_k + d_v) / (3 d_k + d_v + 1)$. We compile each program at a few lengths and add
# up what each rank sends (`cpt.bytes_sent`; how it reads the program: the notes); the figure
# draws the layer's bytes less the kernel's (its halo), as the two would lie on one line.

# %%
bytes_f32 = 4
formula = {"state passing (kernel)": lambda t: (ranks - 1) * batch * num_heads * key_dim
           * (key_dim + value_dim) * bytes_f32,
           "gather the sequence": lambda t: (ranks - 1) / ranks * batch * t * num_heads
           * (3 * key_dim + value_dim + 1) * bytes_f32}
formula["state passing + halo (layer)"] = lambda t: formula["state passing (kernel)"](t) + (
    halo * batch * num_heads * (2 * key_dim + value_dim) * bytes_f32)


def gather_local(q, k, v, g, beta):
    """The alternative: every rank gathers the whole sequence, runs it, keeps its slice."""
    full = [jax.lax.all_gather(a, "context", axis=1, tiled=True) for a in (q, k, v, g, beta)]
    out, _ = kda_lib.kda(*full, implementation=implementation)
    return jax.lax.dynamic_slice_in_dim(out, jax.lax.axis_index("context") * q.shape[1],
                                        q.shape[1], axis=1)


gather_kernel = jax.shard_map(gather_local, mesh=mesh, in_specs=(SEQ,) * 5, out_specs=SEQ)
gather = jax.jit(lambda *a: gather_kernel(*(shard_as(x, mesh, SEQ) for x in a)))

# %%
config = kda_lib.KDAConfig(hidden_size=hidden_size, num_heads=num_heads, head_dim=key_dim,
                           value_head_dim=value_dim, conv_size=conv_size,
                           implementation=implementation)  # notebook 04's layer, on the mesh
layer_cp = kda_lib.KimiDeltaAttention(config, rngs=nnx.Rngs(layer_seed), mesh=mesh)
measured = {name: [] for name in formula}
lengths = [ranks * -(-t // ranks) for t in traffic_lengths]
for t in lengths:
    kernel_args = [jnp.zeros((batch, t, *x.shape[2:])) for x in inputs]  # q, k, v, g, beta
    x = jnp.zeros((batch, t, hidden_size))
    programs = {"state passing (kernel)": (cp, kernel_args),
                "gather the sequence": (gather, kernel_args),
                "state passing + halo (layer)": (type(layer_cp).__call__, [layer_cp, x])}
    for name, (fn, args) in programs.items():
        measured[name].append(cpt.bytes_sent(fn, *args, ranks=ranks))
        assert measured[name][-1] == formula[name](t), (name, t, measured[name][-1])
    print(f"T = {t:5d}, bytes per rank: " + ", ".join(f"{n} {v[-1]:,d}"
                                                      for n, v in measured.items()))

# %%
crossover = ranks * key_dim * (key_dim + value_dim) / (3 * key_dim + value_dim + 1)
ratio_at_longest = measured["gather the sequence"][-1] / measured["state passing (kernel)"][-1]
print(f"state passing moves fewer bytes than gathering for T > {crossover:.1f} tokens (the "
      f"formulas); at T = {lengths[-1]}, gathering sent {ratio_at_longest:.1f}x the bytes")
assert ratio_at_longest > 1
long_t = np.geomspace(16, max(traffic_max_len, lengths[-1]), 60)  # from 16 tokens: the crossover
analytic = {name: [f(t) for t in long_t] for name, f in formula.items()}
viz.show(cpt.plot_traffic(long_t, analytic, lengths, measured, crossover=crossover,
                          title=f"Bytes each rank sends per forward pass, R = {ranks}, "
                          f"B = {batch}, H = {num_heads}, $d_k$ = {key_dim}, $d_v$ = {value_dim}"),
         "05_traffic")

# %% [markdown]
# ## 6. One device, $R$ slices: the ranks as a `vmap` axis
#
# A collective names an axis, not devices: under `jax.vmap(f, axis_name="context")` the
# all-gather in `kda_context_parallel` gathers across the $R$ mapped slices, so section 3's
# per-rank code runs unchanged on one device (a TPU chip, a laptop).
# `cpt.context_parallel_on_one_device` runs $T = 128 R$ tokens as $R$ slices (on a TPU by
# kda_lib's Pallas kernel, `"pallas_tpu"`, $d_k = d_v = 128$; elsewhere by `implementation`)
# against one pass: outputs, final state, gradients, each error the largest $|\text{CP} -
# \text{one pass}|$ over the largest $|\text{one pass}|$. The last slice run alone, from a zero
# state, shows that the state carried into it matters.

# %%
vmap_impl = "pallas_tpu" if jax.default_backend() == "tpu" else implementation
key_vmap_inputs, key_vmap_cotangent = jax.random.split(key_vmap)
x_vmap = cpt.layer_inputs(key_vmap_inputs, batch, 128 * ranks, num_heads,
                          *((128, 128) if vmap_impl == "pallas_tpu" else (key_dim, value_dim)))
last = {n: a[:, -128:] for n, a in x_vmap.items()}  # the last slice, run alone from zero
carried = relative_l2(kernel(**last, implementation=vmap_impl)[0],
                      kernel(**x_vmap, implementation=vmap_impl)[0][:, -128:])
vmap_errors = cpt.context_parallel_on_one_device(x_vmap, jax.random.normal(
    key_vmap_cotangent, x_vmap["v"].shape), ranks=ranks, implementation=vmap_impl)
print(f"the last slice run alone, without the state before it: {carried:.0%} off")
print(f"{ranks} slices under vmap, one {jax.default_backend()} device, vs one pass; largest |CP - "
      "one| / largest |one|: " + ", ".join(f"{n} {e:.1e}" for n, e in vmap_errors.items()))
assert max(vmap_errors.values()) < 1e-5 and carried > 0.01

# %% [markdown]
# ## Summary
#
# - A slice acts on the state as an affine map $S_{\text{out}} = M^{(\rho)} S_{\text{in}} +
#   E^{(\rho)}$, computed by one kernel run from $[\,I \mid 0\,]$; folding the summaries gives
#   the state at every slice boundary, and the same run's outputs give the slice's.
# - The kernel on $R$ devices matches one device, outputs and gradients, and so does the same
#   per-rank code with the ranks a named `vmap` axis of one device; what the devices exchange
#   does not grow with $T$ (measured, equal to the formula), gathering the sequence does. In this
#   schedule (a summary pass, then a rerun) each rank does about three slices' work: at most
#   about $R / 3$ times faster (more in the [notebook notes](https://github.com/kda-notebooks/kda-notebooks/blob/main/docs/NOTEBOOK_NOTES.md)).
#
# ## Exercises
#
# `exercises.check` says whether an answer is right, never the solution. Worked solutions (try
# first): [`notebooks/solutions/ch05.py`](https://github.com/kda-notebooks/kda-notebooks/blob/main/notebooks/solutions/ch05.py).
#
# Both exercises are the **backward pass**, which the page leaves to `jax.grad`. Rank $\rho$'s
# outputs depend on the state entering it, $S^{(\rho)}$; call $\bar S^{(\rho)}_{\text{own}}$ the
# gradient of the loss with respect to $S^{(\rho)}$ through those outputs only (what the backward
# of rank $\rho$'s output pass returns) and $\bar S^{(\rho)}$ the whole gradient. The loss has no
# term in the final state. Autodiff run by your function on its own thread (`jax.grad`,
# `jax.vjp`, `jax.experimental.jet`) is refused; other threads and processes are beyond the checker
# (it gives feedback; it is no proctor). The last trial ($R = 32$, $d_k = 64$, $d_v = 2d_k$) must
# finish within 10 s of CPU time: finite differences cannot, and a loop over every element may not.
#
# 1. **The backward fold.** Derive $\bar S^{(\rho)}$ from $\bar S^{(\rho + 1)}$ and write
#    `state_gradients(ms, hs)`: from the summaries `ms [R, K, K]` ($M^{(\rho)}$) and `hs [R, K, V]`
#    ($\bar S^{(\rho)}_{\text{own}}$), every $\bar S^{(\rho)}$, `[R, K, V]`. Which rank's gradient
#    is known first, and what does that do to the backward pass's critical path?
# 2. **What the all-gather hands back.** The backward of the all-gather returns to each rank the
#    gradient with respect to its summary. Write `summary_cotangents(ms, es, hs)` ->
#    `(dms [R, K, K], des [R, K, V])`, the gradients with respect to every $M^{(\rho)}$ and
#    $E^{(\rho)}$. What does rank $R - 1$ receive, and what need it not compute at all?

# %%
from kda_lib.teaching import exercises

answer = None  # 1: a function state_gradients(ms, hs) -> [R, K, V]
exercises.check("05.1", answer)

# %%
answer = None  # 2: a function summary_cotangents(ms, es, hs) -> (dms, des)
exercises.check("05.2", answer)

# %% [markdown]
# ## References
#
# - Kimi Team, *Kimi Linear: an expressive, efficient attention architecture*, 2025. [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)
# - H. Liu, M. Zaharia, P. Abbeel, *Ring attention with blockwise transformers for
#   near-infinite context*, 2023. [arXiv:2310.01889](https://arxiv.org/abs/2310.01889)
# - S. Li et al., *Sequence parallelism: long sequence training from system perspective*,
#   2021. [arXiv:2105.13120](https://arxiv.org/abs/2105.13120)
# - W. Sun et al., *LASP-2: rethinking sequence parallelism for linear attention and its hybrid*,
#   2025. [arXiv:2502.07563](https://arxiv.org/abs/2502.07563)
# - JAX, *Manual parallelism with `shard_map`*: [docs.jax.dev](https://docs.jax.dev/en/latest/notebooks/shard_map.html)
# - Chunk-state passing in [openxla/tokamax](https://github.com/openxla/tokamax) and
#   [fla-org/flash-linear-attention](https://github.com/fla-org/flash-linear-attention)
