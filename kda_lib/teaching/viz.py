"""Small matplotlib helpers shared by the notebooks: one style, one palette, one way to show.

* :func:`setup_style` once per notebook; :data:`PALETTE` is the Okabe-Ito colour-blind-safe set.
  :data:`MODEL_COLORS` gives each model (``"kda"``, ``"attention"``, ...) one of its colours.
* :func:`show` displays a figure and, when the environment variable ``KDA_FIGURE_DIR`` is set,
  also saves it there as ``<name>.png`` (how figures are reviewed outside a browser).
* :func:`heatmap` draws a labelled matrix with a colour bar; :func:`signed_log_norm` is a colour
  scale on which a dominant diagonal and small off-diagonal weights are both visible.
* :func:`time_vs_length` draws live timings and recorded ones
  (:func:`kda_lib.lab.records.load_benchmark_runs`) in separate panels.
* :func:`draw_context_parallel` sketches a sequence split over devices: the conv halo each rank
  receives and the state summaries the ranks exchange.
* :func:`clearing_paths` draws notebook 06's path argument: the one route left from a token
  before ``p - (w - 1)`` once the states are emptied at ``p``.
* :func:`ablation_norms` draws notebook 04's ablation: every transition's ``||M_t||_2`` and a
  state carried by ``I - beta_t k_t k_t^T`` alone, per way of building the layer.
"""

from __future__ import annotations

import os
import pathlib
import re

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

# Okabe & Ito (2008), distinguishable under the common colour-vision deficiencies.
PALETTE = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "vermillion": "#D55E00",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}
CYCLE = [PALETTE[c] for c in ("blue", "orange", "green", "vermillion", "sky", "purple", "black")]
# one colour per model, the same in every notebook that draws it (06-10): KDA blue
MODEL_COLORS = {
    "kda": PALETTE["blue"],
    "gdn": PALETTE["orange"],
    "attention": PALETTE["green"],
    "attention_conv": PALETTE["vermillion"],
    "conv": PALETTE["sky"],
    "mamba2": PALETTE["purple"],
    "hybrid": PALETTE["black"],
    "hybrid_mha": PALETTE["purple"],
    "mha": PALETTE["green"],  # multi-head attention: "attention" above
    "gqa": PALETTE["sky"],
    "mla": PALETTE["vermillion"],
}
SEQUENTIAL_CMAP = "viridis"  # perceptually uniform, colour-blind safe
DIVERGING_CMAP = "PuOr_r"  # colour-blind safe, white at zero

FIGURE_DIR_ENV = "KDA_FIGURE_DIR"


def setup_style() -> None:
    """Notebook-width figures with readable fonts, light grids and the colour-blind palette."""
    mpl.rcParams.update(
        {
            "figure.figsize": (8.0, 3.6),
            "figure.dpi": 100,
            "savefig.dpi": 130,
            "figure.constrained_layout.use": True,
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 9,
            "legend.framealpha": 0.85,
            "axes.prop_cycle": mpl.cycler(color=CYCLE),
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "image.cmap": SEQUENTIAL_CMAP,
            "lines.linewidth": 1.8,
        }
    )


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "figure"


def show(fig: plt.Figure, name: str) -> None:
    """Display ``fig`` (inline in a notebook) and close it.

    When ``KDA_FIGURE_DIR`` is set, also save it there as ``<name>.png`` (for reviewing the
    figures of an executed notebook without a browser). Returns None, so a cell may end with it.
    """
    directory = os.environ.get(FIGURE_DIR_ENV)
    if directory:
        path = pathlib.Path(directory) / f"{_slug(name)}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    plt.show()
    plt.close(fig)


def heatmap(
    ax: plt.Axes,
    data,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    cbar_label: str,
    diverging: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str | None = None,
    extent=None,
    colorbar: bool = True,
    norm=None,
):
    """Draw ``data`` ``[rows, cols]`` on ``ax`` with a labelled colour bar; return the image.

    ``diverging=True`` centres a diverging map on zero (symmetric limits unless given).
    ``colorbar=False`` leaves the bar out (e.g. to draw one shared bar for several panels with
    ``fig.colorbar(image, ax=axes)``). ``norm``: a matplotlib norm (e.g. ``SymLogNorm``, to
    show entries of very different sizes on one scale); it replaces vmin/vmax.
    """
    data = np.asarray(data)
    if norm is not None:
        vmin = vmax = None
    elif diverging:
        bound = float(np.nanmax(np.abs(data))) or 1.0
        vmin = -bound if vmin is None else vmin
        vmax = bound if vmax is None else vmax
    image = ax.imshow(
        data,
        aspect="auto",
        interpolation="nearest",
        cmap=cmap or (DIVERGING_CMAP if diverging else SEQUENTIAL_CMAP),
        vmin=vmin,
        vmax=vmax,
        norm=norm,
        extent=extent,
        origin="upper",
    )
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(False)
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, shrink=0.9)
        bar.set_label(cbar_label)
        if isinstance(norm, mpl.colors.SymLogNorm):  # decades only, none inside the linear band
            top, low = np.log10(norm.vmax), np.log10(norm.linthresh)
            decades = 10.0 ** np.arange(np.floor(top), np.ceil(low), -1.0)
            bar.set_ticks(np.r_[-decades, 0.0, decades[::-1]])
    return image


def token_rows(ax: plt.Axes, inputs, targets, mask, *, vocab_size: int, title: str):
    """A task example as two heatmap rows, ``input`` over ``target``, each cell labelled with
    its token id; unscored targets (``mask`` False) are left blank. ``inputs``, ``targets``,
    ``mask``: ``[T]``. Returns the ``[2, T]`` grid drawn (NaN where blank)."""
    inputs, targets, mask = np.asarray(inputs), np.asarray(targets), np.asarray(mask)
    length = inputs.shape[0]
    grid = np.stack([inputs, np.where(mask, targets, -1)]).astype(float)
    grid[grid < 0] = np.nan
    heatmap(ax, grid, title=title, xlabel="position t (tokens)", ylabel="",
            cbar_label="token id", vmin=0, vmax=vocab_size - 1,
            extent=(-0.5, length - 0.5, 1.5, -0.5))  # fmt: skip
    ax.set_yticks([0, 1], ["input", "target"])
    for t in range(length):
        for row in (0, 1):
            if not np.isnan(grid[row, t]):
                ax.text(t, row, f"{int(grid[row, t])}", ha="center", va="center", fontsize=7,
                        color="white" if grid[row, t] < vocab_size / 2 else "black")  # fmt: skip
    return grid


def time_vs_length(
    lengths, live: dict, runs: list[dict], *, mode: str, live_title: str, names: dict | None = None
) -> plt.Figure:
    """Measured time against sequence length on log-log axes: live timings on the left, each
    recorded benchmark run (from :func:`kda_lib.lab.records.load_benchmark_runs`) in a panel of its
    own, so that runs of different sizes or machines are never read off one axis as if
    comparable.

    Args:
      lengths: the live sequence lengths; live: ``{name: [ms per length]}``.
      runs: recorded runs; their records with ``mode`` and an ``impl`` in ``names`` are drawn.
      names: recorded ``impl`` -> the label used for the live series (same colour); default: as is.
    """
    names = names or {}
    colours = {name: CYCLE[i % len(CYCLE)] for i, name in enumerate(live)}
    fig, axes = plt.subplots(1, 1 + len(runs), figsize=(7.4 * (1 + len(runs)), 3.8), squeeze=False)
    _time_panel(axes[0, 0], {n: (lengths, ms) for n, ms in live.items()}, colours, live_title)
    for ax, run in zip(axes[0, 1:], runs, strict=True):
        series = {}
        for r in run["records"]:
            if r["mode"] == mode and r["impl"] in names:
                series.setdefault(names[r["impl"]], {})[int(r["T"])] = float(r["median_ms"])
        series = {n: tuple(zip(*sorted(p.items()), strict=True)) for n, p in series.items()}
        for n in series:
            colours.setdefault(n, CYCLE[len(colours) % len(CYCLE)])
        _time_panel(ax, series, colours, f"{run['label']}\n{run['config'] or 'config ?'}")
    return fig


def _time_panel(ax, series: dict, colours: dict, title: str) -> None:
    every_t = sorted({t for ts, _ in series.values() for t in ts})
    few = len(every_t) < 3  # two lengths carry no slope: points only, no guides to read it by
    for i, (name, (ts, ms)) in enumerate(series.items()):  # hollow markers, each a shape and
        marker = "osD^v"[i % 5]  # size of its own, so that equal times show every series
        ax.loglog(ts, ms, marker if few else marker + "-", color=colours[name], label=name,
                  markersize=max(10 - 2 * i, 4), markerfacecolor="none", markeredgewidth=1.5)
    if every_t and not few:
        t_ref = np.array([every_t[0], every_t[-1]], float)
        base = 0.5 * min(min(ms) for _, ms in series.values())  # guides below the data
        ax.loglog(t_ref, base * t_ref / t_ref[0], color="0.6", lw=1, label="slope 1: O(T)")
        ax.loglog(
            t_ref, base * (t_ref / t_ref[0]) ** 2, color="0.6", lw=1, ls=":", label="slope 2: O(T²)"
        )
    if every_t:
        ax.set_xticks(every_t, [str(t) for t in every_t])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        low = ax.get_ylim()[0]  # down to a labelled 1-2-5 tick, so no point sits below them all
        decade = 10.0 ** np.floor(np.log10(low))
        ax.set_ylim(bottom=decade * max(m for m in (1, 2, 5) if m * decade <= low))
        ax.yaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1, 2, 5)))  # plain decimals
        ax.yaxis.set_major_formatter(mpl.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.set(title=title, xlabel="sequence length T (tokens)", ylabel="median time (ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # off the data


def draw_context_parallel(
    ranks: int, local_len: int, halo: int, *, shown_ranks: int = 4, drawn_tokens: int = 8
) -> plt.Figure:
    """Sketch of a sequence split over ``ranks`` devices, ``local_len`` tokens each.

    Top: the tokens of the first ``shown_ranks`` ranks (at most ``drawn_tokens`` boxes per rank,
    the label says how many there really are) and the ``halo`` tokens each receives from its
    predecessor (hatched; rank 0 receives zeros). Bottom: every rank summarises its slice as an
    affine map (M, E) of the state entering it, the ranks all-gather the summaries, and each
    folds those of the ranks before it into its true initial state.
    """
    shown, drawn = min(ranks, shown_ranks), min(local_len, drawn_tokens)
    colours = [CYCLE[r % len(CYCLE)] for r in range(shown)]
    fig, (ax_top, ax_bot) = plt.subplots(2, 1, figsize=(10, 5.6), height_ratios=[1.25, 1])
    _draw_halo(ax_top, shown, drawn, halo, colours)
    _draw_summaries(ax_bot, shown, drawn, colours)
    per_rank = f"{local_len} per rank" + (f", {drawn} of them drawn" if drawn < local_len else "")
    for ax in (ax_top, ax_bot):
        ax.set_xlim(-halo - 2.5, shown * drawn + 0.5)
        ax.set_yticks([])
        if drawn < local_len:  # positions on the axis would not be the tokens' positions
            ax.set_xticks([])
        ax.grid(False)
        ax.spines[["left"]].set_visible(False)
    ax_top.set_xlabel(f"token position (one box per token; {per_rank})")
    ax_bot.set_xticks([])  # a diagram of the exchange: no axis of its own
    ax_top.set_title(
        f"Conv halo: each rank receives the {halo} tokens before its slice "
        "(hatched) from its predecessor (ppermute)"
    )
    ax_bot.set_title(
        "State passing: slice summaries $S \\mapsto M S + E$ are all-gathered; "
        "every rank folds all $R$ of them and keeps $S^{(\\rho)}$"
    )
    return fig


def _draw_halo(ax, shown, drawn, halo, colours):
    box = dict(width=0.9, height=0.7)
    for r in range(shown):
        y, start = shown - 1 - r, r * drawn
        for t in range(start, start + drawn):
            ax.add_patch(mpl.patches.Rectangle((t, y + 0.15), color=colours[r], **box))
        for t in range(start - halo, start):
            style = (
                dict(fill=False, edgecolor="0.5", linestyle=":")
                if t < 0
                else dict(facecolor="white", edgecolor=colours[r - 1], hatch="///")
            )
            ax.add_patch(mpl.patches.Rectangle((t, y + 0.15), **box, **style))
        if r > 0:
            x = start - halo / 2
            ax.annotate(
                "",
                xy=(x, y + 0.85),
                xytext=(x, y + 1.15),
                arrowprops=dict(arrowstyle="->", color="0.2", lw=1.4),
            )
        ax.text(
            start + drawn / 2,
            y + 0.5,
            f"rank {r}",
            ha="center",
            va="center",
            color="white",
            fontsize=9,
            fontweight="bold",
        )
    ax.text(-halo - 0.2, shown - 0.5, "zeros", ha="right", va="center", fontsize=8, color="0.4")
    ax.set_ylim(-0.1, shown + 0.1)


def _draw_summaries(ax, shown, drawn, colours):
    for r in range(shown):
        x0, middle = r * drawn, r * drawn + drawn / 2
        ax.add_patch(
            mpl.patches.FancyBboxPatch(
                (x0 + 0.3, 1.3), drawn - 0.6, 1.0, boxstyle="round,pad=0.1", color=colours[r]
            )
        )
        ax.text(
            middle,
            1.8,
            f"rank {r}: $(M^{{({r})}}, E^{{({r})}})$",
            ha="center",
            va="center",
            color="white",
            fontsize=9,
            fontweight="bold",
        )
        ax.annotate(
            "",
            xy=(middle, 0.75),
            xytext=(middle, 1.25),
            arrowprops=dict(arrowstyle="<->", color="0.2", lw=1.2),
        )
        entering = "0" if r == 0 else f"M^{{({r - 1})}} S^{{({r - 1})}} + E^{{({r - 1})}}"
        ax.text(middle, 2.7, f"$S^{{({r})}} = {entering}$", ha="center", va="center", fontsize=8)
    ax.add_patch(mpl.patches.Rectangle((0.3, 0.25), shown * drawn - 0.6, 0.5, color="0.85"))
    ax.text(
        shown * drawn / 2,
        0.5,
        "all_gather of the summaries: $R \\times (d_k \\times d_k + d_k \\times d_v)$ floats per "
        "sequence and head, independent of $T$",
        ha="center",
        va="center",
        fontsize=9,
    )
    ax.set_ylim(0, 3.1)


def signed_log_norm(data, *, decades: float = 3.0) -> mpl.colors.SymLogNorm:
    """A symmetric log colour scale for signed ``data``: linear within ``decades`` decades below
    its largest magnitude, logarithmic above, so that entries from the largest down to that
    floor are all visible (a delta-rule mixing matrix's diagonal and its small corrections)."""
    bound = float(np.nanmax(np.abs(np.asarray(data)))) or 1.0
    return mpl.colors.SymLogNorm(linthresh=bound * 10.0**-decades, vmin=-bound, vmax=bound)


def mixing_heatmap(ax, mixing, *, title: str) -> None:
    """A causal mixing matrix ``mixing [T, T]`` on ``ax``: signed, symmetric log colours
    (:func:`signed_log_norm`), the entries above the diagonal (s > t) dark grey."""
    heatmap(
        ax,
        mixing,
        title=title,
        xlabel="source token s",
        ylabel="output token t",
        cbar_label=r"$\Omega_{ts}$ (symmetric log; dark grey: s > t)",
        diverging=True,
        norm=signed_log_norm(mixing),
    )
    upper = np.where(np.triu(np.ones_like(mixing), 1) > 0, 1.0, np.nan)
    grey = mpl.colors.ListedColormap(["0.3"])
    ax.imshow(upper, aspect="auto", interpolation="nearest", cmap=grey)


def chunk_dataflow(num_chunks: int, chunk_size: int, *, shown_chunks: int = 4) -> plt.Figure:
    """Dataflow of the chunked form (notebook 03), for the first ``shown_chunks`` chunks.

    Each chunk's ``C x C`` triangle, labelled "intra-chunk products, no state" (the decayed
    scores ``P``, the key overlaps ``L`` and ``(I + L)^-1``), is computed for every chunk at
    once; they give the chunk's ``K~``, ``V~``, ``P`` (notebook 03's symbols). Only the state
    travels between chunks (arrows, ``S_[i]`` entering chunk ``i``): each step corrects the
    values (``V~ - K~ S``), reads the outputs and updates the state (``Q_in``, ``K_out``: the
    code's names of the text's decayed queries and keys, no accents to float off the line).
    """
    shown = min(num_chunks, shown_chunks)
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    for i in range(shown):
        _draw_chunk(ax, i)
    end = 1.2 + 3.0 * shown
    ax.annotate("", xy=(end + 0.05, 1.05), xytext=(end - 0.85, 1.05),
                arrowprops=dict(arrowstyle="->", color="black", lw=2))
    more = f" ... {num_chunks} chunks" if num_chunks > shown else ""
    ax.text(end + 0.1, 1.05, f"$S_{{[{shown}]}}${more}", va="center", fontsize=9)
    ax.text(0.1, 3.6, "parallel\nover\nchunks", fontsize=8, va="center", color="0.3")
    steps = "1 step" if num_chunks == 1 else f"{num_chunks} steps, one per chunk"
    ax.text(0.1, 0.05, f"sequential: {steps}", fontsize=8,
            color="0.3")
    ax.set_xlim(0, end + 2.4)
    ax.set_ylim(-0.1, 4.9)
    ax.axis("off")
    ax.set_title(f"Chunked KDA, C = {chunk_size}: triangular blocks in parallel, "
                 "the state between chunks")
    return fig


def wy_factors(gap, keys_t_src, k0_tilde) -> plt.Figure:
    """Notebook 03's WY form: ``I - product`` (``d_k x d_k``, its rank in its title) next to its
    thin factors ``K^T`` (``d_k x C``, from ``keys_t_src``, ``[C, d_k]``) and ``K~^0`` (``C x
    d_k``, no decay; the WY literature's ``W``). Square cells (the first panel 2.4 inches square),
    placed by hand (a layout engine leaves gaps beside fixed-aspect axes); each panel its own
    symmetric scale, its bar against it (the product's entries are smaller than the factors');
    the suptitle at the panels' title size, as the other figures of 03."""
    d_k, c = gap.shape[0], k0_tilde.shape[0]
    cell, mats = 2.4 / d_k, (gap, keys_t_src.T, k0_tilde)
    titles = (f"I - product of {c} factors: rank {np.linalg.matrix_rank(gap)}",
              f"$K^\\top$ (${d_k} \\times {c}$)", f"$\\tilde K^0$ (${c} \\times {d_k}$)")
    left, bar, right, bottom, top = 0.6, 0.12, 0.75, 0.55, 0.75  # inches around each panel
    width = sum(left + m.shape[1] * cell + 0.08 + bar + right for m in mats)
    height = bottom + d_k * cell + top
    # no layout engine (a placeholder: "none" comes back as the rc's constrained after a savefig)
    engine = mpl.layout_engine.PlaceHolderLayoutEngine(adjust_compatible=True,
                                                      colorbar_gridspec=False)
    fig, x = plt.figure(figsize=(width, height), layout=engine), left
    for mat, title in zip(mats, titles, strict=True):
        w, h = mat.shape[1] * cell, mat.shape[0] * cell
        y = bottom + (d_k * cell - h) / 2  # centred on the tallest panel
        ax = fig.add_axes((x / width, y / height, w / width, h / height))
        image = heatmap(ax, mat, diverging=True, title=title, xlabel="column", ylabel="row",
                        cbar_label="entry", colorbar=False)
        cax = fig.add_axes(((x + w + 0.08) / width, y / height, bar / width, h / height))
        fig.colorbar(image, cax=cax, label="entry")
        x += left + w + 0.08 + bar + right
    fig.suptitle(f"$I - (I - \\beta_{{{c}}} k_{{{c}}} k_{{{c}}}^\\top) \\cdots (I - \\beta_1 "
                 f"k_1 k_1^\\top) = K^\\top \\tilde K^0$: the first {c} tokens (< $d_k$ = {d_k}), "
                 "each panel its own scale", fontsize=mpl.rcParams["axes.titlesize"],
                 y=1 - 0.12 / height, va="top")
    return fig


def scan_rounds(scan_maps: int) -> plt.Figure:
    """The compositions in each round of ``lax.associative_scan`` over ``scan_maps`` maps
    (:func:`kda_lib.lab.costs.associative_scan_rounds`)."""
    from kda_lib.lab.costs import associative_scan_rounds

    rounds = associative_scan_rounds(scan_maps)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(np.arange(1, len(rounds) + 1), rounds, color=PALETTE["blue"])
    ax.set(xlabel="round of lax.associative_scan", ylabel="compositions (independent)",
           xticks=np.arange(1, len(rounds) + 1))
    ax.yaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    ax.set_title(f"associative scan over {scan_maps} maps: {len(rounds)} rounds, "
                 f"{sum(rounds)} compositions", fontsize=10)
    return fig


def _draw_chunk(ax, i: int) -> None:
    """Chunk ``i`` of :func:`chunk_dataflow`: its triangle, the arrow to ``K~, V~, P`` and the
    box of the three lines with the state."""
    x = 1.2 + 3.0 * i
    colour = CYCLE[i % len(CYCLE)]
    ax.add_patch(mpl.patches.Polygon([(x, 2.6), (x, 4.6), (x + 2.0, 2.6)], color=colour,
                                     alpha=0.75, lw=0))
    ax.text(x + 2.0, 4.4, f"chunk {i}\nintra-chunk\nproducts,\nno state", fontsize=7.5, ha="right",
            va="top")
    ax.annotate("", xy=(x + 1.0, 1.75), xytext=(x + 1.0, 2.55),
                arrowprops=dict(arrowstyle="->", color="0.3", lw=1.2))
    ax.text(x + 1.1, 2.15, r"$\tilde K, \tilde V, P$", fontsize=8, va="center")
    ax.add_patch(mpl.patches.FancyBboxPatch((x - 0.1, 0.4), 2.2, 1.3,
                                            boxstyle="round,pad=0.05", color=colour))
    update = ("$\\Delta = \\tilde V - \\tilde K S$\n"  # the code's Q_in, K_out: the text's arrows
              "$O = Q_{\\rm in} S / \\sqrt{d_k} + P \\Delta$\n"
              "$S \\leftarrow \\Gamma_C S + K_{\\rm out}^\\top \\Delta$")
    ax.text(x + 1.0, 1.05, update, ha="center", va="center", fontsize=8, color="white",
            linespacing=1.7)
    ax.annotate("", xy=(x - 0.1, 1.05), xytext=(x - 0.9, 1.05),
                arrowprops=dict(arrowstyle="->", color="black", lw=2))
    ax.text(x - 0.5, 1.25, f"$S_{{[{i}]}}$", ha="center", fontsize=9)


def ablation_norms(runs: list[dict]) -> plt.Figure:
    """Notebook 04's ablation, one column per way (the keys of each ``runs`` entry), every head a
    series: on top ``||M_t||_2`` at every token (above 1: the transition expands the state),
    below ``||S_t||_F / ||S_0||_F`` for a state carried by ``I - beta_t k_t k_t^T`` alone (no
    write, no decay: above 1 only through an eigenvalue outside ``[-1, 1]``), with the count of
    heads whose state rises above ``S_0``. ``runs``: ``{way: (||M_t||_2 [T], ||S_t||_F /
    ||S_0||_F [T])}`` per head."""
    ways = list(runs[0])
    fig, axes = plt.subplots(2, len(ways), figsize=(3.7 * len(ways), 5.8), sharex=True)
    t = np.arange(1, len(runs[0][ways[0]][0]) + 1)
    norms = {w: np.array([r[w][0] for r in runs]) for w in ways}  # [heads, T] each
    kept = {w: np.array([r[w][1] for r in runs]) for w in ways}
    span = (min(map(np.min, kept.values())) / 1.5, max(map(np.max, kept.values())) * 1.5)
    for col, way in enumerate(ways):
        top, bottom = axes[0, col], axes[1, col]
        for row in norms[way]:
            top.plot(t, row, ".", ms=3, alpha=0.6)
        top.axhline(1, color="black", ls="--", lw=1)
        top.set(title=f"{way}\n{np.mean(norms[way] > 1 + 1e-6):.0%} of all $M_t$ expand",
                ylim=(0, 1.05 * max(max(map(np.max, norms.values())), 1.2)))
        bottom.plot(t, kept[way].T, lw=0.8)
        bottom.axhline(1, color="black", ls="--", lw=1)
        bottom.set(xlabel="token t", yscale="log", ylim=span)
        above = int(np.sum(kept[way].max(axis=1) > 1))
        bottom.text(0.03, 0.95, f"above $\\|S_0\\|_F$: {above} of {len(runs)} heads",
                    transform=bottom.transAxes, va="top", fontsize=9)
    axes[0, 0].set(ylabel=r"$\|M_t\|_2$ (above 1: expands)")
    axes[1, 0].set(ylabel="$\\|S_t\\|_F / \\|S_0\\|_F$, log scale\n(no write, no decay)")
    fig.suptitle(f"Every head ({len(runs)}): the transitions $M_t$ (top); a random state $S_0$ "
                 r"through $I - \beta_t \mathbf{k}_t \mathbf{k}_t^\top$ alone (bottom)")
    return fig


def clearing_paths(p: int, conv_size: int, delay: int, seq_len: int) -> plt.Figure:
    """Notebook 06, section 4: the one path left from a token ``s`` before ``p - (w - 1)``
    (``p - w``, or the last whose copy is still in the sequence) to ``t = s + delay`` after every
    state of the two-layer stack is emptied at ``p``, the conv histories kept. Rows: the tokens
    (layer 0's input), the stream after layer 0 (layer 1's input), after layer 1. Boxed: each
    layer's kept conv history, positions ``p - w + 1 .. p - 1``. Arrows: (1) layer 0 reads ``s``
    before ``p`` into its outputs there, (2) layer 1's conv at ``p .. j + w - 1`` reads each kept
    ``j`` (faint for ``j < p - 1``), (3) layer 1's new state carries them on to ``t``."""
    halo, path = conv_size - 1, PALETTE["vermillion"]
    s = max(min(p - conv_size, seq_len - 1 - delay), 0)
    t = s + delay
    x1 = max(t, p + halo) + 2.5
    x0 = s - max(3.5, (x1 - s) / 4)  # room for the labels left of s
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for row in range(3):
        ax.plot(np.arange(int(x0) + 1, int(x1) + 1), np.full(int(x1) - int(x0), row), "o",
                color="0.8", ms=4, zorder=1)
    ax.axvline(p - 0.5, color="0.2", lw=1)
    ax.text(p - 0.35, 2.65, "p: every state emptied", fontsize=8, va="center")
    for row, colour, label, x, y in (
            (0, PALETTE["orange"], "layer 0's kept history (tokens)", p - 0.75, -0.45),
            (1, PALETTE["sky"], "layer 1's kept history\n(emptied in the second run)",
             p - halo - 0.45, 1.25)):
        ax.add_patch(mpl.patches.FancyBboxPatch(
            (p - halo - 0.35, row - 0.2), halo - 0.3, 0.4, boxstyle="round,pad=0.05",
            facecolor=colour, alpha=0.35, edgecolor=colour, zorder=2))
        ax.text(x, y, label, fontsize=8, ha="right", va="bottom" if row else "top",
                color="0.25", multialignment="center")
    arrow = dict(arrowstyle="->", color=path, lw=1.8, shrinkA=4, shrinkB=4)
    for j in range(p - halo, p):  # (1) layer 0 reads s into its outputs at p - w + 1 .. p - 1
        ax.annotate("", xy=(j, 1), xytext=(s, 0), arrowprops=dict(
            arrow, connectionstyle="arc3,rad=-0.2", alpha=1 if j == p - 1 else 0.5))
    ax.text(s - 0.3, 0.55, "(1) layer 0 reads s\nbefore p", fontsize=8, color=path, ha="right")
    for j in range(p - halo, p):  # (2) layer 1's conv at p .. j + w - 1 reads its kept j
        for q in range(p, j + conv_size):
            ax.annotate("", xy=(q, 2), xytext=(j, 1), arrowprops=dict(
                arrow, alpha=0.75 if j == p - 1 else 0.3, lw=1.8 if j == p - 1 else 1.2))
    ax.text(p + halo - 0.5, 1.1, "(2) layer 1's conv reads\nits kept history", fontsize=8,
            color=path)
    if t > p + halo - 1:  # (3) layer 1's new state carries it on
        ax.annotate("", xy=(t, 2), xytext=(p + halo - 1, 2), arrowprops=arrow)
        ax.text((p + halo - 1 + t) / 2, 2.2, "(3) layer 1's\nnew state", fontsize=8, color=path,
                ha="center")
    ax.plot([s], [0], "o", color=path, ms=8, zorder=3)
    ax.plot([t], [2], "*", color=path, ms=14, zorder=3)
    ax.text(s, -0.25, f"s = {s}", ha="center", va="top", fontsize=8, color=path)
    ax.text(t + 0.3, 2.08, f"t = s + ℓ = {t}", fontsize=8, color=path, va="bottom")
    ax.set(xlim=(x0, x1), ylim=(-0.8, 2.85), xlabel="position", yticks=[0, 1, 2],
           title=f"States emptied at p = {p} (w = {conv_size}): the one path left to a token "
           f"s < p - (w - 1) = {p - halo}")
    ax.set_yticklabels(["tokens", "after layer 0\n(layer 1's input)", "after layer 1"])
    ax.grid(False)
    return fig


def one_step(state, q, k, v, g, beta) -> tuple[plt.Figure, np.ndarray]:
    """Notebook 00's picture of one KDA step on one head's state ``[K, V]`` (``q, k, g``: ``[K]``,
    ``v``: ``[V]``, ``beta`` a number): top, the state after each move (decay the rows by
    ``e^g``, erase along ``k``, write ``beta k v^T``); below, what each move changed; under the
    new state, the read ``S_t^T q / sqrt(K)``. Returns the figure and the new state."""
    state, q, k, v, g = (np.asarray(a, np.float64) for a in (state, q, k, v, g))
    decayed = np.exp(g)[:, None] * state
    erased = decayed - beta * np.outer(k, k @ decayed)
    written = erased + beta * np.outer(k, v)
    tops = [(state, "$S_{t-1}$"),
            (decayed, r"1. decay each row: $\mathrm{diag}(e^{\mathbf{g}_t})\,\cdot$"),
            (erased, r"2. erase along $\mathbf{k}_t$: $(I - \beta_t \mathbf{k}_t "
                     r"\mathbf{k}_t^\top)\,\cdot$"),
            (written, r"3. write $+\,\beta_t \mathbf{k}_t \mathbf{v}_t^\top$: $S_t$")]
    fig, axes = plt.subplots(3, 4, figsize=(13, 5.6), height_ratios=[1, 1, 0.16],
                             layout="constrained")
    changes = [b - a for (a, _), (b, _) in zip(tops, tops[1:], strict=False)]
    # one scale over all four states (a zero S_{t-1}, the first token, has none of its own)
    lim = max(np.abs(panel).max() for panel, _ in tops) or 1.0
    dlim = max(np.abs(c).max() for c in changes) or 1.0
    for i, (panel, title) in enumerate(tops):
        top = heatmap(axes[0, i], panel, title=title, xlabel="",
                      ylabel="key channel (K)" * (i == 0), cbar_label="",
                      vmin=-lim, vmax=lim, diverging=True, colorbar=False)
    for i, change in enumerate(changes, start=1):
        low = heatmap(axes[1, i], change, title="what it changed", xlabel="value channel (V)",
                      ylabel="", cbar_label="", vmin=-dlim, vmax=dlim, diverging=True,
                      colorbar=False)
    axes[1, 0].axis("off")
    axes[1, 0].text(0.5, 0.5, "top: the state after each move\n\nbottom: what the move changed"
                    "\n(its own colour scale)", ha="center", va="center", fontsize=10)
    fig.colorbar(top, ax=axes[0], shrink=0.9, label="state entry")
    fig.colorbar(low, ax=axes[1], shrink=0.9, label="change")
    read = written.T @ q / np.sqrt(len(q))
    heatmap(axes[2, 3], read[None], title=r"4. read $\mathbf{o}_t = S_t^\top \mathbf{q}_t "
            r"/ \sqrt{d_k}$ (own scale)", xlabel="value channel (V)", ylabel="", cbar_label="",
            diverging=True, colorbar=False)
    axes[2, 3].set_yticks([])
    for ax in axes[2, :3]:
        ax.axis("off")
    return fig, written
