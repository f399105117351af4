"""KV cache events: what the engine tells routers about its cache (`--kv-events-config`).

The hook is an `EventSink` that `KVManager` calls at the few places where slots enter or leave
the prefix cache (look for `self.events.` in engine/kv/kv_manager.py), and that the engine closes at
the end of each step (`end_step`). The default is `NULL_SINK`, whose calls do nothing, so the
hooks need no `is None` branches.

`BlockEventSink` is the real one. On the step loop it only slices the request's tokens at block
boundaries, reads which device pages end the new blocks, and appends a tuple; `end_step` hands
the step's list to the publisher thread (`radixkv.engine.events.kv_event_publisher`), which hashes,
encodes and sends. The wire format, block ids and page ↔ block mapping: `kv_event_blocks`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np

from radixkv.config.kv_events import KVEventsConfig, parse_kv_events_config
from radixkv.engine.events.kv_event_blocks import MEDIUM_DEVICE, BlockLedger
from radixkv.engine.tiers.tier_residency import TierOp
from radixkv.engine.tokens import TokenBuffer


class EventSink(Protocol):
    """Where the KV manager reports changes to the cached pages (device pool, medium "GPU")."""

    def stored(
        self,
        tokens: TokenBuffer | Sequence[int],
        slots: np.ndarray,
        start: int,
        end: int,
        namespace: Hashable | None,
        tree_upto: int,
    ) -> None:
        """The cache adopted positions [start, end) of `tokens` (page-aligned) with
        `slots[start:end]`. `slots[:tree_upto]` are the tree's slots of the prefix too; those in
        [tree_upto, start) may be a request's duplicates of positions the tree already held."""

    def removed(self, slots: np.ndarray) -> None:
        """The cache dropped these slots (whole pages), before they are freed."""

    def cleared(self) -> None:
        """The cache dropped everything (a flush on an idle engine)."""

    def tier_blocks(self, ops: list[TierOp]) -> None:
        """Pages entered or left host memory / storage (medium "CPU" / "DISK")."""

    def end_step(self) -> None:
        """Publish what this step changed, as one batch."""

    def close(self) -> None:
        """Publish what is pending and stop."""


class NullSink:
    """Events off: every call does nothing."""

    def stored(
        self,
        tokens: TokenBuffer | Sequence[int],
        slots: np.ndarray,
        start: int,
        end: int,
        namespace: Hashable | None,
        tree_upto: int,
    ) -> None:
        return

    def removed(self, slots: np.ndarray) -> None:
        return

    def cleared(self) -> None:
        return

    def tier_blocks(self, ops: list[TierOp]) -> None:
        return

    def end_step(self) -> None:
        return

    def close(self) -> None:
        return


NULL_SINK = NullSink()


class BlockEventSink:
    """The step loop's half: block boundaries and page ids, one list of operations per step."""

    def __init__(self, publisher: Any, block_size: int, page_size: int, cache: Any) -> None:
        self.publisher = publisher  # has put(list of ops) and close(); see ZmqEventPublisher
        self.cache = cache  # PrefixCache: only read (match) in the rare duplicate case
        self.block_size = block_size
        self.page_size = page_size
        self._ops: list[tuple[Any, ...]] = []
        publisher.put([("C",)])  # first batch: forget whatever a past life announced

    def stored(
        self,
        tokens: TokenBuffer | Sequence[int],
        slots: np.ndarray,
        start: int,
        end: int,
        namespace: Hashable | None,
        tree_upto: int,
    ) -> None:
        bs, ps = self.block_size, self.page_size
        first = start // bs * bs  # the block holding `start` completes now if its end <= end
        last = end // bs * bs
        if last <= first:
            return
        ends = range(first + bs, last + 1, bs)
        last_pages = [int(slots[e - 1]) // ps for e in ends]
        parent = None
        if first > 0:
            if tree_upto < first <= start:  # rare: a duplicate there; ask the tree for its slot
                m = self.cache.match(tokens[:first], namespace, record=False)
                slot = int(m.slots[first - 1])
            else:
                slot = int(slots[first - 1])
            parent = slot // ps
        ids = np.array(tokens[first:last], dtype=np.int64)  # a copy: the buffer keeps growing
        self._ops.append(("S", namespace, parent, last_pages, ids))

    def removed(self, slots: np.ndarray) -> None:
        if len(slots):
            self._ops.append(("R", slots))

    def cleared(self) -> None:
        self._ops.append(("C",))

    def tier_blocks(self, ops: list[TierOp]) -> None:
        if ops:
            self._ops.append(("T", ops))

    def end_step(self) -> None:
        if self._ops:
            ops, self._ops = self._ops, []
            self.publisher.put(ops)

    def close(self) -> None:
        self.end_step()
        self.publisher.close()


def make_sink(
    config: KVEventsConfig | str | None, page_size: int, cache: Any, fingerprint: str = ""
) -> EventSink:
    """The sink `--kv-events-config` asks for (NULL_SINK when events are off). Opens the sockets
    now: an endpoint that cannot be bound fails the engine's start-up."""
    cfg = (
        config if isinstance(config, KVEventsConfig) else parse_kv_events_config(config, page_size)
    )
    if not cfg.active:
        return NULL_SINK
    from radixkv.engine.events.kv_event_publisher import ZmqEventPublisher  # zmq only when used

    block = cfg.block_tokens(page_size)
    ledger = BlockLedger(block, page_size, fingerprint)
    return BlockEventSink(ZmqEventPublisher(cfg, ledger), block, page_size, cache)


def sink_for_engine(cache_cfg: Any, cache: Any, tiers: Any, hybrid: Any) -> EventSink:
    """The engine's sink from its cache section. With host/storage tiers the block ids use the
    tiers' model fingerprint (so with block = page they equal the tiers' page keys)."""
    cfg = parse_kv_events_config(cache_cfg.kv_events_config, cache_cfg.page_size)
    if not cfg.active:
        return NULL_SINK
    if hybrid is not None:
        raise ValueError("--kv-events-config: KV events are not supported for hybrid models yet")
    fingerprint: str = getattr(tiers, "fingerprint", "")
    if cfg.block_tokens(cache_cfg.page_size) == cache_cfg.page_size:
        tiers.announce_residency()  # a page is a block: L2/L3 pages are announced too
    return make_sink(cfg, cache_cfg.page_size, cache, fingerprint)


__all__ = ["MEDIUM_DEVICE", "NULL_SINK", "BlockEventSink", "EventSink", "NullSink", "make_sink"]
