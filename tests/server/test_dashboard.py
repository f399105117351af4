"""The dashboard's JSON and auth over a real server on the real engine (a tiny seeded Llama):
the numbers agree with /cache/stats, the census balances, and nothing the tree or the requests
hold leaks (no token ids, no text, no salts, no session ids); every dashboard route but /health
needs the key. The real-browser test is tests/server/test_dashboard_browser.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import LiveServer, live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

KEY = "dash-key"
SALT = "tenant-salt-XYZZY"
SESSION = "session-PLUGH"
SECRET_TEXT = "FROBOZZ"
ROUTES = ("/dashboard", "/dashboard/state", "/cache/tree")


def _engine(path: Path) -> Engine:
    return Engine(str(path), EngineConfig(num_slots=4096, max_model_len=512, seed=0))


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Callable[..., Path]) -> Iterator[LiveServer]:
    with live_server(_engine(tiny_model_dir("llama")), "tiny", api_key=KEY) as server:
        yield server


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _get(srv: LiveServer, path: str) -> Any:
    r = httpx.get(srv.url + path, headers=_auth(), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _complete(srv: LiveServer, prompt: Any, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True, **extra}
    r = httpx.post(srv.url + "/v1/completions", json=body, headers=_auth(), timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def json_numbers(doc: Any) -> list[float]:
    """Every number in a JSON document; fails if any list holds numbers (a token list)."""
    out: list[float] = []
    if isinstance(doc, dict):
        for v in doc.values():
            out.extend(json_numbers(v))
    elif isinstance(doc, list):
        assert not any(isinstance(v, int | float) for v in doc), f"a list of numbers: {doc}"
        for v in doc:
            out.extend(json_numbers(v))
    elif isinstance(doc, int | float) and not isinstance(doc, bool):
        out.append(doc)
    return out


def test_every_dashboard_route_needs_the_key(srv: LiveServer) -> None:
    for path in ROUTES:
        r = httpx.get(srv.url + path, timeout=30)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_api_key"
        bad = httpx.get(srv.url + path, headers={"Authorization": "Bearer nope"}, timeout=30)
        assert bad.status_code == 401, path
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    page = httpx.get(srv.url + "/dashboard", headers=_auth(), timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # The page (only the page: a browser cannot send a header when it opens it) takes ?api_key=.
    assert httpx.get(srv.url + f"/dashboard?api_key={KEY}", timeout=30).status_code == 200
    assert httpx.get(srv.url + "/dashboard?api_key=nope", timeout=30).status_code == 401
    for path in ("/dashboard/state", "/cache/tree", "/cache/stats"):
        assert httpx.get(srv.url + f"{path}?api_key={KEY}", timeout=30).status_code == 401


def test_page_is_self_contained(srv: LiveServer) -> None:
    html = httpx.get(srv.url + "/dashboard", headers=_auth(), timeout=30).text
    assert "<script>" in html and "<style>" in html
    for external in ("http://", "https://", "<script src", "@import", "url("):
        assert external not in html


def test_state_and_tree_agree_with_stats_and_leak_nothing(srv: LiveServer) -> None:
    tok = srv.engine.tokenizer
    shared = f"{SECRET_TEXT} shared instructions repeated by every request. " * 3
    prompts = [shared + q for q in ("one?", "two?", "three?")]
    for p in prompts:
        _complete(srv, p, cache_salt=SALT, session_id=SESSION)
    distinctive = [40_001, 40_002, 40_003, 40_004, 40_005, 40_006, 40_007, 40_008]
    _complete(srv, distinctive)
    _complete(srv, [*distinctive, 40_009])

    stats = _get(srv, "/cache/stats")
    state = _get(srv, "/dashboard/state?limit=10")
    tree = _get(srv, "/cache/tree?top_k=50&max_depth=10")
    assert stats["memory_check"] == "ok"
    for k in (
        "prompt_tokens_total",
        "cached_prompt_tokens_total",
        "finished_requests",
        "cached_tokens_in_tree",
        "token_hit_rate",
        "free_slots",
        "pool_slots",
    ):
        assert state["stats"][k] == stats[k], k
    (pool,) = state["pools"]
    assert pool["free"] + pool["cached"] + pool["held"] == pool["slots"] == stats["pool_slots"]
    assert pool["free"] == stats["free_slots"] and pool["cached"] == stats["cached_tokens_in_tree"]
    total = state["hit_counters"]["total"]
    assert total["prompt_tokens"] == stats["prompt_tokens_total"]
    assert total["cached_tokens"] == stats["cached_prompt_tokens_total"]
    # The ring buffer: newest first, with what the responses reported.
    recent = state["recent"]
    assert [r["seq"] for r in recent] == sorted((r["seq"] for r in recent), reverse=True)
    assert recent[0]["prompt_tokens"] == 9 and recent[0]["cached_tokens"] == 8
    assert recent[0]["ttft_s"] is not None and recent[0]["finish_reason"] == "length"
    assert recent[-1]["session"] is not None and recent[-1]["namespace"].startswith("ns:")
    sessions = {s["session"]: s for s in state["sessions"]}
    assert sessions[recent[-1]["session"]]["requests"] == 3
    # The tree: the salted namespace is listed (hashed) with the same label as the requests.
    assert tree["total_tokens"] == stats["cached_tokens_in_tree"]
    labels = {s["namespace"] for s in tree["namespaces"]}
    assert labels == {"default", recent[-1]["namespace"]}
    assert sum(s["tokens"] for s in tree["namespaces"]) == tree["total_tokens"]
    assert tree["nodes"] and all(n["lock"] == 0 for n in tree["nodes"])  # idle: nothing locked
    # Privacy: no text, salt or session id; no token id (every id here is >= 40,001, above any
    # size in this test) and no list of numbers anywhere.
    ids = set(distinctive) | {t for p in prompts for t in tok.encode(p) if t > 1000}
    for doc in (state, tree):
        text = str(doc)
        for secret in (SECRET_TEXT, SALT, SESSION, "shared instructions"):
            assert secret not in text
        numbers = set(json_numbers(doc))
        assert not numbers & set(distinctive)
        assert not {n for n in numbers if isinstance(n, int) and n > 4096} & ids


def test_bad_query_values_are_clear_400s(srv: LiveServer) -> None:
    r = httpx.get(srv.url + "/cache/tree?top_k=lots", headers=_auth(), timeout=30)
    assert r.status_code == 400 and "top_k" in r.text
    huge = _get(srv, "/cache/tree?top_k=100000000&max_depth=100000000")
    assert huge["top_k"] == 500 and huge["max_depth"] == 64


@pytest.mark.parametrize(
    ("cfg", "kind"),
    [
        ({"cache": "blockhash", "page_size": 16}, "blockhash"),
        ({"disable_radix_cache": True}, "off"),
    ],
)
def test_other_caches_get_a_census_and_a_tree_stub(
    tiny_model_dir: Callable[..., Path], cfg: dict[str, Any], kind: str
) -> None:
    engine = Engine(
        str(tiny_model_dir("llama")), EngineConfig(num_slots=512, max_model_len=256, **cfg)
    )
    engine.generate([list(range(100, 140))] * 2)
    tree = engine.cache_tree(10, 4, b"k")
    assert tree["kind"] == kind and tree["nodes"] == []
    state = engine.dashboard_state(b"k")
    (pool,) = state["pools"]
    assert pool["free"] + pool["cached"] + pool["held"] == pool["slots"] == 512
    assert state["cache"]["kind"] == kind
    assert state["requests"]["running"] == [] and state["requests"]["waiting_total"] == 0


def test_access_log_redacts_the_page_key() -> None:
    import logging

    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", f"/dashboard?x=1&api_key={KEY}", "1.1", 200),
        None,
    )
    for flt in logging.getLogger("uvicorn.access").filters:
        flt.filter(record)  # type: ignore[union-attr]
    assert KEY not in record.getMessage() and "api_key=<redacted>" in record.getMessage()
