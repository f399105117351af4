"""The cache package's layering: the tree core depends on nothing hybrid, the hybrid tree depends
one way on the core, and no module-level import circle runs through `radixkv.cache` (imports
under TYPE_CHECKING do not count: they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import radixkv.cache

CACHE = Path(radixkv.cache.__file__).parent
PKG = "radixkv.cache"


def _name(path: Path) -> str:
    """A module's name under radixkv.cache (`tree`, `hybrid.swa`)."""
    return ".".join(path.relative_to(CACHE).with_suffix("").parts)


def _runtime_imports(path: Path, mods: set[str]) -> set[str]:
    """Modules of `mods` that `path` imports when it runs (at module level or inside
    functions)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(PKG + "."):
                base = node.module[len(PKG) + 1 :]
                subs = {f"{base}.{alias.name}" for alias in node.names} & mods
                found.update(subs or {base})
            elif node.module == PKG:
                found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(_name(path))
    return found


def _graph() -> dict[str, set[str]]:
    """The tree core's and the hybrid tree's modules (the policies are a room of their own)."""
    paths = [*CACHE.glob("*.py"), *(CACHE / "hybrid").glob("*.py")]
    mods = {_name(p): p for p in paths if p.stem != "__init__"}
    return {m: _runtime_imports(p, set(mods)) & set(mods) for m, p in mods.items()}


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
    hybrid = {m for m in graph if m.startswith("hybrid.")}
    assert {"hybrid.cache", "hybrid.swa", "hybrid.state", "hybrid.components"} <= hybrid
    for core in ("tree", "radix", "node", "leafqueue", "sessions", "integrity", "keys", "base"):
        assert not graph[core] & hybrid, f"{core} imports {graph[core] & hybrid}"
    assert "tree" in graph["hybrid.cache"] and "radix" not in graph["hybrid.cache"]
