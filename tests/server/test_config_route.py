"""GET /config: the configuration chain the server runs with, behind the API key, the key itself
never shown."""

from __future__ import annotations

import httpx
from server_fakes import FakeEngine
from server_harness import live_server

from radixkv.engine.types import EngineConfig

KEY = "config-route-secret"


def test_config_route_shows_the_chain_without_the_key() -> None:
    cfg = EngineConfig(num_slots=4096, max_model_len=512, page_size=16, api_key=KEY)
    with live_server(FakeEngine(cfg), api_key=KEY) as srv:
        assert httpx.get(srv.url + "/config", timeout=10).status_code == 401
        resp = httpx.get(srv.url + "/config", headers={"Authorization": f"Bearer {KEY}"})
        assert resp.status_code == 200 and KEY not in resp.text
        body = resp.json()
        assert body["config"]["cache"]["page_size"] == 16
        assert body["config"]["server"]["api_key"] == "***"
        assert body["config"] == cfg.describe()
        assert {"cache.page_size", "cache.num_slots", "server.api_key"} <= set(body["changed"])
        assert body["resolved"]["max_model_len"] == 512
        stats = httpx.get(srv.url + "/cache/stats", headers={"Authorization": f"Bearer {KEY}"})
        assert stats.json()["config"]["page_size"] == 16 and KEY not in stats.text
