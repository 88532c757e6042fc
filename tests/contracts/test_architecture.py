"""The tree shows the architecture, and this test holds it (docs/DESIGN.md, "The tree").

Every node of kda_lib is a folder (``ops``, ``parallel``, ``layers``, ``models``, ``lab``,
``teaching``) or a top-level module (``checks``, ``testing``). A node may import (at module
level or lazily inside a function) only nodes of strictly lower rank, and itself; inside
``ops/`` the same rule holds between its modules (``ops/tokamax/`` is one node there). So
nothing in ops, parallel, layers or models imports ``lab`` or ``teaching``, and there are no
cycles. A new folder or top-level module must be given a rank here.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "kda_lib"
REGISTRY = PACKAGE / "ops" / "api.py"

# the import ladder, written once: a node imports only from nodes below it
RANKS = {
    "checks": 0,  # argument checks every folder uses
    "ops": 1,  # KDA on arrays: the forms, the contract, the entry point and its table
    "testing": 2,  # random inputs and closeness, shared by tests, benchmarks and notebooks
    "parallel": 3,  # halo exchange, state passing, shard_as
    "layers": 4,  # Flax modules: the KDA layer and its CP program, conv, MLA, attention
    "models": 5,  # the tiny LMs and the published presets
    "lab": 6,  # experiments and command lines
    "teaching": 7,  # what only the notebooks use
    "__init__": 8,  # the public API
}
LIBRARY = ("checks", "ops", "testing", "parallel", "layers", "models")

# inside ops/: leaves, then the forms and tokamax's adapter, then the entry point
OPS_RANKS = {
    "contract": 0,
    "norms": 0,
    "gating": 1,
    "segments": 1,
    "reference": 2,
    "scalar_decay": 2,
    "chunked": 2,
    "tokamax": 2,
    "pallas_tpu": 3,
    "api": 4,
    "__init__": 5,
}


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Dotted names below ``kda_lib`` that ``path`` imports anywhere (module level or inside
    functions): ``from kda_lib.ops import costs`` gives ``ops.costs``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "kda_lib" or node.module.startswith("kda_lib."):
                base = node.module.removeprefix("kda_lib").lstrip(".")
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if base else alias.name)
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("kda_lib.") for a in node.names if a.name.startswith("kda_lib.")
            )
    return found


def _node(relative: str) -> str:
    """``ops/chunked.py`` -> ``ops``; ``checks.py`` -> ``checks``; ``ops.chunked`` -> ``ops``."""
    return relative.replace("/", ".").removesuffix(".py").split(".")[0]


def _ops_node(dotted: str) -> str | None:
    """``ops.tokamax.adapter`` -> ``tokamax``; ``ops.chunked`` -> ``chunked``; ``ops`` -> None
    (the folder's ``__init__``)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


FILES = {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {rel: _imported_modules(path) for rel, path in FILES.items()}


def test_every_node_has_a_rank():
    unknown = sorted({_node(rel) for rel in FILES} - set(RANKS))
    assert not unknown, f"give these kda_lib folders or modules a rank in RANKS: {unknown}"
    in_ops = [rel.removesuffix(".py").replace("/", ".") for rel in FILES if _node(rel) == "ops"]
    unknown_ops = sorted({_ops_node(m) for m in in_ops} - set(OPS_RANKS))
    assert not unknown_ops, f"give these ops modules a rank in OPS_RANKS: {unknown_ops}"


@pytest.mark.parametrize("relative", sorted(FILES))
def test_imports_point_down(relative):
    node = _node(relative)
    upward = sorted(
        m for m in GRAPH[relative] if _node(m) != node and RANKS[_node(m)] >= RANKS[node]
    )
    assert not upward, f"kda_lib/{relative} ({node}, rank {RANKS[node]}) imports {upward}"
    if node == "ops":
        here = _ops_node(relative.removesuffix(".py").replace("/", "."))
        inner = sorted(
            m
            for m in GRAPH[relative]
            if _node(m) == "ops"
            and _ops_node(m) != here
            and OPS_RANKS[_ops_node(m)] >= OPS_RANKS[here]
        )
        assert not inner, f"kda_lib/{relative} ({here} in ops) imports {inner} (OPS_RANKS)"


def test_the_library_never_imports_lab_or_teaching():
    offenders = {
        rel: sorted(m for m in deps if _node(m) in ("lab", "teaching"))
        for rel, deps in GRAPH.items()
        if _node(rel) in LIBRARY
    }
    assert not {rel: m for rel, m in offenders.items() if m}, offenders


def test_the_installer_imports_nothing_from_kda_lib():
    """teaching/install.py runs by path before jax exists (tests/teaching/test_install.py
    runs it with jax, numpy, flax, tokamax and kda_lib blocked)."""
    assert GRAPH["teaching/install.py"] == set()


def test_no_module_level_cycles():
    modules = {rel.removesuffix(".py").replace("/", "."): deps for rel, deps in GRAPH.items()}
    modules = {m.removesuffix(".__init__"): deps for m, deps in modules.items()}

    def edges(module):
        for dep in modules.get(module, ()):
            # `from kda_lib.ops import costs` names the module ops.costs; a name in it, its module
            yield dep if dep in modules else dep.rsplit(".", 1)[0]

    visiting, done = [], set()

    def visit(module):
        if module in visiting:
            cycle = visiting[visiting.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        visiting.append(module)
        for dependency in edges(module):
            if dependency != module:
                visit(dependency)
        visiting.pop()
        done.add(module)

    for module in modules:
        visit(module)


def test_the_checker_sees_lazy_and_package_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "def f():\n    from kda_lib.layers.kda_layer import KDAConfig\n"
        "    import kda_lib.lab.train\n    from kda_lib.ops import costs\n"
    )
    assert _imported_modules(source) == {"layers.kda_layer.KDAConfig", "lab.train", "ops.costs"}
    assert {_node(m) for m in _imported_modules(source)} == {"layers", "lab", "ops"}


def test_integer_arguments_are_checked_by_the_one_checker():
    """The test "an int, not a bool" is written once, in checks.is_int (check_int and
    check_positive_int build on it): no module spells it out again."""
    import re

    spelled_out = re.compile(
        r"isinstance\((\w[\w.]*), \(?(?:bool|np\.bool_)\b.*\n?.*"
        r"isinstance\(\1, (?:int|\(int, np\.integer\))\)"
    )
    offenders = [
        p.relative_to(PACKAGE).as_posix()
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "checks.py" and spelled_out.search(p.read_text())
    ]
    assert not offenders, f"use kda_lib.checks.check_int / is_int in {offenders}"


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


def test_implementation_names_are_compared_in_the_dispatch_only():
    found = {
        p.relative_to(PACKAGE).as_posix(): lines
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != REGISTRY and (lines := _implementation_comparisons(p))
    }
    assert not found, f"compare implementation names in kda_lib.ops.api only: {found}"
    assert _implementation_comparisons(REGISTRY)  # the check sees them


def _imports_private(path: pathlib.Path, prefix: str) -> bool:
    """Does ``path`` import ``prefix`` (``tokamax``, ``jax._src``) or a module below it, by
    statement or by ``importlib.import_module("...")``?"""

    def below(name: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    def own_submodule(call) -> bool:  # import_module(f"{__name__}.x"): below the file itself
        arg = call.args[0] if call.args else None
        first = arg.values[0] if isinstance(arg, ast.JoinedStr) and arg.values else None
        return getattr(getattr(first, "value", None), "id", None) == "__name__"

    tree = ast.parse(path.read_text())
    imports_by_name = any(
        isinstance(n, ast.Call)
        and getattr(n.func, "attr", None) == "import_module"
        and not own_submodule(n)
        for n in ast.walk(tree)
    )
    for node in ast.walk(tree):
        if imports_by_name and isinstance(node, ast.Constant) and below(str(node.value)):
            return True  # a module named in a table that import_module(name) resolves
        if isinstance(node, ast.ImportFrom) and below(node.module or ""):
            return True
        if isinstance(node, ast.Import) and any(below(a.name) for a in node.names):
            return True
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and below(str(node.args[0].value))
        ):
            return True
    return False


@pytest.mark.parametrize("prefix", ["tokamax", "jax._src"])
def test_only_the_tokamax_folder_and_the_emulation_import_tokamax_or_private_jax(prefix):
    importers = {
        p.relative_to(PACKAGE).as_posix()
        for p in sorted(PACKAGE.rglob("*.py"))
        if _imports_private(p, prefix)
    }
    assert importers, f"the check sees no import of {prefix}"
    outside = sorted(i for i in importers if not i.startswith(("ops/tokamax/", "lab/emulation.py")))
    assert not outside, f"only ops/tokamax/ and lab/emulation.py may import {prefix}: {outside}"


# ------------------------------------------------------------------ readable functions

MAX_FUNCTION_LINES = 50


def _long_functions(path: pathlib.Path) -> list[str]:
    """Functions of ``path`` whose body, docstring left out, spans more than 50 lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
            body = body[1:]
        if body and body[-1].end_lineno - body[0].lineno + 1 > MAX_FUNCTION_LINES:
            found.append(f"{node.name} (line {node.lineno})")
    return found


def test_no_function_body_over_50_lines():
    """Long checks become tables of (field, rule) rows or smaller functions (docs/DESIGN.md)."""
    found = {rel: names for rel, path in FILES.items() if (names := _long_functions(path))}
    assert not found, f"function bodies over {MAX_FUNCTION_LINES} lines: {found}"


def test_the_length_rule_sees_a_long_function(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n    '''doc'''\n" + "    x = 1\n" * 51)
    assert _long_functions(source) == ["f (line 1)"]
    source.write_text("def f():\n    '''doc'''\n" + "    x = 1\n" * 50)
    assert _long_functions(source) == []


# ------------------------------------------------------------------ tests mirror the tree

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_tests_mirror_the_tree_with_unique_module_names():
    """tests/<folder>/ for each kda_lib folder, plus contracts/; no two test modules share a
    basename (pytest imports them by basename: the second would not be collected)."""
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    package_folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert package_folders <= folders, sorted(package_folders - folders)
    assert folders - package_folders == {"contracts"}, sorted(folders - package_folders)
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_design_shows_every_module_in_its_tree():
    """DESIGN section 2 names each module once in its tree, so a new module must be placed."""
    design = (PACKAGE.parent / "docs" / "DESIGN.md").read_text()
    tree = design.split("## 2. The tree", 1)[1].split("\n## 3.", 1)[0]
    assert "exercises/ " in tree and "(ch00 ... ch10)" in tree  # the checkers: one line
    missing = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
        and path.parent.name != "exercises"
        and f" {path.name} " not in tree.replace("\n", " \n ")
    )
    assert not missing, f"modules missing from DESIGN's tree (section 2): {missing}"
