"""Build the static site of executed notebooks: an index page and one page per notebook.

    python scripts/build_site.py build/notebooks/*.ipynb --output build/html

(``make notebooks`` runs it after executing every notebook with papermill.)

The site works offline, as a folder of files:

* math (``$...$`` inline, ``$$...$$`` on its own lines, in markdown cells) is typeset at build
  time into MathML with latex2mathml; browsers render MathML themselves, no script needed;
* code is highlighted with Pygments, its colours inlined in the page's own stylesheet;
* figures are PNG files under ``figures/`` beside the pages;
* an image from another host (the Colab badge) becomes a text link, so nothing breaks offline;
* no page references a script or stylesheet on another host (tests/test_site.py checks);
* a code cell tagged ``hide-input`` (jupytext: ``# %% tags=["hide-input"]``), or whose input
  Jupyter hides (``metadata.jupyter.source_hidden``), shows its outputs with its code folded
  away in a ``<details>`` element: plotting code that would bury the argument;
* an interactive widget (ipywidgets) cannot run without a kernel: its place holds a visible
  note saying so.

The index lists the notebooks in file-name order (the order to read them), each with its title,
one line (the first sentence of its opening paragraph) and a thumbnail of its first figure.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import html
import pathlib
import re
import sys

import latex2mathml.converter
import nbformat
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

SITE_TITLE = "Kimi Delta Attention in JAX: the notebooks"
HIDE_INPUT_TAG = "hide-input"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = (
    "Interactive widget: it needs a running Python kernel, so this page cannot show it. Open "
    "the notebook in Jupyter or on Colab to move its controls; the figures on this page show "
    "the default setting."
)
# MathJax environments latex2mathml lacks -> (begin, end) of equivalents it has (same layout)
_ENVIRONMENTS = {
    name: (f"\\begin{{{name}}}", f"\\end{{{name}}}", begin, end)
    for name, begin, end in (
        ("aligned", r"\begin{align*}", r"\end{align*}"),
        ("gathered", r"\begin{array}{c}", r"\end{array}"),
        ("gather*", r"\begin{array}{c}", r"\end{array}"),
        ("gather", r"\begin{array}{c}", r"\end{array}"),
    )
}
_UNKNOWN_COMMAND = re.compile(r">(\\[A-Za-z]+)<")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_REMOTE = re.compile(r"^(https?:)?//", re.IGNORECASE)
# a script or stylesheet loaded from another host, in HTML that a cell output carries
_REMOTE_SCRIPT = re.compile(
    r"<script\b[^>]*\bsrc\s*=\s*[\"']?(https?:)?//[^>]*>.*?</script\s*>", re.I | re.S
)
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?(https?:)?//[^>]*>", re.I)

STYLE = """
body { font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       max-width: 60rem; margin: 0 auto; padding: 1rem 1.5rem 4rem; color: #1b1b1b; }
nav { display: flex; justify-content: space-between; gap: 1rem; font-size: 0.9rem;
      border-bottom: 1px solid #ddd; padding-bottom: 0.5rem; margin-bottom: 1rem; }
a { color: #0a58a5; }
h1 { font-size: 1.7rem; line-height: 1.25; }
pre, code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
            font-size: 0.85rem; }
pre { overflow-x: auto; padding: 0.6rem 0.8rem; margin: 0.3rem 0; border-radius: 4px; }
.input pre { background: #f6f8fa; border-left: 3px solid #0072b2; }
.output pre { background: #fff; border-left: 3px solid #ccc; }
.output pre.stderr { background: #fff5f0; border-left-color: #d55e00; }
.output pre.error { background: #fdecea; border-left-color: #b00020; }
.output img { max-width: 100%; height: auto; }
.cell { margin: 0.8rem 0; }
details.hidden-input > summary { cursor: pointer; color: #555; font-size: 0.85rem; }
.note { border: 1px dashed #e69f00; background: #fff8e6; padding: 0.6rem 0.8rem;
        border-radius: 4px; font-size: 0.9rem; }
math { font-family: "Latin Modern Math", "STIX Two Math", "Cambria Math", math; }
div.math { margin: 0.6rem 0; overflow-x: auto; overflow-y: hidden; }
table { border-collapse: collapse; } th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; }
ol.notebooks { list-style: none; padding: 0; }
ol.notebooks li { display: flex; gap: 1rem; align-items: flex-start; padding: 0.8rem 0;
                  border-bottom: 1px solid #eee; }
ol.notebooks img { width: 200px; flex: none; border: 1px solid #eee; }
ol.notebooks .thumb-missing { width: 200px; flex: none; color: #888; font-size: 0.8rem; }
"""


@dataclasses.dataclass
class Page:
    """One rendered notebook: its file names, title, one-line summary and first figure."""

    stem: str
    title: str
    summary: str
    thumbnail: str | None  # path of the first figure, relative to the site folder
    body: str


def _math(latex: str, options: dict) -> str:
    """MathML for ``latex``; ValueError for TeX that would not come out as written."""
    display = "block" if options.get("display_mode") else "inline"
    tex = latex.strip()
    for old_begin, old_end, begin, end in _ENVIRONMENTS.values():
        tex = tex.replace(old_begin, begin).replace(old_end, end)
    try:
        mathml = latex2mathml.converter.convert(tex, display=display)
    except Exception as e:  # latex2mathml raises several exception types for malformed TeX
        raise ValueError(f"cannot typeset the math {latex!r}: {type(e).__name__} {e}") from e
    # what latex2mathml cannot place it writes out verbatim, or drops silently: refuse it
    problems = [f"unsupported {command}" for command in _UNKNOWN_COMMAND.findall(mathml)]
    if "<mi>&</mi>" in mathml:
        problems.append("'&' outside an alignment environment (use align* or aligned)")
    if 'linebreak="newline"' in mathml:
        problems.append("a line break \\\\ outside an environment (use align* or gather*)")
    if problems:
        raise ValueError(f"cannot typeset the math {latex!r}: {'; '.join(problems)}")
    return mathml


def markdown_renderer() -> MarkdownIt:
    """CommonMark + tables + dollar math rendered to MathML; remote images become links."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    dollarmath_plugin(md, renderer=_math, double_inline=True)
    default_image = md.renderer.rules.get("image")

    def image(renderer, tokens, idx, options, env):
        token = tokens[idx]
        if _REMOTE.match(token.attrGet("src") or ""):
            # offline the image would be broken: show its alt text (inside its link, if any)
            return html.escape(token.content or token.attrGet("alt") or "image")
        return default_image(tokens, idx, options, env)

    md.add_render_rule("image", image)
    return md


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _pre(text: str, css_class: str) -> str:
    return f'<pre class="{css_class}">{html.escape(_ANSI.sub("", text))}</pre>'


def _drop_remote_resources(fragment: str) -> str:
    note = '<div class="note">(a script or stylesheet from another host was left out)</div>'
    return _REMOTE_LINK.sub(note, _REMOTE_SCRIPT.sub(note, fragment))


class _Renderer:
    """Renders one notebook's cells; collects its figures into ``site/figures/``."""

    def __init__(self, stem: str, site: pathlib.Path, md: MarkdownIt):
        self.stem, self.site, self.md = stem, site, md
        self.figures: list[str] = []

    def _figure(self, data: str, suffix: str) -> str:
        name = f"figures/{self.stem}-{len(self.figures) + 1}.{suffix}"
        (self.site / name).write_bytes(base64.b64decode(data))
        self.figures.append(name)
        return name

    def output(self, out) -> str:
        kind = out.get("output_type")
        if kind == "stream":
            name = out.get("name", "stdout")
            return _pre(_text(out.get("text", "")), "stderr" if name == "stderr" else "stdout")
        if kind == "error":
            trace = "\n".join(out.get("traceback", []))
            trace = trace or f"{out.get('ename')}: {out.get('evalue')}"
            return _pre(trace, "error")
        data = out.get("data", {})
        if WIDGET_MIME in data:
            return f'<div class="note widget">{html.escape(WIDGET_NOTE)}</div>'
        if "image/png" in data:
            name = self._figure(_text(data["image/png"]).strip(), "png")
            return f'<img src="{name}" alt="figure {len(self.figures)} of {self.stem}">'
        if "image/svg+xml" in data:
            return _drop_remote_resources(_text(data["image/svg+xml"]))
        if "text/html" in data:
            return _drop_remote_resources(_text(data["text/html"]))
        if "text/markdown" in data:
            return self.md.render(_text(data["text/markdown"]))
        if "text/latex" in data:
            latex = _text(data["text/latex"]).strip().strip("$")
            return _math(latex, {"display_mode": True})
        if "text/plain" in data:
            return _pre(_text(data["text/plain"]), "stdout")
        return ""

    def cell(self, cell) -> str:
        if cell.cell_type == "markdown":
            return f'<div class="cell markdown">{self.md.render(cell.source)}</div>'
        if cell.cell_type != "code":
            return ""
        tags = cell.get("metadata", {}).get("tags", [])
        hidden = HIDE_INPUT_TAG in tags or cell.get("metadata", {}).get("jupyter", {}).get(
            "source_hidden", False
        )
        code = highlight(cell.source, PythonLexer(), HtmlFormatter(cssclass="highlight"))
        source = f'<div class="input">{code}</div>' if cell.source.strip() else ""
        if hidden and source:
            source = (
                f'<details class="hidden-input"><summary>show the code of this figure or '
                f"table</summary>{source}</details>"
            )
        outputs = "".join(self.output(out) for out in cell.get("outputs", []))
        outputs = f'<div class="output">{outputs}</div>' if outputs else ""
        return f'<div class="cell code">{source}{outputs}</div>'


def _title_and_summary(nb, md: MarkdownIt, fallback: str) -> tuple[str, str]:
    """The first markdown heading, and the first sentence of the paragraph after it."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.strip().splitlines()
        if not lines or not lines[0].startswith("# "):
            continue
        title = lines[0][2:].strip()
        paragraphs = re.split(r"\n\s*\n", "\n".join(lines[1:]).strip())
        first = next((p for p in paragraphs if p.strip() and not p.startswith("[![")), "")
        first = re.sub(r"^\*\*[^*]+\.\*\*\s*", "", " ".join(first.split()))  # "**Claim.** "
        sentence = re.match(r"(.+?[.!?])(\s|$)", first)
        summary = md.renderInline(sentence.group(1) if sentence else first)
        return title, summary
    return fallback, ""


def _page(title: str, body: str, nav: str) -> str:
    style = STYLE + HtmlFormatter(cssclass="highlight").get_style_defs(".highlight")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
        f"<nav>{nav}</nav>\n{body}\n</body>\n</html>\n"
    )


def render_notebook(path: pathlib.Path, site: pathlib.Path, md: MarkdownIt) -> Page:
    """Render one executed notebook's cells; its figures are written to ``site/figures/``."""
    nb = nbformat.read(path, as_version=4)
    renderer = _Renderer(path.stem, site, md)
    body = "\n".join(renderer.cell(cell) for cell in nb.cells)
    title, summary = _title_and_summary(nb, md, fallback=path.stem)
    thumbnail = renderer.figures[0] if renderer.figures else None
    return Page(path.stem, title, summary, thumbnail, body)


def build_site(notebooks: list[pathlib.Path], output: pathlib.Path) -> list[pathlib.Path]:
    """Write ``output/index.html`` and ``output/<stem>.html`` for each executed notebook.

    Args:
      notebooks: executed ``.ipynb`` files; the index lists them sorted by file name.
      output: the site folder (created; its ``figures/`` is rewritten).

    Returns:
      The written HTML files, the index first.

    Raises:
      ValueError: ``notebooks`` is empty, or a formula cannot be typeset (names the notebook).
      FileNotFoundError: a notebook does not exist.
    """
    if not notebooks:
        raise ValueError("notebooks is empty: give at least one executed .ipynb")
    notebooks = sorted(notebooks, key=lambda p: p.name)
    for path in notebooks:
        if not path.is_file():
            raise FileNotFoundError(f"notebook {path} does not exist")
    (output / "figures").mkdir(parents=True, exist_ok=True)
    for old in (output / "figures").glob("*"):
        old.unlink()
    md = markdown_renderer()
    pages = []
    for path in notebooks:
        try:
            pages.append(render_notebook(path, output, md))
        except ValueError as e:
            raise ValueError(f"{path.name}: {e}") from e
    written = [output / "index.html"]
    items = []
    for page in pages:
        thumb = (
            f'<img src="{page.thumbnail}" alt="first figure of {html.escape(page.title)}">'
            if page.thumbnail
            else '<span class="thumb-missing">(no figure)</span>'
        )
        items.append(
            f'<li><a href="{page.stem}.html">{thumb}</a><div><a href="{page.stem}.html">'
            f"<strong>{html.escape(page.title)}</strong></a><br>{page.summary}</div></li>"
        )
    index_body = (
        f"<h1>{html.escape(SITE_TITLE)}</h1>\n<p>Executed notebooks, in the order to read "
        "them: each one derives, visualises and checks one piece of KDA.</p>\n"
        f'<ol class="notebooks">{"".join(items)}</ol>'
    )
    written[0].write_text(_page(SITE_TITLE, index_body, "<span>index</span>"))
    for i, page in enumerate(pages):
        previous = (
            f'<a href="{pages[i - 1].stem}.html">&larr; {html.escape(pages[i - 1].title)}</a>'
            if i > 0
            else "<span></span>"
        )
        following = (
            f'<a href="{pages[i + 1].stem}.html">{html.escape(pages[i + 1].title)} &rarr;</a>'
            if i + 1 < len(pages)
            else "<span></span>"
        )
        nav = f'{previous}<a href="index.html">index</a>{following}'
        target = output / f"{page.stem}.html"
        target.write_text(_page(page.title, page.body, nav))
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path, help="executed .ipynb files")
    parser.add_argument("--output", "-o", type=pathlib.Path, default=pathlib.Path("build/html"))
    args = parser.parse_args(argv)
    written = build_site(args.notebooks, args.output)
    print(f"site: {written[0]} ({len(written) - 1} notebook pages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
