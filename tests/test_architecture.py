"""The package's import graph points down only: notebooks -> apps -> layer -> kernel -> maths.

Every module of kda_lib has a layer below; a module may import (at module level or lazily
inside a function) only modules of strictly lower layers. A subpackage (``kda_lib/exercises/``)
is one node of the graph: the imports of all its files together, imports among its own files
left out. This rules out cycles and any import
from the maths (gating, reference, chunked, segments, ...) into the layer, CP, models, training,
benchmark or plotting code. A new module must be given a layer here.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "kda_lib"

LAYERS = {
    # -1: argument checks, used by every module and importing none
    "_checks": -1,
    # 0: leaves - segment ids, norms, gates, platform switches, task data
    "segments": 0,
    "norms": 0,
    "gating": 0,
    "emulation": 0,
    "tasks": 0,
    "corpus": 0,
    "measure": 0,
    "records": 0,
    "significance": 0,
    "params": 0,
    # 1: the maths forms and the tokamax backend
    "reference": 1,
    "chunked": 1,
    "costs": 1,
    "tokamax_backend": 1,
    "testing": 1,
    # 1.5: the registry of implementations, over the forms and under the entry point
    "backends": 1.5,
    # 2: the one entry point; explanatory maths over the oracle
    "kernel": 2,
    "explain": 2,
    # 3: arrays across devices
    "context_parallel": 3,
    "conv": 3,
    # 3.5: checkpoint names and layouts, read into the layer by attribute (the layer offers
    # them as from_fla_state_dict, so the module sits below it, above the conv it converts for)
    "checkpoints": 3.5,
    # 4: the Flax layer (and the MLA mixer, a layer beside it)
    "layer": 4,
    "mla": 4,
    "attention": 4,
    # 5: models built from layers, and the published models' layers as presets
    "models": 5,
    "presets": 5,
    # 6: applications
    "train": 6,
    "scale": 6,
    "generate": 6,
    "viz": 6,
    # 7: the command lines: measurements of the applications, training from the shell
    "bench": 7,
    "train_cli": 7,
    # 8: what users import first; the exercise checkers sit at the notebooks' level
    "notebook": 8,
    "exercises": 8,
    "__init__": 9,
    "__main__": 9,
}
MATHS = {"_checks", "segments", "norms", "gating", "reference", "chunked"}
UPPER = {"layer", "checkpoints", "context_parallel", "models", "train", "bench", "viz"}


def _imports(path: pathlib.Path) -> set[str]:
    """kda_lib modules imported anywhere in ``path`` (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "kda_lib":  # from kda_lib import x, y
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("kda_lib."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kda_lib."):
                    found.add(alias.name.split(".")[1])
    return found & set(MODULES)


SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
MODULES = [p.stem for p in sorted(PACKAGE.glob("*.py"))] + SUBPACKAGES
GRAPH = {p.stem: _imports(p) for p in sorted(PACKAGE.glob("*.py"))}
for _sub in SUBPACKAGES:
    GRAPH[_sub] = set().union(*map(_imports, sorted((PACKAGE / _sub).rglob("*.py")))) - {_sub}


def test_every_module_has_a_layer():
    unknown = sorted(set(GRAPH) - set(LAYERS))
    assert not unknown, f"give these kda_lib modules a layer in LAYERS: {unknown}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module):
    upward = sorted(m for m in GRAPH[module] if LAYERS.get(m, 99) >= LAYERS.get(module, -1))
    assert not upward, f"kda_lib.{module} (layer {LAYERS.get(module)}) imports {upward}"


def test_no_cycles():
    visiting, done = [], set()

    def visit(module):
        if module in visiting:
            cycle = visiting[visiting.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        visiting.append(module)
        for dependency in GRAPH.get(module, ()):
            visit(dependency)
        visiting.pop()
        done.add(module)

    for module in GRAPH:
        visit(module)


def test_maths_never_imports_the_upper_layers():
    for module in MATHS:
        assert not GRAPH[module] & UPPER, (module, GRAPH[module] & UPPER)


def test_subpackages_are_nodes_of_the_graph():
    assert "exercises" in SUBPACKAGES and "exercises" in GRAPH
    # its chapter checkers import the library below it (reference, layer, ...)
    assert {"reference", "layer"} <= GRAPH["exercises"], GRAPH["exercises"]
    # and nothing in the library imports it
    assert not [m for m, deps in GRAPH.items() if "exercises" in deps and m != "__init__"]


def test_the_checker_sees_lazy_imports(tmp_path):
    source = tmp_path / "probe.py"
    lazy = "def f():\n    from kda_lib.layer import KDAConfig\n    import kda_lib.train\n"
    source.write_text(lazy)
    assert _imports(source) == {"layer", "train"}


def test_integer_arguments_are_checked_by_the_one_checker():
    """The test "an int, not a bool" is written once, in _checks.is_int (check_int and
    check_positive_int build on it): no module spells it out again."""
    import re

    spelled_out = re.compile(
        r"isinstance\((\w[\w.]*), \(?(?:bool|np\.bool_)\b.*\n?.*"
        r"isinstance\(\1, (?:int|\(int, np\.integer\))\)"
    )
    # context_parallel.py belongs to issue 26's registry rewrite (s8-i26a), which replaces it
    allowed = {"_checks", "context_parallel"}
    offenders = [
        p.relative_to(PACKAGE).as_posix()
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.stem not in allowed and spelled_out.search(p.read_text())
    ]
    assert not offenders, f"use kda_lib._checks.check_int / is_int in {offenders}"


# ------------------------------------------------------------------ the backend registry

IMPLEMENTATION_NAMES = {
    "auto",
    "recurrent",
    "chunked",
    "tokamax_xla",
    "tokamax_xla_chunked",
    "tokamax_mosaic",
}


def _implementation_comparisons(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` that compare an implementation name as a string: a comparison with a
    variable or attribute named ``*implementation`` or with an implementation name, or
    ``*implementation.startswith(...)``."""

    def names_implementation(node):
        name = getattr(node, "id", None) or getattr(node, "attr", None) or ""
        return name.endswith("implementation")

    def is_name_constant(node):  # "auto" alone is too common a word (progress="auto")
        return isinstance(node, ast.Constant) and node.value in IMPLEMENTATION_NAMES - {"auto"}

    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names_implementation(s) or is_name_constant(s) for s in sides):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
            and names_implementation(node.func.value)
        ):
            lines.append(node.lineno)
    return lines


def test_implementation_names_are_compared_in_the_registry_only():
    found = {
        p.stem: lines
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.stem != "backends"
        and (lines := _implementation_comparisons(p))
    }
    assert not found, f"compare implementation names in kda_lib.backends only: {found}"
    assert _implementation_comparisons(PACKAGE / "backends.py")  # the check sees them


def _imports_tokamax(path: pathlib.Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tokamax":
            return True
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "tokamax" for a in node.names
        ):
            return True
        if (  # importlib.import_module("tokamax...")
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).split(".")[0] == "tokamax"
        ):
            return True
    return False


# emulation.py runs the checks tokamax_backend registers with it and names no tokamax module
TOKAMAX_IMPORTERS = {"tokamax_backend"}


def test_only_the_tokamax_backend_imports_tokamax():
    importers = {p.stem for p in sorted(PACKAGE.rglob("*.py")) if _imports_tokamax(p)}
    assert importers == TOKAMAX_IMPORTERS, importers
