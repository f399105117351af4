"""One kind of KV besides FULL in the host (L2) and storage (L3) tiers: the contract of its store
(`KindStore`), what every store is built from (`StoreSetup`), and its share of a load plan
(`KindPart`). Each kind names its store class in its line of the KV registry (engine/kv/kinds.py),
which the engine hands to `tier_setup.make_tiers`.

The tier manager (engine/tiers/manager.py) keeps FULL pages itself: their chained page hashes key
every value of every kind (a value of kind k is stored under "<hash hex>-<k>", with a header and
a checksum of its own). Each other kind the tiers keep is one store: an L2 index and a host pool
of its own, and three answers the manager asks of it; the copies, pins, the vote over what L1 and
L2 hold, the load plans and L3 are the manager's, the same for every kind:

- `to_keep`: which device values of what the tree just adopted (the kind's part, as the KV
  manager's memory of that kind hands it) are copied to L2, each under the page it ends;
- `needs`: the pages whose values a resume at boundary b needs. The tiers can resume a request at
  b iff FULL pages reach b and every kind holds all it needs there (`cache/hybrid/tier_vote.py`
  says the same of the hybrid tree's own vote), and the load plan carries those values;
- `marks`: the boundaries this kind resumes at in a part (checkpoints), so that the others keep
  what a resume there needs too.

A kind the tree never sees (a per-request scratch, an encoder cache) has no store: the tiers never
hold it and a load never needs it. Like the manager, a store never touches a device slot it was
not handed, and never the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from radixkv.cache.tiers import HostIndex
from radixkv.memory.hybrid import PoolSpec
from radixkv.storage import PageMeta


@dataclass(frozen=True)
class StoreSetup:
    """What a kind's store is built from, besides its device pool."""

    spec: PoolSpec | None  # the model's pools (None: a FULL-only model, which has no stores)
    page_size: int
    share: float  # host values per device value: the FULL host pool's share of its device pool
    interval: int  # tokens between kept boundaries (the STATE checkpoint interval, whole pages)
    fingerprint: str  # the model's (L3 headers)


@dataclass
class KindPart:
    """One kind's values in a load plan: the page each is keyed by (`pages`, page indices of the
    prompt) and its L2 entry (`host`), in the same order; pinned until the plan's load."""

    pages: list[int]
    host: list[int]


class HostValues(Protocol):
    """A kind's host pool (HostKVPool, HostStatePool): copies both ways and bytes for L3."""

    @property
    def page_bytes(self) -> int: ...

    def save(self, device: Sequence[int], host: Sequence[int]) -> None: ...

    def load(self, host: Sequence[int], device: Sequence[int]) -> None: ...

    def page_payload(self, page: int) -> bytes | memoryview: ...

    def write_payload(self, page: int, payload: bytes | memoryview) -> None: ...


class KindStore(Protocol):
    """One kind's L2 (and, through the manager, L3) beside FULL's. `saved` counts the values the
    manager copied into it."""

    kind: str
    index: HostIndex
    saved: int

    @property
    def host(self) -> HostValues: ...

    def meta(self) -> PageMeta:
        """The header every stored value of this kind carries (checked on restore)."""

    def marks(self, part: Any) -> tuple[int, ...]:
        """Token boundaries this kind resumes at in `part` (what the tree adopted of it)."""

    def to_keep(
        self, part: Any, cached: int, aligned: int, marks: tuple[int, ...]
    ) -> list[tuple[int, int]]:
        """(page index, device value) pairs to copy to L2, of `part` (the tree adopted
        tokens[cached:aligned] with it; `marks`: every kind's resume boundaries in it)."""

    def needs(self, b: int, start: int) -> Sequence[int]:
        """The pages whose values a resume at boundary `b` (pages) needs from the tiers, when
        the tree resumes at `start` pages (what it holds before `start` it has in L1)."""
