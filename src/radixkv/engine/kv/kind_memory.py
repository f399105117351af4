"""The contract of one kind of KV memory for running requests (`KindMemory`), and what every
kind is built from (`KindSetup`); the registry of kinds is `engine/kv/kinds.py`.

vLLM v1's per-layer KV cache specs and its one manager per spec are the model: each kind of layer
(sliding window, recurrent state, ...) keeps its own pool, allocator and per-request holdings,
and one manager per kind answers the same calls. The hybrid coordinator (`ComponentMemory`,
engine/kv/components_kv.py) iterates the kinds a model has; FULL attention is the KV manager's
own (engine/kv/kv_manager.py) and is no entry here. A kind keeps what it holds for a request in
`req.kv_kinds[kind]`, created when it first takes something and dropped at `release`.

Calls that concern the tree (`on_match`, `tree_part`, `after_insert`, `take_freed`) read and
write this kind's own entry of the tree's per-kind mappings (`HybridMatch.kinds`, the insert's
`parts` and `HybridInsert.refused`, `Freed.kinds`), keyed by the kind's name: a kind the tree
does not know (an encoder cache, a per-request scratch) returns None from `tree_part` and gets
nothing from the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from radixkv.cache.hybrid.components import HybridInsert, HybridMatch, HybridPrefixCache
from radixkv.engine.request import Request
from radixkv.memory.hybrid import PoolSpec

H = TypeVar("H")


def holding(req: Request, kind: str, make: Callable[[], H]) -> H:
    """req's holding of `kind` (`req.kv_kinds[kind]`), made by `make` on first use."""
    h = req.kv_kinds.get(kind)
    if h is None:
        h = req.kv_kinds[kind] = make()
    return h


@dataclass(frozen=True)
class KindSetup:
    """What a kind's memory is built from, besides its pool."""

    spec: PoolSpec
    page_size: int
    rows: int  # request rows (the scheduler's max running requests)
    max_context: int  # the longest row, in tokens
    device: str
    interval: int  # STATE checkpoint interval, in tokens (a whole number of pages)
    cache: HybridPrefixCache | None  # the tree (None: the prefix cache is off)
    # Ask the tree for room, evict(kind, n) (n units of `kind`): what it lets go of, of every
    # kind, goes back to each one's allocator (`take_freed`).
    evict: Callable[[str, int], None]


class KindMemory(Protocol):
    """One kind's pool bookkeeping for running requests. Every call leaves its census balanced:
    free + cached (in the tree) + held (by running requests) == its pool (`census`, `check`)."""

    kind: str

    # -- admission
    def on_match(self, req: Request, m: HybridMatch) -> None:
        """Remember what the tree's match gives this kind (`m.kinds[kind]`), for `bind`."""

    def forget_match(self, req: Request) -> None: ...

    def reserve(self, req: Request) -> bool:
        """Take what `req` needs before it is bound; False (nothing taken) when short."""

    def unreserve(self, req: Request) -> None:
        """Give back what `reserve` took (another kind was short)."""

    def bind(self, req: Request, prefix_len: int) -> None:
        """`req` got its table row at `prefix_len` cached tokens."""

    # -- stepping
    def ensure(self, req: Request, end: int) -> bool:
        """Room for positions < end; False (nothing changed) when short."""

    def chunk_cap(self, req: Request) -> int | None:
        """The longest next prefill chunk this kind allows (None: no limit)."""

    def after_step(self, req: Request, was_prefill: bool) -> None: ...

    def batch_slots(
        self, reqs: Sequence[Request], rows: list[int], ends: list[int]
    ) -> torch.Tensor | Sequence[int] | None:
        """This kind's slots in the step's `ForwardBatch` (`kind_slots[kind]` of `from_table`):
        a windowed kind's slot table [R, max(ends)], a state kind's slot per request, None for
        nothing."""

    # -- the tree
    def tree_part(self, req: Request, aligned: int, finishing: bool) -> Any:
        """What this kind hands the tree with req.tokens[:aligned] (None: nothing)."""

    def after_insert(self, req: Request, part: Any, out: HybridInsert, aligned: int) -> None:
        """Free what the tree refused of `part` (`out.refused[kind]`); give up what it
        adopted."""

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        """req's lock moved onto `handle`: read the tree's data for that prefix."""

    def take_freed(self, value: Any) -> None:
        """Return what the tree let go of, of this kind (its entry of `Freed.kinds` or of
        `HybridInsert.refused`; None: nothing), to the allocator."""

    # -- forks (n > 1: copy-on-write copies of the parent's own data)
    def reserve_fork(self, parent: Request) -> Any:
        """What a fork of `parent` needs, taken now; None (nothing taken) when short."""

    def unreserve_fork(self, held: Any) -> None: ...

    def bind_fork(self, parent: Request, child: Request, held: Any) -> None: ...

    # -- the end, and the books
    def release(self, req: Request) -> None:
        """Free everything `req` still holds of this kind."""

    def census(self, running: Sequence[Request]) -> dict[str, int]:
        """{"size", "free", "cached", "held"}."""

    def check(self, running: Sequence[Request]) -> None: ...


class KindMemoryBase:
    """`KindMemory` with every call a kind may not need answered by its neutral value (nothing
    to remember, take, limit, hand the tree or copy for a fork), so a new kind writes only the
    calls its pool needs, plus `census` and `check`, which every kind must answer."""

    kind: str

    def on_match(self, req: Request, m: HybridMatch) -> None:
        return None

    def forget_match(self, req: Request) -> None:
        return None

    def reserve(self, req: Request) -> bool:
        return True

    def unreserve(self, req: Request) -> None:
        return None

    def bind(self, req: Request, prefix_len: int) -> None:
        return None

    def ensure(self, req: Request, end: int) -> bool:
        return True

    def chunk_cap(self, req: Request) -> int | None:
        return None

    def after_step(self, req: Request, was_prefill: bool) -> None:
        return None

    def batch_slots(
        self, reqs: Sequence[Request], rows: list[int], ends: list[int]
    ) -> torch.Tensor | Sequence[int] | None:
        return None

    def tree_part(self, req: Request, aligned: int, finishing: bool) -> Any:
        return None

    def after_insert(self, req: Request, part: Any, out: HybridInsert, aligned: int) -> None:
        self.take_freed(out.refused.get(self.kind))

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        return None

    def take_freed(self, value: Any) -> None:
        return None

    def reserve_fork(self, parent: Request) -> Any:
        return True  # not None: nothing to take, nothing short

    def unreserve_fork(self, held: Any) -> None:
        return None

    def bind_fork(self, parent: Request, child: Request, held: Any) -> None:
        return None

    def release(self, req: Request) -> None:
        req.kv_kinds.pop(self.kind, None)

    def census(self, running: Sequence[Request]) -> dict[str, int]:
        raise NotImplementedError(f"the {self.kind} kind keeps no census")

    def check(self, running: Sequence[Request]) -> None:
        raise NotImplementedError(f"the {self.kind} kind has no check")


@runtime_checkable
class TierKind(Protocol):
    """The calls a tier load makes of a kind the host/storage tiers keep (a kind with a store in
    its registry line, engine/kv/kinds.py; engine/kv/tier_load.py makes them). A kind the tiers do
    not keep (one the tree never sees) needs none of them."""

    def tier_part(self, part: Any, out: HybridInsert) -> Any:
        """What the tree holds now of `part` (this kind's `tree_part`), for the tiers to keep
        (their `on_kinds_insert`)."""

    def load_alloc(self, n: int) -> list[int] | None:
        """`n` device values (pages, slots) for values a tier load copies down, evicting the
        tree's when short; None (nothing taken) if impossible."""

    def load_free(self, units: list[int]) -> None:
        """Give back what `load_alloc` took (another kind was short). What the tree refuses of
        a loaded part comes back through `take_freed`, as after an eviction."""

    def loaded_part(self, pages: list[int], units: list[int], boundary: int) -> Any:
        """The part this kind hands the tree with the loaded tokens[:boundary]: the values
        copied into `units`, keyed by prompt pages `pages` (the plan's `KindPart.pages`)."""
