"""The device plumbing of the host (L2) tier, decided and exercised on a CPU-only machine
(radixkv.memory.transfer; issue 35, item 2). Nothing here pretends a GPU ran: what torch reports
(torch.cuda.is_available, pinned allocation) is monkeypatched, and the staged copy path a CUDA
device takes runs on CPU tensors, where its copies are synchronous.

- host buffers are pinned only for a CUDA device with CUDA present; a failed pin falls back to
  pageable memory with one warning;
- the host pool stages its copies (pinned block, non_blocking) exactly where pinning is wanted;
- the staged save and load move the same bytes as the direct CPU path, and a save waits for its
  copy before the host reads the staging block (one wait per save).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any

import pytest
import torch

from radixkv.memory import transfer
from radixkv.memory.host_pool import HostKVPool
from radixkv.memory.pool import KVPool, KVPoolConfig

PS = 4


@pytest.fixture
def cuda_present(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """torch reports CUDA; pinned allocations are recorded (then made pageable: no driver)."""
    pins: list[bool] = []
    real_zeros, real_empty = torch.zeros, torch.empty

    def zeros(*shape: Any, pin_memory: bool = False, **kw: Any) -> torch.Tensor:
        pins.append(pin_memory)
        return real_zeros(*shape, **kw)

    def empty(*shape: Any, pin_memory: bool = False, **kw: Any) -> torch.Tensor:
        pins.append(pin_memory)
        return real_empty(*shape, **kw)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(transfer.torch, "zeros", zeros)
    monkeypatch.setattr(transfer.torch, "empty", empty)
    return pins


def test_pinning_follows_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not transfer.wants_pinned("cuda") and not transfer.async_copies("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert transfer.wants_pinned("cuda") and transfer.wants_pinned(torch.device("cuda", 1))
    assert transfer.async_copies("cuda")
    assert not transfer.wants_pinned("cpu") and not transfer.async_copies("cpu")


def test_host_buffers_ask_for_pinned_memory_only_for_cuda(cuda_present: list[bool]) -> None:
    transfer.host_zeros((2, 3), torch.float32, "cuda")
    transfer.host_empty((2,), torch.float32, "cuda:0")
    transfer.host_zeros((2, 3), torch.float32, "cpu")
    transfer.host_empty((2,), torch.float32, "cpu")
    assert cuda_present == [True, True, False, False]


def test_a_failed_pin_falls_back_to_pageable_memory_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_zeros = torch.zeros

    def zeros(*shape: Any, pin_memory: bool = False, **kw: Any) -> torch.Tensor:
        if pin_memory:
            raise RuntimeError("cudaHostAlloc failed: out of locked memory (test)")
        return real_zeros(*shape, **kw)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(transfer.torch, "zeros", zeros)
    with caplog.at_level(logging.WARNING, logger="radixkv.memory.transfer"):
        a = transfer.host_zeros((4,), torch.float16, "cuda")
        b = transfer.host_zeros((4,), torch.float16, "cuda")
    assert a.dtype == b.dtype == torch.float16 and not a.is_pinned() and a.device.type == "cpu"
    assert sum("locked memory" in r.message for r in caplog.records) == 1


def _device_pool(device: str = "cpu") -> KVPool:
    pool = KVPool(KVPoolConfig(3, 2, 8, 40 * PS, torch.bfloat16))
    gen = torch.Generator().manual_seed(2)
    for t in (*pool.k, *pool.v):
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    if device != "cpu":  # the pool as a CUDA engine describes it (its tensors stay here)
        pool = _with_config(pool, device)
    return pool


def _with_config(pool: KVPool, device: str) -> KVPool:
    twin = object.__new__(KVPool)
    twin.__dict__.update(pool.__dict__)
    twin.config = dataclasses.replace(pool.config, device=device)
    return twin


def test_the_host_pool_pins_and_stages_exactly_for_cuda(cuda_present: list[bool]) -> None:
    on_cuda, on_cpu = _device_pool("cuda"), _device_pool("cpu")
    cuda_present.clear()
    assert HostKVPool(on_cuda, 8, PS).staged and cuda_present == [True]
    cuda_present.clear()
    assert not HostKVPool(on_cpu, 8, PS).staged and cuda_present == [False]


@pytest.mark.parametrize("layout", ["run", "scattered"])
def test_staged_copies_move_the_same_bytes_and_save_waits_before_the_host_reads(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    rng = random.Random(layout)
    direct, staged = HostKVPool(_device_pool(), 16, PS), HostKVPool(_device_pool(), 16, PS)
    staged.staged = True  # the path a CUDA device takes, on CPU tensors
    src = rng.sample(range(40), 10)
    hp = list(range(3, 13)) if layout == "run" else rng.sample(range(16), 10)
    waits: list[bool] = []

    def synchronize(device: Any) -> None:  # the host must not have read the block yet
        waits.append(not any(bool(staged.data[p].any()) for p in hp))

    monkeypatch.setattr(transfer, "synchronize", synchronize)
    direct.save(src, hp)
    staged.save(src, hp)
    assert waits == [True]  # one wait, before the scatter into the host pages
    assert torch.equal(staged.data, direct.data)
    dst = rng.sample(range(40), 10)
    direct.load(hp, dst)
    staged.load(hp, dst)
    for a, b in zip(
        (*direct.device_pool.k, *direct.device_pool.v),
        (*staged.device_pool.k, *staged.device_pool.v),
        strict=True,
    ):
        assert torch.equal(a, b)
    assert waits == [True]  # a load queues and returns: stream order covers its readers
