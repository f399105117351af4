"""KV tensor pools: the one owner of K/V tensors.

Layout per layer: `k[layer]` and `v[layer]` of shape [num_slots, num_kv_heads, head_dim]. Slot-major
rows keep the slots of a page contiguous, so gathering whole pages is a contiguous copy. Slots are
handed out by `radixkv.memory.allocator`; the pool itself never tracks who owns a slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixkv.memory import hugepages


@dataclass(frozen=True)
class KVPoolConfig:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_slots: int
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def bytes_per_slot(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_slot * self.num_slots

    @staticmethod
    def slots_for_budget(
        budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return max(1, budget_bytes // (2 * num_layers * num_kv_heads * head_dim * elem))


class KVPool:
    """K and V for `num_slots` token slots in every layer."""

    def __init__(self, config: KVPoolConfig) -> None:
        self.config = config
        shape = (config.num_slots, config.num_kv_heads, config.head_dim)
        # On huge pages (hugepages.py): a decode step reads rows scattered over all of it.
        self.k = [
            hugepages.zeros(shape, config.dtype, config.device) for _ in range(config.num_layers)
        ]
        self.v = [
            hugepages.zeros(shape, config.dtype, config.device) for _ in range(config.num_layers)
        ]

    @property
    def num_slots(self) -> int:
        return self.config.num_slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V ([n, kv_heads, head_dim]) at `slots` ([n] int64) of `layer`."""
        self.k[layer].index_copy_(0, slots, k.to(self.config.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.config.dtype))

    def copy_slots(self, src: Any, dst: Any) -> None:
        """K/V of slots `src` into slots `dst` in every layer (`dst` must not overlap `src`)."""
        device = self.k[0].device if self.k else "cpu"
        src_t = torch.as_tensor(src, dtype=torch.int64, device=device)
        dst_t = torch.as_tensor(dst, dtype=torch.int64, device=device)
        if src_t.numel() == 0:
            return
        for k, v in zip(self.k, self.v, strict=True):
            k.index_copy_(0, dst_t, k.index_select(0, src_t))
            v.index_copy_(0, dst_t, v.index_select(0, src_t))
