"""Framing of one KV page in storage: a header, the payload, and a checksum.

    value = MAGIC | u32 header length | header (JSON) | payload | crc32(everything before)

The checksum is CRC-32 (zlib, which releases the GIL on large buffers): about 3x the speed of
the blake2b-16 it replaced, and what loading a page from storage spent most of its time on. It
guards against accidental corruption (torn or truncated writes, flipped bits, garbage): every
burst of up to 32 bits is caught, anything else with probability 1 - 2^-32, and a value must also
carry the exact magic, length and header to be accepted. Values of the older blake2b framing
(magic "RKVP1") fail the magic check: a miss, deleted by the reader, recomputed.

The header names the key it was written under, the model fingerprint, dtype, layers, page size,
page shape and payload length. `decode_page` accepts a value only if every field matches what the
reader expects and the checksum is right; anything else (truncated, flipped bits, another model's
page, a value moved to another key) raises CorruptPage, which callers treat as a miss.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from dataclasses import asdict, dataclass

MAGIC = b"RKVP2\0"
_DIGEST = 4  # CRC-32, little-endian


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


_SLOT = json.dumps("\0key\0")  # stands for the key in a cached header template


@functools.lru_cache(maxsize=64)
def _template(meta: PageMeta) -> tuple[str, str]:
    """The header's JSON before and after the key's (fields sorted, as json.dumps sorts)."""
    pre, post = json.dumps({"key": "\0key\0", **asdict(meta)}, sort_keys=True).split(_SLOT)
    return pre, post


def _header(key: str, meta: PageMeta) -> bytes:
    """json.dumps({"key": key, **asdict(meta)}, sort_keys=True), from a per-meta template."""
    pre, post = _template(meta)
    return (pre + json.dumps(key) + post).encode()


def encode_page(key: str, meta: PageMeta, payload: bytes | memoryview) -> bytes:
    """The stored value of `payload` (bytes-like; copied once, into the value)."""
    if len(payload) != meta.length:
        raise ValueError(f"payload is {len(payload)} bytes, meta says {meta.length}")
    header = _header(key, meta)
    head = MAGIC + struct.pack("<I", len(header)) + header
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((head, payload, struct.pack("<I", crc)))


def decode_page(key: str, meta: PageMeta, value: bytes | memoryview) -> memoryview:
    """The payload of `value`, verified against `key` and `meta`, as a view into `value` (no
    copy: it keeps `value` alive); raises CorruptPage."""
    fixed = len(MAGIC) + 4
    view = memoryview(value).cast("B")
    if len(view) < fixed + _DIGEST or view[: len(MAGIC)] != MAGIC:
        raise CorruptPage("bad magic or truncated value")
    body = view[:-_DIGEST]
    (digest,) = struct.unpack_from("<I", view, len(body))
    if zlib.crc32(body) != digest:
        raise CorruptPage("checksum mismatch")
    (hlen,) = struct.unpack_from("<I", body, len(MAGIC))
    header = body[fixed : fixed + hlen]
    if header != _header(key, meta):  # the exact bytes the writer of this key wrote
        raise CorruptPage(_mismatch(key, meta, bytes(header)))
    payload = body[fixed + hlen :]
    if len(payload) != meta.length:
        raise CorruptPage("payload length mismatch")
    return payload


def _mismatch(key: str, meta: PageMeta, header: bytes) -> str:
    """What is wrong with a header that is not the expected one (the slow path)."""
    try:
        got = json.loads(header)
    except ValueError:
        return "unreadable header"
    want = {"key": key, **asdict(meta)}
    want["shape"] = list(meta.shape)
    bad = sorted(k for k in want if not isinstance(got, dict) or got.get(k) != want[k])
    return f"header mismatch on {bad or 'its encoding'}"
