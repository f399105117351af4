"""Request → token slot table: the one place that says which slot holds each position of each
running request.

A fixed [max_requests, max_context] int64 tensor; each running request owns one row. Row r,
column i is the KV slot of token i of that request's context, for i < `capacity(r)` (the
positions the request has slots for: its locked cached prefix plus its own pages). Columns past
the capacity are stale and never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch


class ReqToTokenTable:
    """Rows of slot indices, one per running request."""

    def __init__(self, max_requests: int, max_context: int, device: str = "cpu") -> None:
        if max_requests < 1 or max_context < 1:
            raise ValueError("max_requests and max_context must be >= 1")
        self.max_requests = max_requests
        self.max_context = max_context
        self.slots = torch.zeros((max_requests, max_context), dtype=torch.int64, device=device)
        self._capacity = [0] * max_requests
        self._free_rows: list[int] = list(range(max_requests - 1, -1, -1))
        self._in_use = [False] * max_requests

    @property
    def free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free request rows (max_running_requests reached)")
        row = self._free_rows.pop()
        self._in_use[row] = True
        self._capacity[row] = 0
        return row

    def alloc_row_at(self, row: int) -> None:
        """Take a specific free row (a second table kept row-aligned with a first one)."""
        if self._in_use[row]:
            raise RuntimeError(f"row {row} is already in use")
        self._free_rows.remove(row)
        self._in_use[row] = True
        self._capacity[row] = 0

    def free_row(self, row: int) -> None:
        if not self._in_use[row]:
            raise RuntimeError(f"row {row} freed twice")
        self._in_use[row] = False
        self._capacity[row] = 0
        self._free_rows.append(row)

    def capacity(self, row: int) -> int:
        return self._capacity[row]

    def write(self, row: int, start: int, slots: Sequence[int] | npt.NDArray[np.int64]) -> None:
        """Set positions [start, start + len(slots)) of `row`; capacity grows to cover them."""
        n = len(slots)
        if not self._in_use[row]:
            raise RuntimeError(f"row {row} is not allocated")
        if start < 0 or start > self._capacity[row] or start + n > self.max_context:
            raise IndexError(
                f"write [{start}, {start + n}) outside row {row} "
                f"(capacity {self._capacity[row]}, max {self.max_context})"
            )
        if n:
            src = torch.tensor(np.asarray(slots, dtype=np.int64), dtype=torch.int64)
            self.slots[row, start : start + n] = src.to(self.slots.device)
        self._capacity[row] = max(self._capacity[row], start + n)

    def truncate(self, row: int, length: int) -> None:
        """Forget positions >= length (their slots were freed or handed to the cache)."""
        self._capacity[row] = min(self._capacity[row], length)

    def get(self, row: int, start: int, end: int) -> torch.Tensor:
        """A view of the slots of positions [start, end) (must lie within the capacity)."""
        if end > self._capacity[row]:
            raise IndexError(
                f"positions up to {end} requested, row {row} holds {self._capacity[row]}"
            )
        return self.slots[row, start:end]

    def gather(self, rows: Sequence[int], ends: Sequence[int]) -> torch.Tensor:
        """[len(rows), max(ends)] int64: row i holds the slots of positions [0, ends[i]) of
        table row rows[i] (each within its capacity), then whatever the table holds there
        (stale columns, never to be read). One gather on the table's device: a step's slot
        table (radixkv.model.batch.ForwardBatch)."""
        for row, end in zip(rows, ends, strict=True):
            if end > self._capacity[row]:
                raise IndexError(
                    f"positions up to {end} requested, row {row} holds {self._capacity[row]}"
                )
        width = max(ends, default=0)
        index = torch.tensor(list(rows), dtype=torch.int64).to(self.slots.device)
        return self.slots[:, : max(width, 1)].index_select(0, index)

    def get_numpy(self, row: int, start: int, end: int) -> npt.NDArray[np.int64]:
        return self.get(row, start, end).cpu().numpy().astype(np.int64, copy=True)
