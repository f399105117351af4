"""`TokenBuffer`: a request's token ids (prompt + generated) in one growable int64 array.

The prefix cache keys on the raw bytes of int64 token ids, so a numpy view is handed to it with no
conversion (one memcpy when it builds the key), where a Python list slice `tokens[:n]` costs an
O(n) copy plus a per-element pack (20-45 us for a 2k-token match). Slices are read-only views of
the live buffer: take `.copy()` or `.tolist()` to keep them past the next `append`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast, overload

import numpy as np
import numpy.typing as npt

IdArray = npt.NDArray[np.int64]


class TokenBuffer:
    """Append-only int64 token ids with amortised O(1) append and O(1) slicing."""

    __slots__ = ("_buf", "_n")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        arr = np.fromiter(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids
        self._n = int(arr.shape[0])
        self._buf: IdArray = np.empty(max(16, 2 * self._n), dtype=np.int64)
        self._buf[: self._n] = arr

    def append(self, tok: int) -> None:
        if self._n == self._buf.shape[0]:
            grown = np.empty(2 * self._n, dtype=np.int64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n] = tok
        self._n += 1

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...

    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        """An int, or for a slice a read-only int64 ndarray view (typed as Sequence[int], which
        is what the prefix cache's signatures accept; the cache keys it with one memcpy)."""
        view = self._buf[: self._n]
        if isinstance(i, slice):
            out: IdArray = view[i]
            out.flags.writeable = False
            return cast(Sequence[int], out)
        return int(view[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenBuffer):
            other = other.tolist()
        return isinstance(other, list | tuple) and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[int]:
        out: list[int] = self._buf[: self._n].tolist()
        return out

    def array(self, start: int = 0, stop: int | None = None) -> IdArray:
        """A read-only ndarray view of ids [start, stop) (valid until the next append)."""
        return cast(IdArray, self[start:stop])

    def __repr__(self) -> str:
        return f"TokenBuffer({self.tolist()!r})"
