"""File-directory backend: one file per key, written atomically (temp file + fsync + rename).

A reader sees either no file or a whole one; a failed write (full disk, permissions) raises
StorageError and leaves no file under the key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from radixkv.storage.base import StorageError


class FileBackend:
    name = "file"

    def __init__(self, directory: str) -> None:
        self.root = Path(directory)
        self._root = str(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create storage directory {directory}: {exc}") from exc

    def _path(self, key: str) -> Path:
        return Path(self._file(key))

    def _file(self, key: str) -> str:
        """The key's file (a string: pathlib costs more than the read of a small value)."""
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"bad storage key {key!r}")
        return os.path.join(self._root, key[:2], key)

    def put(self, key: str, value: bytes) -> None:
        path = self._path(key)
        tmp = None
        try:
            path.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(value)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:  # ENOSPC, EACCES, EIO...: a failed write, nothing published
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise StorageError(f"file write failed: {exc}") from exc

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._file(key), "rb", buffering=0) as f:  # one read of the whole file
                return f.readall()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"file read failed: {exc}") from exc

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key in keys:
            value = self.get(key)
            out.append(value)
            if value is None:  # callers stop at the first miss
                break
        return out + [None] * (len(keys) - len(out))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def close(self) -> None:
        pass
