"""Host (L2) copies of recurrent-state checkpoints: one entry = one slot of a `StatePool` (every
state layer's tensors of one sequence at one boundary).

Layout: per state layer and tensor, [num_entries, *shape] in host memory, the device pool's
dtypes. A checkpoint's bytes (`page_payload`) are every tensor's bytes in the pool's order
(layers in order, tensors in declaration order), so `write_payload` restores exactly what
`page_payload` read. The pool owns only tensors; which entry holds which checkpoint is a
`radixkv.cache.tiers.HostIndex`'s business (the same index class as the KV host pages).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixkv.memory.state_pool import StatePool


class HostStatePool:
    def __init__(self, device_pool: StatePool, num_entries: int) -> None:
        self.device_pool = device_pool
        self.num_pages = num_entries
        self.data: list[dict[str, torch.Tensor]] = [
            {
                name: torch.zeros((num_entries, *t.shape[1:]), dtype=t.dtype)
                for name, t in layer.items()
            }
            for layer in device_pool.tensors
        ]
        self._sizes = [
            (li, name, t[0].numel() * t.element_size())
            for li, layer in enumerate(self.data)
            for name, t in layer.items()
        ]

    @property
    def page_bytes(self) -> int:
        """Bytes of one checkpoint (every layer's every tensor)."""
        return sum(n for _, _, n in self._sizes)

    def describe(self) -> str:
        """The layout a stored checkpoint must have (goes into its storage header)."""
        parts = [
            f"{li}.{name}:{str(t.dtype).removeprefix('torch.')}{list(t.shape[1:])}"
            for li, layer in enumerate(self.data)
            for name, t in layer.items()
        ]
        return "state:" + ",".join(parts)

    def save(self, slots: Sequence[int], entries: Sequence[int]) -> None:
        """Copy device state slots into host entries."""
        if not len(slots):
            return
        src = torch.as_tensor(list(slots), dtype=torch.int64)
        dst = torch.as_tensor(list(entries), dtype=torch.int64)
        for dev, host in zip(self.device_pool.tensors, self.data, strict=True):
            for name, t in dev.items():
                host[name][dst] = t.index_select(0, src.to(t.device)).to("cpu")

    def load(self, entries: Sequence[int], slots: Sequence[int]) -> None:
        """Copy host entries back into device state slots."""
        if not len(slots):
            return
        src = torch.as_tensor(list(entries), dtype=torch.int64)
        for dev, host in zip(self.device_pool.tensors, self.data, strict=True):
            for name, t in dev.items():
                dst = torch.as_tensor(list(slots), dtype=torch.int64, device=t.device)
                t.index_copy_(0, dst, host[name][src].to(t.device))

    def page_payload(self, page: int) -> bytes:
        return b"".join(
            self.data[li][name][page].contiguous().reshape(-1).view(torch.uint8).numpy().data
            for li, name, _ in self._sizes
        )

    def write_payload(self, page: int, payload: bytes | memoryview) -> None:
        """Fill an entry from bytes produced by `page_payload` (length checked by the caller):
        one copy per tensor, from the buffer straight into the pool."""
        raw = np.frombuffer(payload, dtype=np.uint8)
        pos = 0
        for li, name, n in self._sizes:
            dst = self.data[li][name][page].reshape(-1).view(torch.uint8).numpy()
            dst[:] = raw[pos : pos + n]
            pos += n
