"""Host (L2) KV pool: page-major copies of device pages in host memory.

Layout: one tensor [num_pages, num_layers, 2 (K, V), page_size, num_kv_heads, head_dim], so a
page's whole KV (every layer) is one contiguous block: saving it to storage is one byte view and
restoring it is one copy. The pool owns only tensors; which page holds what is
`radixkv.cache.tiers.HostIndex`'s business. Pinned memory when the device is CUDA (async copies).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixkv.memory.pool import KVPool


class HostKVPool:
    def __init__(self, device_pool: KVPool, num_pages: int, page_size: int) -> None:
        cfg = device_pool.config
        self.device_pool = device_pool
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = cfg.dtype
        self.page_shape = (cfg.num_layers, 2, page_size, cfg.num_kv_heads, cfg.head_dim)
        pin = str(cfg.device).startswith("cuda") and torch.cuda.is_available()
        self.data = torch.zeros((num_pages, *self.page_shape), dtype=cfg.dtype, pin_memory=pin)

    @staticmethod
    def pages_for_bytes(device_pool: KVPool, budget_bytes: int, page_size: int) -> int:
        return max(1, budget_bytes // (device_pool.config.bytes_per_slot * page_size))

    @property
    def page_bytes(self) -> int:
        return int(self.data[0].numel() * self.data.element_size())

    def _slots(self, device_pages: Sequence[int]) -> torch.Tensor:
        ps = self.page_size
        arr = np.asarray(device_pages, dtype=np.int64)
        flat = (arr[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)
        return torch.from_numpy(flat).to(self.device_pool.k[0].device)

    def save(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        """Copy device pages (page ids of the device allocator) into host pages, every layer."""
        if not len(device_pages):
            return
        slots = self._slots(device_pages)
        hp = torch.as_tensor(list(host_pages), dtype=torch.int64)
        n, ps = len(device_pages), self.page_size
        for layer, (k, v) in enumerate(zip(self.device_pool.k, self.device_pool.v, strict=True)):
            kv = torch.stack((k.index_select(0, slots), v.index_select(0, slots)))
            kv = kv.view(2, n, ps, *k.shape[1:]).transpose(0, 1)  # [n, 2, ps, H, D]
            self.data[hp, layer] = kv.to("cpu")

    def load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> None:
        """Copy host pages back into device pages, every layer."""
        if not len(device_pages):
            return
        slots = self._slots(device_pages)
        hp = torch.as_tensor(list(host_pages), dtype=torch.int64)
        for layer, (k, v) in enumerate(zip(self.device_pool.k, self.device_pool.v, strict=True)):
            kv = self.data[hp, layer].to(k.device)  # [n, 2, ps, H, D]
            k.index_copy_(0, slots, kv[:, 0].reshape(-1, *k.shape[1:]))
            v.index_copy_(0, slots, kv[:, 1].reshape(-1, *v.shape[1:]))

    def page_payload(self, page: int) -> bytes:
        """The page's bytes (every layer's K and V), for a storage write."""
        return self.data[page].contiguous().view(torch.uint8).numpy().tobytes()

    def write_payload(self, page: int, payload: bytes) -> None:
        """Fill a host page from bytes produced by `page_payload` (length checked by caller)."""
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        self.data[page] = raw.view(self.dtype).view(self.page_shape)
