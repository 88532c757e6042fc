"""Build the site of executed notebooks with Sphinx + myst-nb and the book theme.

    python scripts/build_site.py build/notebooks/*.ipynb --output build/html

(``make notebooks`` runs it after executing every notebook with papermill; ``make site`` reruns
it alone.) The site is the stack the JAX and Flax documentation use (Sphinx + myst-nb, here with
``sphinx-book-theme``): a table of contents on the left, prev/next links, an outline of the page,
search, copy buttons on code, a Colab launch button per notebook, and math typeset by MathJax 3
(every browser renders it the same; docs/DESIGN.md says why this stack).

What this script does before Sphinx runs (it writes a Sphinx source folder, ``--source``,
by default ``<output>-src``):

* copies the executed notebooks (myst-nb renders their stored outputs:
  ``nb_execution_mode = "off"``, nothing runs twice);
* the index page: the notebooks in file-name order (the order to read them), each with its
  title, one line (the first sentence of its opening paragraph) and a thumbnail of its first
  figure; the ``docs/`` pages (:data:`DOC_PAGES`) become pages of the site, and the
  notebooks' links to them on GitHub point to those pages instead;
* a code cell tagged ``hide-input`` shows its outputs with its code folded away under a label
  that says what the code is (the install cell, the code of a figure, of the sliders, ...);
* an interactive widget (ipywidgets) needs a kernel: its place holds a note saying so, followed
  by what its output widgets drew when the notebook ran (the default view);
* an image from another host (the Colab badge) becomes a text link, and any script or
  stylesheet from another host in a cell's HTML output is left out;
* the absolute path of the checkout, the home folder and the machine's name are replaced in
  every output (a page names no machine).

Offline: MathJax 3 comes from the ``sphinx-mathjax-offline`` package (copied into
``_static/mathjax``), the theme's fonts and scripts are its own files in ``_static``; after the
build, every page is checked for a ``script``, ``link``, ``img`` or ``iframe`` that loads from
another host (a ValueError names it).
"""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import html
import html.parser
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import notebook_setup  # noqa: E402  (scripts/ is no package)

SITE_TITLE = "Kimi Delta Attention in JAX"
INDEX_LEAD = (
    "Executed notebooks, in the order to read them: each one derives, visualises and checks one "
    "piece of KDA (Kimi Delta Attention, the linear attention of Kimi Linear) in JAX."
)
HIDE_INPUT_TAG = "hide-input"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
WIDGET_NOTE = (
    "Interactive widget: it needs a running Python kernel, so this page cannot move it. Open "
    "the notebook in Jupyter or on Colab to use its controls; what it drew when the notebook ran "
    "(the default setting) is shown below."
)
# the pages the docs/ files become (source file -> page name), in the table of contents' order
DOC_PAGES = {
    "TEACHING.md": "teaching",
    "LIBRARY.md": "library",
    "RUNNING.md": "running",
    "NOTATION.md": "notation",
    "NOTEBOOK_NOTES.md": "notebook-notes",
    "DESIGN.md": "design",
}
_REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
_REMOTE_SCRIPT = re.compile(
    r"<script\b[^>]*\bsrc\s*=\s*[\"']?(https?:)?//[^>]*>.*?</script\s*>", re.I | re.S
)
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?(https?:)?//[^>]*>", re.I)
# a markdown image whose source is on another host, possibly inside a link: ![alt](http...)
_REMOTE_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(\s*(https?:)?//[^)]*\)")
# a link to a notebook of the repository by its path (the .py source or the .ipynb)
_NOTEBOOK_SOURCE = re.compile(r"(?:\.\./)?notebooks/(?P<stem>[0-9][0-9]_\w+)\.(?:py|ipynb)")
_MD_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@dataclasses.dataclass
class Page:
    """One notebook of the site: its file stem, title, one-line summary and thumbnail."""

    stem: str
    title: str
    summary: str  # markdown
    thumbnail: str | None  # path relative to the source folder, e.g. _static/thumbs/00_x.png


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def drop_remote_resources(fragment: str) -> str:
    """``fragment`` (HTML) without scripts or stylesheets loaded from another host."""
    note = "<p><em>(a script or stylesheet from another host was left out)</em></p>"
    return _REMOTE_LINK.sub(note, _REMOTE_SCRIPT.sub(note, fragment))


def remote_images_to_links(markdown: str) -> str:
    """Images from another host become their alt text (a badge inside a link stays a link)."""
    return _REMOTE_IMAGE.sub(lambda m: m["alt"] or "image", markdown)


def machine_names() -> dict[str, str]:
    """What names this checkout or machine in printed output -> what replaces it."""
    names = {str(ROOT): "<checkout>", str(pathlib.Path.home()): "~"}
    host = socket.gethostname()
    if len(host) >= 4:  # a short name would match ordinary words
        names[host] = "<host>"
    return dict(sorted(names.items(), key=lambda item: -len(item[0])))


def scrub(text: str, names: dict[str, str]) -> str:
    for name, replacement in names.items():
        text = text.replace(name, replacement)
    return text


def hidden_input_label(cell) -> str:
    """The fold's label of a ``hide-input`` cell: what its code is."""
    source = cell.source
    kinds = set()
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if WIDGET_MIME in data:
            kinds.add("widget")
        elif "image/png" in data or "image/svg+xml" in data:
            kinds.add("figure")
        elif "text/html" in data or "text/markdown" in data:
            kinds.add("table")
    if 'find_spec("kda_lib")' in source or source.lstrip("# ").lower().startswith("install"):
        return "Show the install cell (installs kda_lib and its dependencies where missing)"
    if "solution" in cell.get("metadata", {}).get("tags", []):
        return "Show the solution"
    if "widget" in kinds or "ipywidgets" in source:
        return "Show the code of the sliders"
    if "figure" in kinds:
        return "Show the code of this figure"
    if "table" in kinds:
        return "Show the code of this table"
    return "Show the code"


def _widget_outputs(model_id: str, states: dict, seen: set | None = None) -> list:
    """The outputs that the Output widgets under ``model_id`` captured when the notebook ran."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in states:
        return []
    seen.add(model_id)
    state = states[model_id].get("state", {})
    found = list(state.get("outputs", [])) if state.get("_model_name") == "OutputModel" else []
    for child in state.get("children", []):
        if isinstance(child, str) and child.startswith("IPY_MODEL_"):
            found += _widget_outputs(child.removeprefix("IPY_MODEL_"), states, seen)
    return found


def _first_png(nb) -> str | None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                return _text(png).strip()
    return None


def _title_and_summary(nb, fallback: str) -> tuple[str, str]:
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
        return title, sentence.group(1) if sentence else first
    return fallback, ""


def _relink(markdown: str, url: str, prefix: str) -> str:
    """Links to a page of :data:`DOC_PAGES` (on GitHub or relative, with or without a
    ``#section`` anchor) -> the site's pages (myst's heading anchors are GitHub's)."""

    def target(match):
        link, hash_, anchor = match["target"].partition("#")
        notebook = _NOTEBOOK_SOURCE.fullmatch(link)
        if notebook:  # DESIGN's links to a notebook's source -> its page on the site
            return f"]({prefix}notebooks/{notebook['stem']}.ipynb{hash_}{anchor})"
        for name, page in DOC_PAGES.items():
            if link in (f"{url}/blob/{notebook_setup.BRANCH}/docs/{name}", name, f"docs/{name}"):
                return f"]({prefix}{page}.md{hash_}{anchor})"
        return match.group(0)

    return _MD_LINK.sub(target, markdown)


def prepare_notebook(nb, stem: str, url: str, names: dict[str, str]):
    """A copy of the executed notebook ``nb`` made ready for myst-nb (see the module doc)."""
    nb = copy.deepcopy(nb)
    states = nb.metadata.get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _relink(remote_images_to_links(cell.source), url, "../")
            continue
        if cell.cell_type != "code":
            continue
        metadata = cell.setdefault("metadata", {})
        hidden = HIDE_INPUT_TAG in metadata.get("tags", [])
        if metadata.get("jupyter", {}).get("source_hidden"):
            hidden = True
            metadata.setdefault("tags", []).append(HIDE_INPUT_TAG)
        if hidden:
            metadata.setdefault("mystnb", {})["code_prompt_show"] = hidden_input_label(cell)
            metadata["mystnb"]["code_prompt_hide"] = "Hide the code"
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_MIME in data:
                model_id = data[WIDGET_MIME].get("model_id", "")
                outputs.append(
                    nbformat.v4.new_output(
                        "display_data", data={"text/markdown": f"```{{note}}\n{WIDGET_NOTE}\n```"}
                    )
                )
                outputs += [nbformat.from_dict(o) for o in _widget_outputs(model_id, states)]
                continue
            outputs.append(out)
        for out in outputs:
            if out.get("output_type") == "stream":
                out["text"] = scrub(_text(out["text"]), names)
            elif out.get("output_type") == "error":
                out["traceback"] = [scrub(line, names) for line in out.get("traceback", [])]
                out["evalue"] = scrub(_text(out.get("evalue", "")), names)
            for mime in ("text/plain", "text/markdown", "text/html", "image/svg+xml"):
                if mime in out.get("data", {}):
                    text = scrub(_text(out["data"][mime]), names)
                    if mime in ("text/html", "image/svg+xml"):
                        text = drop_remote_resources(text)
                    out["data"][mime] = text
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)  # the state would make myst-nb load ipywidgets' scripts
    return nb


CONF = """\
# Written by scripts/build_site.py: the Sphinx configuration of the notebooks' site.
project = {title!r}
author = "kda-notebooks"
copyright = "kda-notebooks contributors, Apache-2.0"
extensions = ["myst_nb", "sphinx_copybutton", "sphinx-mathjax-offline"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
# render the outputs papermill stored; execute nothing
nb_execution_mode = "off"
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown(...) outputs with $math$
nb_ipywidgets_js = {{}}  # widgets are replaced by a note: no require.js from a CDN
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_dmath_double_inline = True
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
mathjax3_config = {{"tex": {{"tags": "none"}}}}
html_theme = "sphinx_book_theme"
html_title = {title!r}
html_static_path = ["_static"]
html_last_updated_fmt = None
html_show_sphinx = False
html_theme_options = {{
    "repository_url": {url!r},
    "repository_branch": {branch!r},
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {{"colab_url": "https://colab.research.google.com"}},
    "show_toc_level": 2,
    "home_page_in_toc": True,
    # one search box: the primary sidebar's (the book theme's); the pydata theme under it adds
    # another to the header bar (navbar_persistent) unless told not to. Narrow screens, where
    # the sidebar folds away, keep the article header's search button.
    "navbar_persistent": [],
}}
"""


def _index(pages: list[Page]) -> str:
    items = []
    for page in pages:
        href = f"notebooks/{page.stem}.html"
        thumb = (
            f'<img src="{page.thumbnail}" alt="first figure of {html.escape(page.title)}">'
            if page.thumbnail
            else '<span class="thumb-missing">(no figure)</span>'
        )
        items.append(
            f'<li><a href="{href}">{thumb}</a><div><a href="{href}"><strong>'
            f"{html.escape(page.title)}</strong></a><br>\n\n{page.summary}\n\n</div></li>"
        )
    notebooks = "\n".join(f"notebooks/{page.stem}" for page in pages)
    references = "\n".join(f"{page}" for page in DOC_PAGES.values())
    return (
        f"# {SITE_TITLE}\n\n{INDEX_LEAD}\n\n"
        f'<ol class="notebooks">\n{chr(10).join(items)}\n</ol>\n\n'
        "Symbols follow the [notation table](notation.md). Teachers: [exercises, checkers and "
        "solutions](teaching.md); the library beyond the notebooks: [using it](library.md), "
        "[installing and running](running.md), the [design notes](design.md).\n\n"
        f"```{{toctree}}\n:hidden:\n:caption: Notebooks\n\n{notebooks}\n```\n\n"
        f"```{{toctree}}\n:hidden:\n:caption: Reference\n\n{references}\n```\n"
    )


STYLE = """\
ol.notebooks { list-style: none; padding: 0; }
ol.notebooks li { display: flex; gap: 1rem; align-items: flex-start; padding: 0.8rem 0;
                  border-bottom: 1px solid var(--pst-color-border, #eee); }
ol.notebooks li > a { flex: none; width: 200px; }
ol.notebooks img { width: 200px; border: 1px solid #eee; }
ol.notebooks .thumb-missing { width: 200px; flex: none; color: #888; font-size: 0.8rem; }
/* a printed line longer than the page is wrapped, not hidden behind a scroll bar */
.cell_output pre { white-space: pre-wrap; overflow-wrap: anywhere; }
/* a 1280 px window shows a whole 100-character line of code (the notebooks' limit): narrower
   sidebars and padding than the theme's (20% and 17rem; 2rem), code at 13 px */
html { --pst-sidebar-secondary: 12rem; }
@media (min-width: 992px) {
  .bd-sidebar-primary { flex-basis: 13rem; }
  .bd-sidebar-primary.pst-sidebar-hidden,
  input#pst-primary-sidebar-checkbox:checked ~ .bd-container .bd-sidebar-primary {
    margin-left: -13rem; }
}
.bd-main .bd-content .bd-article-container .bd-article { padding-left: 1.5rem;
                                                          padding-right: 1.5rem; }
.bd-article pre { font-size: 13px; padding: 0.75rem; }
"""


def write_source(notebooks: list[pathlib.Path], source: pathlib.Path) -> list[Page]:
    """Write the Sphinx source folder ``source`` for the executed ``notebooks``."""
    url = notebook_setup.repository_url()
    names = machine_names()
    if source.exists():
        shutil.rmtree(source)
    (source / "notebooks").mkdir(parents=True)
    (source / "_static" / "thumbs").mkdir(parents=True)
    pages = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        title, summary = _title_and_summary(nb, fallback=path.stem)
        png = _first_png(nb)
        thumbnail = None
        if png:
            thumbnail = f"_static/thumbs/{path.stem}.png"
            (source / thumbnail).write_bytes(base64.b64decode(png))
        prepared = prepare_notebook(nb, path.stem, url, names)
        nbformat.write(prepared, source / "notebooks" / path.name)
        pages.append(Page(path.stem, title, summary, thumbnail))
    for name, page in DOC_PAGES.items():
        text = (ROOT / "docs" / name).read_text()
        (source / f"{page}.md").write_text(_relink(text, url, ""))
    (source / "index.md").write_text(_index(pages))
    (source / "_static" / "site.css").write_text(STYLE)
    conf = CONF.format(title=SITE_TITLE, url=url, branch=notebook_setup.BRANCH)
    conf += 'html_css_files = ["site.css"]\n'
    (source / "conf.py").write_text(conf)
    return pages


class _References(html.parser.HTMLParser):
    """The URLs a page loads: script src, link href, img src, iframe src (and source/video)."""

    def __init__(self):
        super().__init__()
        self.loaded: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        key = {"script": "src", "link": "href", "img": "src", "iframe": "src"}.get(tag)
        if key and attrs.get(key):
            self.loaded.append(attrs[key])


def remote_resources(page: pathlib.Path) -> list[str]:
    """What ``page`` would load from another host (script, link, img, iframe; CSS url/import)."""
    parser = _References()
    text = page.read_text(errors="replace")
    parser.feed(text)
    found = [u for u in parser.loaded if _REMOTE.match(u)]
    found += re.findall(r"@import\s+url\(\s*['\"]?((?:https?:)?//[^'\")]+)", text)
    return found


def build_site(
    notebooks: list[pathlib.Path],
    output: pathlib.Path,
    source: pathlib.Path | None = None,
    *,
    quiet: bool = True,
) -> list[pathlib.Path]:
    """Write the site of the executed ``notebooks`` into ``output``.

    Args:
      notebooks: executed ``.ipynb`` files; the site lists them sorted by file name.
      output: the site folder (``output/index.html``, ``output/notebooks/<stem>.html``, ...).
      source: where the Sphinx source folder is written (default ``<output>-src``; rewritten).
      quiet: pass ``-q`` to Sphinx (warnings still print).

    Returns:
      The index and the notebook pages written, the index first.

    Raises:
      ValueError: ``notebooks`` is empty, Sphinx failed, or a page loads something from
        another host (named).
      FileNotFoundError: a notebook does not exist.
    """
    if not notebooks:
        raise ValueError("notebooks is empty: give at least one executed .ipynb")
    notebooks = sorted(notebooks, key=lambda p: p.name)
    for path in notebooks:
        if not path.is_file():
            raise FileNotFoundError(f"notebook {path} does not exist")
    source = source or output.with_name(output.name + "-src")
    pages = write_source(notebooks, source)
    # a process of its own: Sphinx keeps global state (docutils registries, logging handlers)
    # that must not leak into a caller such as a pytest worker
    command = [sys.executable, "-m", "sphinx", "-b", "html", *(["-q"] if quiet else [])]
    # the themes still call Sphinx APIs deprecated for Sphinx 11: not the reader's concern
    quiet_warnings = "ignore::DeprecationWarning,ignore::PendingDeprecationWarning"
    env = dict(os.environ, PYTHONWARNINGS=quiet_warnings)
    if subprocess.run([*command, str(source), str(output)], env=env).returncode != 0:
        raise ValueError(f"sphinx-build failed on {source} (its messages are above)")
    written = [output / "index.html"] + [output / "notebooks" / f"{p.stem}.html" for p in pages]
    for page in sorted(output.rglob("*.html")):
        remote = remote_resources(page)
        if remote:
            raise ValueError(f"{page} loads from another host: {remote}")
    return written


def folder_problem(path: str | None) -> str | None:
    """Why ``path`` cannot be a folder to write into (None: it can, or ``path`` is None): it
    is empty, or it cannot be created (a parent is a file, a link to nowhere) or written to.
    Creates the folder (as writing into it would) to find out."""
    if path is None:
        return None
    if not path:
        return "the path is empty"
    try:
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        return f"cannot write into {path!r}: {error}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path, help="executed .ipynb files")
    parser.add_argument("--output", "-o", default="build/html", help="the site's folder")
    parser.add_argument("--source", default=None, help="Sphinx source folder (<output>-src)")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.notebooks if not path.is_file()]
    if missing:
        parser.error(f"notebooks: no such file {missing}")
    for option in ("output", "source"):
        problem = folder_problem(getattr(args, option))
        if problem:
            parser.error(f"--{option}: {problem}")
    start = time.perf_counter()
    source = args.source and pathlib.Path(args.source)
    written = build_site(args.notebooks, pathlib.Path(args.output), source)
    print(
        f"site: {written[0]} ({len(written) - 1} notebook pages, "
        f"{time.perf_counter() - start:.0f} s; open it from disk or serve the folder)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
