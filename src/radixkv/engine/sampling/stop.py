"""Incremental text with stop strings: detect a stop string as tokens stream in, truncate the text
at it, and hold back any tail that could still become the start of a stop string."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class IncrementalDecoder(Protocol):
    """What `Tokenizer.make_decoder()` returns: push(id) → newly stable text; flush() → rest."""

    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class TextStream:
    """The text of one request's output, with stop-string handling.

    Invariants: `text` never contains a complete stop string (it is cut at the first one, which
    ends the stream); `emitted <= len(text)`; text handed out by `take` is never taken back.
    """

    def __init__(self, decoder: IncrementalDecoder, stop: Sequence[str] = ()) -> None:
        self._decoder = decoder
        self._stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def push(self, token_id: int) -> bool:
        """Append one token's text; True when a stop string just completed (text cut before it)."""
        if self.stopped:
            return True
        return self._append(self._decoder.push(token_id))

    def flush(self) -> bool:
        """Append whatever the decoder still holds (call once, at the end)."""
        if self.stopped:
            return True
        return self._append(self._decoder.flush())

    def _append(self, piece: str) -> bool:
        if not piece:
            return False
        # A stop string that completes now must end inside `piece`, so it starts no earlier than
        # max_stop - 1 characters before the old end.
        search_from = max(0, len(self.text) - self._max_stop + 1)
        self.text += piece
        if not self._stop:
            return False
        cut = -1
        for s in self._stop:
            idx = self.text.find(s, search_from)
            if idx != -1 and (cut == -1 or idx < cut):
                cut = idx
        if cut == -1:
            return False
        self.text = self.text[:cut]
        self.emitted = min(self.emitted, cut)
        self.stopped = True
        return True

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def take(self, final: bool) -> str:
        """New text that is safe to show now (all remaining text when `final`)."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted : end]
        self.emitted = end
        return out
