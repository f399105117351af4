"""The publisher thread: page operations in, vLLM-format KV event batches out on ZMQ.

The step loop only appends cheap tuples (see `radixkv.engine.events.kv_events`) and, once per step,
puts that step's list on a queue. This thread turns each list into events (hashing, on the
`BlockLedger`), encodes one batch per step with msgpack and sends it as three frames:

    [topic, seq (8 bytes, big-endian), payload = msgpack([ts, events, dp_rank])]

It keeps the last `buffer_steps` encoded batches. A client of the replay ROUTER socket sends
`[b"", start_seq (8 bytes big-endian)]` (what a REQ or a DEALER with an empty delimiter frame
sends) and gets back `[b"", seq, payload]` for every buffered batch with seq >= start_seq, then
`[b"", seq = -1 (8 bytes, signed), b""]`; with `replay_layout` "topic" (vLLM's current replies,
the only ones vllm-router applies) a topic frame comes after the delimiter in each, the end
marker's being empty. A subscriber that sees a gap in seq (PUB drops at its high-water mark, or
it joined late) fills it from there.

`seq` starts at 0 in every life, as vLLM's (`seq_start` "zero"): vllm-router takes a seq lower
than the last it applied for a restart (it forgets that replica's blocks) and wants a replay to
start exactly at the seq it asked for (0 when it starts; "noncontiguous" replays are dropped).
With `seq_start` "time" it starts at `first_seq()`, the wall clock in microseconds, so a
restarted replica's stream continues above its previous life's: for consumers that keep the
last seq per endpoint and drop what is not newer (Dynamo's router ignores a stale event id, an
AllBlocksCleared included, until it rediscovers the worker); to them the restart is a gap, filled
from the replay socket, that starts with the new life's AllBlocksCleared.

The first batch is AllBlocksCleared: a consumer that knew this replica's blocks before a
restart forgets them. Closing sends a last AllBlocksCleared.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from radixkv.config.kv_events import KVEventsConfig
from radixkv.engine.events.kv_event_blocks import BlockLedger, Event, encode_batch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
Op = tuple[Any, ...]
_STOP: Any = object()


def first_seq() -> int:
    """A new publisher's first seq with `seq_start` "time": microseconds since 1970 (about
    2**51 today, far below 2**63, so signed and unsigned readers agree). Invariant: it exceeds
    every seq an earlier life of this replica sent, provided that life sent fewer batches than
    microseconds it lived (it sends at most one per engine step) and the host clock did not
    step back across the restart."""
    return time.time_ns() // 1000


def bind_or_connect(sock: zmq.Socket[Any], endpoint: str, bind: bool | None = None) -> None:
    """`bind` True/False decides; None is vLLM's rule: bind wildcard, ipc:// and inproc://
    endpoints, connect to the others."""
    wild = "*" in endpoint or "::" in endpoint
    if bind is None:
        bind = wild or endpoint.startswith(("ipc://", "inproc://"))
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)


class ZmqEventPublisher:
    """PUB socket + replay ROUTER + the thread serving both (sockets live on that thread after
    start-up: they are created and bound here so a bad endpoint fails the engine's start)."""

    def __init__(self, cfg: KVEventsConfig, ledger: BlockLedger, dp_rank: int = 0) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.dp_rank = dp_rank
        self.topic = cfg.topic.encode()
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=cfg.max_queue_size)
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self.next_seq = first_seq() if cfg.seq_start == "time" else 0
        self.batches_sent = 0
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.replay: zmq.Socket[Any] | None = None
        try:
            self.pub.setsockopt(zmq.SNDHWM, cfg.hwm)
            self.pub.setsockopt(zmq.LINGER, 0)
            bind_or_connect(self.pub, cfg.endpoint, cfg.bind)
            if cfg.replay_endpoint is not None:
                self.replay = self.ctx.socket(zmq.ROUTER)
                self.replay.setsockopt(zmq.LINGER, 0)
                self.replay.bind(cfg.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(f"--kv-events-config: cannot open its sockets: {exc}") from None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    # -- called from the step loop -------------------------------------------------------------
    def put(self, ops: list[Op]) -> None:
        """One step's operations (blocks when max_queue_size batches are waiting, as vLLM)."""
        self.queue.put((time.time(), ops))

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish what is queued (bounded by `timeout_s`), then stop and close the sockets."""
        if not self._thread.is_alive():
            self._close_sockets()
            return
        self.queue.put((time.time(), [("C",)]))
        self.queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("kv events: publisher thread did not stop within %.1fs", timeout_s)
            return  # the daemon thread still owns the sockets; the process is exiting
        self._close_sockets()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if self.replay is not None:
                self._serve_replays()
            try:
                item = self.queue.get(timeout=0.02)
            except queue.Empty:
                continue
            if item is _STOP:
                self.queue.task_done()
                return
            try:
                self._publish(*item)
            except Exception:  # never let one bad batch stop the stream
                log.exception("kv events: publishing a batch failed")
            finally:
                self.queue.task_done()  # queue.join(): everything put so far is sent

    def _publish(self, ts: float, ops: list[Op]) -> None:
        events = self.events_of(ops)
        if not events:
            return
        payload = msgpack.packb(encode_batch(ts, events, self.cfg.layout, self.dp_rank))
        seq = self.next_seq
        self.next_seq += 1
        self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self.buffer.append((seq, payload))
        self.batches_sent += 1

    def events_of(self, ops: list[Op]) -> list[Event]:
        out: list[Event] = []
        ledger = self.ledger
        for op in ops:
            kind = op[0]
            if kind == "S":
                out += ledger.stored(*op[1:])
            elif kind == "R":
                out += ledger.removed(*op[1:])
            elif kind == "T":
                out += ledger.tier_events(op[1])
            else:
                out += ledger.cleared()
        return out

    def _serve_replays(self) -> None:
        assert self.replay is not None
        while self.replay.poll(0):
            frames = self.replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("kv events: malformed replay request (%d frames)", len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
            head = (client, b"", self.topic) if self.cfg.replay_layout == "topic" else (client, b"")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    self.replay.send_multipart((*head, seq.to_bytes(8, "big"), payload))
            end_head = head if len(head) == 2 else (client, b"", b"")
            self.replay.send_multipart((*end_head, END_SEQ, b""))

    def _close_sockets(self) -> None:
        self.pub.close(linger=200)  # a moment for the last batch (AllBlocksCleared) to leave
        if self.replay is not None:
            self.replay.close(linger=0)
        self.ctx.term()
