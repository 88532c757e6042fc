"""The notebooks' Colab badge and setup-cell install block, derived from one repository URL.

The URL lives in one place: ``[project.urls] Repository`` in pyproject.toml. From it come

* each notebook's badge (in its opening markdown cell)::

    [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/OWNER/NAME/blob/main/notebooks/NN_name.ipynb)

* the README's ``pip install git+URL`` and ``git clone URL`` commands and its Colab links;
* each notebook's link to the notation table, ``docs/NOTATION.md`` on GitHub (a relative link
  is broken on Colab, which opens the notebook alone);
* the install block of its setup cell (:data:`INSTALL_BLOCK`, with ``git+URL`` and the modules
  that notebook needs, :func:`needed_modules`), which takes kda_lib from the checkout the notebook
  sits in, or installs it where it is missing, and then what else that notebook needs for the
  machine's accelerator through ``kda_lib/teaching/install.py``.

Commands (``make repository-url URL=...`` runs the second, ``make sync`` the third, each then
``jupytext --sync``)::

    python scripts/notebook_setup.py --check                 # exit 1 naming what disagrees
    python scripts/notebook_setup.py --set-repository-url https://github.com/OWNER/NAME
    python scripts/notebook_setup.py --write                 # after a change of INSTALL_BLOCK

tests/teaching/test_notebooks.py asserts that every notebook agrees with pyproject.toml.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
README = ROOT / "README.md"
NOTEBOOK_DIR = ROOT / "notebooks"
BRANCH = "main"  # the branch Colab opens the notebooks from
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
_GITHUB = re.compile(r"^https://github\.com/(?P<owner>[\w.-]+)/(?P<name>[\w.-]+?)(\.git)?/?$")
_BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
# a notebook's install block: from its first line to the end of its cell (jupytext's `# %%`)
_INSTALL_REGION = re.compile(r"^import importlib\.util\n.*?\n(?=\n# %%)", re.S | re.M)
_NOTATION_LINK = re.compile(r"\[`docs/NOTATION\.md`\]\([^)]*\)")
# a link from a notebook to a file of this repository (DESIGN's engineering notes, NOTATION,
# its worked solutions)
_DOCS_LINK = re.compile(
    r"(https://github\.com/[\w.-]+/[\w.-]+)/blob/[\w.-]+/(?:docs|notebooks/solutions)/"
)
_PYPROJECT_URL = re.compile(r'^Repository = "[^"]*"$', re.MULTILINE)
# the README's install and clone commands, and its Colab links (owner/name)
_README_URL = re.compile(r"(?:git\+|git clone )(https://github\.com/[\w.-]+/[\w.-]+)")
_README_COLAB = re.compile(r"https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/")

# The setup cell's install block, the same in every notebook but for NEEDED. find_spec looks
# for kda_lib and what that notebook imports without importing them: a missing one (a fresh
# runtime, or an install cut short that left kda_lib without jax) installs what is missing. In a
# checkout (the notebook's folder or the one above it holds kda_lib/) kda_lib is imported from
# there, not installed: its folder goes at the end of sys.path, so an installed kda_lib wins.
# The installer runs by path because `import kda_lib` needs jax; it leaves out what this Python
# cannot install (tokamax below Python 3.12) with a one-line note. (A module pip has just put in
# site-packages is found without importlib.invalidate_caches(): the import system re-reads a
# folder whose modification time changed, and pip runs for seconds.) A failing pip ends the cell
# with one line (InstallFailed: pip's reason and the command to run by hand), not pip's output
# and a traceback. (scipy, which kda_lib.lab needs, is a requirement of jax and of kda_lib's core)
BASE_MODULES = ("kda_lib", "jax", "flax", "optax", "numpy", "matplotlib")
# beyond the base, by notebook: 02's sliders (ipywidgets), 03's timing of tokamax's chunked
# form beside kda_lib's (tokamax)
MORE_MODULES = {
    "02_gating_and_decay": ("ipywidgets",),
    "03_chunkwise_algorithm": ("tokamax",),
}
NEEDED_MODULES = tuple(dict.fromkeys(BASE_MODULES + sum(MORE_MODULES.values(), ())))
INSTALL_BLOCK = """\
import importlib.util
import os
import runpy
import subprocess
import sys

NEEDED = ({needed})
sys.path += [d for d in map(os.path.abspath, (".", "..")) if os.path.isdir(f"{{d}}/kda_lib")][:1]
if missing := [name for name in NEEDED if importlib.util.find_spec(name) is None]:
    if "kda_lib" in missing:  # not installed, and no checkout here or a folder up: install it
        KDA_LIB_SOURCE = "{source}"
        print(f"Installing kda_lib from {{KDA_LIB_SOURCE}} (about 10 s) ...", flush=True)
        pip = [sys.executable, "-m", "pip", "install", "-qq", "--no-color", "--no-deps"]
        done = subprocess.run([*pip, KDA_LIB_SOURCE], capture_output=True, text=True)
        why = [s for s in done.stderr.split("\\n") if s.strip().startswith(("fatal:", "ERROR:"))]
        if done.returncode:  # one line: pip's reason and what to run instead (no traceback)
            error = RuntimeError(f"pip could not install kda_lib ({{[*why, '?'][0].strip()}}); "
                                 f"run `pip install {{KDA_LIB_SOURCE}}` to see pip's whole output")
            error._render_traceback_ = lambda: [f"InstallFailed: {{error}}"]  # how Jupyter shows it
            raise error
    (kda_lib_dir,) = importlib.util.find_spec("kda_lib").submodule_search_locations
    runpy.run_path(f"{{kda_lib_dir}}/teaching/install.py")["install_dependencies"](missing=missing)
"""
SETUP_CALL = "kda_lib.teaching.notebook.setup(...)"
# the call on a line of its own (a comment that names it is not a call)
CALLS_SETUP = re.compile(r"^kda_lib\.teaching\.notebook\.setup\(", re.MULTILINE)


def repository_url(pyproject: pathlib.Path = PYPROJECT) -> str:
    """``[project.urls] Repository`` of ``pyproject``; KeyError naming the key if it is absent."""
    urls = tomllib.loads(pyproject.read_text())["project"].get("urls", {})
    if "Repository" not in urls:
        raise KeyError(f"{pyproject}: [project.urls] has no Repository entry")
    return _checked(urls["Repository"])


def _checked(url: str) -> str:
    if not _GITHUB.match(url):
        raise ValueError(
            f"url must look like https://github.com/OWNER/NAME (Colab opens "
            f"notebooks from GitHub), got {url!r}"
        )
    return url.rstrip("/").removesuffix(".git")


def colab_url(url: str, notebook: str) -> str:
    """Colab's address of ``notebooks/<notebook>`` (an ``.ipynb`` file name) on :data:`BRANCH`."""
    match = _GITHUB.match(_checked(url))
    return (
        f"https://colab.research.google.com/github/{match['owner']}/{match['name']}"
        f"/blob/{BRANCH}/notebooks/{notebook}"
    )


def badge(url: str, notebook: str) -> str:
    """The markdown Colab badge linking to ``notebook`` (an ``.ipynb`` file name)."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(url, notebook)})"


def notation_link(url: str) -> str:
    """The markdown link to the notation table on :data:`BRANCH` of the repository."""
    return f"[`docs/NOTATION.md`]({_checked(url)}/blob/{BRANCH}/docs/NOTATION.md)"


def solutions_link(url: str, notebook: str) -> str:
    """The markdown link to the worked solutions of ``notebook`` (``NN_name``, any suffix),
    ``notebooks/solutions/chNN.py`` on :data:`BRANCH` (a relative link is broken on Colab)."""
    path = f"notebooks/solutions/ch{notebook[:2]}.py"
    return f"[`{path}`]({_checked(url)}/blob/{BRANCH}/{path})"


def needed_modules(notebook: str) -> tuple[str, ...]:
    """The modules the install cell of ``notebook`` (``NN_name``, any suffix) checks for:
    :data:`BASE_MODULES` and that notebook's :data:`MORE_MODULES`."""
    return BASE_MODULES + MORE_MODULES.get(pathlib.Path(notebook).stem, ())


def install_block(url: str, notebook: str) -> str:
    """The setup cell's install block of ``notebook`` (``NN_name``, any suffix), installing
    kda_lib from ``git+url`` where no checkout or installed kda_lib is there."""
    needed = ", ".join(f'"{name}"' for name in needed_modules(notebook))
    return INSTALL_BLOCK.format(source=f"git+{_checked(url)}", needed=needed)


def problems(source: pathlib.Path, url: str) -> list[str]:
    """What in the notebook ``source`` (a jupytext ``.py``) disagrees with ``url``; [] if none."""
    text = source.read_text()
    found = []
    ipynb = source.with_suffix(".ipynb").name
    badges = _BADGE.findall(text)
    if badges != [badge(url, ipynb)]:
        found.append(f"{source.name}: want exactly one badge {badge(url, ipynb)!r}, found {badges}")
    if install_block(url, source.name) not in text:
        found.append(
            f"{source.name}: the setup cell lacks the install block for {url} "
            "(scripts/notebook_setup.py INSTALL_BLOCK)"
        )
    links = _NOTATION_LINK.findall(text)
    if links != [notation_link(url)]:
        found.append(f"{source.name}: want one link {notation_link(url)!r}, found {links}")
    solutions = solutions_link(url, source.name)
    if "solutions/ch" in text.replace(solutions, ""):
        found.append(f"{source.name}: names its solutions other than as the link {solutions!r}")
    others = sorted({o for o in _DOCS_LINK.findall(text) if o != _checked(url)})
    if others:
        found.append(f"{source.name}: links to docs/ of {others}, not of {url}")
    if not CALLS_SETUP.search(text):
        found.append(f"{source.name}: the setup cell does not call {SETUP_CALL}")
    return found


def readme_problems(url: str, readme: pathlib.Path = README) -> list[str]:
    """The README's install/clone commands that name another address than ``url``."""
    text = readme.read_text()
    found = [f"{readme.name}: {o} is not {url}" for o in _README_URL.findall(text) if o != url]
    slug = _checked(url).removeprefix("https://github.com/")
    found += [
        f"{readme.name}: a Colab link opens {other}, not {slug}"
        for other in _README_COLAB.findall(text)
        if other != slug
    ]
    return found


def set_repository_url(
    url: str,
    sources: list[pathlib.Path],
    pyproject: pathlib.Path = PYPROJECT,
    readme: pathlib.Path = README,
) -> None:
    """Write ``url`` into ``pyproject``, every notebook's badge, install block
    (:data:`INSTALL_BLOCK`, rewritten whole), notation link and links to ``docs/``, and the
    README's commands (where they name the address ``pyproject`` held)."""
    url = _checked(url)
    old_url = repository_url(pyproject)
    text = pyproject.read_text()
    if len(_PYPROJECT_URL.findall(text)) != 1:
        raise ValueError(f"{pyproject}: want one line 'Repository = \"...\"' under [project.urls]")
    pyproject.write_text(_PYPROJECT_URL.sub(f'Repository = "{url}"', text))
    for source in sources:
        ipynb = source.with_suffix(".ipynb").name
        text = _BADGE.sub(lambda _, n=ipynb: badge(url, n), source.read_text())
        if len(_INSTALL_REGION.findall(text)) != 1:
            raise ValueError(f"{source}: want one install block (from 'import importlib.util')")
        text = _INSTALL_REGION.sub(lambda _, n=source.name: install_block(url, n), text)
        text = _NOTATION_LINK.sub(lambda _: notation_link(url), text)
        text = _DOCS_LINK.sub(lambda m: m.group(0).replace(m.group(1), url), text)
        source.write_text(text)
    text = _README_URL.sub(lambda m: m.group(0).replace(old_url, url), readme.read_text())
    old_slug, slug = (u.removeprefix("https://github.com/") for u in (old_url, url))
    text = _README_COLAB.sub(lambda m: m.group(0).replace(old_slug, slug), text)
    readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="report disagreements (exit 1)")
    group.add_argument("--set-repository-url", metavar="URL", help="https://github.com/O/N")
    group.add_argument(
        "--write", action="store_true", help="rewrite the notebooks' badges and install blocks"
    )
    args = parser.parse_args(argv)
    if args.set_repository_url is not None:
        try:
            _checked(args.set_repository_url)
        except ValueError as error:
            parser.error(f"--set-repository-url: {error}")
    sources = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
    if args.write:
        args.set_repository_url = repository_url()
    if args.set_repository_url:
        set_repository_url(args.set_repository_url, sources)
        print(
            f"{PYPROJECT.name} and {len(sources)} notebooks now use {args.set_repository_url}; "
            "run `make sync` to update the .ipynb twins"
        )
        return 0
    url = repository_url()
    found = [p for source in sources for p in problems(source, url)] + readme_problems(url)
    print("\n".join(found) or f"{len(sources)} notebooks agree with {url}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
