"""The cache package's layering: the tree core depends on nothing hybrid, the hybrid tree depends
one way on the core, and no module-level import circle runs through `radixkv.cache` (imports
under TYPE_CHECKING do not count: they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import radixkv.cache

CACHE = Path(radixkv.cache.__file__).parent
PKG = "radixkv.cache"


def _runtime_imports(path: Path) -> set[str]:
    """Sibling modules `path` imports when it runs (at module level or inside functions)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(PKG + "."):
                found.add(node.module[len(PKG) + 1 :].split(".")[0])
            elif node.module == PKG:
                found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(path.stem)
    return found


def _graph() -> dict[str, set[str]]:
    mods = {p.stem: p for p in CACHE.glob("*.py") if p.stem != "__init__"}
    return {m: _runtime_imports(p) & set(mods) for m, p in mods.items()}


def test_no_import_circle_inside_the_cache_package() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def dfs(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            assert state.get(dep) != 1, "import circle: " + " -> ".join([*path, mod, dep])
            if dep not in state:
                dfs(dep, [*path, mod])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            dfs(mod, [])


def test_the_core_knows_nothing_of_the_hybrid_tree() -> None:
    graph = _graph()
    hybrid = {"hybrid", "swa", "state", "components"}
    for core in ("tree", "radix", "node", "leafqueue", "sessions", "integrity", "keys", "base"):
        assert not graph[core] & hybrid, f"{core} imports {graph[core] & hybrid}"
    assert "tree" in graph["hybrid"] and "radix" not in graph["hybrid"]
