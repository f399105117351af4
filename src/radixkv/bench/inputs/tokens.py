"""Where benchmark prompt tokens come from: a safe id range, or whole words of a real vocabulary.

Two modes:
- ids (default): prompts are sent as lists of token ids drawn uniformly from a pool of "safe"
  ids: a range of the vocabulary far from the special tokens at its ends (and, when a tokenizer
  is known, with every special/added token removed).
- text: ids are drawn only from tokens that are a space followed by a short lowercase ASCII word
  and that re-encode to exactly themselves. A byte-level BPE pre-tokenizer splits text at spaces
  and encodes each word independently, so the decoded concatenation of such tokens tokenizes
  back to the same ids: the text prompt has exactly the intended length and prefix structure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_ID_RANGE = (1000, 30000)  # inside the vocab of any modern model (Llama's is 32000)
_WORD = re.compile(r"^ [a-z]{2,10}$")


@dataclass
class TokenSource:
    """A pool of token ids to draw prompts from, plus (text mode) a decoder to text."""

    pool: np.ndarray  # int64 ids, all safe to send
    tokenizer: Any | None = None  # a `tokenizers.Tokenizer` when known
    text_mode: bool = False

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        if n <= 0:
            return []
        return [int(x) for x in self.pool[rng.integers(0, len(self.pool), size=n)]]

    def to_text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer")
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("encoding needs a tokenizer")
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_tokenizer(path: str | Path) -> Any:
    """A `tokenizers.Tokenizer` from a model directory or a tokenizer.json file."""
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return Tokenizer.from_file(str(p))


def _special_ids(tokenizer: Any) -> set[int]:
    return {int(tok_id) for tok_id in tokenizer.get_added_tokens_decoder()}


def id_source(
    tokenizer: Any | None = None, id_range: tuple[int, int] = DEFAULT_ID_RANGE
) -> TokenSource:
    """Ids mode: a contiguous range, minus special/added tokens, clipped to the vocab if known."""
    lo, hi = id_range
    if tokenizer is not None:
        hi = min(hi, int(tokenizer.get_vocab_size(with_added_tokens=True)))
    if not 0 <= lo < hi:
        raise ValueError(f"empty token id range [{lo}, {hi})")
    pool = np.arange(lo, hi, dtype=np.int64)
    if tokenizer is not None:
        special = _special_ids(tokenizer)
        pool = pool[~np.isin(pool, np.array(sorted(special), dtype=np.int64))]
    return TokenSource(pool=pool, tokenizer=tokenizer, text_mode=False)


def text_source(tokenizer: Any) -> TokenSource:
    """Text mode: only ' word' tokens that decode and re-encode to themselves (see module doc)."""
    special = _special_ids(tokenizer)
    good: list[int] = []
    for tok, tok_id in tokenizer.get_vocab(with_added_tokens=False).items():
        if tok_id in special or not tok.startswith("\u0120"):  # 'Ġ' marks a leading space
            continue
        text = tokenizer.decode([tok_id])
        if _WORD.match(text) and tokenizer.encode(text, add_special_tokens=False).ids == [tok_id]:
            good.append(tok_id)
    if len(good) < 16:
        raise ValueError("this tokenizer has too few plain word tokens for text prompts")
    return TokenSource(
        pool=np.array(sorted(good), dtype=np.int64), tokenizer=tokenizer, text_mode=True
    )
