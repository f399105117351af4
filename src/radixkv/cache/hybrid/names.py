"""The built-in components of the hybrid tree by name: "full", "swa:W" (window W tokens),
"state", the spelling of hand-built trees (`HybridCache(["full", "swa:4096", "state"])`, tests,
tools). No torch.

This is a spelling, not the registry of kinds: the engine builds its trees from the
`ComponentSpec`s its own registry answers (engine/kv/kinds.py, `Kind.tree`), so a new kind the
tree keeps needs no line here; a hand-built tree may name it by its spec among the names.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixkv.cache.hybrid.component import ComponentSpec, TreeComponent
from radixkv.cache.hybrid.components import FULL, Components
from radixkv.cache.hybrid.state import StateComponent
from radixkv.cache.hybrid.swa import SwaComponent

# The built-in kinds besides FULL by name. Their data lives on `Node`'s own fields (`swa`,
# `ckpt`), so the tree's check also looks for it on trees built without them (`stray`).
BUILTIN: dict[str, type[TreeComponent]] = {
    SwaComponent.kind: SwaComponent,
    StateComponent.kind: StateComponent,
}


def component_spec(name: str) -> ComponentSpec:
    """One built-in component by name: its kind, then its integer argument after a colon."""
    kind, colon, arg = name.partition(":")
    cls = BUILTIN.get(kind)
    if cls is None:
        raise ValueError(f"unknown component {name!r} (full | {' | '.join(BUILTIN)})")
    try:
        return ComponentSpec(cls, int(arg) if colon else None)
    except ValueError:
        raise ValueError(f"bad component {name!r} (e.g. full | swa:W | state)") from None


def parse_components(spec: Components | Iterable[str | ComponentSpec] | None) -> Components:
    """`None` → FULL only; a `Components` as it is; else names such as ("full", "swa:4096",
    "state"), any of them a `ComponentSpec` instead (a kind without a name here)."""
    if spec is None:
        return Components()
    if isinstance(spec, Components):
        return spec
    full = False
    parts: list[ComponentSpec] = []
    for item in spec:
        if isinstance(item, ComponentSpec):
            parts.append(item)
        elif item == FULL:
            full = True
        else:
            parts.append(component_spec(str(item)))
    return Components(full=full, parts=tuple(parts))
