"""Offline simulation of a cluster of replicas behind a router: what hit rate the routing policy,
the per-replica pools and a shared L3 allow, with no model and no timing.

Model (what `radixkv bench cluster` prints beside the real cluster's figures):
- A prompt is cut into full pages of `page_size` tokens; page k is identified by the whole prefix
  up to its end (`page_chain`), as a radix tree with that page size shares. A partial last page is
  never cached (nor is it by the engine).
- Each replica holds an LRU of `capacity_pages` pages. A request hits the longest run of leading
  pages its replica holds, then its pages are all touched (and missing ones inserted), leaf first,
  so that a parent is always at least as recent as its children: eviction takes leaves first, as
  the radix tree's LRU does, and a held page's ancestors are held too.
- `in_flight` > 0 delays each request's insertion until `in_flight` later requests have been
  looked up (requests that run concurrently cannot hit each other's pages).
- Shared L3: every page any replica computes is also written to one store (an LRU of
  `l3_capacity_pages`, None = unbounded); a request that misses locally continues its match there.
- Routing (`route`): `round_robin`; `cache_aware`, a model of SGLang's gateway: per replica a tree
  of everything routed to it (the router never learns of evictions); the replica with the highest
  match rate gets the request if that rate exceeds `cache_threshold`, else the replica whose tree
  is smallest; `kv_aware`, exact routing on the replicas' real contents (what KV events tell
  vllm-router): the longest actual match when it covers more than `cache_threshold` of the
  prompt (ties to the replica with fewest requests), else the replica with fewest requests.
- `global_pool`: one LRU of the summed capacity (the bound routing cannot beat, for this capacity);
  `ideal`: one unbounded pool (every repeated page is a hit).
Concurrency-driven load balancing (smg's balance thresholds) is not modelled.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ROUTES = ("round_robin", "cache_aware", "kv_aware")


class PageIds:
    """Interns page prefixes: the id of page k of a prompt names its whole token prefix up to the
    end of page k (equal ids ⇔ equal prefixes; exact, no hashing collisions)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def chain(self, tokens: Sequence[int], page_size: int) -> list[int]:
        """Ids of the full pages of `tokens`, in order."""
        out: list[int] = []
        parent = -1
        for start in range(0, len(tokens) - page_size + 1, page_size):
            key = (parent, tuple(tokens[start : start + page_size]))
            parent = self._ids.setdefault(key, len(self._ids))
            out.append(parent)
        return out


class PageLRU:
    """An LRU set of pages with a capacity (None = unbounded)."""

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self.pages: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.pages)

    def match(self, chain: Sequence[int], start: int = 0) -> int:
        """Number of pages of `chain` from `start` held here, up to the first one that is not."""
        n = start
        while n < len(chain) and chain[n] in self.pages:
            n += 1
        return n - start

    def touch(self, chain: Sequence[int]) -> None:
        """Insert or refresh every page of `chain`, leaf first (so ancestors end up more recent),
        then evict least recent pages past the capacity."""
        for page in reversed(chain):
            if page in self.pages:
                self.pages.move_to_end(page)
            else:
                self.pages[page] = None
        if self.capacity is not None:
            while len(self.pages) > self.capacity:
                self.pages.popitem(last=False)


@dataclass
class SimResult:
    """One simulated configuration: totals and per-replica load."""

    name: str
    prompt_tokens: int
    cached_tokens: int
    replica_requests: list[int] = field(default_factory=list)
    replica_prompt_tokens: list[int] = field(default_factory=list)
    replica_cached_tokens: list[int] = field(default_factory=list)
    l3_cached_tokens: int = 0  # of cached_tokens, the part found only in the shared L3

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.hit_rate,
            "l3_cached_tokens": self.l3_cached_tokens,
            "replica_requests": self.replica_requests,
            "replica_prompt_tokens": self.replica_prompt_tokens,
            "replica_cached_tokens": self.replica_cached_tokens,
        }


class _CacheAwareRouter:
    """SGLang gateway's cache_aware choice on page chains (see the module doc)."""

    def __init__(self, replicas: int, threshold: float, page_size: int) -> None:
        self.trees: list[set[int]] = [set() for _ in range(replicas)]
        self.threshold = threshold
        self.page_size = page_size

    def pick(self, chain: Sequence[int], length: int) -> int:
        best, best_rate = 0, -1.0
        for i, tree in enumerate(self.trees):
            n = 0
            while n < len(chain) and chain[n] in tree:
                n += 1
            rate = n * self.page_size / length if length else 0.0
            if rate > best_rate:
                best, best_rate = i, rate
        if best_rate <= self.threshold:
            best = min(range(len(self.trees)), key=lambda i: (len(self.trees[i]), i))
        self.trees[best].update(chain)
        return best


def _exact_pick(
    pools: Sequence[PageLRU],
    chain: Sequence[int],
    length: int,
    page_size: int,
    threshold: float,
    res: SimResult,
) -> int:
    """kv_aware: the replica whose real contents match the most (ties: fewest requests so far)
    when that match is over `threshold` of the prompt, else the replica with fewest requests (a
    stand-in for a load-aware choice; a prefix every replica shares does not pin anything)."""
    least = min(range(len(pools)), key=lambda j: (res.replica_requests[j], j))
    best = max(
        range(len(pools)), key=lambda j: (pools[j].match(chain), -res.replica_requests[j], -j)
    )
    if length and pools[best].match(chain) * page_size / length > threshold:
        return best
    return least


def simulate(
    prompts: Sequence[Sequence[int]],
    *,
    replicas: int,
    capacity_pages: int | None,
    page_size: int,
    route: str = "round_robin",
    shared_l3: bool = False,
    l3_capacity_pages: int | None = None,
    in_flight: int = 0,
    cache_threshold: float = 0.3,
    name: str | None = None,
    page_ids: PageIds | None = None,
) -> SimResult:
    """Run `prompts`, in order, through `replicas` replicas routed by `route` (module doc)."""
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; choose from {ROUTES}")
    if replicas < 1 or page_size < 1 or in_flight < 0:
        raise ValueError("replicas and page_size must be >= 1, in_flight >= 0")
    ids = page_ids or PageIds()
    pools = [PageLRU(capacity_pages) for _ in range(replicas)]
    l3 = PageLRU(l3_capacity_pages) if shared_l3 else None
    router = (
        _CacheAwareRouter(replicas, cache_threshold, page_size) if route == "cache_aware" else None
    )
    label = name or route + (" + L3" if shared_l3 else "")
    res = SimResult(label, 0, 0, [0] * replicas, [0] * replicas, [0] * replicas)
    pending: deque[tuple[int, list[int]]] = deque()
    for i, tokens in enumerate(prompts):
        chain = ids.chain(tokens, page_size)
        if route == "round_robin":
            r = i % replicas
        elif router is not None:
            r = router.pick(chain, len(tokens))
        else:  # kv_aware: see _exact_pick
            r = _exact_pick(pools, chain, len(tokens), page_size, cache_threshold, res)
        local = pools[r].match(chain)
        remote = l3.match(chain, local) if l3 is not None else 0
        hit = (local + remote) * page_size
        res.prompt_tokens += len(tokens)
        res.cached_tokens += hit
        res.l3_cached_tokens += remote * page_size
        res.replica_requests[r] += 1
        res.replica_prompt_tokens[r] += len(tokens)
        res.replica_cached_tokens[r] += hit
        pending.append((r, chain))
        while len(pending) > in_flight:  # requests that finished: their pages are cached
            done_r, done_chain = pending.popleft()
            pools[done_r].touch(done_chain)
            if l3 is not None:
                l3.touch(done_chain)
    return res


def simulate_pool(
    prompts: Sequence[Sequence[int]],
    *,
    capacity_pages: int | None,
    page_size: int,
    in_flight: int = 0,
    name: str = "global pool",
) -> SimResult:
    """One pool of `capacity_pages` (None: the ideal, unbounded) serving every request."""
    return simulate(
        prompts,
        replicas=1,
        capacity_pages=capacity_pages,
        page_size=page_size,
        in_flight=in_flight,
        name=name,
    )
