"""Notebook 05's helpers: what context parallelism costs each rank, counted and drawn.

* :func:`bytes_sent` -- the bytes one rank sends in a compiled program's collectives.
* :func:`step_flops` -- XLA's flop count of one recurrence step (``kda_step``) with ``n``
  value columns; :func:`critical_path` -- the flops on each rank's path (summary pass, fold,
  output pass) and one device's, from those counts.
* :func:`draw_critical_path` -- who waits for whom: the conv halo from the rank before, the
  summary pass, the all-gather, the fold (all R summaries on every rank, ``S^(rho)`` kept), the
  output pass; widths are the flops of :func:`critical_path`.
* :func:`fold_matmuls` -- the fold's ``M S`` products counted in a traced program
  (:func:`cp_jaxpr`: ``kda_context_parallel`` traced on a given set of devices).
* :func:`context_parallel_on_one_device` -- the algorithm on one device (a single chip): the
  sequence in R slices under ``jax.vmap`` with the context axis named, against one pass;
  :func:`layer_inputs` -- its inputs (and section 3's), with the layer's initial gate.
* :func:`plot_folded_states`, :func:`plot_rank_errors`, :func:`plot_traffic`,
  :func:`plot_compute_model` -- notebook 05's figures and docs/NOTEBOOK_NOTES.md's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import PartitionSpec

from kda_lib.ops.reference import kda_step
from kda_lib.parallel.context_parallel import kda_context_parallel, shard_as
from kda_lib.teaching.viz import CYCLE, PALETTE


def step_flops(k_dim: int, n_cols: int) -> float:
    """XLA's flop count of one ``kda_step`` (one sequence, one head) with ``n_cols`` value
    columns, read off the compiled program's cost analysis."""
    shapes = ((1, 1, k_dim, n_cols), (1, 1, k_dim), (1, 1, k_dim), (1, 1, n_cols), (1, 1, k_dim))
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in (*shapes, (1, 1))]
    cost = jax.jit(kda_step).lower(*args).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def bytes_sent(fn, *args, ranks: int) -> int:
    """Bytes one of ``ranks`` ranks sends in ``fn(*args)``: ``fn`` compiled for ``args`` (arrays;
    the first may be an ``nnx.Module``, split into graph and state) and the collectives of its
    HLO text summed (:func:`kda_lib.lab.measure.hlo_collectives`, ring algorithms)."""
    from flax import nnx

    from kda_lib.lab.measure import hlo_collectives

    if args and isinstance(args[0], nnx.Module):
        (graph, state), call = nnx.split(args[0]), fn
        fn, args = (lambda s, *a: call(nnx.merge(graph, s), *a)), (state, *args[1:])
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return sum(c["sent_bytes"] for c in hlo_collectives(hlo, ranks))


def critical_path(ranks: int, local_len: int, k_dim: int, v_dim: int) -> dict[str, float]:
    """Flops per sequence and head on one rank's path and on one device (XLA's step counts):
    ``summary`` (the slice on ``k_dim + v_dim`` value columns), ``fold`` (``ranks`` steps
    ``S -> M S + E``, ``2 k_dim^2 v_dim`` each), ``output`` (the slice on ``v_dim`` columns),
    ``rank`` (their sum) and ``one_device`` (all ``ranks * local_len`` tokens)."""
    f_v, f_kv = step_flops(k_dim, v_dim), step_flops(k_dim, k_dim + v_dim)
    path = dict(summary=local_len * f_kv, fold=ranks * 2.0 * k_dim**2 * v_dim,
                output=local_len * f_v)
    return path | dict(rank=sum(path.values()), one_device=ranks * local_len * f_v)


SKIPPABLE = ".."  # hatch of the fold steps past S^(rho) in draw_critical_path


def draw_critical_path(ranks: int, halo: int, path: dict, *, shown_ranks: int = 4) -> plt.Figure:
    """Gantt sketch of context parallelism: a row per rank (the first ``shown_ranks`` and the
    last), phases left to right, widths the flops of ``path`` (:func:`critical_path`);
    communication (halo, all-gather) is drawn at a fixed width. Every rank folds all ``ranks``
    summaries, as ``kda_context_parallel`` does; those past ``S^(rho)`` are hatched (computed,
    not needed for the rank's outputs). Below: one device, level with the summary pass, and a
    dashed line where each rank's flops would end with no communication."""
    rows = sorted({*range(min(ranks, shown_ranks) - 1), ranks - 1})
    comm = 0.07 * path["rank"]
    x_fold = comm + path["summary"] + comm
    x_out = x_fold + path["fold"]
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.62 * (len(rows) + 2)))
    for i, r in enumerate(rows):
        _rank_row(ax, r, len(rows) - i + 1, path, comm, ranks,
                  halo_from_above=i > 0 and rows[i - 1] == r - 1)  # fmt: skip
    top = len(rows) + 1.45
    ax.add_patch(mpl.patches.Rectangle((comm + path["summary"], 1.55), comm, top - 1.55,
                                       color="0.8"))
    ax.text(x_fold - 0.005 * path["rank"], top + 0.12, "all-gather $(M, E)$\n(not to scale)",
            ha="right", va="bottom", fontsize=8)  # right-aligned, the fold's left-aligned
    ax.text(comm / 2, top + 0.12, f"halo, {halo} tokens\n(not to scale)", ha="center",
            va="bottom", fontsize=8)
    ax.text(x_fold + 0.005 * path["rank"], top + 0.12, f"fold: all {ranks} steps\non every rank",
            ha="left", va="bottom", fontsize=8)
    _box(ax, comm, path["one_device"], 0.7, "0.55", "one device: the whole sequence, $F(T, d_v)$")
    ax.text(-0.01 * path["rank"], 0.7, "1 device", ha="right", va="center", fontsize=9)
    end = x_out + path["output"]
    flops_end = comm + path["rank"]  # a rank's flops from the summary pass, no communication
    ax.plot([flops_end, flops_end], [0.3, 1.1], color=PALETTE["vermillion"], linestyle="--",
            linewidth=1.4)
    ax.text(flops_end, 0.12, f"each rank's flops end here: {path['rank'] / path['one_device']:.2f}"
            " x one device's (communication not counted)", ha="right", va="center", fontsize=9,
            color=PALETTE["vermillion"])
    ax.set(xlim=(-0.12 * path["rank"], 1.03 * max(end, comm + path["one_device"])),
           ylim=(-0.1, top + 0.8), xticks=[], yticks=[],
           xlabel="time on each device: boxes as wide as their flops (per sequence and head); "
           "communication (halo, all-gather) at a fixed width, not to scale")
    ax.legend(handles=[mpl.patches.Patch(facecolor="0.45", edgecolor="white", hatch=SKIPPABLE,
                                         label="fold steps past $S^{(\\rho)}$, the state rank "
                                         "$\\rho$ keeps: computed on every rank, not needed for "
                                         "its outputs (the last gives the final state)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize=8, frameon=False)
    ax.set_title("Context parallelism, who waits for whom: rank $\\rho$ needs rank $\\rho - 1$'s "
                 "halo, every rank needs the all-gathered summaries", fontsize=10)
    ax.grid(False)
    ax.spines[["left", "top", "right"]].set_visible(False)
    return fig


def _rank_row(ax, r: int, y: float, path: dict, comm: float, ranks: int, halo_from_above: bool):
    """Rank ``r``'s row of :func:`draw_critical_path` at height ``y``: halo, summary pass, all
    ``ranks`` fold steps (hatched past ``S^(r)``, which a mark shows) and its output."""
    colour, x_fold = CYCLE[r % len(CYCLE)], comm + path["summary"] + comm
    _box(ax, 0, comm, y, "white", "0" if r == 0 else "halo", edge=colour, hatch="///", text="0.2")
    if halo_from_above:  # the halo comes from the row above (rank r - 1)
        ax.annotate("", xy=(comm / 2, y + 0.28), xytext=(comm / 2, y + 0.72),
                    arrowprops=dict(arrowstyle="->", lw=1.2))
    _box(ax, comm, path["summary"], y, colour, f"summary pass: $(M^{{({r})}}, E^{{({r})}})$")
    step = path["fold"] / ranks
    for j in range(ranks):  # every step computed; those past S^(r) hatched
        _box(ax, x_fold + j * step, step, y, colour, "", edge="white",
             hatch=None if j < r else SKIPPABLE)
    x_keep = x_fold + r * step  # S^(r): the state after the first r summaries
    ax.plot([x_keep, x_keep], [y - 0.32, y + 0.32], color="black", linewidth=2.0)
    ax.text(x_keep, y + 0.33, f" keeps $S^{{({r})}}$", ha="left", va="bottom", fontsize=7)
    _box(ax, x_fold + path["fold"], path["output"], y, colour, f"output from $S^{{({r})}}$")
    ax.text(-0.01 * path["rank"], y, f"rank {r}", ha="right", va="center", fontsize=9)


def _box(ax, x, width, y, colour, label, *, edge=None, hatch=None, text="white"):
    ax.add_patch(mpl.patches.Rectangle((x, y - 0.27), width, 0.54, facecolor=colour,
                                       edgecolor=edge or colour, hatch=hatch, linewidth=1.0))
    if label:
        ax.text(x + width / 2, y, label, ha="center", va="center", fontsize=8, color=text)


def cp_jaxpr(inputs, devices, implementation: str):
    """The traced program (nothing compiled or run) of ``kda_context_parallel`` over
    ``devices`` on ``inputs = (q, k, v, g, beta)``, split along T."""
    mesh = jax.make_mesh((len(devices),), ("context",), devices=devices,
                         axis_types=(jax.sharding.AxisType.Explicit,))
    seq = PartitionSpec(None, "context")
    sharded = jax.shard_map(
        lambda *a: kda_context_parallel(*a, axis_name="context", implementation=implementation)[0],
        mesh=mesh, in_specs=(seq,) * 5, out_specs=seq)
    return jax.make_jaxpr(lambda *a: sharded(*(shard_as(x, mesh, seq) for x in a)))(*inputs)


def fold_matmuls(jaxpr, k_dim: int, v_dim: int) -> int:
    """dot_generals of a ``[.., K, K]`` by a ``[.., K, V]`` operand (the fold's ``M S``) in a
    jaxpr, counted through every sub-jaxpr (shard_map, jit, scan bodies)."""
    found = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            shapes = [tuple(v.aval.shape[-2:]) for v in eqn.invars]
            found += shapes == [(k_dim, k_dim), (k_dim, v_dim)]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += fold_matmuls(inner, k_dim, v_dim)
    return found


def plot_rank_errors(errors: dict, tolerance: float, title: str) -> plt.Figure:
    """Bars of relative errors ``{name: [one per rank]}`` on a log scale; an exact zero (rank 0
    needs nothing from other ranks) gets no bar but the label "= 0 (bitwise)" in its place."""
    ranks = len(next(iter(errors.values())))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width, floor = 0.8 / len(errors), 1e-9
    bottom = mpl.transforms.blended_transform_factory(ax.transData, ax.transAxes)
    for n, (name, values) in enumerate(errors.items()):
        x = np.arange(ranks) + (n - len(errors) / 2 + 0.5) * width
        values = np.asarray(values, float)
        color = CYCLE[n % len(CYCLE)]
        ax.bar(x, np.where(values > 0, values, np.nan), width, label=name, color=color)
        for x_zero in x[values == 0]:
            ax.text(x_zero, 0.03, "= 0 (bitwise)", rotation=90, ha="center", va="bottom",
                    fontsize=7, color=color, fontweight="bold", transform=bottom)
    ax.axhline(tolerance, color="0.3", linestyle=":", linewidth=1.2,
               label=f"tolerance {tolerance:.0e}")
    ax.axhline(np.finfo(np.float32).eps, color="0.6", linestyle="--", linewidth=1,
               label="float32 eps")
    ax.set_yscale("log")
    ax.set_ylim(floor, 1e-3)
    ax.set_xlim(-0.6, ranks - 0.4)
    ax.set_xticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set(title=title, xlabel="rank (slice of the sequence)", ylabel="relative L2 error")
    ax.legend(loc="upper left", ncol=4, fontsize=8)
    return fig


def plot_compute_model(rank_counts, speedup, *, seq_len: int, head_dim: int) -> plt.Figure:
    """Section 7's model: speed-up over one device against the rank count, for state passing
    (passes and the O(R) fold), its R / 3 limit and serial point-to-point passing (1x)."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(rank_counts, rank_counts / 3, "--", color="0.5",
            label="R / 3: summary + output passes")
    ax.plot(rank_counts, speedup, "o-", color=PALETTE["blue"],
            label="state passing: passes + the O(R) fold")
    ax.plot(rank_counts, np.ones_like(rank_counts), "-", color=PALETTE["vermillion"],
            label="serial point-to-point passing (critical path)")
    ax.set(xscale="log", yscale="log", xlabel="ranks R (log scale)",
           ylabel="compute speed-up over one device",
           title=f"Critical-path flops model, T = {seq_len}, $d_k = d_v$ = {head_dim} "
           "(recurrent kernel, communication left out)")
    ax.set_xticks(rank_counts, [str(r) for r in rank_counts])
    ax.minorticks_off()
    ax.legend(loc="upper left", fontsize=8)
    return fig


def plot_folded_states(norms, boundaries, folded_norms) -> plt.Figure:
    """``||S_t||_F`` token by token on one device, and at each slice boundary from the folded
    summaries (``boundaries`` are token counts, ``folded_norms`` one per boundary)."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(np.arange(1, len(norms) + 1), norms, label="one device, token by token")
    ax.plot(boundaries, folded_norms, "o", color=PALETTE["vermillion"], markersize=7,
            label="folded slice summaries")
    for b in boundaries[:-1]:
        ax.axvline(b + 0.5, color="0.6", linewidth=0.8, linestyle=":")
    ax.set(title="The state at every slice boundary, from the summaries alone",
           xlabel="tokens processed t", ylabel=r"$\|S_t\|_F$ (sequence 0, head 0)")
    ax.legend(loc="lower right")
    return fig


_TRAFFIC_STYLES = {
    "state passing (kernel)": (PALETTE["blue"], "-", "o"),
    "halo (the layer's bytes less the kernel's)": (PALETTE["green"], "--", "s"),
    "gather the sequence": (PALETTE["vermillion"], "-", "^"),
}


def plot_traffic(
    long_t, analytic: dict, lengths, measured: dict, *, title: str, crossover: float | None = None
) -> plt.Figure:
    """Bytes each rank sends against T: ``analytic[name]`` over ``long_t`` as lines (the x-axis
    spans ``long_t``), ``measured[name]`` (compiled HLO) at ``lengths`` as hollow markers,
    log-log; ``crossover``: a dotted line at the T above which gathering sends more. The layer's
    bytes (``"state passing + halo (layer)"``, a few percent above the kernel's: the two lines
    would coincide) are drawn less the kernel's, its halo alone."""
    kernel, halo = "state passing (kernel)", "halo (the layer's bytes less the kernel's)"
    analytic, measured = ({**d, halo: np.subtract(d["state passing + halo (layer)"], d[kernel])}
                          for d in (analytic, measured))
    fig, ax = plt.subplots(figsize=(10, 3.8))
    handles, labels = [], []  # one entry a series: its line (analytic) and markers (measured)
    if crossover is not None:
        handles.append(ax.axvline(crossover, color="0.5", linestyle=":", linewidth=1.2))
        labels.append(f"T = {crossover:.1f}: gathering\nsends more above")
    for name, (color, line, marker) in _TRAFFIC_STYLES.items():
        handles.append((ax.plot(long_t, analytic[name], color=color, linestyle=line)[0],
                        ax.plot(lengths, measured[name], marker, color=color, markersize=7,
                                linestyle="none", markerfacecolor="none", markeredgewidth=1.6)[0]))
        labels.append(name.replace(" (the", "\n(the"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(long_t[0], long_t[-1])
    ax.set(title=title, xlabel="sequence length T (tokens, log scale)",
           ylabel="bytes sent per rank (log scale)")
    ax.title.set_fontsize(10)
    ax.legend(handles, labels, handler_map={tuple: mpl.legend_handler.HandlerTuple(ndivide=None)},
              title="line: analytic\nmarkers: compiled HLO", loc="upper left", fontsize=8,
              title_fontsize=8, bbox_to_anchor=(1.01, 1.0))  # beside: off the lines
    return fig


def layer_inputs(key, batch: int, seq_len: int, heads: int, key_dim: int, value_dim: int) -> dict:
    """``kda``'s q, k, v, g, beta ``[B, T, ...]`` (:func:`kda_lib.testing.random_kda_inputs`)
    with ``g`` from notebook 04's gate at the layer's initial ``a_log`` and ``dt_bias`` (keys
    from ``fold_in(key, 1)``): its slowest channels keep a state for hundreds of tokens, where
    ``random_kda_inputs``' own gate forgets it within tens (what enters a slice would not
    matter)."""
    import kda_lib
    from kda_lib.testing import random_kda_inputs

    raw = random_kda_inputs(key, batch, seq_len, heads, key_dim, value_dim, gate="raw")
    key_a, key_dt = jax.random.split(jax.random.fold_in(key, 1))  # one key per parameter
    g = kda_lib.kda_gate(raw["g"], kda_lib.init_a_log(key_a, heads),
                         kda_lib.init_dt_bias(key_dt, heads, key_dim))  # log decay <= 0
    return dict(q=raw["q"], k=raw["k"], v=raw["v"], g=g, beta=raw["beta"])


def context_parallel_on_one_device(inputs: dict, cotangent, *, ranks: int,
                                   implementation: str = "pallas_tpu") -> dict:
    """CP's algorithm where one device is all there is: the sequence in ``ranks`` slices under
    ``jax.vmap`` with the context axis named (``kda_context_parallel``'s all-gather runs over
    the mapped axis), each slice by ``implementation``, against one pass over the whole
    sequence. ``inputs``: ``kda``'s q, k, v, g, beta ``[B, T, ...]`` (T a multiple of
    ``ranks``); ``cotangent`` ``[B, T, HV, V]``. Returns ``{name: max |cp - one| / max |one|}``
    for the outputs ``o``, the final state and the gradients (``d<name>``) of ``<o, cotangent>
    + |state|^2``."""
    import kda_lib

    split = lambda x: jnp.moveaxis(x.reshape(x.shape[0], ranks, -1, *x.shape[2:]), 1, 0)  # noqa: E731
    merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])  # noqa: E731

    def whole(x):
        return kda_lib.kda(**x, output_final_state=True, implementation=implementation)

    def parallel(x):
        per_rank = lambda x: kda_context_parallel(**x, output_final_state=True,  # noqa: E731
                                                  implementation=implementation)  # fmt: skip
        o, s = jax.vmap(per_rank, axis_name="context")({n: split(a) for n, a in x.items()})
        return merge(o), s[0]

    def run(f, x):
        def loss(x):
            o, s = f(x)
            return jnp.sum(o.astype(jnp.float32) * cotangent) + jnp.sum(s * s), (o, s)

        (_, (o, s)), grads = jax.value_and_grad(loss, has_aux=True)(x)
        return {"o": o, "state": s, **{f"d{n}": g for n, g in grads.items()}}

    one, cp = jax.jit(lambda x: (run(whole, x), run(parallel, x)))(inputs)
    largest = lambda x: float(np.abs(np.asarray(x, np.float64)).max())  # noqa: E731
    return {n: largest(np.asarray(cp[n], np.float64) - one[n]) / largest(one[n]) for n in one}
