"""OpenAI logprobs objects from the engine's per-token (logprob, top-k) data.

Completions (`logprobs=k`): {"tokens", "token_logprobs", "top_logprobs", "text_offset"} with
parallel lists; `text_offset` is each token's character offset in the choice's text (after the
echoed prompt, if any). Chat (`logprobs=true`, `top_logprobs=k`): {"content": [{"token",
"logprob", "bytes", "top_logprobs": [...]}], "refusal": None}. A token's text is its own decoding
(special tokens included); a token that is part of a multi-byte character decodes to U+FFFD.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixkv.engine.types import TokenLogprobs

TokenText = Callable[[int], str]


class LogprobsBuilder:
    """Accumulates one choice's logprobs; `add()` returns the piece for the new tokens."""

    def __init__(self, kind: str, token_text: TokenText, offset: int = 0) -> None:
        self.kind = kind
        self.token_text = token_text
        self.offset = offset  # next token's character offset (completions)
        self.pieces: list[dict[str, Any]] = []

    def add(self, token_ids: Sequence[int], lps: Sequence[TokenLogprobs]) -> dict[str, Any]:
        piece = self._chat(token_ids, lps) if self.kind == "chat" else self._cmpl(token_ids, lps)
        self.pieces.append(piece)
        return piece

    def _cmpl(self, token_ids: Sequence[int], lps: Sequence[TokenLogprobs]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for tid, (lp, top) in zip(token_ids, lps, strict=True):
            text = self.token_text(tid)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({self.token_text(t): v for t, v in top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _entry(self, tid: int, lp: float) -> dict[str, Any]:
        text = self.token_text(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    def _chat(self, token_ids: Sequence[int], lps: Sequence[TokenLogprobs]) -> dict[str, Any]:
        content = []
        for tid, (lp, top) in zip(token_ids, lps, strict=True):
            entry = self._entry(tid, lp)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in top]
            content.append(entry)
        return {"content": content, "refusal": None}

    def total(self) -> dict[str, Any]:
        """Everything added so far as one logprobs object."""
        if self.kind == "chat":
            return {"content": [c for p in self.pieces for c in p["content"]], "refusal": None}
        keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        return {k: [x for p in self.pieces for x in p[k]] for k in keys}
