"""Attention over the slot-indexed KV pool, behind one backend protocol.

- `backend.py`: the `AttentionBackend` protocol (prepare once per step, write_kv, attend,
  forward; capture / replay, where CUDA graphs go) — the seam every attention layer goes
  through. A backend for another device is a new class behind it (and a line in
  `select_backend`); no model changes.
- `torch_backend.py`: `TorchAttention`, the CPU backend (the C++ decode and extend kernels,
  reading K/V in place through the batch's slot table) and the plain-torch fallback on any
  device (gather + SDPA).
- `meta.py`: the per-step metadata `TorchAttention` builds.
- `step.py`: `KVStep`, one forward's attention for every family (pools and metadata per KV
  component, where each attention layer reads and writes).
"""

from __future__ import annotations

import os

import torch

from radixkv.model.attention.backend import AttentionBackend, write_slots
from radixkv.model.attention.meta import (
    AttentionMetadata,
    DecodeGroup,
    DecodeView,
    ExtendItem,
    PackedExtends,
)
from radixkv.model.attention.step import AttnLayer, KVStep, kv_components, window_view
from radixkv.model.attention.torch_backend import TorchAttention

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "AttnLayer",
    "DecodeGroup",
    "DecodeView",
    "ExtendItem",
    "KVStep",
    "PackedExtends",
    "TorchAttention",
    "kv_components",
    "select_backend",
    "window_view",
    "write_slots",
]


def select_backend(device: str | torch.device) -> AttentionBackend:
    """The attention backend for `device`: on CUDA the Triton kernels (radixkv.model.triton)
    where triton imports; elsewhere torch (kernel from $RADIXKV_ATTENTION_KERNEL, "sdpa" by
    default, or "matmul"), on CPU with the C++ decode and extend kernels where they build
    ($RADIXKV_CPU_KERNELS=0 turns it off). $RADIXKV_ATTENTION_BACKEND=triton|torch forces one
    (triton on CPU runs under Triton's interpreter: TRITON_INTERPRET=1)."""
    dev = torch.device(device)
    forced = os.environ.get("RADIXKV_ATTENTION_BACKEND", "")
    if forced not in ("", "triton", "torch"):
        raise ValueError(f"RADIXKV_ATTENTION_BACKEND={forced!r}: triton or torch")
    if forced == "triton" or (not forced and dev.type == "cuda" and _triton_available()):
        from radixkv.model.triton.backend import TritonAttention

        return TritonAttention()
    decode = extend = None
    if dev.type == "cpu":
        from radixkv.model.kernels import decode_attention, extend_attention

        decode, extend = decode_attention(), extend_attention()
    return TorchAttention(os.environ.get("RADIXKV_ATTENTION_KERNEL", "sdpa"), decode, extend)


def _triton_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None
