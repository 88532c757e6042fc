"""Notebook 02's figures of the forget gate, its gate explorer, and the notes' mixing matrices.

* :func:`plot_half_lives`, :func:`plot_cumulative_decay`: the half-lives at initialisation and
  the retention over a sequence, one row per channel (section 3's figure: an initialised KDA
  head beside a scalar gate; the explorer's).
* The explorer: :func:`view` recomputes one head's cumulative decay for one shared ``A_log``,
  ``dt_bias`` and floor (the raw gate input still varies by channel and token), channels sorted
  by the token at which each first keeps half; :func:`explore` draws it at the defaults and,
  with ``interactive=True`` and ipywidgets installed, adds sliders (ranges that hold the
  defaults) that redraw it.
* :func:`plot_mixing_matrices`: a head as a ``T x T`` mixing of the values beside softmax (the
  notes' figure: ``docs/NOTEBOOK_NOTES.md``, notebook 02).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from kda_lib.ops.gating import kda_gate
from kda_lib.teaching import viz


def plot_gate_functions(x, gate_curve, lower_bound: float) -> plt.Figure:
    """Notebook 02's section 2: the softplus gate (left) and the safe gate (right) as log decay
    ``g`` over the raw inputs ``x``, for rates a = 1, 4, 16 (safe: two floors) and a bias of +2;
    ``gate_curve(a_log, bound=None, bias=0.0)`` gives g on ``x`` for one head and channel."""
    fig, (ax_sp, ax_safe) = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    for a in (1.0, 4.0, 16.0):
        ax_sp.plot(x, gate_curve(np.log(a)), label=f"$a_h = {a:g}$")
    ax_sp.plot(x, gate_curve(0.0, bias=2.0), linestyle="--", label="$a_h = 1$, $b_c = +2$")
    ax_sp.set_ylim(-20, 1)
    ax_sp.set_title(r"Softplus gate  $g = -a_h\,\mathrm{softplus}(f_c + b_c)$")
    for bound, a in ((lower_bound, 1.0), (lower_bound, 4.0), (lower_bound / 5, 1.0)):
        ax_safe.plot(
            x, gate_curve(np.log(a), bound), label=f"$g_{{\\min}} = {bound:g}$, $a_h = {a:g}$"
        )
    ax_safe.plot(
        x,
        gate_curve(0.0, lower_bound, bias=2.0),
        linestyle="--",
        label=f"$g_{{\\min}} = {lower_bound:g}$, $a_h = 1$, $b_c = +2$",
    )
    ax_safe.axhline(lower_bound, color="0.4", linewidth=1, linestyle=":")
    ax_safe.set_title(r"Safe gate  $g = g_{\min}\,\sigma(a_h (f_c + b_c))$")
    for ax in (ax_sp, ax_safe):
        ax.set(
            xlabel="raw gate input $f_c$ of channel $c$ (bias $b_c = 0$ unless stated)",
            ylabel="log decay per token $g$",
        )
        ax.legend(loc="lower left", fontsize=8)
    return fig


def plot_mixing_matrices(Omega, Omega_soft, same, *, temperature: float, title: str) -> plt.Figure:
    """The notes' figure: the KDA mixing matrix ``Omega [T, T]`` (signed, symmetric log), the
    causal softmax weights ``Omega_soft [T, T]`` (log, below 1e-3 blank) and their last rows
    (linear), the last token's earlier occurrences ``same`` (indices) circled."""
    t_last = Omega.shape[0] - 1
    fig, (ax_kda, ax_soft, ax_row) = plt.subplots(1, 3, figsize=(15, 4.2))
    viz.mixing_heatmap(ax_kda, Omega, title=r"KDA head: $o = \Omega v$ (signed)")
    viz.heatmap(
        ax_soft,
        np.where(Omega_soft >= 1e-3, Omega_soft, np.nan),
        xlabel="source token s",
        title=f"Causal softmax attention, temperature {temperature:g}",
        ylabel="output token t",
        cbar_label="weight (log; white: below 1e-3, or s > t)",
        norm=plt.matplotlib.colors.LogNorm(vmin=1e-3, vmax=1.0),
    )
    fig.suptitle(title)
    for ax in (ax_kda, ax_soft):  # the last token's row: its earlier occurrences circled
        ax.plot(same, np.full(same.size, t_last), "o", mfc="none", mec="black", ms=7, clip_on=False)
    for row, name in ((Omega, r"KDA $\Omega_{ts}$"), (Omega_soft, "softmax weight")):  # s < t
        ax_row.plot(
            row[t_last, :t_last], "o-", lw=0.8, mfc="none", markevery=list(same), label=name
        )
    ax_row.set(xlabel="source token s", ylabel="weight", title=f"Row t = {t_last} (s < t), linear")
    ax_row.legend(fontsize=8)
    return fig


def plot_half_lives(lives: dict, bounds, *, title: str) -> plt.Figure:
    """Histograms (log scale) of the half-lives ``lives[label]`` (tokens), with the range
    ``bounds = (shortest, longest)`` the softplus gate can draw at initialisation."""
    fig, ax = plt.subplots(figsize=(8, 3.4))
    bins = np.geomspace(0.2, 2e3, 41)
    for (label, life), style in zip(lives.items(), ("-", "--"), strict=False):
        ax.hist(
            np.ravel(life), bins=bins, histtype="step", linewidth=2, linestyle=style, label=label
        )
    for bound_life in bounds:
        ax.axvline(bound_life, color="0.5", linewidth=1, linestyle=":")
    ax.annotate(
        "softplus range at init",
        (bounds[0], 0.97),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        va="top",
        fontsize=9,
        color="0.3",
    )
    ax.set_xscale("log")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(0, 1.35 * ax.get_ylim()[1])  # room for the legend
    ax.set(title=title, xlabel="half-life $t_{1/2}$ (tokens, log scale)", ylabel="channels")
    ax.legend(loc="upper right")
    return fig


def plot_cumulative_decay(panels, *, floor: float, title: str,
                          order: str = "longest memory on top") -> plt.Figure:
    """One heatmap per ``(title, g [T, K], memory [K])`` of ``panels``: log10 of the fraction
    each channel keeps since token 0, one row per channel, the largest ``memory`` (a half-life,
    a halving token) on top, among equal ones the channel keeping more at the last token; a
    white dot where each row first keeps half or less."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4 + 4 * len(panels), 3.8), sharey=True,
                             squeeze=False)
    for n, (ax, (panel_title, g_head, memory)) in enumerate(zip(axes[0], panels, strict=True)):
        g_head = np.asarray(g_head, np.float64)
        rows = np.lexsort((g_head.sum(axis=0), np.asarray(memory, np.float64)))[::-1]
        kept = np.cumsum(g_head[:, rows], axis=0).T  # [K, T]: log of the fraction kept
        key_dim, seq_len = kept.shape
        image = viz.heatmap(
            ax,
            np.maximum(kept / np.log(10), floor),
            title=panel_title,
            xlabel="tokens since the write",
            ylabel=f"channel ({order})" if n == 0 else "",
            cbar_label="",
            vmin=floor,
            vmax=0.0,
            colorbar=False,
            extent=(0.5, seq_len + 0.5, key_dim - 0.5, -0.5),
        )
        halved = kept <= -np.log(2.0)
        where = np.flatnonzero(halved.any(axis=1))
        ax.plot(halved[where].argmax(axis=1) + 1, where, "o", color="white", ms=1.5)
    fig.colorbar(image, ax=list(axes[0]), shrink=0.9, extend="min",
                 label="log10 fraction retained (dot: half)")
    fig.suptitle(title)
    return fig


def measure(f_head, *, a_log=0.0, dt_bias_value=-3.0, bound=-5.0, gate="safe") -> dict:
    """What :func:`view` shows of one head (``f_head [1, T, 1, K]``, one ``A_log`` and one
    ``dt_bias`` for every channel), as numbers: ``g [T, K]``; ``rate_at_zero``, the rate ``-g``
    at ``f = 0``, and ``mean_rate``, its mean over the inputs; ``half_life_at_zero``, ``ln 2 /
    rate_at_zero``; ``halved [K]``, the first token at which each channel keeps 1/2 or less (inf
    where it never does), and ``measured``, their median (inf where at most half reach it)."""
    key_dim = f_head.shape[-1]
    lower_bound = bound if gate == "safe" else None
    g = np.asarray(kda_gate(f_head, jnp.array([a_log], jnp.float32), jnp.full(
        (key_dim,), dt_bias_value, jnp.float32), lower_bound=lower_bound)[0, :, 0], np.float64)
    assert np.isfinite(g).all()
    g_zero = float(kda_gate(jnp.zeros((1, 1, 1, 1)), jnp.array([a_log], jnp.float32), jnp.array(
        [dt_bias_value], jnp.float32), lower_bound=lower_bound)[0, 0, 0, 0])
    halved = np.cumsum(g, axis=0) <= -np.log(2.0)  # [T, K]: the channel keeps 1/2 or less
    first = np.where(halved.any(axis=0), halved.argmax(axis=0) + 1.0, np.inf)  # tokens
    return dict(g=g, rate_at_zero=-g_zero, mean_rate=float(-g.mean()),
                half_life_at_zero=float(np.log(2.0) / max(-g_zero, 1e-30)), halved=first,
                measured=float(np.median(first)))


def view(f_head, *, a_log=0.0, dt_bias_value=-3.0, bound=-5.0, gate="safe", floor=-6.0) -> None:
    """Show what one head keeps of each channel over the tokens: ``f_head [1, T, 1, K]``, the
    raw gate input; ``gate``: ``"safe"`` (floor ``bound``) or ``"softplus"``; one ``A_log``
    and one ``dt_bias`` for every channel (``f`` still varies by channel and token). The title:
    ``a_h = exp(A_log)``, the half-life at ``f = 0`` and the measured median halving token
    (:func:`measure`)."""
    seen = measure(f_head, a_log=a_log, dt_bias_value=dt_bias_value, bound=bound, gate=gate)
    g, measured, life = seen["g"], seen["measured"], seen["half_life_at_zero"]
    detail = f", $g_{{\\min}}$ {bound:g}" if gate == "safe" else ""
    title = (f"{gate} gate: $a_h$ {np.exp(a_log):.3g} (A_log {a_log:g}), $b_c$ {dt_bias_value:g}"
             f"{detail}\nhalf-life at $f = 0$: {life:.3g} tokens (halved at token "
             f"{np.ceil(life):.0f}); measured: median halving token "
             + (f"{measured:.0f}" if np.isfinite(measured) else f"past {len(g)}"))
    # channels sorted by the token at which each halved: their a, b and floor are the same
    viz.show(plot_cumulative_decay([(title, g, seen["halved"])], floor=floor, title="",
                                   order="latest to keep half on top"), "02_gate_explorer")


def explore(inputs: dict, defaults: dict, *, interactive: bool) -> dict:
    """:func:`view` with ``inputs`` (its arrays) at ``defaults`` (its four settings); sliders
    that redraw it when ``interactive`` and ipywidgets is installed, each range widened to hold
    its default (the bound's: any kda_gate takes). Returns :func:`measure` at the defaults."""
    draw = functools.partial(view, **inputs)
    seen = measure(**{name: a for name, a in inputs.items() if name != "floor"}, **defaults)
    widgets = None
    if interactive:
        try:
            import ipywidgets as widgets
        except ImportError:
            print("ipywidgets is not installed: no sliders, the default view only")
    if widgets is None:
        draw(**defaults)
        return seen
    from IPython.display import display

    style = {"description_width": "initial"}

    def slider(name, low, high, step, description):  # the range holds the default
        value = defaults[name]
        return widgets.FloatSlider(value, min=min(low, value), max=max(high, value), step=step,
                                   description=description, continuous_update=False, style=style)

    sliders = {
        "a_log": slider("a_log", -2, 3, 0.1, "A_log"),
        "dt_bias_value": slider("dt_bias_value", -10, 4, 0.25, "dt_bias"),
        "bound": slider("bound", -5, -0.01, 0.01, "lower_bound"),
        "gate": widgets.Dropdown(
            options=["safe", "softplus"], value=defaults["gate"], description="gate", style=style
        ),
    }
    assert {name: w.value for name, w in sliders.items()} == defaults
    output = widgets.interactive_output(draw, sliders)
    display(
        widgets.VBox(
            [
                widgets.HBox(list(sliders.values())[:3]),
                widgets.HBox(list(sliders.values())[3:]),
                output,
            ]
        )
    )
    return seen
