"""Helpers of notebook 03 (the chunkwise algorithm): the roofline model of one chunk, the live
timing loop and the tables it renders. The algebra stays in the notebook; these are plumbing."""

from __future__ import annotations

import functools
import importlib.util

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from kda_lib.lab import costs
from kda_lib.lab.at_scale import Chip, step_time
from kda_lib.lab.measure import median_ms
from kda_lib.testing import assert_close, random_kda_inputs


def chunk_bytes(C: int, K: int, V: int, size: int = 2) -> int:
    """HBM bytes of one chunk and head in notebook 03's pipeline model, ``size`` bytes a number:
    the inputs read and outputs written, ``C (3K + 2V + 1)`` numbers; the chunk's intermediates
    (two ``C x C`` matrices, ``K~`` and ``V~``) written and read back, ``2 (2 C^2 + C (K + V))``;
    the state entering the chunk written and read back, ``2 K V``."""
    return size * (C * (3 * K + 2 * V + 1) + 2 * (2 * C * C + C * (K + V)) + 2 * K * V)


def roofline(flops_per_token: dict, K: int, V: int, chip: Chip) -> dict:
    """``{C: (compute s, memory s, roofline s, compute + memory s)}`` per token and head: flops at
    the chip's peak, :func:`chunk_bytes` at its HBM bandwidth, the longer of the two (the
    roofline: perfect overlap) and their sum (no overlap)."""
    table = {}
    for C, flops in flops_per_token.items():
        memory = chunk_bytes(C, K, V) / C
        compute_s, memory_s = flops / chip.peak_flops, memory / chip.hbm_bandwidth
        table[C] = (compute_s, memory_s, step_time(flops, memory, chip), compute_s + memory_s)
    return table


def roofline_figure(table: dict, chip: Chip, K: int) -> plt.Figure:
    """Time per token against chunk size, each column of :func:`roofline`."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    sizes = list(table)
    for col, label, style, width in (
        (2, "roofline: the longer of the two", "-", 5),
        (1, "memory: bytes / bandwidth", "--", 1.5),
        (0, "compute: matrix-product flops / peak", ":", 1.5),
        (3, "no overlap: their sum", "-.", 1.5),
    ):
        alpha = 0.4 if width > 2 else 1.0
        ax.plot(
            [str(c) for c in sizes],
            [table[c][col] * 1e9 for c in sizes],
            style,
            marker="o",
            lw=width,
            alpha=alpha,
            label=label,
        )
    ax.set_xlabel("chunk size C (tokens)")
    ax.set_ylabel("time per token and head (ns)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Chunked KDA forward on an {chip.name} (model), $d_k = d_v$ = {K}, bf16")
    return fig


def kda_forms(lower_bound: float) -> dict:
    """The forms notebook 03 times: ``{name: fn(q, k, v, f, beta, a_log, dt_bias) -> output}``,
    KDA through ``kda_lib.kda`` (safe gate applied inside): the recurrence, the chunked form,
    tokamax's chunked form where tokamax is installed, the Pallas kernel on a TPU (the page needs
    no other column: notebook 07 times softmax attention beside KDA, decoding)."""
    import kda_lib

    def kda_form(name):
        def run(q, k, v, f, beta, a_log, dt_bias):
            return kda_lib.kda(
                q,
                k,
                v,
                f,
                beta,
                a_log=a_log,
                dt_bias=dt_bias,
                lower_bound=lower_bound,
                use_gate_in_kernel=True,
                implementation=name,
            )[0]

        return run

    names = ["recurrent", "chunked"]
    names += ["tokamax_xla_chunked"] * (importlib.util.find_spec("tokamax") is not None)
    names += ["pallas_tpu"] * (jax.default_backend() == "tpu")
    return {name: kda_form(name) for name in names}


AGREE = dict(atol=2e-4, rtol=2e-3)  # the timed KDA forms' outputs against the recurrence's


def time_forms(forms: dict, lengths, *, key, heads: int, dim: int, modes, repeats: int) -> dict:
    """``{mode: {name: [median ms per length]}}``, batch 1, ``heads`` heads, K = V = ``dim``;
    ``"fwd+bwd"`` times the gradient of ``sum(outputs)`` with respect to q, k and v. The KDA
    forms' forward outputs are asserted equal to the recurrence's."""
    timings = {mode: {name: [] for name in forms} for mode in modes}
    for T in lengths:
        inputs = random_kda_inputs(jax.random.fold_in(key, T), 1, T, heads, dim, gate="raw")
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "a_log", "dt_bias")]
        for mode in modes:
            outs = {}
            for name, fn in forms.items():
                if mode != "fwd":
                    fn = jax.grad(functools.partial(_summed, fn), argnums=(0, 1, 2))
                ms, outs[name] = median_ms(jax.jit(fn), *args, repeats=repeats)
                timings[mode][name].append(ms)
            if mode == "fwd":  # the KDA implementations compute the same thing
                for name in {"chunked", "tokamax_xla_chunked", "pallas_tpu"} & outs.keys():
                    assert_close(outs[name], outs["recurrent"], **AGREE, name=name)
    for per_form in timings.values():
        assert all(np.isfinite(ms).all() and min(ms) > 0 for ms in per_form.values())
    return timings


def _summed(fn, *args):
    return jnp.sum(fn(*args))


def dependent_steps(fn, *args) -> int:
    """The longest ``lax.scan`` in ``fn(*args)``'s traced program (nested programs included): the
    steps that run one after another, each waiting for the carry of the last (traced, not run)."""

    def lengths(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "scan":
                yield eqn.params["length"]
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        yield from lengths(inner)

    return max(lengths(jax.make_jaxpr(fn)(*args).jaxpr), default=1)


# what each column of :func:`timing_markdown` holds, one sentence a form of :func:`kda_forms`
COLUMNS = {
    "recurrent": "`kda_lib`'s recurrence, one token after another",
    "chunked": "`kda_lib`'s chunked form, this page's algorithm",
    "tokamax_xla_chunked": "the same chunked algorithm as the tokamax library writes it (XLA)",
    "pallas_tpu": "`kda_lib`'s Pallas kernel of the chunked form (on a TPU only)",
}


def timing_markdown(timings: dict, lengths, dim: int, chunk_size: int = 64,
                    others=((64, 32), (128, 32), (128, 64))) -> str:
    """The live timings (median ms per form) as a Markdown table, one row per pass and length,
    with the flops per head of the recurrence (``6 T K V``: ``k^T S``, ``S^T q`` and the write
    ``k delta^T``, multiply and add counted; the decay left out) and of the chunked form
    (``K = V = dim``, ``T`` padded up to a multiple of ``chunk_size``, ``kda_lib.kda``'s
    default), forward only, and their ratio; then that ratio
    per token at the ``(d, C)`` of ``others``, what each timed column is (:data:`COLUMNS`) and,
    on a CPU, that its times cannot test the claim about matrix units. A time below the same
    form's at a shorter ``T`` is marked ``*`` (more tokens cannot need less work: noise)."""
    names = list(next(iter(timings.values())))
    rows = [
        f"Median ms on this machine ({jax.default_backend()}; * below the same form's time at a "
        "shorter T: noise), flops per head (forward):\n",
        "| pass | $T$ | " + " | ".join(names) + " | flops: recurrence ($6 d_k d_v$ a token) | "
        "flops: chunked "
        f"($C$ = {chunk_size}, as timed) | chunked / recurrence |",
        "|---|---|" + "---|" * (len(names) + 3),
    ]
    for mode, per_form in timings.items():
        for n, T in enumerate(lengths):
            times = " | ".join(f"{per_form[name][n]:.2f}" + (
                "*" if n and per_form[name][n] < min(per_form[name][:n]) else "")
                for name in names)
            padded = -(-T // chunk_size) * chunk_size
            flops = (6 * T * dim * dim, costs.chunked_flops(padded, chunk_size, dim, dim))
            rows.append(f"| {mode} | {T:,} | {times} | {flops[0]:.3g} | {flops[1]:.3g} | "
                        f"{flops[1] / flops[0]:.2f} |")
    ratios = (f"$d_k = d_v$ = {d}, $C$ = {c}: "
              f"{costs.chunked_flops(c, c, d, d) / (6 * c * d * d):.2f}" for d, c in others)
    rows.append("\nChunked / recurrence flops per token at other sizes: "
                + ", ".join(ratios) + ".")
    rows.append("\nColumns: " + "; ".join(f"`{name}`: {COLUMNS[name]}" for name in names)
                + ". Their forward outputs are asserted equal to the recurrence's "
                + f"(atol {AGREE['atol']:g}, rtol {AGREE['rtol']:g}).")
    if jax.default_backend() == "cpu":
        rows.append("\nA CPU has no matrix units: these times cannot test the claim about them.")
    return "\n".join(rows)


def masked_overflow(chunk_size: int, fall: float = 800.0) -> dict:
    """NaN entries of ``exp(gamma_t - gamma_s) * causal`` for a gate falling by ``fall`` over a
    chunk (every exponent formed, masked after ``exp``: ``inf * 0``), in float64 and float32, and
    with the exponent masked before ``exp`` (``"before"``, float64)."""
    steep = np.subtract.outer(*[-fall / (chunk_size - 1) * np.arange(chunk_size)] * 2)
    causal = np.tril(np.ones((chunk_size, chunk_size)))
    with np.errstate(over="ignore", invalid="ignore"):
        count = lambda e: int(np.isnan(np.exp(e) * causal).sum())  # noqa: E731
        return {"float64": count(steep), "float32": count(steep.astype(np.float32)),
                "before": count(np.where(causal > 0, steep, -np.inf))}


def step_counts(forms: dict, lengths, *, key, heads: int, dim: int) -> list[tuple]:
    """``[(T, recurrent steps, chunked steps, C, share of chunked flops free of the state)]``:
    :func:`dependent_steps` of the forms' traced programs (inputs as :func:`time_forms` draws
    them); the share from :func:`kda_lib.lab.costs.chunk_terms` (scores, inverse, K~ and V~)."""
    rows = []
    for T in lengths:
        inputs = random_kda_inputs(jax.random.fold_in(key, T), 1, T, heads, dim, gate="raw")
        args = [inputs[n] for n in ("q", "k", "v", "g", "beta", "a_log", "dt_bias")]
        steps = [dependent_steps(forms[name], *args) for name in ("recurrent", "chunked")]
        terms = costs.chunk_terms(T // steps[1], dim, dim)
        free = sum(terms[t] for t in ("scores", "inverse", "wu")) / sum(
            terms[t] for t in costs.SEQUENTIAL_TERMS)
        rows.append((T, *steps, T // steps[1], free))
    return rows
