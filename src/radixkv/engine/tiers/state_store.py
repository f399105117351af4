"""The recurrent-state (STATE) kind in the host and storage tiers: one `KindStore`
(engine/tiers/kind_store.py).

A checkpoint is the state after exactly b pages; it is kept under the hash of page b - 1 (the
page it ends), copied to L2 when the tree accepts it, and a resume at boundary b needs exactly
that one value.
"""

from __future__ import annotations

from typing import Any

from radixkv.cache.tiers import HostIndex
from radixkv.engine.tiers.kind_store import StoreSetup
from radixkv.memory.host_state import HostStatePool
from radixkv.memory.hybrid import STATE
from radixkv.memory.state_pool import StatePool
from radixkv.storage import PageMeta


class StateStore:
    kind = STATE

    def __init__(self, pool: StatePool, setup: StoreSetup) -> None:
        self.page_size = setup.page_size
        n = max(1, round(setup.share * pool.num_slots))
        self.host = HostStatePool(pool, n)
        self.index = HostIndex(n)
        self.saved = 0
        self._meta = PageMeta(
            fingerprint=setup.fingerprint,
            dtype=self.host.describe(),
            num_layers=pool.num_layers,
            page_size=setup.page_size,
            shape=(self.host.page_bytes,),
            length=self.host.page_bytes,
        )

    def meta(self) -> PageMeta:
        return self._meta

    def marks(self, part: Any) -> tuple[int, ...]:
        """`part`: the checkpoints (boundary tokens, state slot) the tree accepted."""
        return tuple(b for b, _ in part or ())

    def to_keep(
        self, part: Any, cached: int, aligned: int, marks: tuple[int, ...]
    ) -> list[tuple[int, int]]:
        ps = self.page_size
        return [(b // ps - 1, s) for b, s in part or () if b > 0 and b % ps == 0]

    def needs(self, b: int, start: int) -> list[int]:
        return [b - 1]
