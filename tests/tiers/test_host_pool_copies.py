"""The host (L2) pool's copies against a naive per-slot reference: save (L1 -> L2), load (L2 ->
L1) for runs of consecutive host pages, scattered ones and a mix, and the storage payloads
(page_payload / write_payload) byte for byte, in bfloat16 and float32."""

from __future__ import annotations

import random

import pytest
import torch

from radixkv.memory.host_pool import HostKVPool, _runs
from radixkv.memory.pool import KVPool, KVPoolConfig

PS = 4


def _pools(dtype: torch.dtype, device_pages: int = 100, host_pages: int = 64) -> HostKVPool:
    # num_slots not a multiple of the page: the slots past the last page stay untouched
    pool = KVPool(KVPoolConfig(3, 2, 8, device_pages * PS + 3, dtype))
    gen = torch.Generator().manual_seed(1)
    for t in (*pool.k, *pool.v):
        t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
    return HostKVPool(pool, host_pages, PS)


def _page(pool: KVPool, page: int) -> torch.Tensor:
    """One device page as the host layout has it: [layers, 2, page, H, D], slot by slot."""
    rows = [
        torch.stack([torch.stack([k[page * PS + i], v[page * PS + i]]) for i in range(PS)], 1)
        for k, v in zip(pool.k, pool.v, strict=True)
    ]
    return torch.stack(rows)


def test_runs() -> None:
    assert _runs([]) == []
    assert _runs([5, 6, 7, 2, 3, 9]) == [(0, 5, 3), (3, 2, 2), (5, 9, 1)]
    assert _runs([3, 2, 1]) == [(0, 3, 1), (1, 2, 1), (2, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["one run", "scattered", "long runs"])
def test_save_load_and_payloads_match_a_per_slot_reference(dtype: torch.dtype, layout: str) -> None:
    rng = random.Random(layout)
    host = _pools(dtype)
    pool = host.device_pool
    n = 40
    if layout == "one run":
        host_pages = list(range(10, 10 + n))
    elif layout == "scattered":
        host_pages = rng.sample(range(64), n)
    else:  # two runs of 20: copied run by run
        host_pages = list(range(40, 60)) + list(range(0, 20))
    src = rng.sample(range(100), n)
    before = [_page(pool, p) for p in src]
    host.save(src, host_pages)
    for hp, want in zip(host_pages, before, strict=True):
        assert torch.equal(host.data[hp], want)
    # payloads: bytes out, bytes in, into another page, equal
    payload = bytes(host.page_payload(host_pages[0]))
    assert len(payload) == host.page_bytes
    spare = next(p for p in range(64) if p not in host_pages)
    host.write_payload(spare, memoryview(payload))
    assert torch.equal(host.data[spare], host.data[host_pages[0]])
    # load into other device pages (the rest stays untouched)
    dst = rng.sample([p for p in range(100) if p not in src], n)
    untouched = [p for p in range(100) if p not in dst]
    keep = {p: _page(pool, p) for p in untouched}
    tail = [k[100 * PS :].clone() for k in pool.k]
    host.load(host_pages, dst)
    for d, want in zip(dst, before, strict=True):
        assert torch.equal(_page(pool, d), want)
    for p, want in keep.items():
        assert torch.equal(_page(pool, p), want)
    assert all(torch.equal(k[100 * PS :], t) for k, t in zip(pool.k, tail, strict=True))
