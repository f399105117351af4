"""Learned hit-density eviction (the `density` policy): keep what is worth its space.

Every cached span is in a *life*: from its last access (or insert) to its next reuse. The
policy learns online, from its own stream, how likely a life of each class is to be reused
at each age (`radixkv.cache.lifetable`: Kaplan-Meier hazards with ghosts, so it also sees the
reuses it missed), and evicts the leaf whose expected reused tokens per token-tick of space,
from its current age on, are lowest: LHD's hit density (Beckmann et al., NSDI'18) with the
hold horizon chosen optimally (a Gittins index) instead of by the current policy. Recency is
not assumed to be good: under human think times a span a few minutes old can be worth more
than a fresh one, and the table finds that out.

Classes (fixed at a life's birth): reuse count R (0, 1, 2, 3+: times a recorded match covered
the node, counting a reuse seen through a ghost), for R >= 1 the age G at that last reuse
(log4 buckets of ticks: the conversation's rhythm, as LHD's classes by last hit age), and the
node's depth D (log4 buckets of pages: "head blocks are worth more"). R x G x D = 88 classes;
a sparse class borrows from its reuse group R. Ghosts: an evicted span leaves ghosts (depth and
hash of each 256-token-aligned granule) in a FIFO bounded by 8x the cache's granules; a new
leaf whose head granules are ghosts is a reuse of those lives (it did come back).

Constants and where they come from (never from the Mooncake traces): 64 sampled candidates
(LHD's default); refit every 512 ticks with decay 0.9 (LHD's EWMA decay; the Claude Code
traces are insensitive to 128..2048 ticks and 0.7..1.0), the first refit at tick 128, then at
doubling ticks (Claude Code: first at 8 / 32 / 128 / 512 within 1.6 points, 128 best); 8x
ghosts (Claude Code: 4x / 8x / 16x within 1 point); 4,096 tokens of smoothing prior and the
log4 class boundaries with R <= 3, 7 gap and 4 depth buckets (the best of the grid tried on
Claude Code, docs/eviction.md).

Eviction samples up to `samples` evictable leaves uniformly (all of them when there are fewer)
and pops the lowest index: O(samples) per leaf, independent of the cache size. Hooks are O(1)
per node except ghosts, O(granules) of the tokens evicted or inserted.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from radixkv.cache.keys import TOKEN_BYTES
from radixkv.cache.policies.base import EvictionPolicy, PolicyKey, PolicyNode
from radixkv.cache.policies.research.lifetable import LifeTable, age_bucket

GRANULE = 256  # ghost granularity in tokens (rounded up to whole pages)
GhostKey = tuple[int, int]  # (depth in tokens, hash of the granule's tokens)


def log4_bucket(x: int, n: int) -> int:
    """0 for x < 4, then floor(log4(x)), capped at n - 1."""
    b = (x.bit_length() - 1) >> 1 if x > 0 else 0
    return b if b < n else n - 1


class SampledLeaves:
    """The evictable leaves in an array (swap-remove), so a uniform sample is O(1) per draw.
    A tracked node's `entry` is `((), position, node)`; `pop` returns the sampled leaf of
    lowest `policy.rank`. Invariant: `nodes[i].entry[1] == i` for every i."""

    def __init__(self, policy: DensityPolicy, seed: int = 0) -> None:
        self.policy = policy
        self.nodes: list[Any] = []
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.nodes)

    def push(self, node: Any) -> None:
        node.entry = ((), len(self.nodes), node)
        self.nodes.append(node)

    def invalidate(self, node: Any) -> None:
        i = node.entry[1]
        last = self.nodes.pop()
        if last is not node:
            self.nodes[i] = last
            last.entry = ((), i, last)
        node.entry = None

    def touched(self, node: Any) -> None:
        """Nothing to do: ranks are computed when sampled."""

    def pop(self) -> Any:
        nodes = self.nodes
        if not nodes:
            return None
        k = self.policy.samples
        if len(nodes) <= k:
            cands = nodes
        else:
            draw, n = self.rng.randrange, len(nodes)
            cands = [nodes[draw(n)] for _ in range(k)]
        best = min(cands, key=self.policy.rank)
        self.invalidate(best)
        return best

    def clear(self) -> None:
        self.nodes = []

    def tracked(self) -> list[Any]:
        for i, n in enumerate(self.nodes):
            if n.entry is None or n.entry[1] != i or n.entry[2] is not n:
                raise AssertionError(f"sampled leaves: position {i} is not its node's entry")
        return list(self.nodes)

    def check(self, policy: EvictionPolicy) -> None:
        self.tracked()
        self.policy.check_lives()


class DensityPolicy(EvictionPolicy):
    """See the module docstring. Per node it owns `born` (tick its life began), `kind` (its
    class) and `gap` (its reuse count)."""

    name = "density"
    monotone = False

    def __init__(
        self,
        *,
        reuse_classes: int = 4,
        gap_classes: int = 7,
        depth_classes: int = 4,
        samples: int = 64,
        ghost_factor: int = 8,
        period: int = 512,
        decay: float = 0.9,
        prior: float = 4096.0,
        granule: int = GRANULE,
    ) -> None:
        self.reuse_classes = reuse_classes
        self.gap_classes = gap_classes
        self.depth_classes = depth_classes
        self.samples = samples
        self.ghost_factor = ghost_factor
        per_depth = 1 + (reuse_classes - 1) * gap_classes  # R = 0 has no gap
        groups = []
        for c in range(per_depth * depth_classes):
            rg = c % per_depth
            groups.append(0 if rg == 0 else 1 + (rg - 1) // gap_classes)
        self._per_depth = per_depth
        self.table = LifeTable(groups, period=period, decay=decay, prior=prior)
        self._ghosts: OrderedDict[GhostKey, tuple[int, int, int]] = OrderedDict()
        self._cache: Any = None
        self._page = 1
        self.granule = granule
        self._granule = granule

    def bind(self, cache: Any) -> None:
        self._cache = cache
        self._page = cache.page_size
        self._granule = cache.page_size * -(-self.granule // cache.page_size)

    def make_queue(self) -> Any:
        return SampledLeaves(self)

    # ---------------------------------------------------------------- classes and ranks

    def classify(self, node: Any, reuse_age: int) -> int:
        """The class of a life starting now: reuse count, age at that reuse, depth."""
        r = min(node.gap, self.reuse_classes - 1)
        c = 0
        if r:  # a reused life: also by the age at which it was reused
            c = 1 + (r - 1) * self.gap_classes + log4_bucket(reuse_age, self.gap_classes)
        d = log4_bucket(node.depth // self._page, self.depth_classes)
        return c + self._per_depth * d

    def rank(self, node: Any) -> tuple[float, int]:
        """(hit density at the node's age, birth tick): the smallest is evicted first."""
        now = self._cache._clock
        self.table.advance(now)
        return (self.table.value(node.kind, now - node.born), node.born)

    def key(self, node: PolicyNode) -> PolicyKey:
        density, born = self.rank(node)
        return (round(density * 1e12), born)

    # ---------------------------------------------------------------- hooks

    def _start(self, node: Any, reuse_age: int, now: int) -> None:
        node.born = now
        node.kind = c = self.classify(node, reuse_age)
        self.table.birth(c, node.ntok, now)

    def on_match(self, path: list[Any], clock: int) -> None:
        """Each node of the path ends a life with a reuse and starts the next one."""
        table = self.table
        table.advance(clock)
        for node in path:
            age = clock - node.born
            table.end(node.kind, node.born, node.ntok, clock, True)
            node.gap += 1
            self._start(node, age, clock)

    def on_insert(self, node: Any) -> None:
        """A new leaf: its head granules that are ghosts are reuses of lives we evicted."""
        now = self._cache._clock
        self.table.advance(now)
        node.gap = 0
        age = 0
        if self._ghosts:
            g = self._granule
            best = -1
            for key in self._granule_keys(node):
                ghost = self._ghosts.pop(key, None)
                if ghost is None:
                    break  # an evicted run's ghosts start at its head: the rest is new
                kind, born, reuses = ghost
                self.table.end(kind, born, g, now, True)
                if reuses > best:
                    best, age = reuses, now - born
            if best >= 0:
                node.gap = best + 1
        self._start(node, age, now)

    def on_evict(self, node: Any) -> None:
        """The evicted span's lives go on as ghosts (the tokens outside whole granules end)."""
        cache = self._cache
        now = cache._clock
        table = self.table
        table.advance(now)
        g = self._granule
        keys = self._granule_keys(node)
        rest = node.ntok - g * len(keys)
        if rest:
            table.end(node.kind, node.born, rest, now, False)
        ghosts = self._ghosts
        value = (node.kind, node.born, node.gap)
        for key in keys:
            old = ghosts.pop(key, None)
            if old is not None:
                table.end(old[0], old[1], g, now, False)
            ghosts[key] = value
        limit = max(cache.total_size // g * self.ghost_factor, 1024)
        while len(ghosts) > limit:
            kind, born, _ = ghosts.popitem(last=False)[1]
            table.end(kind, born, g, now, False)  # forgotten: censored

    def on_reset(self) -> None:
        self.table.clear_lives()
        self._ghosts.clear()

    def _granule_keys(self, node: Any) -> list[GhostKey]:
        """(depth, hash) of every whole granule of the node, aligned to the tree's depth."""
        g = self._granule
        start = node.depth
        pos = -(-start // g) * g
        end = start + node.ntok
        key = node.key
        out = []
        while pos + g <= end:
            off = (pos - start) * TOKEN_BYTES
            out.append((pos, hash(key[off : off + g * TOKEN_BYTES])))
            pos += g
        return out

    # ---------------------------------------------------------------- checks

    def check_lives(self) -> None:
        """The life table's rings hold exactly the tokens of the tracked lives (every node of
        the tree and every ghost granule born within the horizon)."""
        cache = self._cache
        if cache is None:
            return
        now = self.table.now
        want = sum(n.ntok for _, n in cache.iter_nodes() if self.table.tracked(n.born, now))
        want += sum(
            self._granule for _, b, _ in self._ghosts.values() if self.table.tracked(b, now)
        )
        if want != self.table.live_tokens():
            raise AssertionError(
                f"density: life table holds {self.table.live_tokens()} live tokens, "
                f"the tree and ghosts {want}"
            )
        if any(age_bucket(now - n.born) < 0 for _, n in cache.iter_nodes()):
            raise AssertionError("density: a node was born in the future")
