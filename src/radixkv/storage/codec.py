"""Framing of one KV page in storage: a header, the payload, and a checksum.

    value = MAGIC | u32 header length | header (JSON) | payload | blake2b-16(everything before)

The header names the key it was written under, the model fingerprint, dtype, layers, page size,
page shape and payload length. `decode_page` accepts a value only if every field matches what the
reader expects and the checksum is right; anything else (truncated, flipped bits, another model's
page, a value moved to another key) raises CorruptPage, which callers treat as a miss.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass

MAGIC = b"RKVP1\0"
_DIGEST = 16


class CorruptPage(ValueError):
    """A stored value failed verification; it must never be used as KV."""


@dataclass(frozen=True)
class PageMeta:
    """What a reader expects of every page it restores."""

    fingerprint: str
    dtype: str
    num_layers: int
    page_size: int
    shape: tuple[int, ...]
    length: int  # payload bytes


def encode_page(key: str, meta: PageMeta, payload: bytes) -> bytes:
    if len(payload) != meta.length:
        raise ValueError(f"payload is {len(payload)} bytes, meta says {meta.length}")
    header = json.dumps({"key": key, **asdict(meta)}, sort_keys=True).encode()
    body = MAGIC + struct.pack("<I", len(header)) + header + payload
    return body + hashlib.blake2b(body, digest_size=_DIGEST).digest()


def decode_page(key: str, meta: PageMeta, value: bytes) -> bytes:
    """The payload of `value`, verified against `key` and `meta`; raises CorruptPage."""
    fixed = len(MAGIC) + 4
    if len(value) < fixed + _DIGEST or not value.startswith(MAGIC):
        raise CorruptPage("bad magic or truncated value")
    body, digest = value[:-_DIGEST], value[-_DIGEST:]
    if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
        raise CorruptPage("checksum mismatch")
    (hlen,) = struct.unpack_from("<I", body, len(MAGIC))
    try:
        header = json.loads(body[fixed : fixed + hlen])
    except ValueError:
        raise CorruptPage("unreadable header") from None
    want = {"key": key, **asdict(meta)}
    want["shape"] = list(meta.shape)
    if header != want:
        bad = sorted(k for k in want if header.get(k) != want[k])
        raise CorruptPage(f"header mismatch on {bad}")
    payload = body[fixed + hlen :]
    if len(payload) != meta.length:
        raise CorruptPage("payload length mismatch")
    return payload
