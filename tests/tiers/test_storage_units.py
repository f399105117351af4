"""Storage framing, the file backend's atomic writes, and the worker's health handling."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path

import pytest

from radixkv.storage import CorruptPage, PageMeta, StorageError, decode_page, encode_page
from radixkv.storage.file import FileBackend
from radixkv.storage.worker import FetchDone, StorageWorker, WriteDone

META = PageMeta("fp-a", "float32", 2, 4, (2, 2, 4, 2, 8), 8)


def test_codec_roundtrip_and_every_corruption_is_detected() -> None:
    value = encode_page("k1", META, b"12345678")
    assert decode_page("k1", META, value) == b"12345678"
    bad = {
        "truncated": value[:-5],
        "empty": b"",
        "flipped": value[:30] + bytes([value[30] ^ 1]) + value[31:],
        "payload flipped": value[:-20] + bytes([value[-20] ^ 0x40]) + value[-19:],
    }
    for name, v in bad.items():
        with pytest.raises(CorruptPage):
            decode_page("k1", META, v)
        assert name
    with pytest.raises(CorruptPage):  # another model's page (valid checksum, foreign header)
        decode_page(
            "k1",
            META,
            encode_page("k1", PageMeta("fp-b", *list(vars(META).values())[1:]), b"12345678"),
        )
    with pytest.raises(CorruptPage):  # a valid value moved under another key
        decode_page("k2", META, value)


def test_codec_checksum_catches_every_single_flip_and_the_old_framing() -> None:
    """The CRC-32 framing: one flipped bit anywhere (magic, header, payload, checksum) is a
    CorruptPage, a value of the older blake2b framing ("RKVP1") too, and the payload comes back
    as a view into the value (the fetch path copies it once, into the host pool)."""
    meta = PageMeta("fp-a", "bfloat16", 2, 4, (64,), 4096)
    payload = bytes(range(256)) * 16
    value = encode_page("k1", meta, memoryview(payload))
    got = decode_page("k1", meta, value)
    assert isinstance(got, memoryview) and got == payload and got.obj is value
    for pos in range(0, len(value), 97):
        for bit in (0x01, 0x80):
            flipped = bytearray(value)
            flipped[pos] ^= bit
            with pytest.raises(CorruptPage):
                decode_page("k1", meta, bytes(flipped))
    old = b"RKVP1\0" + value[6:-4]
    old += hashlib.blake2b(old, digest_size=16).digest()
    with pytest.raises(CorruptPage, match="magic"):
        decode_page("k1", meta, old)


def test_file_backend_atomic_and_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fb = FileBackend(str(tmp_path / "l3"))
    fb.put("abcd", b"x" * 100)
    assert fb.get("abcd") == b"x" * 100 and fb.get("zzzz") is None

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match="space"):
        fb.put("abce", b"y" * 100)
    assert fb.get("abce") is None  # nothing published under the key
    assert fb.get("abcd") == b"x" * 100
    leftovers = [p for p in (tmp_path / "l3").rglob("*") if p.name.startswith(".tmp")]
    assert leftovers == []


class FlakyBackend:
    name = "flaky"

    def __init__(self) -> None:
        self.down = False
        self.data: dict[str, bytes] = {}
        self.calls = 0

    def put(self, key: str, value: bytes) -> None:
        self.calls += 1
        if self.down:
            raise StorageError("down")
        self.data[key] = value

    def get(self, key: str) -> bytes | None:
        self.calls += 1
        if self.down:
            raise StorageError("down")
        return self.data.get(key)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def close(self) -> None:
        pass


def _wait(worker: StorageWorker, n: int) -> list[WriteDone | FetchDone]:
    out: list[WriteDone | FetchDone] = []
    while len(out) < n:
        got = worker.poll(timeout=5.0)
        assert got, "storage worker produced no result"
        out.extend(got)
    return out


def test_worker_marks_unhealthy_backs_off_and_recovers() -> None:
    be = FlakyBackend()
    w = StorageWorker(be, META, retry_base_s=0.2, retry_max_s=0.2)
    try:
        assert w.submit_write(1, "k1", lambda: b"12345678")
        assert _wait(w, 1) == [WriteDone(1, True)]
        be.down = True
        assert w.submit_fetch(2, ["k1"])
        assert _wait(w, 1) == [FetchDone(2, [])]
        assert not w.healthy and w.counters.unhealthy_events == 1
        calls = be.calls
        assert not w.submit_fetch(3, ["k1"])  # in backoff: refused without a backend call
        assert be.calls == calls
        be.down = False
        time.sleep(0.25)
        assert w.submit_fetch(4, ["k1", "k2"])
        assert _wait(w, 1) == [FetchDone(4, [b"12345678"])]  # leading run; k2 is a miss
        assert w.healthy
        be.data["k1"] = be.data["k1"][:-1]  # truncated value: a miss, and deleted
        assert w.submit_fetch(5, ["k1"])
        assert _wait(w, 1) == [FetchDone(5, [])]
        assert "k1" not in be.data and w.counters.corrupt == 1
    finally:
        w.close()


def test_worker_fetches_extra_keys_each_alone_with_their_own_headers(tmp_path: Path) -> None:
    """A hybrid model's values: "<hash>-swa" keys carry their own header; each extra key is
    fetched alone (misses and bad values skip it only) and only if the leading run reaches it."""
    swa = PageMeta("fp-a", "float32", 3, 4, (3, 2, 4, 2, 8), 4)
    w = StorageWorker(FileBackend(str(tmp_path / "l3")), META)
    w.metas["swa"] = swa
    try:
        for key, payload in (("a1", b"12345678"), ("a2", b"87654321")):
            assert w.submit_write(key, key, lambda p=payload: p)
        for key in ("a1-swa", "a3-swa", "a4-swa"):
            assert w.submit_write(key, key, lambda: b"wxyz")
        assert all(r == WriteDone(r.token, True) for r in _wait(w, 5))
        w.backend.put("a4-swa", encode_page("a4-swa", META, b"12345678"))  # wrong header
        extra = [(0, "a1-swa"), (1, "a2-swa"), (2, "a3-swa"), (2, "a4-swa"), (3, "a3-swa")]
        assert w.submit_fetch(1, ["a1", "a2", "a9"], extra)
        (done,) = _wait(w, 1)
        assert isinstance(done, FetchDone)
        assert done.payloads == [b"12345678", b"87654321"]
        # a2-swa is absent, a4-swa fails verification, the last one needs a run of 3 pages.
        assert done.extra == {"a1-swa": b"wxyz", "a3-swa": b"wxyz"}
        assert w.counters.corrupt == 1
        assert w.submit_fetch(2, [], [(0, "a1-swa"), (0, "a1-bogus")])  # unknown suffix
        (done,) = _wait(w, 1)
        assert isinstance(done, FetchDone) and done.extra == {"a1-swa": b"wxyz"}
    finally:
        w.close()
