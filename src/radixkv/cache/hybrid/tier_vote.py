"""Where a hybrid model resumes from its lower tiers (L2, and L3 through L2): the component vote
of `HybridCache.match`, over what the tiers hold instead of what the tree holds. No torch.

The tiers keep, under one chained page hash h_p per page p (`radixkv.cache.tiers`), up to three
values: the page's FULL K/V, its SWA K/V (kept only for the pages in the window before a
boundary, see `tier_boundaries`), and the STATE checkpoint after its last token. Given that the
tree resumes at `start` pages, a boundary B > start (in pages) is usable from the tiers iff

- FULL: pages start .. B-1 are all held (the run `full_run` from `start` reaches B);
- SWA (window W tokens, `window_pages` = ceil(W / page_size)): every page in
  [max(start, B - window_pages), B) is held (those before `start` are in the tree: the tree
  accepted `start`, so the W tokens before it are live there, and B - W > start - W);
- STATE: a checkpoint is held at B (the state after exactly B pages).

The request resumes at the deepest usable B, exactly as every component votes in L1.
"""

from __future__ import annotations

from collections.abc import Callable


def deepest_boundary(
    start: int,
    full_run: int,
    window_pages: int | None,
    swa_held: Callable[[int], bool],
    state_held: Callable[[int], bool] | None,
) -> int:
    """The deepest boundary (pages) in (start, start + full_run] every component accepts, or
    `start` when there is none. `window_pages` None: no SWA component; `state_held` None: no
    STATE component. `swa_held(p)`: page p's SWA K/V is held; `state_held(b)`: a checkpoint
    after b pages is held."""
    for b in range(start + full_run, start, -1):
        if state_held is not None and not state_held(b):
            continue
        if window_pages is not None and not all(
            swa_held(p) for p in range(max(start, b - window_pages), b)
        ):
            continue
        return b
    return start


def window_pages_before(b: int, start: int, window_pages: int) -> range:
    """The SWA pages a resume at boundary b (pages) loads from the tiers."""
    return range(max(start, b - window_pages), b)


def tier_boundaries(
    first: int, last: int, page_size: int, interval: int, extra: tuple[int, ...] = ()
) -> list[int]:
    """Token boundaries in (first, last] whose SWA windows the tiers keep: every `interval`
    tokens, every page_size * 2**k tokens (as the STATE checkpoints, so a prefix shared up to
    S tokens resumes past S/2), `last` itself (the end of what was inserted) and `extra`
    (checkpoint boundaries); all page multiples."""
    out = set()
    for b in range(first - first % page_size + page_size, last + 1, page_size):
        pages = b // page_size
        if b % interval == 0 or pages & (pages - 1) == 0:
            out.add(b)
    if last > first and last % page_size == 0:
        out.add(last)
    out.update(b for b in extra if first < b <= last and b % page_size == 0)
    return sorted(out)
