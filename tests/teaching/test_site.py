"""The site of scripts/build_site.py (Sphinx + myst-nb, book theme), built from two small
notebooks executed here.

The notebooks hold what the real ones hold: a title, a Colab badge, a link to the notation table
on GitHub, inline and display math (bold vectors, blackboard letters, an aligned block), the
install cell and a plotting cell tagged ``hide-input``, sliders whose output widget draws a
figure, a line printing the checkout's path, and a cell asking whether it may start a widget.
The checks: the index lists both in file-name order with a line and a thumbnail; the theme
gives a table of contents, prev/next, search, copy buttons and a Colab button; math is left as
TeX for MathJax, which the site serves itself; folds say what they hide; the widget's place
holds a note and the figure it drew; the docs pages are pages; no page loads anything from
another host or names this machine; the content column is wide enough for a 100-character
line of code. How the math looks in a real browser is checked by ``make check-browser``
(scripts/check_browser.py).
"""

from __future__ import annotations

import html
import pathlib
import re
import socket
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import build_site  # noqa: E402  (scripts/ is no package)
import notebook_setup  # noqa: E402

URL = notebook_setup.repository_url()
INSTALL = "# Install: where kda_lib is missing, install it\nimport importlib.util\n" + (
    'if importlib.util.find_spec("kda_lib") is None:\n    pass'
)
SLIDERS = (
    "import ipywidgets, matplotlib.pyplot as plt\n"
    "def draw(n):\n    fig, ax = plt.subplots(figsize=(2, 1))\n    ax.plot(range(n))\n"
    "    plt.show()\n"
    "display(ipywidgets.interactive_output(draw, {'n': ipywidgets.IntSlider(3)}))"
)

NO_FRONTEND = (
    "import os\nfrom kda_lib.teaching import notebook\n"
    "os.environ.pop(notebook.NONINTERACTIVE_ENV, None)\n"
    "print('may start a widget:', notebook.interactive())"
)


def _notebook(name: str, title: str, with_widget: bool) -> nbformat.NotebookNode:
    cells = [
        nbformat.v4.new_markdown_cell(
            f"# {title}\n\n**Claim.** The state obeys $S_t = S_{{t-1}} + \\mathbf k_t "
            f"\\mathbf v_t^\\top$ in $\\mathbb R^{{d_k \\times d_v}}$ for every token. A second "
            f"sentence.\n\n{notebook_setup.badge(URL, name + '.ipynb')}\n\n"
            f"Symbols follow {notebook_setup.notation_link(URL)}.\n\n"
            "$$\n\\begin{aligned} \\beta_t &\\in (0, 1), \\\\ \\sum_{i=1}^{T} \\alpha_i^2 &\\le T"
            "\n\\end{aligned}\n$$"
        ),
        nbformat.v4.new_code_cell("seed = 0", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(INSTALL, metadata={"tags": ["hide-input"]}),
        nbformat.v4.new_code_cell(
            "import os, socket\nprint('checked:', 2 + 2, 'from', os.getcwd(), 'on', "
            "socket.gethostname())"
        ),
        nbformat.v4.new_code_cell(
            "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(3, 2))\n"
            "ax.plot([0, 1, 4])\nplt.show()",
            metadata={"tags": ["hide-input"]},
        ),
        nbformat.v4.new_markdown_cell("## A section\n\nMore text."),
    ]
    if with_widget:
        cells.append(nbformat.v4.new_code_cell(SLIDERS, metadata={"tags": ["hide-input"]}))
    else:  # what a notebook asks before it starts a widget, run through nbclient as papermill
        cells.append(nbformat.v4.new_code_cell(NO_FRONTEND))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    return nb


# one worker builds the site once for every test that reads it (session scope: the worker may
# run other modules' tests between this module's, which would tear a module fixture down)
pytestmark = pytest.mark.xdist_group("site")


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("executed")
    paths = []
    # written in reverse order: the index must sort them
    for name, title, widget in (
        ("01_second", "01 · The second one", False),
        ("00_first", "00 · The first one", True),
    ):
        nb = _notebook(name, title, widget)
        resources = {"metadata": {"path": str(ROOT)}}  # run in the checkout: it prints its path
        NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources).execute()
        paths.append(folder / f"{name}.ipynb")
        nbformat.write(nb, paths[-1])
    output = tmp_path_factory.mktemp("site") / "html"
    written = build_site.build_site(paths, output)
    return output, written


def _page(output, name):
    return (output / name).read_text()


def test_index_lists_the_notebooks_in_order_with_a_line_and_a_thumbnail(site):
    output, written = site
    assert [p.relative_to(output).as_posix() for p in written] == [
        "index.html",
        "notebooks/00_first.html",
        "notebooks/01_second.html",
    ]
    index = _page(output, "index.html")
    listing = index[index.index('<ol class="notebooks">') :]
    assert listing.index("00 · The first one") < listing.index("01 · The second one")
    assert "The state obeys" in listing and "A second sentence" not in listing  # one line each
    thumbnails = re.findall(r'<img src="(_static/thumbs/[^"]+)"', listing)
    assert len(thumbnails) == 2 and all((output / t).is_file() for t in thumbnails)


def test_theme_gives_toc_prev_next_search_copy_and_colab(site):
    output, _ = site
    page = _page(output, "notebooks/00_first.html")
    toc = page[page.index('id="pst-primary-sidebar"') :]
    pages = [f"{page}.html" for page in build_site.DOC_PAGES.values()]
    for target in ("01_second.html", *pages):
        assert target in toc, f"the table of contents lacks {target}"
    assert re.search(r'class="[^"]*prev-next[^"]*"', page) and "01_second.html" in page
    assert (output / "search.html").is_file() and (output / "searchindex.js").is_file()
    assert "copybutton.js" in page
    colab = f"https://colab.research.google.com/github/{URL.removeprefix('https://github.com/')}"
    assert f"{colab}/blob/main/notebooks/00_first.ipynb" in page, "the Colab launch button"
    assert 'id="pst-page-navigation-heading' in page or "A section" in page  # in-page outline


def test_one_search_box_per_page(site):
    """The book theme's sidebar search field, and no second one in the header bar (the pydata
    theme's navbar_persistent); the search dialog both open holds the one search input (the
    search page has its own form besides)."""
    output, _ = site
    pages = [p for p in sorted(output.rglob("*.html")) if p.parent.name != "_static"]
    assert len(pages) >= 6
    for page in pages:
        text = page.read_text()
        fields = re.findall(r'<button class="[^"]*\bsearch-button-field\b[^"]*"', text)
        inputs = re.findall(r'<input\b[^>]*\btype="search"', text)
        assert len(fields) == 1, f"{page.name}: {len(fields)} search boxes"
        assert "navbar-persistent" not in text, f"{page.name}: a search box in the header bar"
        assert len(inputs) == (2 if page.name == "search.html" else 1), page.name


def test_math_is_tex_for_the_mathjax_the_site_serves(site):
    output, _ = site
    page = _page(output, "notebooks/00_first.html")
    assert "\\mathbf k_t" in page and "\\mathbb R" in page and "\\begin{aligned}" in page
    assert '<span class="math notranslate nohighlight">' in page
    assert "$$" not in page and "$S_t" not in page, "dollar signs left for nobody to typeset"
    (script,) = re.findall(r'<script[^>]*src="([^"]*tex-chtml\.js)"', page)
    assert not script.startswith(("http", "//"))
    mathjax = (output / "notebooks" / script).resolve()
    assert mathjax.is_file(), "MathJax is served from the site folder"
    fonts = list(mathjax.parent.glob("output/chtml/fonts/woff-v2/*.woff"))
    assert len(fonts) > 10, "MathJax's fonts are served from the site folder"


def test_folds_say_what_they_hide(site):
    output, _ = site
    page = _page(output, "notebooks/00_first.html")
    folds = re.findall(r"<details.*?</details>", page, re.S)
    labels = [re.search(r"Show the [^<]*", fold).group(0) for fold in folds]
    assert labels == [
        "Show the install cell (installs kda_lib and its dependencies where missing)",
        "Show the code of this figure",
        "Show the code of the sliders",
    ]
    assert "subplots" in folds[1] and "find_spec" in folds[0]
    assert "<img" in page[page.index(folds[1]) + len(folds[1]) :], "the figure itself is shown"
    assert "checked: 4" in page


def test_widget_place_holds_a_note_and_what_it_drew(site):
    output, _ = site
    page = _page(output, "notebooks/00_first.html")
    assert build_site.WIDGET_NOTE.split(":")[0] in page
    after = page[page.index(build_site.WIDGET_NOTE.split(":")[0]) :]
    assert "<img" in after, "the figure the output widget drew is shown under the note"
    assert "widget-view+json" not in page
    assert build_site.WIDGET_NOTE.split(":")[0] not in _page(output, "notebooks/01_second.html")


def test_a_notebook_run_without_a_frontend_starts_no_widget(site):
    """nbclient (papermill's executor) gives the kernel no stdin: no widget, whatever the
    environment says (tests/teaching/test_batch_runs.py checks the switches themselves)."""
    output, _ = site
    assert "may start a widget: False" in _page(output, "notebooks/01_second.html")


def test_a_1280_px_window_shows_a_100_character_line_of_code():
    """The site's layout at 1280 px (15 of them a scroll bar): both sidebars, the article's and
    the code block's padding and border, and 100 characters at DejaVu Sans Mono's advance
    (0.602 em) fit. (In Chromium 150 the code block is then 813 px wide and shows such a line
    whole; the theme's own layout cut it at about 78 characters.)"""

    def number(pattern):
        return float(re.search(pattern, build_site.STYLE).group(1))

    rem = 16
    sidebars = number(r"--pst-sidebar-secondary: ([\d.]+)rem") + number(r"flex-basis: ([\d.]+)rem")
    article = 2 * number(r"\.bd-article \{ padding-left: ([\d.]+)rem")
    font = number(r"\.bd-article pre \{ font-size: (\d+)px")
    code_box = 2 * number(r"\.bd-article pre \{[^}]*padding: ([\d.]+)rem") * rem + 2 + 3
    assert (sidebars + article) * rem + code_box + 100 * 0.602 * font <= 1280 - 15


def test_the_docs_are_pages_and_the_notation_link_stays_on_the_site(site):
    output, _ = site
    for name, page in build_site.DOC_PAGES.items():
        title = (ROOT / "docs" / name).read_text().splitlines()[0].removeprefix("# ")
        assert html.escape(title, quote=False) in _page(output, f"{page}.html"), name
    assert 'href="running.html#the-site"' in _page(output, "teaching.html"), "links between pages"
    page = _page(output, "notebooks/00_first.html")
    assert 'href="../notation.html"' in page
    assert f"{URL}/blob/main/docs/NOTATION.md" not in page


def test_no_page_loads_anything_from_another_host_or_names_this_machine(site):
    output, _ = site
    pages = sorted(output.rglob("*.html"))
    assert len(pages) >= 6
    for page in pages:
        assert build_site.remote_resources(page) == [], page.name
        text = page.read_text()
        assert str(ROOT) not in text and str(pathlib.Path.home()) + "/" not in text, page.name
        host = socket.gethostname()
        assert len(host) < 4 or host not in text, page.name
    page = _page(output, "notebooks/00_first.html")
    assert "colab-badge.svg" not in page and "Open In Colab</a>" in page, "badge -> text link"
    assert "checked: 4 from &lt;checkout&gt; on" in page, "the checkout's path is replaced"


def test_remote_resources_are_found_and_left_out(tmp_path):
    fragment = '<div>x</div><script src="https://cdn.example/lib.js"></script><script>1</script>'
    cleaned = build_site.drop_remote_resources(fragment)
    assert "cdn.example" not in cleaned and "<script>1</script>" in cleaned
    page = tmp_path / "p.html"
    for tag, remote in (
        ('<script src="https://cdn.example/a.js"></script>', "https://cdn.example/a.js"),
        ('<link rel="stylesheet" href="//cdn.example/a.css">', "//cdn.example/a.css"),
        ('<img src="http://x.example/i.png">', "http://x.example/i.png"),
        ('<iframe src="https://x.example/"></iframe>', "https://x.example/"),
    ):
        page.write_text(f"<html><body>{tag}<a href='https://ok.example/'>a link</a></body></html>")
        assert build_site.remote_resources(page) == [remote]


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="notebooks is empty"):
        build_site.build_site([], tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.ipynb"):
        build_site.build_site([tmp_path / "missing.ipynb"], tmp_path)


def test_links_to_docs_become_site_pages_keeping_their_section():
    design = build_site.DOC_PAGES["DESIGN.md"]
    text = (
        f"[notes]({URL}/blob/{notebook_setup.BRANCH}/docs/DESIGN.md#engineering-notes-x), "
        f"[table](docs/NOTATION.md), [other](https://github.com/someone/else/blob/main/docs/DESIGN.md)"
    )
    relinked = build_site._relink(text, URL, "../")
    assert f"[notes](../{design}.md#engineering-notes-x)" in relinked
    assert f"[table](../{build_site.DOC_PAGES['NOTATION.md']}.md)" in relinked
    assert "(https://github.com/someone/else/blob/main/docs/DESIGN.md)" in relinked
    # DESIGN's links to a notebook's source open the notebook's page
    assert build_site._relink("[05](../notebooks/05_context_parallel.py)", URL, "") == (
        "[05](notebooks/05_context_parallel.ipynb)"
    )
