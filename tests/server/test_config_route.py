"""GET /config: the configuration chain the server runs with, behind the API key, the key itself
never shown."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
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


def test_startup_logs_the_configuration(
    tiny_model_dir: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """What `radixkv serve` logs before loading the model: every field with its flag, the
    changed ones marked, the key masked; then what the engine resolved."""
    from radixkv.cli import build_parser
    from radixkv.server.cli import build_engine

    model = str(tiny_model_dir("llama"))
    argv = ["serve", "--model", model, "--num-slots", "512", "--api-key", KEY, "--no-compile"]
    args = build_parser().parse_args(argv)
    with caplog.at_level(logging.INFO, logger="radixkv.server"):
        build_engine(args)
    text = caplog.text
    assert "configuration (* = not the default):" in text and KEY not in text
    lines = [line.split() for line in text.splitlines()]
    assert ["*", "num_slots", "512", "--num-slots"] in lines
    assert ["*", "api_key", "***", "--api-key"] in lines
    assert ["page_size", "1", "--page-size"] in lines
    assert "engine ready" in text and "pool 512 token slots" in text
