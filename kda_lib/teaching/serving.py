"""Pictures and small sums of notebook 07's serving sections: a shared prompt computed once
(prefix caching) and the token counts it saves."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from kda_lib.teaching.viz import PALETTE


def prefix_tokens(prompt_len: int, chunk_size: int, question_len: int, requests: int) -> dict:
    """Tokens the layer runs to answer ``requests`` requests that share a ``prompt_len``-token
    prompt, each with its own ``question_len`` tokens: from scratch every time, or with the
    prompt prefilled once and each request resumed at the last chunk boundary in the prompt
    (the ``prompt_len - reused`` tokens after it are run again, the state exists only at
    boundaries)."""
    reused = (prompt_len // chunk_size) * chunk_size
    scratch = requests * (prompt_len + question_len)
    cached = prompt_len + requests * (prompt_len - reused + question_len)
    return dict(reused=reused, scratch=scratch, cached=cached, saved=scratch - cached)


def draw_shared_prefix(prompt_len: int, chunk_size: int, question_len: int, requests: int):
    """Timeline of a shared prompt: prefilled once (a cache kept at every chunk boundary),
    then each request resumes at the last boundary and runs only its own tokens."""
    counts = prefix_tokens(prompt_len, chunk_size, question_len, requests)
    reused = counts["reused"]
    fig, ax = plt.subplots(figsize=(8, 0.55 * (requests + 1) + 1.2))
    rows = ["prefill once"] + [f"request {r + 1}" for r in range(requests)]
    ax.barh(0, prompt_len, color=PALETTE["sky"], edgecolor="0.3")
    for b in range(chunk_size, prompt_len + 1, chunk_size):  # the caches prefill keeps
        ax.plot(b, 0, "v", color=PALETTE["blue"], markersize=8)
    for r in range(1, requests + 1):
        ax.barh(r, reused, color="0.92", edgecolor="0.6", hatch="//")
        ax.barh(r, prompt_len - reused + question_len, left=reused, color=PALETTE["orange"],
                edgecolor="0.3")  # fmt: skip
        ax.annotate("", xy=(reused, r - 0.3), xytext=(reused, -0.3),
                    arrowprops=dict(arrowstyle="->", color=PALETTE["blue"], lw=1))  # fmt: skip
    handles = [
        Patch(facecolor=PALETTE["sky"], edgecolor="0.3", label="shared prompt, run once"),
        plt.Line2D([], [], marker="v", ls="", color=PALETTE["blue"],
                   label="cache kept at a chunk boundary"),  # fmt: skip
        Patch(facecolor="0.92", edgecolor="0.6", hatch="//", label="resumed, not recomputed"),
        Patch(facecolor=PALETTE["orange"], edgecolor="0.3", label="run for this request"),
    ]
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("token position (tokens)")
    ax.set_title(f"A {prompt_len}-token prompt shared by {requests} requests: "
                 f"{counts['cached']} tokens run instead of {counts['scratch']}")  # fmt: skip
    ax.legend(handles=handles, loc="upper left", fontsize=8, ncol=2)
    ax.set_xlim(0, (prompt_len + question_len) * 1.02)
    ax.set_ylim(requests + 0.6, -1.5)
    return fig
