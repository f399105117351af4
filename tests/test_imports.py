"""The package's shape, read from its source with `ast` (nothing is imported): no import circle
inside any room (a top-level folder of src/radixkv), room-to-room imports exactly those the table
in docs/architecture.md allows (so the doc's diagram cannot drift from the code), the model room
knows nothing of the engine, the host/storage tiers import neither the tree nor the KV manager,
only the KV room moves device slots, no module is over 400 lines and no folder holds over 15
modules.

An import counts when it can run: at module level or inside a function (a lazy import that
breaks a circle at load time still makes one); imports under `if TYPE_CHECKING:` never run and do
not count."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "radixkv"
DOC = ROOT / "docs" / "architecture.md"
MAX_LINES = 400
# Modules per folder: the *.py files directly in it, its __init__.py included (a sub-folder
# counts in its own folder, not in its parent's).
MAX_MODULES = 15


def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The package module `name` is, or lives in (None outside radixkv)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """The package modules `module` imports when it runs (see the module docstring)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    resolved = {_resolve(name) for name in found}
    return {m for m in resolved if m is not None and m != module}


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def room(module: str) -> str:
    """The top-level folder of src/radixkv a module lives in (`radixkv.engine.kv.kv_manager` →
    `engine`); the package's own top-level modules (`__init__`, `cli`, `__main__`) are the room
    `radixkv`."""
    parts = MODULES[module].relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else "radixkv"


def _circles(nodes: set[str]) -> list[list[str]]:
    """One import circle per strongly connected group of `nodes` (empty when there is none)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(GRAPH[v] & nodes):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_inside_any_room() -> None:
    rooms = {room(m) for m in MODULES}
    assert {"cache", "engine", "model", "storage"} <= rooms
    found = {r: _circles({m for m in MODULES if room(m) == r}) for r in sorted(rooms)}
    assert not any(found.values()), {r: c for r, c in found.items() if c}


def test_the_model_imports_nothing_from_the_engine() -> None:
    bad = {
        m: sorted(d for d in deps if room(d) == "engine")
        for m, deps in GRAPH.items()
        if room(m) == "model"
    }
    assert not any(bad.values()), {m: d for m, d in bad.items() if d}


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in GRAPH[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


# The prefix trees and what holds or walks their nodes (the tiers may use the cache room's
# slot-free helpers: keys, page hashes, HostIndex in cache/tiers.py, the policy names).
TREE = (
    {"radixkv.cache"}
    | {f"radixkv.cache.{m}" for m in ("tree", "radix", "node", "blockhash")}
    | {
        f"radixkv.cache.hybrid.{m}"
        for m in ("cache", "evict", "names", "swa", "state", "components", "component")
    }
)


def test_the_tiers_import_neither_the_tree_nor_the_kv_manager() -> None:
    """No module of engine/tiers/, not even through another module: the tiers return plans, the
    KV manager carries them out (only it moves device slots and request locks)."""
    tiers = sorted(m for m in MODULES if m.startswith("radixkv.engine.tiers."))
    assert {"radixkv.engine.tiers.manager", "radixkv.engine.tiers.storage_tier"} <= set(tiers)
    assert "radixkv.engine.tiers.manager" in _reachable("radixkv.engine.kv.kv_manager")
    kv = {m for m in MODULES if m.startswith("radixkv.engine.kv.")}
    for module in tiers:
        forbidden = _reachable(module) & (TREE | kv)
        assert not forbidden, f"{module} imports {sorted(forbidden)}"


# The allocator's calls that move slots between owners (memory/allocator.py).
SLOT_MOVERS = {"alloc_pages", "free_page_ids", "free_slots_of_pages", "reserve_tail"}


def test_only_the_kv_room_moves_slots() -> None:
    """Outside engine/kv/ (and memory/, which defines the allocator) no module calls a slot-moving
    allocator method: the scheduler admits through `KVManager.admit`, the tiers return plans."""
    movers = []
    for name, path in MODULES.items():
        if name.startswith(("radixkv.engine.kv.", "radixkv.memory.")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SLOT_MOVERS:
                movers.append(f"{name}:{node.lineno} .{node.attr}")
    assert not movers, movers


def _doc_table() -> dict[str, set[str]]:
    """The rooms table of docs/architecture.md: room → the rooms it imports."""
    text = DOC.read_text()
    start = text.index("<!-- rooms table -->")
    end = text.index("<!-- end of rooms table -->")
    table: dict[str, set[str]] = {}
    for line in text[start:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        name = re.findall(r"`([^`]+)`", cells[0])[0].rstrip("/")
        table[name] = {t.rstrip("/") for t in re.findall(r"`([^`]+)`", cells[-1])}
    return table


def test_room_imports_match_the_architecture_doc() -> None:
    actual: dict[str, set[str]] = {room(m): set() for m in MODULES}
    for m, deps in GRAPH.items():
        actual[room(m)] |= {room(d) for d in deps} - {room(m)}
    documented = _doc_table()
    assert set(documented) == set(actual), "rooms in the doc's table != folders of src/radixkv"
    for name in sorted(actual):
        extra = actual[name] - documented[name]
        stale = documented[name] - actual[name]
        # Name the modules behind an undocumented arrow, so the fix is obvious.
        culprits = sorted(
            f"{m} -> {d}"
            for m, deps in GRAPH.items()
            if room(m) == name
            for d in deps
            if room(d) in extra
        )
        assert not extra, f"{name} imports {sorted(extra)}, not in the doc's table: {culprits}"
        assert not stale, f"the doc says {name} imports {sorted(stale)}; it does not"


def test_no_module_over_400_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def _doc_sub_rooms() -> set[str]:
    """The folders the sub-rooms table of docs/architecture.md names (`engine/kv`)."""
    text = DOC.read_text()
    start = text.index("<!-- sub-rooms table -->")
    end = text.index("<!-- end of sub-rooms table -->")
    return {
        re.findall(r"`([^`]+)`", line)[0].rstrip("/")
        for line in text[start:end].splitlines()
        if line.startswith("| `")
    }


def test_every_sub_room_is_in_the_architecture_doc() -> None:
    """Each folder below a room is a row of the doc's sub-rooms table, and each row a folder."""
    folders = {p.parent.relative_to(SRC) for p in MODULES.values()}
    actual = {str(f.as_posix()) for f in folders if len(f.parts) > 1}
    documented = _doc_sub_rooms()
    assert actual - documented == set(), "sub-rooms missing from the doc's table"
    assert documented - actual == set(), "the doc's table names folders that do not exist"


def test_no_folder_over_15_modules() -> None:
    """A room that grows past 15 modules splits into sub-rooms by meaning (docs/architecture.md
    names them), not into halves by size."""
    folders = {p.parent for p in MODULES.values()}
    crowded = {
        str(f.relative_to(SRC.parent)): n
        for f in folders
        if (n := len(list(f.glob("*.py")))) > MAX_MODULES
    }
    assert not crowded, crowded
