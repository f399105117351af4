"""`NoComponents`: the component memory of a model with FULL attention layers only.

The null `ComponentMemory` (engine/kv/components_kv.py): there is no SWA or STATE pool, so there is
nothing to reserve, track or free per request, and the KV manager calls its per-request hooks
unconditionally instead of asking whether the model is hybrid."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixkv.engine.request import Request


class NoComponents:
    """Every hook does nothing, every check passes; `spec` and `cache` are None (no hybrid
    pools, no hybrid tree)."""

    spec: Any = None
    cache: Any = None

    def reserve(self, req: Request) -> bool:
        return True

    def forget_match(self, req: Request) -> None:
        return None

    def bind(self, req: Request, prefix_len: int) -> None:
        return None

    def ensure(self, req: Request, end: int) -> bool:
        return True

    def chunk_cap(self, req: Request) -> int:
        return req.pending

    def after_step(self, req: Request, was_prefill: bool) -> None:
        return None

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        return None

    def release(self, req: Request) -> None:
        return None

    def census(self, running: Sequence[Request]) -> dict[str, dict[str, int]]:
        return {}

    def check(self, running: Sequence[Request]) -> None:
        return None
