"""Full invariant checks for the cache designs (used by tests after every step).

Every check recomputes from scratch what the caches maintain incrementally and raises
AssertionError with a message naming the violated invariant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from radixkv.cache.keys import TOKEN_BYTES

if TYPE_CHECKING:
    from radixkv.cache.blockhash import Block
    from radixkv.cache.leafqueue import LeafQueue
    from radixkv.cache.node import Node, Root
    from radixkv.cache.policies import EvictionPolicy


def _fail(msg: str) -> NoReturn:
    raise AssertionError(f"cache integrity: {msg}")


def check_unique_slots(parts: list[Any]) -> int:
    """No slot is held twice; returns the number of slots."""
    if not parts:
        return 0
    allslots = np.concatenate(parts)
    uniq, counts = np.unique(allslots, return_counts=True)
    if len(uniq) != len(allslots):
        _fail(f"slots held twice: {uniq[counts > 1][:10].tolist()}")
    return len(allslots)


def check_tree(
    roots: dict[Any, Root],
    leaf_queue: LeafQueue,
    policy: EvictionPolicy,
    page_size: int,
    full: bool,
    sizes: tuple[int, int],
) -> None:
    """The radix tree core's invariants (both trees): namespace roots, edges of whole pages with
    one FULL slot per token (none when `full` is False), locks, the (evictable, protected)
    `sizes`, no slot twice, and the leaf queue tracking exactly the unlocked leaves."""
    pb = page_size * TOKEN_BYTES
    evictable = protected = 0
    leaves: set[int] = set()
    seen: dict[int, Any] = {}  # id(node) -> namespace; proves namespace roots are isolated
    parts = []
    for ns, root in roots.items():
        if root.parent is not None or root.key or root.ntok or root.lock or root.entry:
            _fail(f"root of namespace {ns!r} is not a bare root")
        if root.namespace != ns or not root.children:
            _fail(f"root of namespace {ns!r} is mislabelled or empty")
        if id(root) in seen:
            _fail(f"namespaces {seen[id(root)]!r} and {ns!r} share a root")
        seen[id(root)] = ns
        stack: list[Node] = [root]
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                if id(child) in seen:
                    _fail(f"node reachable twice (namespaces {seen[id(child)]!r}, {ns!r})")
                seen[id(child)] = ns
                where = f"namespace {ns!r}, node of {child.ntok} tokens"
                if child.parent is not node:
                    _fail(f"{where}: parent pointer is wrong")
                if not child.alive:
                    _fail(f"{where}: dead node still in the tree")
                if not child.key or len(child.key) % pb:
                    _fail(f"{where}: edge of {len(child.key)} bytes is not whole pages")
                want = child.ntok if full else 0  # a cache without FULL keeps no FULL slots
                if child.ntok * TOKEN_BYTES != len(child.key) or len(child.slots) != want:
                    _fail(f"{where}: {len(child.slots)} slots for {child.ntok} tokens")
                if child.slots.flags.writeable:
                    _fail(f"{where}: slot array is writable (callers could alter the tree)")
                if first != child.key[:pb]:
                    _fail(f"{where}: filed under a key that is not its first page")
                if child.lock < 0:
                    _fail(f"{where}: negative lock {child.lock}")
                if node.parent is not None and node.lock < child.lock:
                    _fail(f"{where}: lock {child.lock} exceeds its parent's {node.lock}")
                if child.lock:
                    protected += child.ntok
                else:
                    evictable += child.ntok
                    if not child.children:
                        leaves.add(id(child))
                if child.created > child.last_access:
                    _fail(f"{where}: created after its last access")
                parts.append(child.slots)
                stack.append(child)
    if (evictable, protected) != sizes:
        _fail(f"sizes (evictable, protected) = {sizes} but recomputed ({evictable}, {protected})")
    total = check_unique_slots(parts)
    if full and total != sum(sizes):
        _fail(f"total_size {sum(sizes)} but the tree holds {total} slots")
    try:
        leaf_queue.check(policy)  # heap order, keys valid for the policy
    except AssertionError as exc:
        _fail(str(exc))
    tracked = {id(n) for n in leaf_queue.tracked()}
    if tracked != leaves:
        _fail(
            f"evictable-leaf set has {len(tracked - leaves)} nodes that are not unlocked leaves "
            f"and misses {len(leaves - tracked)} unlocked leaves"
        )


def check_blockhash(
    roots: dict[Any, int],
    blocks: dict[Any, Block],
    free: dict[int, Block],
    first_blocks: dict[int, int],
    page: int,
    sizes: tuple[int, int],
) -> None:
    """The block-hash cache's invariants (see blockhash.py) from its namespace root ids, block
    table, free queue (oldest first), first-block counts, page size and (evictable, protected)
    sizes."""
    evictable = protected = 0
    children: dict[int, int] = {}
    parts = []
    root_ids = set(roots.values())
    if len(root_ids) != len(roots):
        _fail("two namespaces share a root id")
    for key, block in blocks.items():
        parent_id, tokens = key
        if block.key != key or not block.alive:
            _fail(f"block {block.block_id} is filed under a foreign key or dead")
        if len(tokens) != page * TOKEN_BYTES or len(block.slots) != page:
            _fail(f"block {block.block_id} is not one full page")
        parent = block.parent
        if parent is None:
            if parent_id not in root_ids:
                _fail(f"first block {block.block_id} chains to unknown root {parent_id}")
        else:
            if parent.block_id != parent_id or blocks.get(parent.key) is not parent:
                _fail(f"block {block.block_id} chains to a parent not in the table")
            if parent.ref < block.ref:
                _fail(f"block {block.block_id} ref {block.ref} exceeds its parent's")
            if parent.namespace != block.namespace:
                _fail(f"block {block.block_id} crosses namespaces")
            children[parent.block_id] = children.get(parent.block_id, 0) + 1
        if roots.get(block.namespace) != _root_id(block):
            _fail(f"block {block.block_id} chain does not start at its namespace root")
        if block.ref < 0:
            _fail(f"block {block.block_id} has negative ref {block.ref}")
        in_queue = block.block_id in free
        if in_queue != (block.ref == 0):
            _fail(f"block {block.block_id} (ref {block.ref}) free-queue membership is wrong")
        if block.ref:
            protected += page
        else:
            evictable += page
        parts.append(block.slots)
    firsts: dict[int, int] = {}
    for block in blocks.values():
        if block.parent is None:
            firsts[block.key[0]] = firsts.get(block.key[0], 0) + 1
    if firsts != first_blocks or set(firsts) != root_ids:
        _fail("namespace roots and their first-block counts disagree (or an empty root is kept)")
    for block in blocks.values():
        if block.num_children != children.get(block.block_id, 0):
            _fail(f"block {block.block_id} child count {block.num_children} is wrong")
    if len(free) != sum(1 for b in blocks.values() if b.ref == 0):
        _fail("free queue holds blocks that are not in the table")
    # Free-queue order: every unreferenced block comes after all its unreferenced descendants,
    # so the front of the queue never has cached children.
    position = {bid: i for i, bid in enumerate(free)}
    for block in blocks.values():
        parent = block.parent
        if block.ref == 0 and parent is not None and parent.ref == 0:  # noqa: SIM102
            if position[parent.block_id] < position[block.block_id]:
                _fail(f"free queue has block {parent.block_id} before its child")
    if (evictable, protected) != sizes:
        _fail(f"sizes (evictable, protected) = {sizes} but recomputed ({evictable}, {protected})")
    check_unique_slots(parts)


def _root_id(block: Any) -> int:
    while block.parent is not None:
        block = block.parent
    return int(block.key[0])
