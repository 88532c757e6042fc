"""The static site of scripts/build_site.py, built from two small notebooks executed here.

The notebooks hold what the real ones hold: a title, a Colab badge, inline and display math, a
plotting cell tagged ``hide-input``, an ipywidget and printed text. The checks: the index lists
both in file-name order with a thumbnail, math is MathML, the plotting code is folded away, the
widget's place holds a note, and no page loads a script or stylesheet from another host (an
offline reader, a TPU VM without egress, sees the same page).
"""

from __future__ import annotations

import html.parser
import pathlib
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
import build_site  # noqa: E402  (scripts/ is no package)

BADGE = (
    "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
    "(https://colab.research.google.com/github/o/n/blob/main/notebooks/{name}.ipynb)"
)
REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)


def _notebook(name: str, title: str, with_widget: bool) -> nbformat.NotebookNode:
    cells = [
        nbformat.v4.new_markdown_cell(
            f"# {title}\n\n**Claim.** The state obeys $S_t = S_{{t-1}} + k_t v_t^\\top$ for "
            f"every token. A second sentence.\n\n{BADGE.format(name=name)}\n\n"
            "$$\n\\begin{aligned} \\beta_t &\\in (0, 1), \\\\ \\sum_{i=1}^{T} \\alpha_i^2 &\\le T"
            "\n\\end{aligned}\n$$"
        ),
        nbformat.v4.new_code_cell("seed = 0", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print('checked:', 2 + 2)"),
        nbformat.v4.new_code_cell(
            "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(3, 2))\n"
            "ax.plot([0, 1, 4])\nplt.show()",
            metadata={"tags": ["hide-input"]},
        ),
    ]
    if with_widget:
        cells.append(nbformat.v4.new_code_cell("import ipywidgets\nipywidgets.IntSlider(3)"))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    return nb


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("executed")
    paths = []
    # written in reverse order: the index must sort them
    for name, title, widget in (
        ("01_second", "01 · The second one", False),
        ("00_first", "00 · The first one", True),
    ):
        nb = _notebook(name, title, widget)
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={}).execute()
        paths.append(folder / f"{name}.ipynb")
        nbformat.write(nb, paths[-1])
    output = tmp_path_factory.mktemp("site")
    written = build_site.build_site(paths, output)
    return output, written


class _References(html.parser.HTMLParser):
    """Collects the URLs of scripts, stylesheets (any <link>) and images of a page."""

    def __init__(self):
        super().__init__()
        self.scripts, self.links, self.images = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])
        elif tag == "link" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag == "img":
            self.images.append(attrs.get("src", ""))


def _references(page: pathlib.Path) -> _References:
    parser = _References()
    parser.feed(page.read_text())
    return parser


def test_index_lists_the_notebooks_in_order_with_thumbnails(site):
    output, written = site
    assert [p.name for p in written] == ["index.html", "00_first.html", "01_second.html"]
    index = (output / "index.html").read_text()
    assert index.index("00 · The first one") < index.index("01 · The second one")
    assert "The state obeys" in index and "A second sentence" not in index  # one line each
    thumbnails = _references(output / "index.html").images
    assert len(thumbnails) == 2 and all((output / t).is_file() for t in thumbnails)


def test_math_is_mathml_and_plotting_code_is_folded(site):
    output, _ = site
    page = (output / "00_first.html").read_text()
    assert page.count("<math") == 2 and 'display="block"' in page, "inline + display math"
    assert "<mtable" in page and "&amp;" not in page, "the aligned rows are a table"
    assert "$$" not in page and "S_t" not in page, "raw TeX left on the page"
    folded = re.search(r"<details class=\"hidden-input\">.*?</details>", page, re.S)
    assert folded and "subplots" in folded.group(0)
    assert "<img" in page[folded.end() :], "the figure itself is shown"
    assert ">print<" in page and "checked: 4" in page


def test_widget_place_holds_a_note(site):
    output, _ = site
    assert build_site.WIDGET_NOTE in (output / "00_first.html").read_text()
    assert build_site.WIDGET_NOTE not in (output / "01_second.html").read_text()


def test_no_page_loads_anything_from_another_host(site):
    output, written = site
    for page in written:
        refs = _references(page)
        remote = [u for u in refs.scripts + refs.links + refs.images if REMOTE.match(u)]
        assert not remote, f"{page.name} references {remote}"
        assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", page.read_text())
    page = (output / "00_first.html").read_text()
    assert ">Open In Colab</a>" in page, "the badge image becomes a text link"


def test_remote_scripts_in_outputs_are_left_out():
    fragment = '<div>x</div><script src="https://cdn.example/lib.js"></script><script>1</script>'
    cleaned = build_site._drop_remote_resources(fragment)
    assert "cdn.example" not in cleaned and "<script>1</script>" in cleaned


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="notebooks is empty"):
        build_site.build_site([], tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.ipynb"):
        build_site.build_site([tmp_path / "missing.ipynb"], tmp_path)
    for bad, why in (
        ("x^", "MissingSuperScript"),
        ("\\eqref{x}", "unsupported \\\\eqref"),
        ("a &= b", "outside an alignment"),
        ("a \\\\ b", "line break"),
    ):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# t\n\n${bad}$")])
        nbformat.write(nb, tmp_path / "bad.ipynb")
        with pytest.raises(ValueError, match=rf"bad.ipynb: cannot typeset .*{why}"):
            build_site.build_site([tmp_path / "bad.ipynb"], tmp_path / "out")
