"""The figures of `radixkv bench cluster`: each real configuration beside its offline simulation,
then the simulated bounds (one global pool of the summed capacity, the ideal), as a table and as
JSON-ready dicts. Hit rates are cached prompt tokens / prompt tokens; "of ideal" divides cached
tokens by the ideal's (one unbounded cache, requests in order, page-granular).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixkv.bench.cluster.cluster_driver import ClusterRun
from radixkv.bench.cluster.cluster_sim import PageIds, SimResult, simulate, simulate_pool
from radixkv.bench.serving.metrics import _stats

# Configuration name → (router, policy, shared L3, host L2). `+l3` adds one Redis shared by every
# replica; `+l2` gives every replica a host-RAM tier (`--enable-hierarchical-cache`, 2x its pool),
# whose pages its KV events announce with medium "CPU" (vllm-router's kv_aware counts them, at a
# discount). `one_pool` is no cluster: one replica holding the summed pool, no router (the real
# counterpart of the simulated global pool).
ONE_POOL = "one_pool"
ROUTED: dict[str, tuple[str, str]] = {
    "round_robin": ("smg", "round_robin"),
    "cache_aware": ("smg", "cache_aware"),
    "kv_aware": ("vllm-router", "kv_aware"),
}
TIERS = ("l2", "l3")
# A replica's L2 holds twice its pool by default, written through from the pool, so what it holds
# in either tier is modelled as one LRU of twice the pool's pages.
L2_CAPACITY_FACTOR = 2


class ClusterConfig(NamedTuple):
    router: str
    policy: str
    shared_l3: bool = False
    host_l2: bool = False


DEFAULT_CONFIGS = ("round_robin", "cache_aware", "cache_aware+l3", "kv_aware")


def parse_config(name: str) -> ClusterConfig:
    """`cache_aware+l3` → ("smg", "cache_aware", True, False); ValueError for unknown names."""
    if name == ONE_POOL:
        return ClusterConfig("none", "none")
    base, *tiers = name.split("+")
    if base not in ROUTED or len(set(tiers)) != len(tiers) or not set(tiers) <= set(TIERS):
        names = ", ".join(f"{k}[+l2][+l3]" for k in ROUTED) + f", {ONE_POOL}"
        raise ValueError(f"unknown configuration {name!r}; choose from {names}")
    router, policy = ROUTED[base]
    return ClusterConfig(router, policy, "l3" in tiers, "l2" in tiers)


@dataclass(frozen=True)
class SimSetup:
    """The cluster the simulation models: replicas of `capacity_pages` pages of `page_size`."""

    replicas: int
    capacity_pages: int
    page_size: int
    in_flight: int


def simulate_all(
    prompts: Sequence[Sequence[int]], setup: SimSetup, configs: Sequence[str]
) -> dict[str, SimResult]:
    """Each configuration's simulation, plus `global pool` and `ideal` (keys of the result)."""
    ids = PageIds()  # shared: the page chains are computed once per prompt set
    common: dict[str, Any] = dict(page_size=setup.page_size, in_flight=setup.in_flight)
    out: dict[str, SimResult] = {}
    total = setup.replicas * setup.capacity_pages
    for name in configs:
        cfg = parse_config(name)
        if name == ONE_POOL:
            out[name] = simulate_pool(prompts, capacity_pages=total, name=name, **common)
            continue
        out[name] = simulate(
            prompts,
            replicas=setup.replicas,
            capacity_pages=setup.capacity_pages * (L2_CAPACITY_FACTOR if cfg.host_l2 else 1),
            route=cfg.policy,
            shared_l3=cfg.shared_l3,
            name=name,
            page_ids=ids,
            **common,
        )
    out["global pool"] = simulate_pool(prompts, capacity_pages=total, name="global pool", **common)
    out["ideal"] = simulate_pool(
        prompts, capacity_pages=None, page_size=setup.page_size, name="ideal"
    )
    return out


def real_summary(run: ClusterRun, replicas: int, ideal_cached: int) -> dict[str, Any]:
    """A real run's figures: hit rate from the clients' usage, TTFT, load per replica."""
    ok = [r for r in run.results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    per = run.per_replica(replicas)
    for row, stats in zip(per, run.replica_stats, strict=True):
        row["server"] = stats  # the replica's own counters over the run (cross-check)
    return {
        "completed": len(ok),
        "errors": len(run.results) - len(ok),
        "unattributed": sum(1 for r in run.replica_of if r is None),
        "first_errors": run.errors,
        "wall_s": run.wall_s,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "of_ideal": cached / ideal_cached if ideal_cached else None,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None], (50, 90, 99)),
        "replicas": per,
        "requests": [
            {
                "index": res.index,
                "group": res.group,
                "replica": r,
                "ok": res.ok,
                "prompt_tokens": res.prompt_tokens,
                "cached_tokens": res.cached_tokens,
                "ttft_s": res.ttft_s,
                "send_s": res.send_s,
            }
            for res, r in zip(run.results, run.replica_of, strict=True)
        ],
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def format_table(
    sims: dict[str, SimResult], real: dict[str, dict[str, Any]], configs: Sequence[str]
) -> str:
    """Rows: each configuration (real then simulated), then the simulated bounds."""
    ideal = sims["ideal"].cached_tokens
    head = (
        f"{'configuration':<16} {'hit real':>9} {'of ideal':>9} {'hit sim':>8} {'of ideal':>9} "
        f"{'TTFT p50':>9} {'p90 ms':>7} {'err':>4}  requests per replica (real | sim)"
    )
    lines = [head, "-" * len(head)]
    for name in [*configs, "global pool", "ideal"]:
        sim = sims[name]
        r = real.get(name)
        sim_of = sim.cached_tokens / ideal if ideal else None
        if r is None:
            cells = f"{'-':>9} {'-':>9}"
            lat = f"{'-':>9} {'-':>7} {'-':>4}"
            load = "- | " + "/".join(map(str, sim.replica_requests))
        else:
            cells = f"{_pct(r['hit_rate']):>9} {_pct(r['of_ideal']):>9}"
            t = r["ttft_s"]
            lat = f"{_ms(t['p50']):>9} {_ms(t['p90']):>7} {r['errors']:>4}"
            load = "/".join(str(x["requests"]) for x in r["replicas"])
            load += " | " + "/".join(map(str, sim.replica_requests))
        if name in ("global pool", "ideal"):
            load = ""
        lines.append(f"{name:<16} {cells} {_pct(sim.hit_rate):>8} {_pct(sim_of):>9} {lat}  {load}")
    return "\n".join(lines)
