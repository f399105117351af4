"""Host (L2) KV pool: page-major copies of device pages in host memory.

Layout: one tensor [num_pages, num_layers, 2 (K, V), page_size, num_kv_heads, head_dim], so a
page's whole KV (every layer) is one contiguous block: saving it to storage is one byte view and
restoring it is one copy. The pool owns only tensors; which page holds what is
`radixkv.cache.tiers.HostIndex`'s business.

On a CUDA device (radixkv.memory.transfer decides) the pool is pinned and the copies are staged:
a save gathers the pages on the device into one block laid out as host pages, queues one
asynchronous copy of it into pinned memory, waits once, then scatters it into the host pages; a
load gathers the host pages into one pinned block, queues one asynchronous copy to the device and
scatters it there (stream-ordered: the next forward sees it; the pinned block is not reused
before the copy is done). On the CPU the copies are direct, as they always were.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixkv.memory import transfer
from radixkv.memory.pool import KVPool

# Below this many pages per run on average, `load` gathers the pages first instead of copying run
# by run (each run costs two calls per layer).
MIN_RUN_PAGES = 16


def _runs(pages: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive page numbers: (position in `pages`, first page, length)."""
    runs: list[tuple[int, int, int]] = []
    for i, p in enumerate(pages):
        if runs and runs[-1][1] + runs[-1][2] == p:
            pos, first, n = runs[-1]
            runs[-1] = (pos, first, n + 1)
        else:
            runs.append((i, int(p), 1))
    return runs


class HostKVPool:
    def __init__(self, device_pool: KVPool, num_pages: int, page_size: int) -> None:
        cfg = device_pool.config
        self.device_pool = device_pool
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = cfg.dtype
        self.page_shape = (cfg.num_layers, 2, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.data = transfer.host_zeros((num_pages, *self.page_shape), cfg.dtype, cfg.device)
        self.staged = transfer.async_copies(cfg.device)  # pinned staging, non_blocking copies

    @staticmethod
    def pages_for_bytes(device_pool: KVPool, budget_bytes: int, page_size: int) -> int:
        return max(1, budget_bytes // (device_pool.config.bytes_per_slot * page_size))

    @property
    def page_bytes(self) -> int:
        return int(self.data[0].numel() * self.data.element_size())

    def _pages(self, pages: Sequence[int], device: torch.device | str) -> torch.Tensor:
        return torch.as_tensor(list(pages), dtype=torch.int64, device=device)

    def _paged(self, t: torch.Tensor) -> torch.Tensor:
        """A device pool layer [num_slots, H, D] as whole pages [num_pages, page_size, H, D] (a
        view: writes go to the pool; slots past the last whole page are left out)."""
        ps = self.page_size
        return t[: t.shape[0] // ps * ps].view(-1, ps, *t.shape[1:])

    def save(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        """Copy device pages (page ids of the device allocator) into host pages, every layer:
        per layer and K/V, one gather of the device pages and one scatter into the host pages."""
        if not len(device_pages):
            return
        dev = self._pages(device_pages, self.device_pool.k[0].device)
        hp = self._pages(host_pages, "cpu")
        if self.staged:
            self._save_staged(dev, hp)
            return
        for layer, (k, v) in enumerate(zip(self.device_pool.k, self.device_pool.v, strict=True)):
            self.data[hp, layer, 0] = self._paged(k).index_select(0, dev).to("cpu")
            self.data[hp, layer, 1] = self._paged(v).index_select(0, dev).to("cpu")

    def load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> None:
        """Copy host pages back into device pages, every layer. Runs of consecutive host pages
        (what landing fetched pages one by one in a fresh stretch of the pool gives) are copied
        straight from a view of the pool, one copy of each byte; scattered pages are gathered
        first (two copies), where one copy per run would cost more calls than bytes."""
        if not len(device_pages):
            return
        device = self.device_pool.k[0].device
        if self.staged:
            self._load_staged(self._pages(host_pages, "cpu"), self._pages(device_pages, device))
            return
        runs = _runs(host_pages)
        if len(runs) > 1 and len(runs) * MIN_RUN_PAGES > len(host_pages):
            self._copy_in(self._pages(device_pages, device), self._pages(host_pages, "cpu"))
            return
        for pos, first, n in runs:
            self._copy_in(self._pages(device_pages[pos : pos + n], device), slice(first, first + n))

    def _copy_in(self, dev: torch.Tensor, host: torch.Tensor | slice) -> None:
        """Device pages `dev` := host pages `host` (a tensor of pages: gathered first; a slice:
        copied from a view of the pool), every layer."""
        for layer, (k, v) in enumerate(zip(self.device_pool.k, self.device_pool.v, strict=True)):
            self._paged(k).index_copy_(0, dev, self.data[host, layer, 0].to(k.device))
            self._paged(v).index_copy_(0, dev, self.data[host, layer, 1].to(v.device))

    def _save_staged(self, dev: torch.Tensor, hp: torch.Tensor) -> None:
        """Device pages `dev` -> host pages `hp` through one block: gathered on the device,
        one asynchronous copy into pinned memory, one wait, then the host scatter."""
        block = torch.empty((dev.shape[0], *self.page_shape), dtype=self.dtype, device=dev.device)
        for layer, (k, v) in enumerate(zip(self.device_pool.k, self.device_pool.v, strict=True)):
            block[:, layer, 0] = self._paged(k).index_select(0, dev)
            block[:, layer, 1] = self._paged(v).index_select(0, dev)
        stage = transfer.host_empty(tuple(block.shape), self.dtype, dev.device)
        stage.copy_(block, non_blocking=stage.is_pinned())
        transfer.synchronize(dev.device)  # the copy has landed before the host reads `stage`
        self.data.index_copy_(0, hp, stage)

    def _load_staged(self, hp: torch.Tensor, dev: torch.Tensor) -> None:
        """Host pages `hp` -> device pages `dev` through one block: gathered on the host into
        pinned memory, one asynchronous copy to the device, scattered there. No wait: the
        copy reads only the pinned block (torch does not reuse it before the copy is done),
        and what reads the pool after runs on the same stream, after the scatter."""
        stage = transfer.host_empty((hp.shape[0], *self.page_shape), self.dtype, dev.device)
        torch.index_select(self.data, 0, hp, out=stage)
        block = stage.to(dev.device, non_blocking=stage.is_pinned())
        for layer, (k, v) in enumerate(zip(self.device_pool.k, self.device_pool.v, strict=True)):
            self._paged(k).index_copy_(0, dev, block[:, layer, 0])
            self._paged(v).index_copy_(0, dev, block[:, layer, 1])

    def page_payload(self, page: int) -> memoryview:
        """The page's bytes (every layer's K and V), for a storage write: a view of the pool
        (no copy), valid while nobody writes the page (the tiers pin it until the write ends)."""
        return self.data[page].view(torch.uint8).numpy().reshape(-1).data

    def write_payload(self, page: int, payload: bytes | memoryview) -> None:
        """Fill a host page from bytes produced by `page_payload` (length checked by caller):
        one copy, from the buffer straight into the pool."""
        dst = self.data[page].view(torch.uint8).numpy().reshape(-1)
        dst[:] = np.frombuffer(payload, dtype=np.uint8)
