"""Host <-> device copies of KV pages, and the decisions they rest on (issue 35, item 2).

Three rules, each one function here so that the decisions are tested on a machine without a GPU
(tests/tiers/test_device_transfer.py monkeypatches what torch reports):

- `wants_pinned(device)`: host buffers that feed or receive device copies are pinned
  (page-locked) only when the device is CUDA and torch has CUDA: pinned pages are what lets a
  copy run asynchronously by DMA. On a CPU device the "device" pool is host memory already and
  pinning would only lock memory.
- `host_zeros(shape, dtype, device)`: such a buffer, pinned where wanted; when pinning fails
  (RLIMIT_MEMLOCK, a container without the driver's host allocator) it falls back to pageable
  memory with one warning, and copies then simply stop being asynchronous.
- `async_copies(device)`: whether the host tier stages its copies through pinned buffers with
  `non_blocking=True` (CUDA only). Every such batch of copies ends in `synchronize(device)`
  before the host reads what came back (a device -> host copy) or may write the host memory a
  copy reads from (a host -> device copy): an asynchronous copy has only been queued when
  `copy_` returns.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
_warned: set[str] = set()


def wants_pinned(device: str | torch.device) -> bool:
    """Whether host buffers exchanged with `device` should be pinned: a CUDA device, and a
    torch that sees CUDA."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def async_copies(device: str | torch.device) -> bool:
    """Whether copies with `device` go through pinned staging with non_blocking=True."""
    return wants_pinned(device)


def host_zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device
) -> torch.Tensor:
    """A zeroed host tensor for copies with `device`: pinned where `wants_pinned`, pageable
    where it is not or where pinning fails (warned once per reason)."""
    if wants_pinned(device):
        try:
            return torch.zeros(shape, dtype=dtype, pin_memory=True)
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if reason not in _warned:
                _warned.add(reason)
                log.warning(
                    "pinned host memory unavailable (%s): host copies are synchronous", reason
                )
    return torch.zeros(shape, dtype=dtype)


def host_empty(
    shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device
) -> torch.Tensor:
    """A staging buffer for one batch of copies (pinned where wanted: torch caches freed
    pinned blocks and reuses them only once the copies that used them are done)."""
    if wants_pinned(device):
        try:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        except RuntimeError:
            pass  # host_zeros warned already, or will: pageable staging, synchronous copies
    return torch.empty(shape, dtype=dtype)


def synchronize(device: str | torch.device) -> None:
    """Wait for the copies queued on `device`'s current stream (a no-op off CUDA, where every
    copy is done when it returns)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
