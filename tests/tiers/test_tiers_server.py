"""End-to-end: the real server over a tiny Llama checkpoint with L2 + Redis L3, driven by the
official `openai` client. Outputs equal the cache-off server's; after /flush_cache (L1 and L2
dropped) and after a restart (a new engine on the same Redis) the prefix comes back from L3;
/cache/stats and /metrics report cached tokens by tier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis_proc import RedisServer
from server_harness import live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

MODEL = "tiny-llama"
PROMPT = "A long shared system prompt about radix trees and storage tiers. " * 6


def _engine(path: Path, **cfg: Any) -> Engine:
    base = {"num_slots": 1024, "max_model_len": 512, "seed": 0, "page_size": 4}
    return Engine(str(path), EngineConfig(**{**base, **cfg}))


def _complete(url: str, prompt: str) -> tuple[str, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.choices[0].text, int(r.usage.prompt_tokens_details.cached_tokens or 0)


@pytest.mark.slow
def test_server_tiers_end_to_end(
    tiny_model_dir: Callable[..., Path], redis_server: RedisServer
) -> None:
    path = tiny_model_dir("llama")
    tiers = {
        "enable_hierarchical_cache": True,
        "hicache_storage_backend": "redis",
        "hicache_storage_url": redis_server.url,
        "hicache_storage_prefetch_policy": "wait_complete",
    }
    prompts = [PROMPT + f"Question {i}: what is {i} plus {i}?" for i in range(3)]
    with live_server(_engine(path, disable_radix_cache=True), MODEL) as off:
        want = [_complete(off.url, p)[0] for p in prompts]
    engine = _engine(path, **tiers)
    with live_server(engine, MODEL) as srv:
        assert [_complete(srv.url, p)[0] for p in prompts] == want
        assert httpx.post(srv.url + "/flush_cache", timeout=30).json()["flushed"]
        text, cached = _complete(srv.url, prompts[0])
        assert text == want[0] and cached > 0  # from L3: L1 and L2 were flushed
        stats = httpx.get(srv.url + "/cache/stats", timeout=30).json()
        assert stats["memory_check"] == "ok"
        assert stats["cached_tokens_by_tier"]["storage"] > 0
        assert stats["tier_stats"]["storage_healthy"] == 1
        fams = {
            f.name: f for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text)
        }
        tiers_seen = {
            s.labels["tier"] for s in fams["radixkv_cached_prompt_tokens_by_tier"].samples
        }
        assert tiers_seen >= {"device", "host", "storage"}
        assert "radixkv_hicache_host_free_pages" in fams
        assert fams["radixkv_hicache_prefetch_waited"].samples[0].value >= 1  # the L3 reload
        assert stats["tier_stats"]["prefetch_waited"] >= 1
        state = httpx.get(srv.url + "/dashboard/state", timeout=30).json()
        host = next(p for p in state["pools"] if p["name"] == "host")
        assert host["free"] + host["cached"] + host["held"] == host["slots"] > 0
        assert state["hit_counters"]["storage"]["cached_tokens"] > 0
    assert engine.close()
    restarted = _engine(path, **tiers)  # a new server process: empty tree, same Redis
    with live_server(restarted, MODEL) as srv2:
        text, cached = _complete(srv2.url, prompts[1])
        assert text == want[1] and cached >= len(PROMPT) // 8
    restarted.close()
