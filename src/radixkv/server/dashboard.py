"""The live dashboard: `GET /dashboard` (one self-contained HTML page, inline JS/CSS, no CDN) and
the JSON it polls, `GET /dashboard/state` and `GET /cache/tree`.

Privacy contract (tests check it): these routes return sizes, counts, ages and short keyed hashes
only, never token ids or text; request ids, session ids and cache salts appear as keyed hashes
(the key is a per-process secret, `ServerState.label_key`). Like every route but /health they sit
behind `--api-key`; the page asks for the key once and sends it as a Bearer token.

`RecentRequests` is the bounded ring buffer of finished-request summaries the page lists.
"""

from __future__ import annotations

import hmac
import logging
import operator
import re
import time
from collections import deque
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from radixkv.cache.tree_view import namespace_label, request_label, session_label

if TYPE_CHECKING:
    from radixkv.server.app import ServerState
    from radixkv.server.openai.serving import Generation

RECENT_REQUESTS = 200  # ring buffer size (summaries of finished requests)
MAX_SESSIONS_LISTED = 20


class RecentRequests:
    """The last `maxlen` finished requests as privacy-safe summaries (event-loop thread only)."""

    def __init__(self, key: bytes, maxlen: int = RECENT_REQUESTS) -> None:
        self.key = key
        self._items: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.total = 0

    def record(self, gen: Generation, cache_salt: str | None = None) -> None:
        self.total += 1
        self._items.append(
            {
                "seq": self.total,
                "id": request_label(self.key, gen.request_id),
                "kind": gen.kind,
                "namespace": namespace_label(self.key, cache_salt),
                "session": session_label(self.key, gen.session_id),
                "finish_reason": gen.finish_reason,
                "prompt_tokens": gen.prompt_tokens,
                "cached_tokens": gen.cached_tokens,
                "completion_tokens": gen.completion_tokens,
                "ttft_s": None if gen.ttft_s is None else round(gen.ttft_s, 4),
                "latency_s": round(time.perf_counter() - gen.t0, 4),
                "finished_at": time.time(),
            }
        )

    def last(self, n: int) -> list[dict[str, Any]]:
        """The newest `n` summaries, newest first."""
        n = max(0, min(n, len(self._items)))
        return [self._items[-1 - i] for i in range(n)]


def page_key_ok(scope: Any, api_key: str) -> bool:
    """A browser cannot send a Bearer header when it opens a page, so `GET /dashboard` (the page
    only, never its JSON) also accepts `?api_key=K`; the page then strips it from the address bar
    and sends it as a Bearer token on every poll."""
    if scope.get("path") != "/dashboard" or scope.get("method") != "GET":
        return False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    given = query.get("api_key", [""])[-1]
    return bool(given) and hmac.compare_digest(given.encode(), api_key.encode())


class _RedactPageKey(logging.Filter):
    """Keeps `?api_key=` of the dashboard's address out of uvicorn's access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and "api_key=" in a for a in args):
            record.args = tuple(
                _KEY_IN_QUERY.sub(r"\1api_key=<redacted>", a) if isinstance(a, str) else a
                for a in args
            )
        return True


_KEY_IN_QUERY = re.compile(r"([?&])api_key=[^&\s]*")
logging.getLogger("uvicorn.access").addFilter(_RedactPageKey())


@cache
def dashboard_html() -> str:
    return resources.files("radixkv.server").joinpath("dashboard.html").read_text("utf-8")


def _sessions(state: ServerState, n: int) -> list[dict[str, Any]]:
    """The most recently used sessions, ids hashed."""
    now = time.time()
    out = []
    for s in state.sessions.most_recent(n):
        out.append(
            {
                "session": session_label(state.label_key, s.session_id),
                "requests": s.requests,
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "token_hit_rate": round(s.token_hit_rate, 6),
                "idle_s": round(now - s.last_used, 1),
                "closed": s.closed,
            }
        )
    return out


def install_dashboard(app: FastAPI, state: ServerState) -> None:
    """Register /dashboard, /dashboard/state and /cache/tree on `app`."""

    @app.get("/dashboard", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-store"})

    @app.get("/dashboard/state")
    async def dashboard_state(limit: int = 50) -> dict[str, Any]:
        limit = max(0, min(limit, RECENT_REQUESTS))
        engine = await state.engine.call(
            operator.methodcaller("dashboard_state", state.label_key, limit)
        )
        m = engine.pop("metrics")
        return {
            "time": time.time(),
            "server": {
                "model": state.model_name,
                "started": state.started,
                "inflight_requests": state.engine.inflight,
            },
            "stats": m,
            **engine,
            "recent": state.recent.last(limit),
            "recent_total": state.recent.total,
            "sessions": _sessions(state, MAX_SESSIONS_LISTED),
            "sessions_total": len(state.sessions),
        }

    @app.get("/cache/tree")
    async def cache_tree(top_k: int = 40, max_depth: int = 8) -> dict[str, Any]:
        tree: dict[str, Any] = await state.engine.call(
            operator.methodcaller("cache_tree", top_k, max_depth, state.label_key)
        )
        return tree
