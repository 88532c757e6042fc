"""The notebooks' math symbols against docs/NOTATION.md (no notebook is executed).

NOTATION promises one meaning per symbol. Every LaTeX symbol in a notebook's markdown cells
(``$...$`` and ``$$...$$``: single Latin letters, Greek letters, calligraphic letters; bold and
non-bold count as one symbol, ``e^{...}`` is the exponential, the arguments of ``\\text``,
``\\operatorname``, ``\\mathrm``, ``\\mathtt`` and ``\\mathbb`` are words, not symbols) must be
declared in one of NOTATION's tables, or in its table of notebook-local symbols for that
notebook. A symbol is declared once: no two rows of the global tables declare the same symbol
(after dropping running indices such as the ``t`` of ``\\mathbf k_t``), and a local symbol is
neither a global one nor declared locally with two meanings.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTATION = ROOT / "docs" / "NOTATION.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
GREEK = frozenset(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu "
    "xi pi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma "
    "Upsilon Phi Psi Omega ell".split()
)
WORDS = ("text", "operatorname", "mathrm", "texttt", "mathtt", "mathbb", "textbf", "textit",
         "begin", "end")
INDICES = frozenset("t s i j h c e u r".split()) | {r"\rho"}  # running indices (subscripts)
PAPER = "## The paper's symbols"  # its first column is the paper's letters, not ours
LOCAL = "## Symbols of one notebook"


def math_spans(markdown: str) -> list[str]:
    """The LaTeX of every ``$$...$$`` and ``$...$`` span (code spans removed first)."""
    markdown = re.sub(r"`[^`]*`", " ", markdown)
    display = re.findall(r"\$\$(.+?)\$\$", markdown, flags=re.S)
    markdown = re.sub(r"\$\$(.+?)\$\$", " ", markdown, flags=re.S)
    return display + re.findall(r"(?<!\\)\$(.+?)(?<!\\)\$", markdown, flags=re.S)


def symbols(tex: str) -> list[str]:
    """The symbols of one span, in order: ``k``, ``\\beta``, ``\\mathcal L``, ..."""
    words = "|".join(WORDS)
    tex = re.sub(rf"\\({words})\s*\{{[^{{}}]*\}}", " ", tex)
    tex = re.sub(rf"\\({words})\s*\\?[A-Za-z]", " ", tex)
    tex = re.sub(r"(\\rVert|\\\|)\s*_\s*F", " ", tex)  # the Frobenius norm's F is a word
    out, i = [], 0
    while i < len(tex):
        macro = re.match(r"\\([A-Za-z]+)", tex[i:])
        if macro:
            i += len(macro.group(0))
            if macro.group(1) == "mathcal":
                letter = re.match(r"\s*\{?\s*([A-Za-z])", tex[i:])
                out.append(r"\mathcal " + letter.group(1))
                i += len(letter.group(0))
            elif macro.group(1) in GREEK:
                out.append("\\" + macro.group(1))
            continue
        if tex[i] == "\\":
            i += 2
            continue
        if tex[i].isalpha() and not re.match(r"e\s*\^", tex[i:]):  # e^x: the exponential
            out.append(tex[i])
        i += 1
    return out


def markdown_of(path: pathlib.Path) -> str:
    """The markdown cells of a jupytext percent-format notebook, comment marks removed."""
    text = path.read_text()
    heads = re.findall(r"^# %%.*$", text, flags=re.M)
    bodies = re.split(r"^# %%.*$", text, flags=re.M)[1:]
    return "\n".join(
        "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                  for line in body.splitlines())
        for head, body in zip(heads, bodies, strict=True)
        if "[markdown]" in head
    )


def table_rows(section: str) -> list[list[str]]:
    """The body rows of every markdown table in ``section``, as lists of cells."""
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not re.match(r"\|\s*(symbol|paper|---)", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def sections() -> dict[str, str]:
    text = NOTATION.read_text()
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def items(cell: str) -> list[str]:
    """The symbols a table cell declares: its math spans split at top-level commas and
    semicolons, each cut at its first ``\\in``, ``=``, ``\\le`` or ``,``."""
    out = []
    for span in math_spans(cell):
        depth, start = 0, 0
        for i, ch in enumerate(span + ","):
            depth += ch in "{([" and 1 or ch in "})]" and -1 or 0
            if ch in ",;" and depth == 0:
                part = re.split(r"\\in\b|=|\\le\b|\\ge\b", span[start:i])[0].strip()
                if part and not part.startswith(r"\dots"):
                    out.append(part)
                start = i + 1
    return out


def key(item: str) -> str:
    """A declared symbol with bold and running-index subscripts dropped: ``\\mathbf k_t`` ->
    ``k``, ``d_k`` stays ``d_k``, ``M_{[i]}`` stays ``M_{[i]}``."""
    item = re.sub(r"\\(mathbf|boldsymbol)\s*", "", item).replace("{", "").replace("}", "")
    item = re.sub(r"\s+", "", item)
    base, _, sub = item.partition("_")
    return base if sub in INDICES or sub.startswith(("t-", "t+")) else item


def declarations():
    """(global rows: [(row text, [symbols])], local rows: [(symbols, notebooks, meaning)])."""
    global_rows, local_rows = [], []
    for title, body in sections().items():
        if title.startswith(PAPER):
            continue
        for cells in table_rows(body):
            if title.startswith(LOCAL):
                notebooks = set(re.findall(r"\d\d", cells[1]))
                local_rows.append((items(cells[0]), notebooks, cells[2]))
            else:
                global_rows.append((cells[0], items(cells[0])))
    return global_rows, local_rows


def test_the_notation_parser_reads_its_tables():
    global_rows, local_rows = declarations()
    assert len(global_rows) > 60 and local_rows
    assert symbols(r"\mathbf k_t^\top e^{\boldsymbol\gamma_t} \text{global} \mathcal L") == [
        "k", "t", r"\gamma", "t", r"\mathcal L"]
    assert key(r"\mathbf q_t") == "q" and key("d_k") == "d_k" and key("M_{[i]}") == "M_[i]"


def test_no_symbol_is_declared_with_two_meanings():
    global_rows, local_rows = declarations()
    seen: dict[str, str] = {}
    for row, declared in global_rows:
        for k in {key(item) for item in declared}:
            assert k not in seen, f"{k!r} declared twice: {seen[k]!r} and {row!r}"
            seen[k] = row
    global_symbols = {s for _, declared in global_rows for item in declared for s in symbols(item)}
    local_meaning: dict[str, str] = {}
    for declared, notebooks, meaning in local_rows:
        assert notebooks, f"local row {declared} names no notebook"
        for item in declared:
            base = symbols(item)[0]
            assert base not in global_symbols, f"local {item!r} is a global symbol too"
            assert local_meaning.setdefault(base, meaning) == meaning, (
                f"local {item!r} has two meanings: {local_meaning[base]!r} and {meaning!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_math_symbol_of_a_notebook_is_declared(path):
    global_rows, local_rows = declarations()
    declared = {s for _, items_ in global_rows for item in items_ for s in symbols(item)}
    number = path.name[:2]
    declared |= {symbols(item)[0] for items_, nbs, _ in local_rows if number in nbs
                 for item in items_}
    undeclared = {}
    for span in math_spans(markdown_of(path)):
        for s in symbols(span):
            if s not in declared:
                undeclared.setdefault(s, span.strip()[:80])
    assert not undeclared, f"{path.name}: symbols missing from docs/NOTATION.md: {undeclared}"


INDEX_LETTERS = "tshcije"  # NOTATION's running indices that are Latin letters


def index_misuses(markdown: str) -> list[str]:
    """Math spans that give an index letter a second meaning: written bold (a vector, e.g. an
    error vector named like the value-channel index), set equal to a vector expression (e.g.
    an overlap of keys named like the key-channel index), or a constant: a coefficient
    (``c\\, \\omega^\\nu``) or a decimal (``c = 0.643``); t excepted there (the token index
    also counts the tokens up to it, ``t\\, d_v``)."""
    out = []
    for span in math_spans(markdown):
        for letter in INDEX_LETTERS:
            bold = re.search(rf"\\(mathbf|boldsymbol)\s*\{{?\s*{letter}(?![A-Za-z])", span)
            value = re.search(rf"(?<![\\A-Za-z_^]){letter}\s*=([^,;}}]*)", span)
            constant = letter != "t" and re.search(
                rf"(?<![\\A-Za-z_^{{]){letter}\s*(\\,|=\s*-?\d*\.\d)", span)
            if bold or constant or (
                    value and re.search(r"\\(mathbf|boldsymbol)|\\top", value.group(1))):
                out.append(f"{letter}: {span.strip()[:60]}")
    return out


def test_the_index_check_finds_a_second_meaning():
    assert index_misuses(r"overlap $c = \mathbf k_1^\top \mathbf k_2$") == [
        r"c: c = \mathbf k_1^\top \mathbf k_2"]
    assert index_misuses(r"errors $\mathbf e_j = S^\top \mathbf k_j$")
    assert not index_misuses(r"$t = 1, \dots, C$, $S_{ce}$, $e^{\mathbf g_t}$, $\mathbf k_t$")
    assert not index_misuses(r"$\sum_{j=0}^{w-1} \boldsymbol\kappa_j$")
    assert index_misuses(r"$\phi(\nu) = c\, \omega^\nu$") and index_misuses(r"$c = 0.643$")
    assert not index_misuses(r"$\mathbb E \lVert S_t \rVert_F^2 = t\, d_v$, $S_{ce}\,$")


# known second meanings, to be renamed: notebook 09 writes MLA's cached latent as DeepSeek's
# bold c^{KV} (the key-channel index's letter)
INDEX_EXCEPTIONS = {"09_hybrid_language_model": {"c"}}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_an_index_letter_keeps_its_one_meaning(path):
    allowed = INDEX_EXCEPTIONS.get(path.stem, set())
    misuses = [m for m in index_misuses(markdown_of(path)) if m[0] not in allowed]
    assert not misuses, f"{path.name}: index letters used as something else: {misuses}"


@pytest.mark.parametrize("doc", ["NOTATION.md", "NOTEBOOK_NOTES.md"])
def test_the_docs_keep_the_index_letters_too(doc):
    """NOTATION's own rows and the notebook notes (teacher re-read: NOTATION wrote notebook
    08's filter as c times a power, c the key-channel index)."""
    misuses = index_misuses((ROOT / "docs" / doc).read_text())
    assert not misuses, f"{doc}: index letters used as something else: {misuses}"


def plain_only() -> set[str]:
    """The letters NOTATION declares only plain (never bold): ``w``, ``d``, ``j``, ``W``, ..."""
    global_rows, local_rows = declarations()
    bold, plain = set(), set()
    for item in [i for _, its in global_rows for i in its] + [i for its, _, _ in local_rows
                                                               for i in its]:
        letters = symbols(item)
        if letters:
            is_bold = re.match(r"\s*(\\tilde\s*\{?\s*)?\\(mathbf|boldsymbol)", item)
            (bold if is_bold else plain).add(letters[0])
    return plain - bold


def subscript_owners(letter: str, tex: str) -> list[str]:
    """The symbols that take the index ``letter`` as a subscript in ``tex``'s math (``k`` of
    ``\\mathbf k_{j'}``); a bound variable (``\\sum_{j=0}``) has no owner."""
    out = []
    for span in math_spans(tex):
        for m in re.finditer(rf"_\s*\{{?\s*{letter}(?![A-Za-z])", span):
            before = span[:m.start()].rstrip().rstrip("}").rstrip()
            macro = re.search(r"\\([A-Za-z]+)$", before)
            if macro and macro.group(1) not in GREEK:
                continue  # \sum_{j ...}, \max_j: the letter is bound there
            letters = symbols(before)
            if letters:
                out.append(letters[-1])
    return out


# notebook 09's bold c^{KV} (DeepSeek's cached latent) is INDEX_EXCEPTIONS' known exception
SUBSCRIPTED = {"W"}  # NOTATION: every W with a subscript is a learned weight matrix, no bare W


def one_meaning_misuses(tex: str, allowed: frozenset = frozenset()) -> list[str]:
    """Symbols written with another meaning than NOTATION's: a letter declared only plain
    written bold (03 once wrote the WY factors as bold w_t, w the conv width), a bare W (03's
    WY factor; every W with a subscript is a weight matrix), and an index whose NOTATION row
    names the symbols it indexes subscripting another one (04 once indexed the conv taps
    kappa_j by j, the index of a stored pair)."""
    out, plain = [], plain_only() - allowed
    owners = {}  # index letter -> the symbols its NOTATION row lets it subscript
    for cells in table_rows(sections()["## Sizes and indices"]):
        letter = symbols(cells[0])
        if len(letter) == 1 and letter[0] in INDICES and subscript_owners(letter[0], cells[1]):
            owners[letter[0]] = set(subscript_owners(letter[0], cells[1]))
    for span in math_spans(tex):
        for m in re.finditer(r"\\(mathbf|boldsymbol)\s*\{?\s*(\\[A-Za-z]+|[A-Za-z])", span):
            if m.group(2) in plain:
                out.append(f"bold {m.group(2)}: {span.strip()[:60]}")
        for letter in SUBSCRIPTED - allowed:
            if re.search(rf"(?<![\\A-Za-z]){letter}(?![A-Za-z]|\s*[_^])", span):
                out.append(f"bare {letter}: {span.strip()[:60]}")
    for letter, ok in owners.items():
        out += [f"{owner}_{letter}: not one of {sorted(ok)}"
                for owner in subscript_owners(letter, tex) if owner not in ok]
    return out


def test_the_one_meaning_check_finds_the_old_clashes():
    assert one_meaning_misuses(r"rows $\mathbf w_t = \beta_t \mathbf k_t$") == [
        r"bold w: \mathbf w_t = \beta_t \mathbf k_t"]
    assert one_meaning_misuses(r"$(I + L) W = \operatorname{diag}(\boldsymbol\beta) K$") == [
        r"bare W: (I + L) W = \operatorname{diag}(\boldsymbol\beta) K"]
    assert one_meaning_misuses(r"$\sum_{j=0}^{w-1} \boldsymbol\kappa_j \odot \xi_{t-j}$") == [
        r"\kappa_j: not one of ['k', 'v']"]
    assert not one_meaning_misuses(r"$\mathbf k_{j'}^\top S = \mathbf v_j^\top$, $W_q$, "
                                   r"$W^{K}_h$, $\operatorname{diag}(\boldsymbol\beta)$, "
                                   r"$\sum_{j'} \tilde{\mathbf k}_t$")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_symbol_keeps_its_one_meaning(path):
    allowed = frozenset(INDEX_EXCEPTIONS.get(path.stem, set()))
    misuses = one_meaning_misuses(markdown_of(path), allowed)
    assert not misuses, f"{path.name}: symbols used with another meaning: {misuses}"


def test_the_notes_keep_one_meaning_too():
    misuses = one_meaning_misuses((ROOT / "docs" / "NOTEBOOK_NOTES.md").read_text())
    assert not misuses, f"NOTEBOOK_NOTES.md: symbols used with another meaning: {misuses}"
