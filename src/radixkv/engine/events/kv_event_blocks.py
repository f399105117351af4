"""Blocks from pages, on the publisher's thread: block ids, and the events in vLLM's wire format.

A block is `block_size` tokens (a multiple of the page size) aligned from the start of the
sequence. It is cached exactly when its *last* page is in the tree: cached prefixes are closed
under taking prefixes (eviction takes leaves first), so the last page's presence implies every
earlier one. The ledger therefore keys each live block by its last device page, announces it
when that page is adopted and retracts it when that page is evicted. A partial block (a tail
shorter than `block_size`) is never announced.

Block ids are chained hashes (the tiers' construction, `radixkv.cache.tiers.chain_hashes`, at the
block's granularity: with block = page they are the tiers' own page keys):

    h_0 = H(fingerprint, cache salt);  h_i = H(h_{i-1} || tokens of block i)

so an id is stable (same tokens, same salt → same id, on every replica of one model), unique
per prefix and salt (two salts never share an id), and names its parent. On the wire an id is the
first 8 bytes of the hash as an unsigned 64-bit integer (vllm-router refuses signed ids; Dynamo
takes either).

The ledger runs on one thread (the publisher's) and only sees the step loop's operations through
a FIFO queue, in order; it never reads engine state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

import numpy as np

from radixkv.cache.keys import token_key
from radixkv.cache.tiers import HASH_BYTES, namespace_seed
from radixkv.engine.tiers.tier_residency import TierOp

MEDIUM_DEVICE = "GPU"  # vLLM's name for the device pool's medium, whatever the device
Event = dict[str, Any]


def external_id(h: bytes) -> int:
    """The wire id of a block hash: its first 8 bytes, big-endian, unsigned."""
    return int.from_bytes(h[:8], "big")


class BlockLedger:
    """Live blocks by last device page; turns page operations into events (plain dicts in the
    map layout's field names; `encode_event` writes either layout)."""

    def __init__(self, block_size: int, page_size: int, fingerprint: str = "") -> None:
        if block_size % page_size:
            raise ValueError(f"block size {block_size} is not a multiple of the page {page_size}")
        self.block_size = block_size
        self.page_size = page_size
        self.fingerprint = fingerprint
        self._by_page: dict[int, bytes] = {}  # last device page of a live block -> its hash
        self._seeds: dict[Hashable | None, bytes] = {}
        self.orphans = 0  # blocks skipped because their parent was unknown (should stay 0)

    def __len__(self) -> int:
        return len(self._by_page)

    def live_ids(self) -> set[int]:
        return {external_id(h) for h in self._by_page.values()}

    def seed(self, namespace: Hashable | None) -> bytes:
        s = self._seeds.get(namespace)
        if s is None:
            s = self._seeds[namespace] = namespace_seed(self.fingerprint, namespace)
        return s

    def stored(
        self,
        namespace: Hashable | None,
        parent_page: int | None,
        last_pages: list[int],
        tokens: np.ndarray | list[int],
        medium: str = MEDIUM_DEVICE,
    ) -> list[Event]:
        """Blocks whose last pages are `last_pages` became cached; `tokens` are theirs, in order
        (len(last_pages) * block_size); `parent_page` is the last page of the block before the
        first one (None: they start the sequence)."""
        if not last_pages:
            return []
        if parent_page is None:
            prev, parent_id = self.seed(namespace), None
        else:
            got = self._by_page.get(parent_page)
            if got is None:
                self.orphans += len(last_pages)
                return []
            prev, parent_id = got, external_id(got)
        key = token_key(tokens)
        step = len(key) // len(last_pages)
        ids: list[int] = []
        for i, page in enumerate(last_pages):
            prev = hashlib.blake2b(
                prev + key[i * step : (i + 1) * step], digest_size=HASH_BYTES
            ).digest()
            self._by_page[page] = prev
            ids.append(external_id(prev))
        return [self._stored_event(ids, parent_id, tokens, medium, namespace)]

    def _stored_event(
        self,
        ids: list[int],
        parent_id: int | None,
        tokens: np.ndarray | list[int],
        medium: str,
        namespace: Hashable | None,
    ) -> Event:
        ev: Event = {
            "type": "BlockStored",
            "block_hashes": ids,
            "parent_block_hash": parent_id,
            "token_ids": np.asarray(tokens, dtype=np.int64).tolist(),
            "block_size": self.block_size,
            "lora_id": None,
            "medium": medium,
            "lora_name": None,
        }
        if namespace is not None and isinstance(namespace, str):
            # vLLM puts the salt in the extra keys of the sequence's first block; Dynamo also
            # reads a top-level cache_salt on every event.
            ev["extra_keys"] = [
                [namespace] if parent_id is None and i == 0 else None for i in range(len(ids))
            ]
            ev["cache_salt"] = namespace
        return ev

    def removed(self, slots: np.ndarray, medium: str = MEDIUM_DEVICE) -> list[Event]:
        """Device slots were evicted: the blocks whose last page was among them are gone."""
        ps = self.page_size
        pages = slots if ps == 1 else slots[slots % ps == 0] // ps
        by_page = self._by_page
        ids = [external_id(h) for p in pages.tolist() if (h := by_page.pop(p, None)) is not None]
        if not ids:
            return []
        return [{"type": "BlockRemoved", "block_hashes": ids, "medium": medium}]

    def tier_events(self, ops: list[TierOp]) -> list[Event]:
        """Pages entering or leaving L2 / L3 (`radixkv.engine.tiers.tier_residency`; block = page,
        so a page hash is the block's id). Consecutive stored pages of one chain become one
        event."""
        out: list[Event] = []
        run: list[TierOp] = []

        def flush() -> None:
            if run:
                out.append(self._tier_stored(run))
                run.clear()

        for op in ops:
            if not op.stored:
                flush()
                gone = {"type": "BlockRemoved", "block_hashes": [external_id(op.h)]}
                if out and out[-1]["type"] == "BlockRemoved" and out[-1]["medium"] == op.medium:
                    out[-1]["block_hashes"] += gone["block_hashes"]
                else:
                    out.append({**gone, "medium": op.medium})
                continue
            prev = run[-1] if run else None
            assert op.info is not None
            if prev is not None and (
                prev.medium != op.medium or op.info.parent != prev.h
            ):  # not the next page of the same chain in the same medium
                flush()
            run.append(op)
        flush()
        return out

    def _tier_stored(self, run: list[TierOp]) -> Event:
        first = run[0].info
        assert first is not None
        tokens = np.concatenate([op.info.tokens for op in run if op.info is not None])
        parent = None if first.parent is None else external_id(first.parent)
        return self._stored_event(
            [external_id(op.h) for op in run], parent, tokens, run[0].medium, first.namespace
        )

    def cleared(self) -> list[Event]:
        self._by_page.clear()
        return [{"type": "AllBlocksCleared"}]


# Field order of each event in the tuple layout (older vLLM: msgspec array_like structs).
_TUPLE_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def encode_event(ev: Event, layout: str) -> Any:
    """One event as msgpack-ready data: a map tagged by "type", or ["Tag", field, ...]."""
    if layout == "map":
        return ev
    return [ev["type"], *(ev[f] for f in _TUPLE_FIELDS[ev["type"]])]


def encode_batch(ts: float, events: list[Event], layout: str, dp_rank: int = 0) -> list[Any]:
    """The payload: [ts, events, dp_rank] (both layouts; older decoders ignore the rank)."""
    return [ts, [encode_event(e, layout) for e in events], dp_rank]
