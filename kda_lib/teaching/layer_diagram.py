"""The block diagram of the KDA layer (notebook 04): hidden states in, six projections, the
recurrence, the output norm and gate, hidden states out; drawn with matplotlib from boxes and
arrows (our drawing of the layer, with NOTATION's symbols)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from kda_lib.teaching import viz

_CONV = "causal conv, last\n$w$ tokens; SiLU"  # the short convolution reaches back w - 1 tokens
# (row label, y, boxes left to right, numbers a token); every row starts from x and ends in the
# recurrence (z: in the output gate)
_ROWS = (
    ("q", 6.0, (r"$W_q$", _CONV, "L2 norm"), r"$H d_k$"),
    ("k", 5.0, (r"$W_k$", _CONV, "L2 norm"), r"$H d_k$"),
    ("v", 4.0, (r"$W_v$", _CONV), r"$H d_v$"),
    ("g", 3.0, (r"$W_f^{\downarrow} W_f^{\uparrow}$, rank $r$",
                r"$-a_h\,\mathrm{softplus}(\cdot + \mathbf{b})$"), r"$H d_k$"),
    (r"\beta", 2.0, (r"$W_\beta$", r"$\sigma$"), r"$H$"),
    ("z", 0.8, (r"$W_z^{\downarrow} W_z^{\uparrow} + \mathbf{b}_z$", r"$\sigma$"), r"$H d_v$"),
)
_COLUMNS, _WIDTH = (2.4, 4.3, 6.1), 1.6  # centres and width of the boxes of a row
_KDA = (8.6, 1.5)  # centre x and width of the recurrence's box (it spans y 1.6 .. 6.4)
_OUT = ((10.6, 1.5, "RMSNorm\nper head, $\\boldsymbol{\\eta}$"), (11.9, 0.55, r"$\odot$"),
        (12.9, 0.75, r"$W_o$"), (13.9, 0.75, r"$\mathbf{y}_t$"))
_LIGHT = {"proj": "#dceaf7", "act": "#fbe3cc", "core": "#d6efe3", "io": "#eeeeee"}


def _box(ax, x, y, width, text, color, height=0.62, edge="0.3", lw=1.0, fontsize=8):
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.02,rounding_size=0.1", facecolor=color,
                                edgecolor=edge, lw=lw))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, start, end, text=None, color="0.25", width=None):
    """An arrow, ``text`` (the array's name) above it, ``width`` (its numbers a token) below."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle="-|>", color=color, lw=1.1, shrinkA=0, shrinkB=0))
    middle = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
    if text:
        ax.text(middle[0], middle[1] + 0.12, text, ha="center", va="bottom", fontsize=9,
                color="0.15")
    if width:
        ax.text(middle[0], middle[1] - 0.1, width, ha="center", va="top", fontsize=7.5,
                color="0.35")


def draw_kda_layer(ax=None):
    """Draw the layer on ``ax`` (a new figure if None) and return the figure."""
    fig = ax.figure if ax is not None else plt.figure(figsize=(11, 4.8))
    ax = ax or fig.add_subplot()
    blue, orange, green = (viz.PALETTE[c] for c in ("blue", "orange", "green"))
    _box(ax, 0.65, 4.0, 1.1, "$\\mathbf{x}_t$\n(width $d$)", _LIGHT["io"], height=0.9,
         fontsize=9)
    gate_x = _OUT[1][0]
    for name, y, boxes, numbers in _ROWS:
        _arrow(ax, (1.2, 4.0), (_COLUMNS[0] - _WIDTH / 2, y), color="0.55")
        for i, text in enumerate(boxes):
            _box(ax, _COLUMNS[i], y, _WIDTH, text, _LIGHT["proj" if i == 0 else "act"])
            if i:
                _arrow(ax, (_COLUMNS[i - 1] + _WIDTH / 2, y), (_COLUMNS[i] - _WIDTH / 2, y))
        end = _COLUMNS[len(boxes) - 1] + _WIDTH / 2
        if name == "z":
            ax.plot([end, gate_x], [y, y], color=orange, lw=1.1)  # below the recurrence
            _arrow(ax, (gate_x, y), (gate_x, 4.0 - 0.31), color=orange)
            ax.text(gate_x + 0.15, 2.2, r"$\sigma(\mathbf{z}_t)$", fontsize=9, color="0.15")
            ax.text(gate_x + 0.15, 1.95, numbers, fontsize=7.5, color="0.35", va="top")
        else:
            label = r"$\beta_t$" if name == r"\beta" else rf"$\mathbf{{{name}}}_t$"
            _arrow(ax, (end, y), (_KDA[0] - _KDA[1] / 2, y), label, color=blue, width=numbers)
    _box(ax, _KDA[0], 4.0, _KDA[1], "KDA\nrecurrence\n\nstate $S_t$,\n$d_k \\times d_v$\nper head",
         _LIGHT["core"], height=4.8, edge=green, lw=2, fontsize=9)
    top = 4.0 + 2.4  # the state feeds back into the next token's step: a loop over the box
    ax.annotate("", xy=(_KDA[0] + 0.35, top), xytext=(_KDA[0] - 0.35, top),
                arrowprops=dict(arrowstyle="-|>", color=green, lw=1.4,
                                connectionstyle="arc3,rad=-1.6", shrinkA=0, shrinkB=0))
    ax.text(_KDA[0] + 0.75, top + 0.35, r"$S_{t-1} \to S_t$", fontsize=9, color="0.15")
    previous = _KDA[0] + _KDA[1] / 2
    for i, (x, width, text) in enumerate(_OUT):
        kind = "io" if i == len(_OUT) - 1 else ("proj" if i == 2 else "act")
        _box(ax, x, 4.0, width, text, _LIGHT[kind], fontsize=12 if i == 1 else 8)
        _arrow(ax, (previous, 4.0), (x - width / 2, 4.0), r"$\mathbf{o}_t$" if i == 0 else None,
               width=r"$H d_v$" if i == 0 else None)
        previous = x + width / 2
    ax.set(xlim=(0, 14.35), ylim=(0.3, 7.2), aspect="auto")
    ax.set_axis_off()
    ax.set_title("The KDA layer, per token: projections, short convolutions and gates around "
                 "the recurrence")
    return fig
