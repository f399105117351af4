"""Shared helpers for the cache designs: token keys, slot arrays, and the stats ledger.

Token keys are stored as `bytes` of little-endian int64 token ids (`TOKEN_BYTES` per token), so
comparing or hashing an edge is one memcmp in C however long the edge. Input may be a numpy int
array (the fast path: one `tobytes`), a list or tuple of ints, or anything `numpy.asarray`
accepts as a 1-D integer array.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from radixkv.cache.base import CacheStats, SlotArray

TOKEN_BYTES = 8
_TOKEN_DTYPE = np.dtype("<i8")

EMPTY_SLOTS: SlotArray = np.empty(0, dtype=np.int64)
EMPTY_SLOTS.flags.writeable = False


def token_key(tokens: Any) -> bytes:
    """Canonical key bytes of a token sequence (int64 little-endian)."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
        if tokens.dtype != _TOKEN_DTYPE:
            if tokens.dtype.kind not in "iu":
                raise TypeError(f"tokens must be integers, got dtype {tokens.dtype}")
            tokens = tokens.astype(_TOKEN_DTYPE)
        return tokens.tobytes()
    if isinstance(tokens, list | tuple):
        try:
            return _packer(len(tokens)).pack(*tokens)
        except struct.error as exc:
            raise TypeError(f"tokens must be ints: {exc}") from None
    return token_key(np.asarray(tokens))


@functools.lru_cache(maxsize=4096)
def _packer(n: int) -> struct.Struct:
    """A compiled packer per length (20% faster than re-parsing the format every call)."""
    return struct.Struct(f"<{n}q")


def slot_array(slots: Sequence[int] | SlotArray, expected_len: int) -> SlotArray:
    """Slots as a 1-D int64 array; a length other than `expected_len` is a ValueError."""
    arr = np.asarray(slots)
    if arr.ndim != 1:
        raise ValueError(f"slots must be 1-D, got shape {arr.shape}")
    if len(arr) != expected_len:
        raise ValueError(f"len(slots) == {len(arr)} but len(tokens) == {expected_len}")
    if arr.dtype != np.int64:
        if len(arr) and arr.dtype.kind not in "iu":
            raise TypeError(f"slots must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    return arr


def frozen_copy(arr: SlotArray) -> SlotArray:
    """A private read-only copy, so neither the caller nor a match result can alter the tree."""
    out = arr.copy()
    out.flags.writeable = False
    return out


def concat_slots(parts: list[SlotArray]) -> SlotArray:
    """A fresh, writable array the caller owns (torch.from_numpy warns on read-only ones)."""
    if len(parts) == 1:
        return parts[0].copy()
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(parts)


class StatsLedger:
    """Mutable cumulative counters behind `stats()` (all in tokens except the call counts)."""

    __slots__ = (
        "evicted_tokens",
        "insert_calls",
        "inserted_tokens",
        "match_calls",
        "matched_tokens",
        "requested_tokens",
    )

    def __init__(self) -> None:
        self.matched_tokens = 0
        self.requested_tokens = 0
        self.inserted_tokens = 0
        self.evicted_tokens = 0
        self.match_calls = 0
        self.insert_calls = 0

    def snapshot(self) -> CacheStats:
        return CacheStats(
            matched_tokens=self.matched_tokens,
            requested_tokens=self.requested_tokens,
            inserted_tokens=self.inserted_tokens,
            evicted_tokens=self.evicted_tokens,
            match_calls=self.match_calls,
            insert_calls=self.insert_calls,
        )
