"""Integrity checks of the hybrid components (recomputed from scratch; tests call them after
every step through `RadixCache.check_integrity`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from radixkv.cache.integrity import check_unique_slots

if TYPE_CHECKING:
    from radixkv.cache.hybrid import ComponentOps
    from radixkv.cache.radix import RadixCache


def _fail(msg: str) -> NoReturn:
    raise AssertionError(f"component integrity: {msg}")


def check_components(cache: RadixCache, hy: ComponentOps) -> None:
    ps = cache.page_size
    window = hy.window
    live_parts = []
    ckpt_nodes = {}
    for ns, node in cache.iter_nodes():
        where = f"namespace {ns!r}, node of {node.ntok} tokens"
        if window is None:
            if node.swa is not None:
                _fail(f"{where}: SWA slots without an SWA component")
        else:
            swa = node.swa
            if swa is None or len(swa) != node.ntok or swa.flags.writeable:
                _fail(f"{where}: SWA array missing, of the wrong length, or writable")
            pages = (swa >= 0).reshape(-1, ps)
            if (pages.any(axis=1) != pages.all(axis=1)).any():
                _fail(f"{where}: a tombstone covers part of a page")
            if bool((swa >= 0).any()) != (id(node) in hy.swa_nodes):
                _fail(f"{where}: live SWA entries and the swa_nodes registry disagree")
            live_parts.append(swa[swa >= 0])
        if node.ckpt >= 0:
            if not cache.components.state:
                _fail(f"{where}: checkpoint without a STATE component")
            ckpt_nodes[id(node)] = node.ckpt
    total = check_unique_slots(live_parts)
    if total != hy.swa_size:
        _fail(f"swa_size {hy.swa_size} but the tree holds {total} live SWA slots")
    if set(ckpt_nodes) != set(hy.ckpts):
        _fail("checkpoint registry disagrees with the nodes carrying checkpoints")
    ids = list(ckpt_nodes.values())
    if len(set(ids)) != len(ids):
        _fail(f"a checkpoint id is held twice: {sorted(ids)}")
    for node in hy.swa_nodes.values():
        if not node.alive:
            _fail("a dead node is still in the swa_nodes registry")
    for root in cache._roots.values():
        if root.swa is not None or root.ckpt >= 0:
            _fail("a namespace root carries component data")
