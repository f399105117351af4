"""The component tree (FULL + SWA + STATE) against the naive per-page reference.

Every match is compared vote by vote (length, FULL slots, the SWA window's slots, the checkpoint,
the shared length); every insert's duplicates and rejected checkpoints; after every eviction the
tree's whole content is compared page by page with the reference before it, and every entry that
disappeared (page, SWA slot -> tombstone, checkpoint) must be exactly what the eviction returned,
legal (unlocked, leaf-first, outside every locked window) and enough.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
from component_reference import ComponentReference, Page
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.cache import HybridCache, RadixCache
from radixkv.cache.hybrid.components import Components, Freed
from radixkv.cache.hybrid.names import parse_components
from radixkv.cache.keys import TOKEN_BYTES

COMBOS = [
    parse_components(["full", "swa:6"]),
    parse_components(["full", "state"]),
    parse_components(["full", "swa:5", "state"]),
    parse_components(["swa:4"]),
    parse_components(["swa:8", "state"]),
]
SWA, STATE = "swa", "state"


def freed_parts(freed: Freed) -> tuple[np.ndarray, tuple[int, ...]]:
    """The SWA slots and checkpoint ids an eviction let go of (empty for an absent kind)."""
    return freed.kinds.get(SWA, np.empty(0, dtype=np.int64)), freed.kinds.get(STATE, ())


def actual_pages(cache: HybridCache) -> dict[tuple[Hashable | None, tuple[int, ...]], Page]:
    """The tree's content as the reference stores it (one entry per page)."""
    out = {}
    p = cache.page_size
    prefix: dict[int, tuple[int, ...]] = {}
    for ns, node in cache.iter_nodes():  # parents before children
        parent = node.parent
        base = prefix.get(id(parent), ())
        toks = np.frombuffer(node.key, dtype="<i8").tolist()
        full = node.slots.tolist()
        swa = node.swa.tolist() if node.swa is not None else []
        for k in range(node.ntok // p):
            key = base + tuple(toks[: (k + 1) * p])
            last = k == node.ntok // p - 1
            out[(ns, key)] = Page(
                full[k * p : (k + 1) * p],
                swa[k * p : (k + 1) * p],
                node.ckpt if last else -1,
            )
        prefix[id(node)] = base + tuple(toks)
    return out


class Driver:
    def __init__(self, comp: Components, page: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.comp = comp
        self.page = page
        policy = random.Random(seed).choice(
            ["lru", "lfu", "fifo", "priority", "s3fifo", "predict", "density"]
        )
        self.cache = HybridCache(page_size=page, policy=policy, components=comp)
        self.ref = ComponentReference(page, comp.get(SWA), comp.full, comp.has(STATE))
        self.next_slot = 0
        self.next_swa = 1_000_000
        self.next_ckpt = 2_000_000
        self.handles: list[tuple[Any, Hashable | None, tuple[int, ...]]] = []
        self.corpus: list[tuple[int, ...]] = []
        # Per-component pool census: every id the driver handed out is the tree's or was
        # given back (by an insert's refusals or an eviction) exactly once.
        self.issued: dict[str, set[int]] = {"full": set(), "swa": set(), "ckpt": set()}
        self.back: dict[str, Counter[int]] = {k: Counter() for k in self.issued}

    def query(self) -> tuple[Hashable | None, tuple[int, ...]]:
        rng = self.rng
        ns = rng.choice([None, None, "b"])
        if self.corpus and rng.random() < 0.8:
            base = rng.choice(self.corpus)
            cut = rng.randrange(0, len(base) + 1)
            toks = base[:cut] + tuple(rng.randrange(3) for _ in range(rng.randrange(0, 12)))
        else:
            toks = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 30)))
        return ns, toks

    def do_match(self) -> None:
        ns, toks = self.query()
        m = self.cache.match(list(toks), ns)
        b, full, swa, ckpt = self.ref.match(ns, toks)
        assert m.length == b
        assert m.shared_length == self.ref.shared(ns, toks)
        assert m.slots.tolist() == full
        if self.comp.has(SWA):
            assert m.kinds[SWA].tolist() == swa
        assert m.kinds.get(STATE, -1) == ckpt
        if b and self.rng.random() < 0.4:
            self.cache.lock(m.handle)
            self.handles.append((m.handle, ns, toks[:b]))
            self.ref.locks.append((ns, toks[:b]))

    def do_unlock(self) -> None:
        if not self.handles:
            return
        i = self.rng.randrange(len(self.handles))
        handle, ns, toks = self.handles.pop(i)
        self.cache.unlock(handle)
        self.ref.locks.remove((ns, toks))

    def do_insert(self) -> None:
        rng, p = self.rng, self.page
        ns, toks = self.query()
        m = self.cache.match(list(toks), ns, record=False)
        owned = m.length
        n = len(toks)
        full = list(m.slots) + list(range(self.next_slot, self.next_slot + n - owned))
        self.next_slot += n
        swa: list[int] = [-1] * owned
        if SWA in m.kinds:
            swa = [int(s) for s in m.kinds[SWA]]
        for k in range(owned, n, p):  # the caller's own pages; some freed as it advanced
            dead = rng.random() < 0.3
            for _i in range(k, min(n, k + p)):
                swa.append(-1 if dead else self.next_swa)
                self.next_swa += 1
        ckpts = []
        for _ in range(rng.randrange(0, 3)):
            b = rng.randrange(0, n + 1)
            b = b - b % p if rng.random() < 0.8 else b
            ckpts.append((b, self.next_ckpt))
            self.next_ckpt += 1
        parts: dict[str, Any] = {}
        if self.comp.has(SWA):
            parts[SWA] = swa
        if self.comp.has(STATE):
            parts[STATE] = ckpts
        out = self.cache.insert(list(toks), full if self.comp.full else None, parts, ns, 0, owned)
        cached, free, rejected = self.ref.insert(ns, toks, full, swa, ckpts, owned)
        assert out.cached == cached
        swa_free = out.refused.get(SWA, np.empty(0, dtype=np.int64))
        assert set(swa_free.tolist()) == free and len(swa_free) == len(free)
        # Without a STATE component the caller keeps (and frees) every checkpoint it made.
        not_taken = out.refused[STATE] if STATE in parts else tuple(c for _, c in ckpts)
        assert set(not_taken) == rejected
        self.corpus.append(toks)
        end = n - n % p  # the caller keeps (and frees) its duplicates and the partial page
        if self.comp.full:
            self.issued["full"].update(full[owned:])
            self.back["full"].update(full[owned:cached] + full[end:])
        if self.comp.has(SWA):
            self.issued["swa"].update(s for s in swa[owned:] if s >= 0)
            self.back["swa"].update(swa_free.tolist() + [s for s in swa[end:] if s >= 0])
        self.issued["ckpt"].update(c for _, c in ckpts)
        self.back["ckpt"].update(not_taken)

    def do_evict(self) -> None:
        rng = self.rng
        want_full = rng.choice([0, 0, 1, 5, 40]) if self.comp.full else 0
        want_swa = rng.choice([0, 1, 6, 40]) if self.comp.has(SWA) else 0
        want_ck = rng.choice([0, 1, 3]) if self.comp.has(STATE) else 0
        before = dict(self.ref.pages)
        freed = self.cache.evict({"full": want_full, SWA: want_swa, STATE: want_ck})
        after = actual_pages(self.cache)
        self.check_eviction(before, after, freed)
        freed_swa, freed_ck = freed_parts(freed)
        self.back["full"].update(freed.full.tolist())
        self.back["swa"].update(freed_swa.tolist())
        self.back["ckpt"].update(freed_ck)
        got_full, got_swa, got_ck = len(freed.full), len(freed_swa), len(freed_ck)
        if got_full < want_full:
            assert self.cache.evictable_size == 0
        if got_swa < want_swa:
            assert self.cache.evictable_size == 0 and self.cache.evictable(SWA) == 0
        if got_ck < want_ck:
            assert self.cache.evictable(STATE) == 0
        self.ref.pages = {k: Page(list(v.full), list(v.swa), v.ckpt) for k, v in after.items()}

    def check_eviction(self, before: dict, after: dict, freed: Any) -> None:
        gone_full: Counter[int] = Counter()
        gone_swa: Counter[int] = Counter()
        gone_ck: Counter[int] = Counter()
        locked_win = self.ref.locked_windows()
        for key, page in before.items():
            new = after.get(key)
            if new is None:
                assert key not in after
                assert not self.ref.is_locked_page(key), "a locked page was evicted"
                below = [k for k in after if k[0] == key[0] and k[1][: len(key[1])] == key[1]]
                assert not below, "a page was evicted before its descendants"
                gone_full.update(page.full)
                gone_swa.update(s for s in page.swa if s >= 0)
                if page.ckpt >= 0:
                    gone_ck[page.ckpt] += 1
                continue
            assert new.full == page.full
            for i, (old_s, new_s) in enumerate(zip(page.swa, new.swa, strict=True)):
                if old_s != new_s:
                    assert new_s == -1 and old_s >= 0, "SWA entry changed other than freed"
                    assert (key, i) not in locked_win, "a locked window was tombstoned"
                    gone_swa[old_s] += 1
            if new.ckpt != page.ckpt:
                assert new.ckpt == -1 and key not in self.ref.locks, "a handle's checkpoint"
                gone_ck[page.ckpt] += 1
        freed_swa, freed_ck = freed_parts(freed)
        assert Counter(freed.full.tolist()) == gone_full
        assert Counter(freed_swa.tolist()) == gone_swa
        assert Counter(freed_ck) == gone_ck

    def step(self) -> None:
        op = self.rng.choices(
            [self.do_match, self.do_insert, self.do_evict, self.do_unlock], [4, 4, 2, 1]
        )[0]
        op()
        self.cache.check_integrity()
        assert actual_pages(self.cache) == self.ref.pages
        if self.comp.has(SWA):
            live = sum(1 for pg in self.ref.pages.values() for s in pg.swa if s >= 0)
            assert self.cache.held(SWA) == live
        ck = sum(1 for pg in self.ref.pages.values() if pg.ckpt >= 0)
        assert self.cache.held(STATE) == ck
        self.check_census()

    def check_census(self) -> None:
        """free + cached == issued in every component pool, nothing given back twice, nothing
        both given back and still cached (no handle is held across steps: held == 0)."""
        nodes = [node for _, node in self.cache.iter_nodes()]
        cached = {
            "full": [int(s) for n in nodes for s in n.slots] if self.comp.full else [],
            "swa": [int(s) for n in nodes if n.swa is not None for s in n.swa if s >= 0],
            "ckpt": [n.ckpt for n in nodes if n.ckpt >= 0],
        }
        for name, issued in self.issued.items():
            back = self.back[name]
            assert all(c == 1 for c in back.values()), f"{name}: an id came back twice"
            held = Counter(cached[name])
            assert all(c == 1 for c in held.values()), f"{name}: an id cached twice"
            assert not set(back) & set(held), f"{name}: an id given back is still cached"
            assert set(back) | set(held) == issued, f"{name}: free + cached != pool"


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    page=st.sampled_from([1, 2, 4]),
    combo=st.sampled_from(range(len(COMBOS))),
)
def test_component_tree_matches_reference(seed: int, page: int, combo: int) -> None:
    d = Driver(COMBOS[combo], page, seed)
    for _ in range(120):
        d.step()
    while d.handles:
        d.do_unlock()
    freed = d.cache.reset()
    assert d.cache.held(SWA) == 0 and d.cache.held(STATE) == 0
    assert len(freed.full) == sum(len(p.full) for p in d.ref.pages.values())


def test_swa_vote_rejects_tombstoned_window() -> None:
    c = HybridCache(page_size=2, components=["full", "swa:4"])
    toks = list(range(12))
    swa = [-1, -1, -1, -1, 10, 11, 12, 13, 14, 15, 16, 17]  # first 4 positions freed
    c.insert(toks, list(range(12)), {SWA: swa})
    assert c.match(toks).length == 12
    assert c.match([*toks[:7], 99]).length == 0  # windows before 6 all hit tombstones
    m = c.match([*toks[:9], 99])
    assert m.length == 8
    assert m.kinds[SWA].tolist() == [-1] * 4 + [10, 11, 12, 13]
    assert c.match([*toks[:3], 99]).length == 0  # window [0, 2) is tombstoned


@settings(max_examples=200, deadline=None)
@given(
    pages=st.lists(st.booleans(), min_size=0, max_size=40),
    page=st.sampled_from([1, 2, 4, 16]),
    window=st.integers(1, 70),
    data=st.data(),
)
def test_swa_deepest_equals_brute_force(
    pages: list[bool], page: int, window: int, data: st.DataObject
) -> None:
    """The vote's run-jumping search gives the brute force's deepest boundary (every page
    boundary <= p whose window [p - W, p) holds no tombstone) for every p, from a path of
    several nodes; tombstones are whole pages."""
    live = np.repeat(np.array(pages, dtype=bool), page)
    swa = np.where(live, np.arange(len(live)), -1).astype(np.int64)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(swa) - 1)), max_size=4)))
    path: list[Any] = [
        type("N", (), {"swa": part})() for part in np.split(swa, [c for c in cuts if c < len(swa)])
    ]
    comp = parse_components(["full", f"swa:{window}"]).parts[0].make(page, lambda n: 0)
    deepest = comp.vote(path, len(swa))
    for p in range(0, len(swa) + 1, page):
        want = max(b for b in range(0, p + 1, page) if not (swa[max(0, b - window) : b] < 0).any())
        assert deepest(p) == want, (p, want)


def test_state_resumes_at_deepest_checkpoint_and_divergence_reports_shared() -> None:
    c = HybridCache(page_size=4, components=["full", "state"])
    toks = list(range(40))
    c.insert(toks, list(range(40)), {STATE: [(16, 7), (32, 8), (40, 9)]})
    m = c.match([*toks[:30], 99])
    assert (m.length, m.kinds[STATE], m.shared_length) == (16, 7, 28)
    m = c.match(toks)
    assert (m.length, m.kinds[STATE]) == (40, 9)
    # A checkpoint left at the divergence point splits the edge there; siblings hit it.
    out = c.insert(toks[:28], list(range(28)), {STATE: [(28, 11)]}, owned_from=16)
    assert out.refused[STATE] == () and out.cached == 28
    assert c.match([*toks[:30], 5]).kinds[STATE] == 11
    c.check_integrity()


def test_trim_keeps_windows_and_locked_resume_point() -> None:
    c = HybridCache(page_size=1, components=["full", "swa:3"])
    toks = list(range(10))
    c.insert(toks, list(range(10)), {SWA: list(range(100, 110))})
    m = c.match([*toks[:6], 99])
    c.lock(m.handle)
    freed = c.evict({SWA: 100})  # trims, then evicts the unlocked leaf
    c.check_integrity()
    again = c.match([*toks[:6], 99])
    assert again.length == 6
    assert again.kinds[SWA].tolist()[3:] == [103, 104, 105]
    assert 103 not in freed.kinds[SWA].tolist()
    c.unlock(m.handle)


def test_hybrid_cache_needs_every_component_and_is_not_the_plain_one() -> None:
    with pytest.raises(ValueError):
        HybridCache(components=["full"])  # FULL only: that is a RadixCache
    hy = HybridCache(components=["full", "swa:2"])
    with pytest.raises(ValueError):
        hy.insert([1, 2], [3, 4])  # the SWA slots are missing
    with pytest.raises(ValueError):
        Components(full=False)
    with pytest.raises(ValueError):
        HybridCache(components=["state"])  # no component carries per-token data
    with pytest.raises(ValueError, match="unknown component"):
        HybridCache(components=["full", "mla"])
    assert not hasattr(RadixCache(), "components")
    assert TOKEN_BYTES == 8


def test_insert_handle_covers_the_inserted_prefix_and_locks() -> None:
    c = HybridCache(page_size=2, components=["full", "swa:2", "state"])
    toks = list(range(9))
    out = c.insert(toks, list(range(9)), {SWA: list(range(100, 109)), STATE: [(8, 5)]})
    assert (out.cached, out.refused[STATE]) == (0, ())
    assert c.slots_of(out.handle).tolist() == list(range(8))
    swa = c.part_of(SWA, out.handle)
    assert swa is not None and swa.tolist() == [-1] * 6 + [106, 107]
    assert c.part_of(STATE, out.handle) == 5
    c.lock(out.handle)
    assert c.protected_size == 8 and c.evict({"full": 8}).full.size == 0
    again = c.insert(toks[:6], list(range(50, 56)), {SWA: list(range(200, 206))}, owned_from=0)
    assert again.cached == 6 and c.slots_of(again.handle).tolist() == list(range(6))
    c.unlock(out.handle)
    c.check_integrity()


def test_full_eviction_is_page_granular_like_the_plain_tree() -> None:
    c = HybridCache(page_size=2, components=["full", "swa:4", "state"])
    c.insert(list(range(12)), list(range(12)), {SWA: list(range(100, 112)), STATE: [(12, 9)]})
    freed = c.evict({"full": 3})  # two pages from the tail; the head stays cached
    assert sorted(freed.full.tolist()) == [8, 9, 10, 11]
    assert sorted(freed.kinds[SWA].tolist()) == [108, 109, 110, 111]
    assert freed.kinds[STATE] == (9,)
    m = c.match(list(range(12)))
    assert m.length == 0 and m.shared_length == 8  # no checkpoint left to resume from
    c.check_integrity()
    assert c.evictable_size == 8 and c.held(SWA) == 8


def test_trim_frees_page_by_page_furthest_back_first() -> None:
    """SWA pressure frees only the pages asked for, the furthest from the kept boundary first:
    a boundary inside the cached chain keeps its window as long as the pages it needs live."""
    c = HybridCache(page_size=2, components=["full", "swa:4"])
    toks = list(range(12))
    c.insert(toks[:6], list(range(6)), {SWA: list(range(100, 106))})  # a chunk commit: two nodes
    c.insert(toks, list(range(12)), {SWA: list(range(100, 112))}, owned_from=6)
    assert sorted(c.evict({SWA: 1}).kinds[SWA].tolist()) == [100, 101]  # one page, the first
    assert c.match([*toks[:9], 99]).length == 8  # window [4, 8) still live
    assert sorted(c.evict({SWA: 3}).kinds[SWA].tolist()) == [102, 103, 104, 105]
    assert c.match([*toks[:9], 99]).length == 0  # now its window is gone
    assert c.match(toks).length == 12  # the leaf's own window is never trimmed
    assert c.held(SWA) == 6 and c.evictable_size == 12
    c.check_integrity()
