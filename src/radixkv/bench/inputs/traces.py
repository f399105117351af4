"""Loaders for public prefix-cache traces: Mooncake FAST'25 jsonl and Claude Code agent sessions.

Both formats describe requests by chained block hash ids (equal id at position i ⇒ equal first i+1
blocks) and carry no tokens. A `TraceRequest` turns its ids back into deterministic token ids: block
id `b` stands for the tokens `b * block_size + arange(block_size)`, so distinct blocks never share a
token and a cache sees exactly the trace's prefix structure.

Claude Code ids are local to one session file. The loader namespaces them by giving each session
(sorted by trace id, so the result does not depend on archive order) a disjoint range of global ids;
a nested `subagent` shares its parent's range. Session start times are a choice (the files have no
absolute clock): session k starts at `k * session_gap` seconds, or, with `session_gap=None`, right
after session k-1's last request (sequential, no interleaving).
"""

from __future__ import annotations

import json
import math
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

TraceFormat = Literal["mooncake", "claude-code"]
IdArray = npt.NDArray[np.int64]
BlockIds = npt.NDArray[np.int32] | npt.NDArray[np.int64]

MOONCAKE_BLOCK_SIZE = 512
CLAUDE_CODE_BLOCK_SIZE = 64
DEFAULT_SESSION_GAP_S = 60.0

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(eq=False)
class TraceRequest:
    """One request of a trace, with its block ids already namespaced (global).

    Invariants: `len(hash_ids) * block_size >= input_length > (len(hash_ids) - 1) * block_size`
    (the last block may be partial: it holds the leading tokens of that block) unless the input
    runs past the hashed blocks; then `tail_id >= 0` starts a run of `num_tail_blocks` block ids
    used by no other request, whose tokens stand for the unhashed remainder (Claude Code hashes
    only full blocks, so that remainder can never be a hit).
    """

    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: BlockIds  # int64 (Mooncake) or int32 (Claude Code, to halve memory)
    block_size: int
    session: str = ""
    tail_id: int = -1
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return len(self.hash_ids)

    @property
    def hashed_length(self) -> int:
        """Tokens covered by hashed blocks (the rest, if any, is the unique tail)."""
        return min(self.num_blocks * self.block_size, self.input_length)

    @property
    def num_tail_blocks(self) -> int:
        """Unique blocks `tail_id, tail_id + 1, ...` that stand for the unhashed remainder."""
        rest = self.input_length - self.num_blocks * self.block_size
        return -(-rest // self.block_size) if rest > 0 else 0

    def token_ids(self, vocab_size: int | None = None) -> IdArray:
        """The request's `input_length` token ids, deterministic in the block ids.

        Without `vocab_size` ids are `block * block_size + offset` (distinct across blocks). With
        it they are a 64-bit mix of that value reduced mod `vocab_size`, for replay against a real
        model; accidental equality of whole blocks is then negligible, not impossible.
        """
        bs = self.block_size
        ids = self.hash_ids
        if self.tail_id >= 0:
            ids = np.concatenate([ids, self.tail_id + np.arange(self.num_tail_blocks)])
        tokens = (ids.astype(np.int64)[:, None] * bs + np.arange(bs, dtype=np.int64)).ravel()
        tokens = tokens[: self.input_length]
        if vocab_size is None:
            return tokens
        return (_mix64(tokens) % np.uint64(vocab_size)).astype(np.int64)


def _mix64(values: IdArray) -> npt.NDArray[np.uint64]:
    """splitmix64 finaliser, vectorised (wrapping uint64 arithmetic is intended)."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


# ---------------------------------------------------------------- format detection


def detect_format(path: str | Path) -> TraceFormat:
    """Guess the trace format from the path and, for plain files, the first JSON value."""
    p = Path(path)
    if p.is_dir() or tarfile.is_tarfile(p):
        return "claude-code"
    with p.open("rb") as fh:
        head = fh.read(1 << 16)
    first_line = head.split(b"\n", 1)[0].strip()
    try:
        obj = json.loads(first_line)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and "hash_ids" in obj and "input_length" in obj:
        return "mooncake"
    if p.suffix == ".json" or b'"requests"' in head:
        return "claude-code"
    raise ValueError(f"{path}: not a Mooncake jsonl nor a Claude Code trace")


def load_trace(
    path: str | Path,
    *,
    session_gap: float | None = DEFAULT_SESSION_GAP_S,
    max_sessions: int | None = None,
) -> list[TraceRequest]:
    """Load any supported trace, requests in replay (arrival) order."""
    if detect_format(path) == "mooncake":
        return load_mooncake(path)
    return load_claude_code(path, session_gap=session_gap, max_sessions=max_sessions)


# ---------------------------------------------------------------- Mooncake


def load_mooncake(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[TraceRequest]:
    """Mooncake FAST'25 jsonl: `{timestamp (ms), input_length, output_length, hash_ids}` per line.

    Ids are already global (one chained hash space per file). Order: file order, which is
    timestamp order in the published traces (kept stable for equal timestamps).
    """
    out: list[TraceRequest] = []
    name = Path(path).name
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            ids = np.asarray(rec["hash_ids"], dtype=np.int64)
            length = int(rec["input_length"])
            _check_blocks(length, len(ids), block_size, f"{name}:{lineno}", allow_tail=False)
            out.append(
                TraceRequest(
                    arrival_s=float(rec["timestamp"]) / 1000.0,
                    input_length=length,
                    output_length=int(rec.get("output_length", 0)),
                    hash_ids=ids,
                    block_size=block_size,
                    session=name,
                )
            )
    out.sort(key=lambda r: r.arrival_s)  # stable: file order breaks ties
    return out


def _check_blocks(length: int, n: int, bs: int, where: str, *, allow_tail: bool) -> None:
    """Reject id lists that cannot describe `length` tokens (too many, or too few if no tail)."""
    if length <= 0:
        raise ValueError(f"{where}: input length {length} must be positive")
    if n > math.ceil(length / bs) or (not allow_tail and n < math.ceil(length / bs)):
        raise ValueError(f"{where}: {n} block ids for {length} tokens of block size {bs}")


# ---------------------------------------------------------------- Claude Code


@dataclass
class _Raw:
    """A leaf request of a session file, parsed (ids local, time from the session start)."""

    t: float
    input_length: int
    output_length: int
    ids: npt.NDArray[np.int32]
    kind: str


@dataclass
class _Session:
    """One parsed trace file. Raw JSON lists are dropped at once: as Python ints the whole
    archive would take GBs; as int32 arrays it takes ~4 bytes per block."""

    name: str
    block_size: int
    requests: list[_Raw]
    max_id: int


def _iter_claude_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, raw json) of every trace file: a tar archive streamed member by member (never
    extracted to disk), a directory of *.json files, or one json file."""
    if path.is_dir():
        for p in sorted(path.glob("*.json")):
            yield p.name, p.read_bytes()
    elif tarfile.is_tarfile(path):
        with tarfile.open(path, mode="r|*") as tf:  # stream mode: sequential decompression
            for member in tf:
                if not (member.isfile() and member.name.endswith(".json")):
                    continue
                fh = tf.extractfile(member)
                if fh is not None:
                    yield Path(member.name).name, fh.read()
    else:
        yield path.name, path.read_bytes()


def _flatten(
    requests: list[dict[str, Any]], base_t: float
) -> Iterator[tuple[float, dict[str, Any]]]:
    """Leaf requests with times from the session start; a subagent's `t` offsets its children."""
    for req in requests:
        t = base_t + float(req.get("t", 0.0))
        if req.get("type") == "subagent":
            yield from _flatten(req.get("requests", []), t)
        elif "hash_ids" in req:
            yield t, req


def _parse_session(name: str, raw: bytes) -> _Session:
    doc = json.loads(raw)
    if not isinstance(doc, dict) or "requests" not in doc:
        raise ValueError(f"{name}: not a Claude Code trace (no 'requests')")
    sid = str(doc.get("id") or Path(name).stem)
    reqs: list[_Raw] = []
    max_id = -1
    for seq, (t, req) in enumerate(_flatten(doc["requests"], 0.0)):
        ids = np.asarray(req["hash_ids"], dtype=np.int64)
        if ids.size:
            if ids.min() < 0:
                raise ValueError(f"{sid}#{seq}: negative hash id")
            max_id = max(max_id, int(ids.max()))
        kind = f"{req.get('type')}:{req.get('model')}"
        reqs.append(_Raw(t, int(req["in"]), int(req.get("out", 0)), ids.astype(np.int32), kind))
    return _Session(sid, int(doc.get("block_size", CLAUDE_CODE_BLOCK_SIZE)), reqs, max_id)


def load_claude_code(
    path: str | Path,
    *,
    session_gap: float | None = DEFAULT_SESSION_GAP_S,
    max_sessions: int | None = None,
) -> list[TraceRequest]:
    """Claude Code sessions (archive, directory or single file) merged into one arrival order.

    Sessions are sorted by id; with `max_sessions` only the first ones are kept. Session k gets the
    global ids `[base_k, base_k + max_local_id + 1)` (so equal local ids in two files never meet)
    and starts at `k * session_gap` s, or after session k-1 ends when `session_gap` is None.
    Requests of different sessions that arrive at the same time keep session order.
    """
    sessions = sorted(
        (_parse_session(n, raw) for n, raw in _iter_claude_files(Path(path))), key=lambda s: s.name
    )
    if max_sessions is not None:
        sessions = sessions[:max_sessions]
    merged: list[tuple[float, int, int, TraceRequest]] = []
    base = 0
    start = 0.0
    for k, sess in enumerate(sessions):
        if session_gap is not None:
            start = k * session_gap
        last = start
        for seq, raw in enumerate(sess.requests):
            req = _claude_request(sess, raw, base, start + raw.t, f"{sess.name}#{seq}")
            merged.append((req.arrival_s, k, seq, req))
            last = max(last, req.arrival_s)
        base += sess.max_id + 1
        if session_gap is None:
            start = last
    merged.sort(key=lambda x: x[:3])
    out = [m[3] for m in merged]
    # Tails get ids past every real block, disjoint per request: never shared, never hit.
    for req in out:
        if req.tail_id >= 0:
            req.tail_id = base
            base += req.num_tail_blocks
    return out


def _claude_request(
    sess: _Session, raw: _Raw, base: int, arrival: float, where: str
) -> TraceRequest:
    bs = sess.block_size
    _check_blocks(raw.input_length, len(raw.ids), bs, where, allow_tail=True)
    if base + sess.max_id >= 2**31:
        raise ValueError(f"{where}: global block ids overflow int32")
    return TraceRequest(
        arrival_s=arrival,
        input_length=raw.input_length,
        output_length=raw.output_length,
        hash_ids=raw.ids + np.int32(base),
        block_size=bs,
        session=sess.name,
        tail_id=0 if len(raw.ids) * bs < raw.input_length else -1,  # real id set after ordering
        meta={"kind": raw.kind},
    )


def trace_summary(requests: Sequence[TraceRequest]) -> dict[str, Any]:
    """Sizes of a loaded trace (for headers and JSON)."""
    return {
        "requests": len(requests),
        "input_tokens": int(sum(r.input_length for r in requests)),
        "blocks": int(sum(r.num_blocks for r in requests)),
        "sessions": len({r.session for r in requests}),
        "block_size": requests[0].block_size if requests else 0,
        "duration_s": (requests[-1].arrival_s - requests[0].arrival_s) if requests else 0.0,
    }
