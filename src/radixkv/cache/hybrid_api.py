"""RadixCache's public methods for hybrid components (a mixin: still one cache class).

The FULL-only cache refuses them; a hybrid cache refuses the FULL-only `insert`, `evict` and
`reset` (which would leave other components' slots unaccounted) and takes these instead.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from radixkv.cache.base import MatchResult, SlotArray
from radixkv.cache.components import Freed, InsertOutcome

if TYPE_CHECKING:
    from radixkv.cache.hybrid import ComponentOps


class ComponentMethods:
    _hy: ComponentOps | None
    _roots: dict[Hashable | None, Any]
    _leaves: Any
    _sessions: Any
    policy: Any
    _evictable: int
    _protected: int

    def iter_nodes(self) -> list[tuple[Hashable | None, Any]]:
        raise NotImplementedError

    def insert_components(
        self,
        tokens: Sequence[int] | SlotArray,
        slots: Sequence[int] | SlotArray | None,
        swa: Sequence[int] | SlotArray | None = None,
        checkpoints: Sequence[tuple[int, int]] = (),
        namespace: Hashable | None = None,
        priority: int = 0,
        owned_from: int = 0,
    ) -> InsertOutcome:
        """`insert` for every component: FULL `slots` (None without FULL), per-token `swa`
        slots (-1 where the caller already freed them), and STATE `checkpoints` as
        (boundary, checkpoint id) pairs (a boundary must be a whole number of pages within the
        inserted prefix). Positions < `owned_from` are the caller's locked match (the tree's
        own data); for positions >= owned_from the tree adopts SWA slots where it has
        tombstones. See InsertOutcome for what the caller must free."""
        hy = self._need_hybrid()
        return hy.insert(tokens, slots, swa, checkpoints, namespace, priority, owned_from)

    def match_path(
        self, tokens: Sequence[int] | SlotArray, namespace: Hashable | None = None
    ) -> MatchResult:
        """Hybrid: the longest cached page-aligned prefix WITHOUT the SWA/STATE votes (the
        engine re-locks the path it just inserted, whose end may carry no checkpoint)."""
        return self._need_hybrid().path_match(tokens, namespace)

    def evict_components(
        self, full_tokens: int = 0, swa_slots: int = 0, checkpoints: int = 0
    ) -> Freed:
        """Evict per component (see ComponentOps.evict); the caller frees what comes back."""
        return self._need_hybrid().evict(full_tokens, swa_slots, checkpoints)

    def reset_components(self) -> Freed:
        """`reset` for every component."""
        hy = self._need_hybrid()
        nodes = [n for _, n in self.iter_nodes()]
        for n in nodes:
            n.alive = False
            n.entry = None
        freed = hy.reset(nodes)
        self._roots.clear()
        self._leaves.clear()
        self._sessions.clear()
        self.policy.on_reset()
        self._evictable = 0
        self._protected = 0
        return freed

    @property
    def swa_size(self) -> int:
        """Live SWA slots held by the tree (0 without an SWA component)."""
        return self._hy.swa_size if self._hy is not None else 0

    @property
    def checkpoint_count(self) -> int:
        """STATE checkpoints held by the tree."""
        return len(self._hy.ckpts) if self._hy is not None else 0

    def cached_checkpoints(self) -> list[int]:
        return [n.ckpt for n in self._hy.ckpts.values()] if self._hy is not None else []

    def _need_hybrid(self) -> ComponentOps:
        if self._hy is None:
            raise RuntimeError("this cache has only the FULL component; use insert/evict/reset")
        return self._hy
