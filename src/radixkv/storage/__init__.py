"""radixkv.storage: L3 backends (a file directory, Redis/Valkey) behind one small interface.

No tree knowledge and no torch: backends store opaque values under string keys; `codec` frames a
KV page (header + checksum) and verifies it on the way back; `worker` runs every backend call on
background threads with timeouts, health tracking and backoff.
"""

from __future__ import annotations

from radixkv.storage.backends import make_backend
from radixkv.storage.base import StorageBackend, StorageError
from radixkv.storage.codec import CorruptPage, PageMeta, decode_page, encode_page

__all__ = [
    "CorruptPage",
    "PageMeta",
    "StorageBackend",
    "StorageError",
    "decode_page",
    "encode_page",
    "make_backend",
]
