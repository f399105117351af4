"""Long-lived CPU tensors on transparent huge pages.

A decode step reads the KV rows of every request's context, scattered over the pool, and streams
every weight once: hundreds of MB on 4 KiB pages, so a large share of those reads also miss the
TLB and walk the page tables. Linux backs a mapping with 2 MiB pages when it is asked to
(`madvise(MADV_HUGEPAGE)`; most distributions set THP to `madvise`, so nothing asks by default),
and torch's allocator asks only under `THP_MEM_ALLOC_ENABLE=1`, for every allocation of 2 MiB or
more, which slows the short-lived activations of a prefill down (each is faulted in as fresh
zeroed huge pages). So only what lives as long as the engine goes here: the KV pools and the
packed weights.

`RADIXKV_HUGEPAGES=0` turns it off (plain torch allocations). Elsewhere than Linux on a CPU
device, and below 2 MiB, these are plain torch allocations too. The values are the same either
way: this changes where bytes live, never what they are.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import torch

HUGE = 2 << 20  # bytes per transparent huge page on x86-64 and arm64 (4 KiB base pages)


def enabled() -> bool:
    """Whether long-lived tensors are placed on huge pages here."""
    return (
        os.environ.get("RADIXKV_HUGEPAGES", "1") != "0"
        and hasattr(mmap, "MADV_HUGEPAGE")
        and hasattr(mmap.mmap, "madvise")
    )


def _mapped(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """A tensor of `shape` on a fresh anonymous mapping (zero-filled, not yet faulted in) with
    MADV_HUGEPAGE over it, or None where huge pages do not apply (small, or turned off)."""
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE or not enabled():
        return None
    # One huge page more than needed, so that the tensor can start at a 2 MiB boundary (only
    # aligned 2 MiB ranges can be huge pages).
    buf = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(buf, dtype=torch.uint8)  # holds `buf` alive as long as any view
    start = -raw.data_ptr() % HUGE
    with contextlib.suppress(OSError):  # THP unavailable (e.g. "never"): 4 KiB pages, same values
        buf.madvise(mmap.MADV_HUGEPAGE, start, len(buf) - start)
    return raw[start : start + nbytes].view(dtype).view(shape)


def zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """A zero tensor of `shape`, on huge pages where it is a CPU tensor of >= 2 MiB, every page
    faulted in before it returns (as `torch.zeros` does)."""
    out = _mapped(shape, dtype) if torch.device(device).type == "cpu" else None
    if out is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    # Fault every page in now (already zero): a first touch while serving would stall that
    # step on zeroing, and on compaction where the kernel has to assemble a free huge page.
    out.zero_()
    return out


def copy_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `t` on huge pages (where `zeros` would place it there), else `t`."""
    out = _mapped(tuple(t.shape), t.dtype) if t.device.type == "cpu" else None
    if out is None:
        return t
    out.copy_(t)  # touches every page: all faulted in here
    return out
