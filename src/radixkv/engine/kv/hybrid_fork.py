"""n > 1 on a hybrid model: a choice forks from its parent's computed prompt (copy-on-write).

The parent (choice 0) has just computed its whole prompt. A fork shares its cache-owned prefix
through the tree lock (KVManager.fork, FULL part), reads the same SWA window of the tree through
its SWA row, gets its own SWA pages holding copies of the parent's own SWA K/V [swa_lo, kv_len),
and its own working state slot holding a copy of the parent's state after the prompt. Nothing
the parent owns is written by the child, and nothing is recomputed. What a fork needs is taken
first (`reserve_fork`), so a failure later gives it back (`unreserve_fork`) and the choice is
admitted like any request instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixkv.engine.request import Request

if TYPE_CHECKING:
    from radixkv.engine.kv.components_kv import ComponentMemory


def reserve_fork(comp: ComponentMemory, parent: Request) -> tuple[list[int], int] | None:
    """The SWA pages and the state slot a fork of `parent` needs (its own SWA positions
    [swa_lo, kv_len) and a working state); None (nothing taken) when they cannot be had."""
    state = -1
    if comp.state_alloc is not None:
        got = comp.alloc_state()
        if got is None:
            return None
        state = got
    pages: list[int] = []
    if comp.swa_alloc is not None:
        n = comp.swa_alloc.pages_for(max(0, parent.kv_len - parent.hybrid.swa_lo))
        swa = comp.alloc_swa(n) if n else []
        if swa is None:
            unreserve_fork(comp, ([], state))
            return None
        pages = swa
    return pages, state


def unreserve_fork(comp: ComponentMemory, held: tuple[list[int], int]) -> None:
    pages, state = held
    if pages:
        assert comp.swa_alloc is not None
        comp.swa_alloc.free_page_ids(pages)
    if state >= 0:
        assert comp.state_alloc is not None
        comp.state_alloc.free_page_ids([state])


def bind_fork(
    comp: ComponentMemory, parent: Request, child: Request, held: tuple[list[int], int]
) -> None:
    """`child` (its FULL row bound, at the parent's kv_len) reads the parent's SWA row up to
    swa_lo (the tree's window, -1 before it) and copies of the parent's own SWA K/V after
    it; its working state is a copy of the parent's (the state after the whole prompt)."""
    pages, state = held
    child.hybrid.swa_lo, child.hybrid.swa_pages = parent.hybrid.swa_lo, pages
    child.hybrid.resume_ckpt, child.hybrid.ckpt_target = -1, 0
    if comp.swa_table is not None:
        assert comp.swa_alloc is not None and comp.pools.swa is not None
        lo, kv = parent.hybrid.swa_lo, parent.kv_len
        comp.swa_table.alloc_row_at(child.row)
        comp.swa_table.write(child.row, 0, comp.swa_table.get_numpy(parent.row, 0, lo))
        dst = comp.swa_alloc.page_slots(pages)
        comp.swa_table.write(child.row, lo, dst)
        comp.pools.swa.copy_slots(comp.swa_table.get_numpy(parent.row, lo, kv), dst[: kv - lo])
    if state >= 0:
        assert comp.pools.state is not None
        child.hybrid.state_slot = state
        comp.pools.state.copy_state(parent.hybrid.state_slot, state)
