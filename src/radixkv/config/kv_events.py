"""`--kv-events-config`: the JSON object vLLM and SGLang take for publishing KV cache events.

The keys, their meaning and their defaults are vLLM's `KVEventsConfig` (SGLang reads the same
JSON); five keys are ours:

    enable_kv_cache_events  false     publish at all
    publisher               "zmq" when enabled, else "null"
    endpoint                "tcp://*:5557"   PUB socket; bound when it holds "*", "::", ipc:// or
                                             inproc://, connected to otherwise (vLLM's rule)
    replay_endpoint         null      ROUTER socket (always bound) serving missed batches
    buffer_steps            10000     batches kept for replay
    hwm                     100000    the PUB socket's send high-water mark
    max_queue_size          100000    batches waiting for the publisher thread
    topic                   ""        first frame of every message
    layout                  "map"     ours: "map" (events as tagged maps, vLLM's current
                                      encoding) or "tuple" (tagged arrays, the older one)
    block_size              null      ours: tokens per announced block, a multiple of the page
                                      size (default: the smallest multiple of the page >= 16)
    bind                    null      ours: true binds `endpoint` (tcp://127.0.0.1:5557 for a
                                      router on this host), false connects; null: vLLM's rule
    seq_start               "zero"    ours: a new life's first seq: 0 (vLLM's; vllm-router
                                      takes a lower seq for a restart and wants replays that
                                      start at the seq it asked, 0 when it starts) or "time"
                                      (the wall clock in microseconds: a restarted replica's
                                      stream continues above its last life's, for consumers
                                      that keep the last seq and drop what is not newer)
    replay_layout           "plain"   ours: replay replies as [b"", seq, payload] ("plain":
                                      SGLang's, what Dynamo's indexer reads) or [b"", topic,
                                      seq, payload] ("topic": vLLM's current, what vllm-router
                                      reads; it ignores the other)

No torch and no zmq here: the CLI checks the flag before anything heavy is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

PUBLISHERS = ("null", "zmq")
LAYOUTS = ("map", "tuple")
REPLAY_LAYOUTS = ("plain", "topic")
SEQ_STARTS = ("zero", "time")
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    layout: str = "map"
    block_size: int | None = None
    bind: bool | None = None
    replay_layout: str = "plain"
    seq_start: str = "zero"

    @property
    def active(self) -> bool:
        """True when events are published (enabled, with the zmq publisher)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def block_tokens(self, page_size: int) -> int:
        """Tokens per announced block: the configured size, or the smallest multiple of the
        page size that is at least 16 (page 16 ↔ block 16; page 1 → 16; page 64 → 64)."""
        if self.block_size is not None:
            return self.block_size
        return -(-DEFAULT_BLOCK_TOKENS // page_size) * page_size


_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,),
    "publisher": (str, type(None)),
    "endpoint": (str,),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
    "layout": (str,),
    "block_size": (int, type(None)),
    "bind": (bool, type(None)),
    "replay_layout": (str,),
    "seq_start": (str,),
}


def parse_kv_events_config(text: str | None, page_size: int = 1) -> KVEventsConfig:
    """The config from the flag's JSON text (None: events off). Raises ValueError saying which key
    is wrong: unknown keys, wrong types, bad values are start-up errors, never ignored."""
    if text is None or not text.strip():
        return KVEventsConfig()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object")
    known = {f.name for f in fields(KVEventsConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; known: {sorted(known)}")
    for key, value in raw.items():
        ok = _TYPES[key]
        if not isinstance(value, ok) or (isinstance(value, bool) and bool not in ok):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in ok)
            raise ValueError(f"{key!r} must be {names}, not {json.dumps(value)}")
    args: dict[str, Any] = dict(raw)
    if args.get("publisher") is None:
        args["publisher"] = "zmq" if args.get("enable_kv_cache_events") else "null"
    cfg = KVEventsConfig(**args)
    _check(cfg, page_size)
    return cfg


def _check(cfg: KVEventsConfig, page_size: int) -> None:
    if cfg.publisher not in PUBLISHERS:
        raise ValueError(f"'publisher' must be one of {list(PUBLISHERS)}, not {cfg.publisher!r}")
    if cfg.layout not in LAYOUTS:
        raise ValueError(f"'layout' must be one of {list(LAYOUTS)}, not {cfg.layout!r}")
    if cfg.replay_layout not in REPLAY_LAYOUTS:
        raise ValueError(
            f"'replay_layout' must be one of {list(REPLAY_LAYOUTS)}, not {cfg.replay_layout!r}"
        )
    if cfg.seq_start not in SEQ_STARTS:
        raise ValueError(f"'seq_start' must be one of {list(SEQ_STARTS)}, not {cfg.seq_start!r}")
    for key in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"{key!r} must be >= 0")
    if cfg.block_size is not None and (cfg.block_size < 1 or cfg.block_size % page_size):
        raise ValueError(
            f"'block_size' {cfg.block_size} must be a positive multiple of the page size "
            f"({page_size})"
        )
    for key in ("endpoint", "replay_endpoint"):
        ep = getattr(cfg, key)
        if ep is not None and "://" not in ep:
            raise ValueError(f"{key!r} must be a zmq address such as tcp://*:5557, not {ep!r}")
