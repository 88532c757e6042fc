"""Numbers stated in a notebook's prose may not be typed in: they come from the code.

Issue 14's rule: every sentence of a notebook that states a result is either computed into the
text from the run (a code cell renders it, e.g. ``display(Markdown(f"... {err:.2f} ..."))``, or
prints it next to the figure) or asserted. This test guards the first half without executing
anything: every *measured-looking* number written in a markdown cell of ``notebooks/NN_*.py``
must also appear as a numeric literal in that notebook's code (a parameter, a threshold an
assert uses, a constant a formula computes with). Prose can then restate what the code fixes
("tolerance 1e-5", "T = 4096") but cannot carry a result of the run, which is what went wrong
when notebook 01 said its old pairs "recall nothing (error 1)" beside a figure at 1.4-1.6, or
notebook 05 said gathering loses "beyond a few hundred tokens" while printing 32.

Measured-looking: decimals (``0.64``), scientific notation (``3e-4``), percentages (``90%``)
and integers of three digits or more (``693 tokens``). Small integers are exempt (sizes, counts,
section numbers and formula constants); so are the References section, links, and notebook
numbers. Numbers inside ``$...$`` math count like any other.

Words ("a few hundred") cannot be checked mechanically; the notebooks assert what such words
claim, next to where they claim it.
"""

from __future__ import annotations

import ast
import math
import pathlib
import re

import jupytext
import nbformat
import pytest

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
SOURCES = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))

_LINK = re.compile(r"\]\([^)]*\)|https?://\S+|doi:\S+|arXiv[: ]\s*\S+", re.I)
_NOTEBOOK_REF = re.compile(r"\bnotebooks? \d\d(?:\s*(?:,|and|-|to)\s*\d\d)*", re.I)
_NUMBER = re.compile(
    r"(?<![\w.])(?P<number>\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?)(?P<percent>\s?%)?(?![\w.]*\d)"
)


def _stated_numbers(markdown: str) -> list[tuple[str, float]]:
    """(as written, value) of every measured-looking number in a markdown cell."""
    text = _NOTEBOOK_REF.sub(" ", _LINK.sub(" ", markdown))
    found = []
    for match in _NUMBER.finditer(text):
        written = match["number"]
        value = float(written.replace(",", ""))
        is_integer = re.fullmatch(r"\d+(?:,\d{3})*", written) is not None
        if is_integer and not match["percent"] and value < 100:
            continue
        found.append((written + (match["percent"] or "").strip(), value))
    return found


def _code_numbers(code: str) -> set[float]:
    """Numeric literals of the code (negative ones too), and numbers inside its strings."""
    values = set()
    try:
        tree = ast.parse(code)
    except SyntaxError:  # IPython magics: fall back to the numbers in the text
        return {float(m) for m in re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", code)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            values.add(float(node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            values.update(float(m) for m in re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
                                                       node.value))
    return values


def _matches(value: float, known: set[float], percent: bool) -> bool:
    candidates = [value, value / 100] if percent else [value]
    return any(math.isclose(c, k, rel_tol=1e-9, abs_tol=0.0) for c in candidates for k in known)


def typed_in_numbers(nb) -> list[str]:
    """Numbers of a notebook's markdown that its code does not contain, with their cell."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    known = _code_numbers(code)
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or cell.source.lstrip().startswith("## References"):
            continue
        for written, value in _stated_numbers(cell.source):
            if not _matches(value, known, written.endswith("%")):
                first_line = cell.source.strip().splitlines()[0][:60]
                problems.append(f"cell {index} ({first_line!r}): {written!r}")
    return problems


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_no_result_is_typed_into_the_prose(source):
    problems = typed_in_numbers(jupytext.read(source))
    assert not problems, (
        f"{source.name}: numbers in markdown that the code does not contain; render results "
        "from the run (display(Markdown(f'...'))) or make them parameters/asserted constants:\n"
        + "\n".join(problems)
    )


def _notebook(*cells):
    make = {"md": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    return nbformat.v4.new_notebook(cells=[make[kind](text) for kind, text in cells])


def test_a_contradiction_is_caught():
    """The old text of notebook 01, with the code that produced other numbers."""
    nb = _notebook(
        ("code", "errors = recall(memory)\nprint(f'old pairs {errors.mean():.2f}')"),
        ("md", "Beyond capacity KDA lets old pairs fade to an error of 1.0, on top of the delta "
               "rule at 0.64 for n = 32."),
    )
    assert typed_in_numbers(nb) == [
        "cell 1 ('Beyond capacity KDA lets old pairs fade to an error of 1.0, '): '1.0'",
        "cell 1 ('Beyond capacity KDA lets old pairs fade to an error of 1.0, '): '0.64'",
    ]


def test_computed_text_constants_and_exemptions_pass():
    nb = _notebook(
        ("code", "atol = 1e-5\nthreshold = 0.25\nT = 4096\n"
                 "display(Markdown(f'error {err:.2f}'))"),
        ("md", "Within tolerance 1e-5 at $T = 4096$; the error stays under 0.25 (25%) with "
               "3 heads, see notebook 03 and [arXiv:2510.26692](https://arxiv.org/abs/2510.26692)."),
        ("md", "## References\n\n- A paper, 2024, pages 1234-1240."),
    )
    assert typed_in_numbers(nb) == []


def test_large_integers_and_percentages_are_checked():
    nb = _notebook(("code", "x = 1"), ("md", "Half-lives up to 693 tokens; 90% of chance."))
    assert [p.split(": ")[-1] for p in typed_in_numbers(nb)] == ["'693'", "'90%'"]


# --- notebook 03: the numbers its prose states (issue 25) ---------------------------------------


@pytest.mark.parametrize("scan", ["sequential", "associative"])
@pytest.mark.parametrize(("C", "K", "V", "N"), [(16, 8, 4, 1), (32, 16, 8, 3), (64, 32, 16, 4)])
def test_nb03_flop_count_equals_the_traced_matmuls(scan, C, K, V, N):
    """kda_lib.costs counts kda_chunked's matrix products term by term, exactly."""
    import jax

    import kda_lib
    from kda_lib import costs
    from kda_lib.testing import random_kda_inputs

    x = random_kda_inputs(jax.random.key(0), 1, N * C, 2, K, V, gate="raw")
    args = (x["q"], x["k"], x["v"], -jax.nn.softplus(x["g"]), x["beta"])
    traced = costs.matmul_flops(
        lambda *a: kda_lib.kda_chunked(*a, chunk_size=C, scan=scan)[0], *args
    )
    assert traced == 2 * costs.chunked_flops(N * C, C, K, V, scan)


def test_nb03_xla_cost_analysis_is_close_to_the_count():
    """XLA's count of one compiled chunk (C = 64, K = V = 128) adds only elementwise work."""
    import jax
    import jax.numpy as jnp

    import kda_lib
    from kda_lib import costs
    from kda_lib.testing import random_kda_inputs

    x = random_kda_inputs(jax.random.key(1), 1, 64, 1, 128, gate="raw")
    state = jnp.ones((1, 1, 128, 128))
    args = (x["q"], x["k"], x["v"], -jax.nn.softplus(x["g"]), x["beta"], state)
    fn = lambda q, k, v, g, b, s: kda_lib.kda_chunked(  # noqa: E731
        q, k, v, g, b, initial_state=s, output_final_state=True, scan="sequential"
    )
    xla = jax.jit(fn).lower(*args).compile().cost_analysis()["flops"]
    assert 1.0 <= xla / costs.chunked_flops(64, 64, 128, 128) <= 1.3


def test_nb03_ratios_and_chunk_sizes():
    """The sequential pass: about 1.5x the recurrence at K = V = 128, C = 64 (not 2.3x); its
    flops grow with C (optimum 16), the associative scan's optimum is 128."""
    from kda_lib import costs

    ratio = costs.chunked_flops(4096, 64, 128, 128) / costs.recurrent_flops(4096, 128, 128)
    assert 1.45 < ratio < 1.5
    per_token_sizes = (16, 32, 64, 128, 256)
    per_token = [costs.chunked_flops(4096, c, 128, 128) for c in per_token_sizes]
    assert per_token == sorted(per_token)
    assoc = {c: costs.chunked_flops(4096, c, 128, 128, "associative") for c in per_token_sizes}
    assert min(assoc, key=assoc.get) == 128


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 256])
def test_nb03_associative_scan_rounds(n):
    """lax.associative_scan over n = 2^j maps: 2j - 1 rounds, 2n - 2 - j compositions."""
    from kda_lib import costs

    j = int(math.log2(n))
    rounds = costs.associative_scan_rounds(n)
    assert len(rounds) == 2 * j - 1 and sum(rounds) == 2 * n - 2 - j
    assert rounds[:j] == [n // 2**i for i in range(1, j + 1)]


def test_nb03_float32_exponent_budget():
    """exp overflows past ~88.7 in float32: 16 tokens at the floor -5 stay within 80."""
    import numpy as np

    limit = float(np.log(np.finfo(np.float32).max))
    assert 88.7 < limit < 88.8
    assert 16 * 5 <= 80 < limit < 64 * 5


def test_nb03_recorded_cpu_sequential_step_cost():
    """The recorded CPU run: forward about even, fwd+bwd the recurrence several times slower."""
    from kda_lib.recorded import load_recorded

    records = load_recorded("benchmarks", "cpu-2026-12-01.json")["records"]
    ms = {(r["impl"], r["T"], r["mode"]): r["median_ms"] for r in records}
    assert round(ms["recurrent", 1024, "fwd+bwd"]) == 191
    assert round(ms["chunked", 1024, "fwd+bwd"]) == 32
    forward = [ms["chunked", t, "fwd"] / ms["recurrent", t, "fwd"] for t in (256, 1024)]
    assert [round(f, 2) for f in forward] == [0.86, 0.98]
