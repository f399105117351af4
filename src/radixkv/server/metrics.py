"""Prometheus metrics for `GET /metrics` (text exposition via prometheus-client).

Engine-side figures (hit rate, pool, tree, queue depths) come from the latest EngineMetrics
snapshot the loop thread published, rendered at scrape time by a custom collector, so scraping
never touches the engine. Server-side figures (TTFT, latency, request counts) are ordinary
prometheus-client histograms/counters. Each app gets its own registry, so several servers can run
in one process (tests) without clashing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixkv.engine.types import EngineMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _EngineCollector(Collector):
    def __init__(self, snapshot: Callable[[], EngineMetrics]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        m = self._snapshot()
        gauges = {
            "token_hit_rate": ("Cached prompt tokens / prompt tokens, all time", m.token_hit_rate),
            "pool_slots": ("KV pool size in token slots", m.pool_slots),
            "pool_free_slots": ("Free KV slots", m.free_slots),
            "pool_usage": ("Fraction of KV slots not free", m.pool_usage),
            "tree_cached_tokens": ("Tokens held by the prefix cache", m.cached_tokens_in_tree),
            "evictable_tokens": ("Cached tokens not locked by any request", m.evictable_tokens),
            "running_requests": ("Requests in the running batch", m.running_requests),
            "waiting_requests": ("Requests waiting for admission", m.waiting_requests),
            "window_token_hit_rate": (
                "Token hit rate over the recent live-regret window",
                m.window_hit_rate,
            ),
            "window_belady_token_hit_rate": (
                "Belady's token hit rate over the same window at the same capacity (the bound)",
                m.window_belady_hit_rate,
            ),
            "window_requests": ("Requests in the live-regret window", m.window_requests),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"radixkv_{name}", doc, value=float(value))
        if m.component_pools:
            pools = GaugeMetricFamily(
                "radixkv_component_pool_slots",
                "Slots of each memory component's pool (full, swa, state) by owner: "
                "size, free, cached (held by the tree), held (by running requests)",
                labels=["pool", "owner"],
            )
            for pool, row in sorted(m.component_pools.items()):
                for owner, value in sorted(row.items()):
                    pools.add_metric([pool, owner], float(value))
            yield pools
        counters = {
            "prompt_tokens": ("Prompt tokens of admitted requests", m.prompt_tokens_total),
            "cached_prompt_tokens": (
                "Prompt tokens served from the prefix cache",
                m.cached_prompt_tokens_total,
            ),
            "generated_tokens": ("Generated tokens", m.generated_tokens_total),
            "preemptions": ("Requests retracted to the queue", m.num_preemptions),
            "engine_finished_requests": ("Requests the engine finished", m.finished_requests),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"radixkv_{name}", doc, value=float(value))
        yield from _tier_metrics(m)
        yield from _graph_metrics(m)


def _graph_metrics(m: EngineMetrics) -> Iterable[Metric]:
    """Decode as CUDA graphs: steps replayed and steps run eagerly by reason (only when the
    engine captured graphs)."""
    if m.graph_replays is None:
        return
    yield CounterMetricFamily(
        "radixkv_decode_graph_replays", "Decode steps replayed from a CUDA graph", m.graph_replays
    )
    eager = CounterMetricFamily(
        "radixkv_decode_graph_fallbacks",
        "Steps run eagerly with decode graphs on, by reason (prefill, batch too large, ...)",
        labels=["reason"],
    )
    for reason, count in sorted(m.graph_fallbacks.items()):
        eager.add_metric([reason], float(count))
    yield eager


def _tier_metrics(m: EngineMetrics) -> Iterable[Metric]:
    """Hierarchical cache: cached prompt tokens by tier, host pool census, storage health."""
    if m.cached_tokens_by_tier:
        fam = CounterMetricFamily(
            "radixkv_cached_prompt_tokens_by_tier",
            "Prompt tokens served from the cache, by the tier they came from",
            labels=["tier"],
        )
        for tier, value in sorted(m.cached_tokens_by_tier.items()):
            fam.add_metric([tier], float(value))
        yield fam
    for name, figure in sorted(m.tier_stats.items()):
        yield GaugeMetricFamily(
            f"radixkv_hicache_{name}", f"Hierarchical cache: {name}", value=figure
        )


class ServerMetrics:
    """The registry behind /metrics plus the server-side instruments."""

    def __init__(self, snapshot: Callable[[], EngineMetrics]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(snapshot))
        self.ttft = Histogram(
            "radixkv_time_to_first_token_seconds",
            "Time from request arrival to its first generated token",
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "radixkv_request_latency_seconds",
            "Time from request arrival to its last token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = Counter(
            "radixkv_http_requests",
            "HTTP requests by route and status code",
            ["route", "status"],
            registry=self.registry,
        )
        self.finished = Counter(
            "radixkv_requests_finished",
            "Generation requests by finish reason (stop, length, abort, error)",
            ["reason"],
            registry=self.registry,
        )
        self.request_prompt_tokens = Counter(
            "radixkv_request_prompt_tokens",
            "Prompt tokens of finished generation requests",
            registry=self.registry,
        )
        self.request_cached_tokens = Counter(
            "radixkv_request_cached_tokens",
            "Cached prompt tokens of finished generation requests",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
