"""A KV event consumer written from the wire format alone (as a router's indexer would be): a SUB
socket for the stream, a DEALER for replay, msgpack decoding of both layouts, and the block table
the events describe. It imports nothing from radixkv, so it checks the format, not our code."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

END = -1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def decode_event(raw: Any) -> dict[str, Any]:
    """A tagged map, or a tagged array (older layout) as a map of the same field names."""
    if isinstance(raw, dict):
        return raw
    tag, *rest = raw
    names = {
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
    }[tag]
    assert len(rest) == len(names), raw
    return {"type": tag, **dict(zip(names, rest, strict=True))}


@dataclass
class Block:
    parent: int | None
    tokens: list[int]
    salt: str | None


@dataclass
class Subscriber:
    """Connects to a publisher that binds (or binds for one that connects: `bind=True`)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: bytes = b""
    bind: bool = False
    replay_layout: str = "plain"  # "topic": each replay reply carries the topic after b""
    blocks: dict[int, Block] = field(default_factory=dict)
    next_seq: int | None = None  # the last applied seq + 1; None before the first
    batches: list[tuple[int, list[Any]]] = field(default_factory=list)  # (seq, raw payload)
    replayed: int = 0
    holes: int = 0  # gaps that replay could not fill (a publisher's new life, a full buffer)
    clears: int = 0
    # The lower tiers' live blocks by medium ("CPU", "DISK"); `blocks` is the device pool's.
    tiers: dict[str, dict[int, Block]] = field(default_factory=dict)
    known: dict[int, Block] = field(default_factory=dict)  # every block ever stored, any medium

    def __post_init__(self) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        (self.sub.bind if self.bind else self.sub.connect)(self.endpoint)

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()

    def hang_up(self) -> None:
        """Close the stream socket (what it would have received is lost to it)."""
        self.sub.close(0)

    def reopen(self) -> None:
        """A new stream socket on the same endpoint (a publisher that connects finds it again)."""
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        (self.sub.bind if self.bind else self.sub.connect)(self.endpoint)

    # -- receiving -------------------------------------------------------------------------------
    # As Dynamo's indexer and vllm-router keep it: the last seq applied (`next_seq` - 1; None
    # before the first batch), dropping any batch whose seq is not newer, and a gap (a batch
    # newer than the next one expected) filled from the replay socket first. A batch past a gap
    # that replay could not fill is applied anyway (counted in `holes`): a publisher's new life
    # starts above its last one, with AllBlocksCleared.
    def drain(
        self, quiet_s: float = 0.3, until_seq: int | None = None, limit_s: float = 10
    ) -> None:
        """Receive until nothing arrives for `quiet_s` (and `until_seq` was applied, if given);
        a gap in seq is filled from the replay socket before going on. A subscriber that has
        applied nothing yet first asks the replay socket for all it buffered."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if until_seq is not None and self.next_seq is not None and self.next_seq > until_seq:
                return
            if not self.sub.poll(int(quiet_s * 1000)):
                before = self.next_seq
                if self.replay_endpoint is not None:
                    self.replay(self.next_seq or 0)  # the tail may have been dropped: ask for it
                if until_seq is None and self.next_seq == before:
                    return
                continue
            topic, seq_b, payload = self.sub.recv_multipart()
            assert topic == self.topic
            seq = int.from_bytes(seq_b, "big")
            if self.next_seq is not None and seq < self.next_seq:
                continue  # not newer: already applied (from a replay), or a stale stream
            gap = self.next_seq is None or seq > self.next_seq
            if gap and self.replay_endpoint is not None:
                self.replay(self.next_seq or 0)
                if self.next_seq is not None and seq < self.next_seq:
                    continue
            if self.next_seq is not None and seq > self.next_seq:
                self.holes += 1  # the replay buffer no longer (or never) held the batches between
            self.apply(seq, msgpack.unpackb(payload))
        raise AssertionError(f"no quiet period / seq {until_seq} not reached in {limit_s}s")

    def replay(self, start: int) -> None:
        """Ask the replay socket for every batch from `start` and apply, in order, the ones newer
        than the last applied."""
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                assert dealer.poll(5000), "replay socket did not answer"
                frames = dealer.recv_multipart()
                if self.replay_layout == "topic":
                    empty, topic, seq_b, payload = frames
                    assert topic in (self.topic, b"")  # the end marker's is empty
                else:
                    empty, seq_b, payload = frames
                assert empty == b""
                seq = int.from_bytes(seq_b, "big", signed=True)
                if seq == END:
                    assert payload == b""
                    return
                assert seq >= start, (seq, start)
                if self.next_seq is None or seq >= self.next_seq:
                    if self.next_seq is not None and seq > self.next_seq:
                        self.holes += 1
                    self.replayed += 1
                    self.apply(seq, msgpack.unpackb(payload))
        finally:
            dealer.close(0)

    # -- the block table -------------------------------------------------------------------------
    def apply(self, seq: int, payload: list[Any]) -> None:
        ts, events, dp_rank = payload
        assert isinstance(ts, float) and dp_rank == 0
        self.batches.append((seq, payload))
        self.next_seq = seq + 1
        for raw in events:
            ev = decode_event(raw)
            if ev["type"] == "BlockStored":
                self._stored(ev)
            elif ev["type"] == "BlockRemoved":
                table = self._table(ev["medium"])
                for h in ev["block_hashes"]:
                    assert h in table, f"removed unknown block {h} ({ev['medium']})"
                    del table[h]
            else:
                assert ev["type"] == "AllBlocksCleared", ev
                self.blocks.clear()
                self.tiers.clear()
                self.clears += 1

    def _table(self, medium: str) -> dict[int, Block]:
        if medium == "GPU":
            return self.blocks
        assert medium in ("CPU", "DISK"), medium
        return self.tiers.setdefault(medium, {})

    def _stored(self, ev: dict[str, Any]) -> None:
        bs, hashes, toks = ev["block_size"], ev["block_hashes"], ev["token_ids"]
        assert len(toks) == bs * len(hashes), ev
        table = self._table(ev["medium"])
        parent = ev["parent_block_hash"]
        # The device pool holds whole prefixes, so a block's parent is live there; a lower
        # tier may hold a page without its parent (announced earlier, in some medium).
        parents = self.blocks if table is self.blocks else self.known
        assert parent is None or parent in parents, "stored block of an unknown parent"
        salt = ev.get("cache_salt")
        if parent is not None:
            assert parents[parent].salt == salt, "a salt's chain continues another salt's"
        for i, h in enumerate(hashes):
            assert isinstance(h, int) and 0 <= h < 2**64  # vllm-router refuses signed ids
            assert h not in table, f"block {h} stored twice ({ev['medium']})"
            table[h] = self.known[h] = Block(parent, toks[i * bs : (i + 1) * bs], salt)
            parent = h

    def tier_prefixes(self, medium: str) -> dict[int, tuple[str | None, tuple[int, ...]]]:
        """A lower tier's live blocks: id -> (salt, all tokens from the sequence's start)."""
        out = {}
        for h, b in self.tiers.get(medium, {}).items():
            toks: list[int] = []
            cur: int | None = h
            while cur is not None:
                toks[:0] = self.known[cur].tokens
                cur = self.known[cur].parent
            out[h] = (b.salt, tuple(toks))
        return out

    def prefixes(self) -> set[tuple[str | None, tuple[int, ...]]]:
        """Every live block as (salt, all tokens from the sequence's start to its end)."""
        out = set(self.prefix_list())
        assert len(out) == len(self.blocks), "two live blocks for one prefix"
        return out

    def prefix_list(self) -> list[tuple[str | None, tuple[int, ...]]]:
        out = []
        for h, b in self.blocks.items():
            toks: list[int] = []
            cur: int | None = h
            while cur is not None:
                blk = self.blocks[cur]
                toks[:0] = blk.tokens
                cur = blk.parent
            out.append((b.salt, tuple(toks)))
        return out
