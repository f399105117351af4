"""SWA / STATE eviction of the component tree (see radixkv.cache.hybrid for the invariants).

Phase 1 trims SWA K/V outside every kept boundary's window (tombstones) and drops the checkpoints
that trimming made unusable; then checkpoints go by policy; then whole unlocked leaves go, leaf
first, freeing every component they hold. Split out of hybrid.py; `ComponentOps` inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixkv.cache.base import SlotArray
from radixkv.cache.components import Components, Freed
from radixkv.cache.keys import concat_slots
from radixkv.cache.radix_node import Node, Root
from radixkv.cache.sessions import move_anchors

if TYPE_CHECKING:
    from radixkv.cache.radix import RadixCache


def _frozen(arr: SlotArray) -> SlotArray:
    arr.flags.writeable = False
    return arr


class ComponentEviction:
    """Eviction half of ComponentOps (state lives on ComponentOps)."""

    cache: RadixCache
    comp: Components
    window: int | None
    swa_size: int
    ckpts: dict[int, Node]
    swa_nodes: dict[int, Node]
    dropped: list[int]

    def _track(self, node: Node) -> None:
        """Keep `swa_nodes` exact for `node` after its SWA array changed."""
        assert node.swa is not None
        if bool((node.swa >= 0).any()):
            self.swa_nodes[id(node)] = node
        else:
            self.swa_nodes.pop(id(node), None)

    @staticmethod
    def _is_handle(node: Node) -> bool:
        """Some request holds a lock that ends exactly at this node."""
        return node.lock > sum(c.lock for c in node.children.values())

    def _kept(self, node: Node) -> bool:
        """A boundary whose window trimming keeps (see the module docstring)."""
        return len(node.children) != 1 or self._is_handle(node)

    def keep_from(self, node: Node) -> int:
        """First edge-relative position of `node` some kept boundary's window needs (page
        floored); `node.ntok` when none does. Walks down the pass-through chain below."""
        assert self.window is not None
        below = 0  # tokens from node's end to the nearest kept boundary at or below it
        n = node
        while not self._kept(n):
            (n,) = n.children.values()
            below += n.ntok
        cut = node.ntok + below - self.window
        if cut <= 0:
            return 0
        cut = min(cut, node.ntok)
        return cut - cut % self.cache.page_size

    # ---------------------------------------------------------------- eviction

    def evict(self, full_tokens: int, swa_slots: int, checkpoints: int) -> Freed:
        """Free at least the asked amounts where possible: SWA K/V outside every node's window
        first (tombstones), then unlocked checkpoints in policy order, then whole unlocked
        leaves in policy order (freeing every component they hold) while FULL or SWA is short."""
        swa_parts: list[SlotArray] = []
        self.dropped = []
        got_swa = self._trim(swa_slots, swa_parts) if swa_slots > 0 else 0
        ckpts = self.dropped
        if len(ckpts) < checkpoints:
            ckpts += self._drop_checkpoints(checkpoints - len(ckpts))
        full_parts: list[SlotArray] = []
        got_full = 0
        c = self.cache
        pb = c._page_bytes
        while got_full < full_tokens or got_swa < swa_slots:
            node = c._leaves.pop()
            if node is None:
                break
            parent = node.parent
            del parent.children[node.key[:pb]]
            node.parent = None
            node.alive = False
            c._evictable -= node.ntok
            c._stats.evicted_tokens += node.ntok
            if node.anchors:  # its session references now end at the parent
                move_anchors(node, parent)
            c.policy.on_evict(node)
            if self.comp.full:
                full_parts.append(node.slots)
                got_full += node.ntok
            got_swa += self._forget(node, swa_parts, ckpts)
            if parent.children:
                continue
            if parent.parent is not None:
                if parent.lock == 0:
                    c._leaves.push(parent)
            elif isinstance(parent, Root):
                del c._roots[parent.namespace]
        if got_swa < swa_slots:  # removed leaves turned branch points into pass-through nodes
            got_swa += self._trim(swa_slots - got_swa, swa_parts)
        return Freed(concat_slots(full_parts), concat_slots(swa_parts), tuple(ckpts))

    def _forget(self, node: Node, swa_parts: list[SlotArray], ckpts: list[int]) -> int:
        """Drop a removed node's SWA slots and checkpoint into the freed lists."""
        got = 0
        if node.swa is not None:
            live = node.swa[node.swa >= 0]
            swa_parts.append(live)
            got = len(live)
            self.swa_size -= got
            self.swa_nodes.pop(id(node), None)
        if node.ckpt >= 0:
            ckpts.append(node.ckpt)
            node.ckpt = -1
            del self.ckpts[id(node)]
        return got

    def _trim(self, want: int, out: list[SlotArray]) -> int:
        """Phase 1 of SWA eviction: tombstone K/V outside every kept boundary's window, least
        valuable nodes first (policy order), until `want` slots are freed. O(n log n) in the
        nodes holding SWA; runs only when the SWA pool is short."""
        got = 0
        key = self.cache.policy.key
        for node in sorted(self.swa_nodes.values(), key=key):
            if got >= want:
                break
            assert node.swa is not None
            keep = self.keep_from(node)
            head = node.swa[:keep]
            live = head[head >= 0]
            if len(live):
                out.append(live.copy())
                new = node.swa.copy()
                new[:keep] = -1
                node.swa = _frozen(new)
                got += len(live)
                self._track(node)
        self.swa_size -= got
        if got:
            self._drop_blind_checkpoints()
        return got

    def _window_intact(self, node: Node) -> bool:
        """No tombstone among the `window` SWA entries before `node`'s end."""
        assert self.window is not None
        need = self.window
        n: Node | None = node
        while need > 0 and n is not None and n.parent is not None:
            assert n.swa is not None
            if bool((n.swa[max(0, n.ntok - need) :] < 0).any()):
                return False
            need -= n.ntok
            n = n.parent
        return True

    def _drop_blind_checkpoints(self) -> None:
        """Checkpoints whose SWA window was just trimmed can never be resumed from."""
        for node in list(self.ckpts.values()):
            if not self._window_intact(node):
                self.dropped.append(node.ckpt)
                node.ckpt = -1
                del self.ckpts[id(node)]

    def _drop_checkpoints(self, want: int) -> list[int]:
        """Checkpoints in policy order, except where a handle is locked (a request admitted
        there may not have copied its checkpoint yet)."""
        key = self.cache.policy.key
        cands = [n for n in self.ckpts.values() if not self._is_handle(n)]
        cands = sorted(cands, key=key)[:want]
        out = []
        for node in cands:
            out.append(node.ckpt)
            node.ckpt = -1
            del self.ckpts[id(node)]
        return out

    def reset(self, nodes: list[Node]) -> Freed:
        """Everything the tree held (the caller has already marked `nodes` dead)."""
        full = concat_slots([n.slots for n in nodes]) if self.comp.full else concat_slots([])
        swa_parts: list[SlotArray] = []
        ckpts: list[int] = []
        for n in nodes:
            self._forget(n, swa_parts, ckpts)
        self.swa_nodes.clear()
        return Freed(full, concat_slots(swa_parts), tuple(ckpts))

    # ---------------------------------------------------------------- checks

    def evictable_swa(self) -> int:
        """Live SWA entries eviction could free now: everything on unlocked nodes plus what
        trimming frees on locked ones. O(nodes); for admission estimates and tests."""
        total = 0
        w = self.window
        if w is None:
            return 0
        for _, n in self.cache.iter_nodes():
            assert n.swa is not None
            if n.lock == 0:
                total += int((n.swa >= 0).sum())
            else:
                total += int((n.swa[: self.keep_from(n)] >= 0).sum())
        return total
