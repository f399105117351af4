"""The sliding-window (SWA) kind in the host and storage tiers: one `KindStore`
(engine/tiers/kind_store.py).

SWA K/V exists on the device only while the tree holds it: a running request frees its pages as
they leave its window. So the store keeps, when the tree adopts a row, the pages of the window
before each boundary a later request may resume at (`tier_boundaries`: every checkpoint
interval, page_size * 2**k, the end of the insert, every kind's checkpoints), and a resume at
boundary b needs the window's pages before b past what the tree holds (`window_pages_before`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixkv.cache.hybrid.tier_vote import tier_boundaries, window_pages_before
from radixkv.cache.tiers import HostIndex
from radixkv.engine.tiers.kind_store import StoreSetup
from radixkv.memory.host_pool import HostKVPool
from radixkv.memory.hybrid import SWA
from radixkv.memory.pool import KVPool
from radixkv.storage import PageMeta


class SwaStore:
    kind = SWA

    def __init__(self, pool: KVPool, setup: StoreSetup) -> None:
        ps = self.page_size = setup.page_size
        window = setup.spec.window(SWA) if setup.spec is not None else None
        # None: no window (the tiers keep nothing of this kind and no resume needs it).
        self.window_pages = -(-window // ps) if window is not None else None
        self.interval = setup.interval
        n = max(1, round(setup.share * (pool.num_slots // ps)))
        self.host = HostKVPool(pool, n, ps)
        self.index = HostIndex(n)
        self.saved = 0
        self._meta = PageMeta(
            fingerprint=setup.fingerprint,
            dtype=str(pool.config.dtype).removeprefix("torch."),
            num_layers=pool.config.num_layers,
            page_size=ps,
            shape=self.host.page_shape,
            length=self.host.page_bytes,
        )

    def meta(self) -> PageMeta:
        return self._meta

    def marks(self, part: Any) -> tuple[int, ...]:
        return ()

    def to_keep(
        self, part: Any, cached: int, aligned: int, marks: tuple[int, ...]
    ) -> list[tuple[int, int]]:
        """`part`: the SWA row of positions [0, aligned) (slots, -1 where freed)."""
        if part is None or self.window_pages is None:
            return []
        ps, row = self.page_size, np.asarray(part)
        pages: set[int] = set()
        for b in tier_boundaries(cached, aligned, ps, self.interval, marks):
            pages.update(window_pages_before(b // ps, 0, self.window_pages))
        return [(p, int(row[p * ps]) // ps) for p in sorted(pages) if int(row[p * ps]) >= 0]

    def needs(self, b: int, start: int) -> range:
        if self.window_pages is None:
            return range(0)
        return window_pages_before(b, start, self.window_pages)
