"""Per-session cache statistics (`session_id` on requests, `/sessions/{id}`).

The session id is also passed to the engine in RequestOptions so a later session-aware eviction
policy can use it; here the server only records what each session got from the cache. The table
is bounded (least recently used sessions are dropped first) so clients inventing ids cannot grow
server memory without limit.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SessionStats:
    session_id: str
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    closed: bool = False

    @property
    def token_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["token_hit_rate"] = round(self.token_hit_rate, 6)
        return out


class SessionTracker:
    """LRU-bounded map session_id → SessionStats; all calls run on the event loop thread."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, SessionStats] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def record(
        self, session_id: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int
    ) -> None:
        """Account one finished request; a request on a closed session reopens it afresh."""
        stats = self._sessions.get(session_id)
        if stats is None or stats.closed:
            stats = SessionStats(session_id)
            self._sessions[session_id] = stats
        self._sessions.move_to_end(session_id)
        stats.last_used = time.time()
        stats.requests += 1
        stats.prompt_tokens += prompt_tokens
        stats.cached_tokens += cached_tokens
        stats.completion_tokens += completion_tokens
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def get(self, session_id: str) -> SessionStats | None:
        return self._sessions.get(session_id)

    def most_recent(self, n: int) -> list[SessionStats]:
        """The `n` most recently used sessions, newest first."""
        out: list[SessionStats] = []
        for stats in reversed(self._sessions.values()):
            if len(out) >= n:
                break
            out.append(stats)
        return out

    def close(self, session_id: str) -> SessionStats | None:
        """Mark a session closed and return its final stats (None if unknown)."""
        stats = self._sessions.get(session_id)
        if stats is not None:
            stats.closed = True
        return stats
