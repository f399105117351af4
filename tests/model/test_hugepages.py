"""Long-lived tensors on huge pages (radixkv.memory.hugepages): same values as plain torch
allocations, 2 MiB aligned, the mapping advised for THP, kept alive by its views, and plain torch
allocations where it does not apply."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from radixkv.memory import hugepages
from radixkv.memory.pool import KVPool, KVPoolConfig
from radixkv.model.nn.linear import PackedLinear

BIG = (3 << 20) // 4 + 5  # f32 elements: a bit over 3 MiB, not a multiple of a page


def _thp_mode() -> str | None:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return None
    text = path.read_text()
    return text[text.index("[") + 1 : text.index("]")]


def _vma_field(ptr: int, field: str) -> str | None:
    """`field` of the mapping of this process holding address `ptr` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


def test_zeros_is_zero_aligned_and_writable() -> None:
    t = hugepages.zeros((BIG,), torch.float32)
    assert t.shape == (BIG,) and t.dtype == torch.float32 and t.is_contiguous()
    assert torch.count_nonzero(t) == 0
    if hugepages.enabled():
        assert t.data_ptr() % hugepages.HUGE == 0
    t[::4096] = 7.0
    assert float(t.sum()) == 7.0 * len(range(0, BIG, 4096))


def test_views_keep_the_mapping_alive() -> None:
    t = hugepages.zeros((BIG,), torch.float32)[10:20]
    gc.collect()
    t.fill_(3.0)
    assert torch.equal(t, torch.full((10,), 3.0))


@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="no transparent huge pages here")
def test_mapping_is_advised_for_huge_pages() -> None:
    t = hugepages.zeros((BIG,), torch.float32)
    assert _vma_field(t.data_ptr(), "THPeligible") == "1"


def test_small_and_disabled_are_plain_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    small = hugepages.zeros((1000,), torch.bfloat16)
    assert small.dtype == torch.bfloat16 and torch.count_nonzero(small) == 0
    w = torch.randn(8, 8)
    assert hugepages.copy_of(w) is w  # below 2 MiB: the tensor itself
    monkeypatch.setenv("RADIXKV_HUGEPAGES", "0")
    assert not hugepages.enabled()
    big = torch.randn(BIG)
    assert hugepages.copy_of(big) is big
    assert torch.count_nonzero(hugepages.zeros((BIG,), torch.float32)) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_of_has_the_same_bits(dtype: torch.dtype) -> None:
    src = torch.randn(1024, 2048, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = hugepages.copy_of(src)
    assert out.shape == src.shape and out.dtype == dtype
    assert torch.equal(
        out.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        src.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
    )
    if hugepages.enabled():
        assert out.data_ptr() != src.data_ptr() and out.data_ptr() % hugepages.HUGE == 0


def test_pool_and_packed_weights_match_plain_allocations(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool and a packed linear on huge pages give the bits of the plain ones."""
    cfg = KVPoolConfig(num_layers=2, num_kv_heads=3, head_dim=64, num_slots=8192)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1024, 576, generator=g) * 0.05
    x = torch.randn(7, 576, generator=g)
    kv = torch.randn(5, 3, 64, generator=g)
    slots = torch.tensor([0, 4095, 4096, 8000, 8191])
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("RADIXKV_HUGEPAGES", flag)
        pool = KVPool(cfg)
        assert all(torch.count_nonzero(t) == 0 for t in pool.k + pool.v)
        pool.write(1, slots, kv, -kv)
        results.append((pool.k[1][slots].clone(), pool.v[1][slots].clone(), PackedLinear(w)(x)))
    for a, b in zip(results[0], results[1], strict=True):
        assert torch.equal(a, b)
