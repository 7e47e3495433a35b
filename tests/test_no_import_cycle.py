"""kvlab's modules and packages import each other without a cycle, and the bottom layer imports none of them.

Read with ast. For cycles of modules, imports inside functions do not run at import time and are not counted;
everything at module level is, inside ``try``/``if`` too, and under ``if TYPE_CHECKING:``: such an import does
not run, but a module that needs another's types to be read depends on it all the same (two modules that type
each other belong together, or their types belong in a third). Cycles of packages count every import, lazy
ones too. A package is a subpackage of kvlab (``kvlab.store``) or a top-level module (``kvlab.paths``).
The bottom layer, :mod:`kvlab.core` (the spec and result types and the registries they are built
from), is held to more: no import of another kvlab package anywhere in it, lazy ones included, and
no third-party package beyond pydantic and tomli_w, so that validating a spec is instant and free of
torch wherever it happens.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

import kvlab

ROOT = Path(kvlab.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ("kvlab", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            found += _top_level_imports(node.body) + _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level_imports(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                found += _top_level_imports(handler.body)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: Iterable[str]) -> list[str]:
    """The modules an import statement of module ``name`` imports (any, kvlab's or not)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _resolve(name, path.name == "__init__.py", node)
    # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """kvlab module -> the kvlab modules it imports at module level."""
    paths = _modules()
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _top_level_imports(tree.body):
            graph[name] |= {t for t in _imported(name, path, node, paths) if t in paths and t != name}
    return graph


def package_of(module: str) -> str:
    """``kvlab.store.tunes`` -> ``kvlab.store``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages (an import inside one package is no edge)."""
    folded: dict[str, set[str]] = {package_of(name): set() for name in graph}
    for name, targets in graph.items():
        folded[package_of(name)] |= {package_of(t) for t in targets} - {package_of(name)}
    return folded


def every_import(module: str) -> set[str]:
    """Every module that ``module``'s file imports anywhere (in functions and TYPE_CHECKING blocks too)."""
    paths = _modules()
    path = paths[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {t for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
            for t in _imported(module, path, node, paths)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read_from_the_real_modules():
    graph = import_graph()
    assert "kvlab.core.kv_config" in graph["kvlab.compress.eviction"]
    assert "kvlab.core.methods" in graph["kvlab.core.kv_config"]
    assert len(graph) > 50
    packages = package_graph(graph)
    assert {"kvlab.core", "kvlab.store", "kvlab.paths"} <= set(packages)
    assert "kvlab.core" in packages["kvlab.compress"] and "kvlab.compress" not in packages["kvlab.core"]
    lazy = "kvlab.experiments.ray_executor"  # imported inside a function of kvlab.tune.session
    assert lazy in every_import("kvlab.tune.session") and lazy not in graph["kvlab.tune.session"]
    assert "kvlab.store.records" in graph["kvlab.analysis.noise_floor"]  # under TYPE_CHECKING: counted


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_kvlab_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_kvlab_packages_have_no_import_cycle_even_through_lazy_imports():
    """A package's lazy import of another is a dependency all the same: none closes a cycle."""
    modules = _modules()
    graph = {name: {t for t in every_import(name) if t in modules and t != name} for name in modules}
    cycle = find_cycle(package_graph(graph))
    assert cycle is None, "package import cycle: " + " -> ".join(cycle or [])


#: What the bottom layer may import beside the standard library and itself.
CORE_MAY_IMPORT = ("pydantic", "tomli_w")


def test_the_bottom_layer_imports_no_other_kvlab_package_and_no_heavy_library():
    stdlib = sys.stdlib_module_names
    for module in sorted(name for name in _modules() if package_of(name) == "kvlab.core"):
        for target in every_import(module):
            top = target.split(".")[0]
            if top == "kvlab":
                assert package_of(target) == "kvlab.core", f"{module} imports {target}"
            else:
                assert top in stdlib or top in CORE_MAY_IMPORT or top == "__future__", f"{module} imports {target}"
