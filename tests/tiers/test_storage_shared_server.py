"""End-to-end with the official `openai` client: the real server over a tiny Llama checkpoint on a
shared scale-out L3 (a 3-node Redis Cluster, Mooncake Store). One replica computes a long
prompt and shuts down; a new replica finds >= 90% of it in the store. Then part of the store
dies (a cluster node, the Mooncake master): the server keeps answering, identically to the
cache-off server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from server_harness import live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig
from radixkv.storage.local_services import MooncakeProcs, RedisClusterProcs

MODEL = "tiny-llama"
LONG = "Shared context: the radix tree keeps every prefix once and storage tiers hold more. " * 20


def _engine(path: Path, **cfg: Any) -> Engine:
    base = {"num_slots": 2048, "max_model_len": 1024, "seed": 0, "page_size": 4}
    return Engine(str(path), EngineConfig(**{**base, **cfg}))


def _complete(url: str, prompt: str) -> tuple[str, int, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    cached = int(r.usage.prompt_tokens_details.cached_tokens or 0)
    return r.choices[0].text, cached, r.usage.prompt_tokens


def _store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict, Callable]:
    """(the engine's storage settings, a function that kills part of the store)."""
    if kind == "cluster":
        cluster: RedisClusterProcs = request.getfixturevalue("redis_cluster")
        cfg = {"hicache_storage_backend": "redis", "hicache_storage_url": cluster.url}
        return cfg, lambda: cluster.kill(cluster.ports[0])
    mc: MooncakeProcs = request.getfixturevalue("mooncake")
    conf = tmp_path / "mooncake.json"
    conf.write_text(
        f'{{"master_server_address": "{mc.master_address}", "metadata_server": '
        f'"{mc.metadata_server}", "global_segment_size": 0, "local_hostname": "127.0.0.1"}}'
    )
    return {"hicache_storage_backend": "mooncake", "hicache_storage_url": str(conf)}, mc.kill_master


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cluster", "mooncake"])
def test_new_replica_finds_the_prefix_and_survives_store_faults(
    kind: str,
    tiny_model_dir: Callable[..., Path],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    path = tiny_model_dir("llama")
    storage, break_store = _store(kind, request, tmp_path)
    tiers = {
        **storage,
        "enable_hierarchical_cache": True,
        "hicache_storage_prefetch_policy": "wait_complete",
        "hicache_storage_timeout_s": 0.5,
    }
    prompts = [LONG + f"Question {i}: what is {i} times {i}?" for i in range(5)]
    with live_server(_engine(path, disable_radix_cache=True), MODEL) as off:
        want = [_complete(off.url, p)[0] for p in prompts]
    first = _engine(path, **tiers)
    with live_server(first, MODEL) as srv:
        assert _complete(srv.url, prompts[0])[0] == want[0]
    assert first.close()  # flushes its L3 writes, then the replica is gone
    second = _engine(path, **tiers)  # a new replica: empty tree, empty L2
    with live_server(second, MODEL) as srv:
        text, cached, total = _complete(srv.url, prompts[1])
        assert text == want[1]
        assert total > 200 and cached >= 0.9 * total, (cached, total)
        assert second.metrics().cached_tokens_by_tier["storage"] >= 0.9 * total
        break_store()
        for i in (2, 3, 4):  # new prompts after the fault: served, and right
            assert _complete(srv.url, prompts[i])[0] == want[i]
        assert second.metrics().tier_stats["storage_errors"] >= 1
    second.close(timeout_s=2.0)
