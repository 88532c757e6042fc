"""Small matplotlib helpers shared by the notebooks: one style, one palette, one way to show.

* :func:`setup_style` once per notebook; :data:`PALETTE` is the Okabe-Ito colour-blind-safe set.
* :func:`show` displays a figure and, when the environment variable ``KDA_FIGURE_DIR`` is set,
  also saves it there as ``<name>.png`` (how figures are reviewed outside a browser).
* :func:`heatmap` draws a labelled matrix with a colour bar.
* :func:`kda_mixing_matrix` is the implicit ``T x T`` attention matrix of one KDA head.
* :func:`load_benchmark_runs` reads recorded timings from ``data/benchmarks/*.json`` defensively.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

from kda_lib.reference import kda_recurrent

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
):
    """Draw ``data`` ``[rows, cols]`` on ``ax`` with a labelled colour bar; return the image.

    ``diverging=True`` centres a diverging map on zero (symmetric limits unless given).
    ``colorbar=False`` leaves the bar out (e.g. to draw one shared bar for several panels with
    ``fig.colorbar(image, ax=axes)``).
    """
    data = np.asarray(data)
    if diverging:
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


def kda_mixing_matrix(q, k, g, beta, *, scale: float | None = None) -> jax.Array:
    """The implicit ``[T, T]`` mixing matrix ``A`` of one KDA head: ``o = A @ v``.

    For fixed ``q, k, g, beta`` the output is linear in ``v`` and every value channel goes
    through the same map, so feeding one-hot values (``v = I_T``, one channel per token) reads
    ``A`` off the outputs: ``A[t, s]`` is how much ``v_s`` contributes to ``o_t``. It is lower
    triangular (causal) and, unlike softmax attention, can be negative (the delta rule subtracts).

    Args:
      q, k, g: ``[T, K]`` for one head; beta: ``[T]``.
    Returns:
      ``A`` ``[T, T]`` in the accumulation dtype (float32, or float64 under x64).
    """
    seq_len = q.shape[0]
    eye = jnp.eye(seq_len, dtype=jnp.result_type(q.dtype, jnp.float32))
    o, _ = kda_recurrent(
        q[None, :, None],
        k[None, :, None],
        eye[None, :, None],
        g[None, :, None],
        beta[None, :, None],
        scale=scale,
    )
    return o[0, :, 0, :]


def softmax_attention_matrix(q, k, *, scale: float | None = None) -> jax.Array:
    """Causal softmax attention weights ``[T, T]`` for one head (q, k ``[T, K]``)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = scale * q @ k.T
    causal = jnp.tril(jnp.ones(scores.shape, bool))
    return jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)


def load_benchmark_runs(directory) -> tuple[list[dict], list[str]]:
    """Recorded benchmark runs from ``directory/*.json``, as written by ``python -m kda_lib.bench``.

    Accepts files with a top-level ``"platform"`` (optionally ``"device"``) and a list of records
    (under ``"records"``, ``"results"``, ..., or a bare list), each record holding at least
    ``impl``, ``T``, ``mode`` and ``median_ms``. Anything else is skipped, not raised.

    Returns:
      ``(runs, notes)``: runs are ``{"label", "file", "config", "records"}`` dicts (label like
      ``"recorded: gpu NVIDIA H200"``, config like ``"B=1, H=16, K=128, V=128, bfloat16"`` when
      the file says, records keep only usable entries); notes say what was skipped and why.
    """
    runs, notes = [], []
    directory = pathlib.Path(directory)
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        notes.append(f"no recorded benchmarks in {directory}/")
    for path in files:
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            notes.append(f"{path.name}: unreadable ({e})")
            continue
        meta = payload if isinstance(payload, dict) else {}
        records = payload if isinstance(payload, list) else None
        for key in ("records", "results", "rows", "benchmarks"):
            if records is None and isinstance(meta.get(key), list):
                records = meta[key]
        if records is None:  # any other list of dicts at the top level
            records = next(
                (v for v in meta.values() if isinstance(v, list) and v and isinstance(v[0], dict)),
                None,
            )
        if records is None:
            notes.append(f"{path.name}: no list of records found; skipped")
            continue
        usable = [
            r
            for r in records
            if isinstance(r, dict)
            and {"impl", "T", "mode", "median_ms"} <= r.keys()
            and isinstance(r["median_ms"], (int, float))
            and isinstance(r["T"], (int, float))
        ]
        if not usable:
            notes.append(f"{path.name}: no record with impl, T, mode and median_ms; skipped")
            continue
        platform = str(meta.get("platform", "unknown platform"))
        device = meta.get("device") or meta.get("device_kind")
        label = f"recorded: {platform}" + (f" {device}" if device and device != platform else "")
        config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
        shape = ", ".join(
            f"{short}={config[key]}"
            for key, short in (("batch", "B"), ("heads", "H"), ("key_dim", "K"), ("value_dim", "V"))
            if key in config
        )
        if config.get("dtype"):
            shape += f", {config['dtype']}"
        runs.append({"label": label, "file": path.name, "config": shape, "records": usable})
        if len(usable) < len(records):
            notes.append(
                f"{path.name}: {len(records) - len(usable)} records without impl, T, mode and a "
                "numeric median_ms (failed or skipped runs) left out"
            )
    return runs, notes
