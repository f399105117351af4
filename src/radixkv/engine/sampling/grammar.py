"""Structured output (JSON Schema, or a grammar in llguidance's Lark syntax) through llguidance:
compile once per schema, one matcher per choice, a token mask per step.

Grammar objects never leave the engine: requests carry the schema as JSON text
(`SamplingParams.json_schema`), and `GrammarCompiler.matcher()` turns it into a fresh matcher state.
Compiled grammars are cached by schema text (a small LRU), so repeated schemas (the common case:
one schema per application) pay compilation once; a matcher per choice is a cheap deep copy.

JSON is compact by default (`,` and `:` without spaces, no free-running whitespace), so a model
cannot burn its token budget on blanks; a schema may opt back in through llguidance's own
`x-guidance` options.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance as llg
import numpy as np
import torch

from radixkv.engine.types import RequestError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Applied before the schema's own "x-guidance" options.
COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # response_format json_object: any JSON object


class GrammarCompiler:
    """Schema text → validated llguidance grammar, cached; and per-choice matchers."""

    cache_size = 64

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int]) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = eos_ids
        self._tok: llg.LLTokenizer | None = None  # built on first use (~0.5 s)
        self._cache: OrderedDict[str, llg.LLMatcher] = OrderedDict()
        self.compiled = 0  # cache misses (schemas compiled)

    @property
    def tokenizer(self) -> llg.LLTokenizer:
        if self._tok is None:
            eos: int | list[int] = self._eos if len(self._eos) != 1 else self._eos[0]
            self._tok = llg.LLTokenizer(
                self._tokenizer_json, n_vocab=self.vocab_size, eos_token=eos
            )
        return self._tok

    def _compile(self, schema_text: str, lark: bool = False) -> llg.LLMatcher:
        if lark:
            try:
                return self._matcher(llg.LLMatcher.grammar_from_lark(schema_text), "grammar")
            except ValueError as exc:
                raise RequestError(f"invalid grammar: {exc}", param=_PARAM) from None
        try:
            schema = json.loads(schema_text)
        except json.JSONDecodeError as exc:
            raise RequestError(f"the JSON schema is not valid JSON: {exc}", param=_PARAM) from None
        if not isinstance(schema, dict):
            raise RequestError("the JSON schema must be an object", param=_PARAM)
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)
        except ValueError as exc:
            raise RequestError(f"invalid JSON schema: {exc}", param=_PARAM) from None
        return self._matcher(grammar, "JSON schema")

    def _matcher(self, grammar: str, what: str) -> llg.LLMatcher:
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            # llguidance names the construct, e.g. 'Unimplemented keys: ["uniqueItems"]'.
            raise RequestError(f"unsupported {what}: {matcher.get_error()}", param=_PARAM)
        self.compiled += 1
        return matcher

    def matcher(self, schema_text: str, lark: bool = False) -> Matcher:
        """A fresh matcher for one choice (`lark`: the text is a Lark grammar, not a JSON
        schema); raises RequestError(400) naming what is unsupported."""
        key = ("lark:" if lark else "schema:") + schema_text
        proto = self._cache.get(key)
        if proto is None:
            proto = self._compile(schema_text, lark)
            self._cache[key] = proto
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return Matcher(proto.deep_copy(), self.vocab_size)


_PARAM = "response_format"


class Matcher:
    """One choice's grammar state: mask the next token's logits, then advance by the sample."""

    def __init__(self, matcher: llg.LLMatcher, vocab_size: int) -> None:
        self._m = matcher
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self.vocab_size = vocab_size

    def allowed(self) -> torch.Tensor:
        """Bool [vocab_size]: the tokens the grammar allows next (EOS once it is complete)."""
        words = self._words
        self._m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if self._m.is_error():
            raise RuntimeError(f"grammar matcher failed: {self._m.get_error()}")
        # Bit i of little-endian word w is token 32*w + i.
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size]
        return torch.from_numpy(bits.astype(np.bool_))

    def apply(self, logits: torch.Tensor) -> None:
        """Set every disallowed token's logit to -inf (1-D f32 CPU logits, in place)."""
        allowed = self.allowed()
        n = min(logits.shape[0], allowed.shape[0])
        logits[:n].masked_fill_(~allowed[:n], float("-inf"))
        if logits.shape[0] > n:
            logits[n:] = float("-inf")

    def advance(self, token: int) -> None:
        # A token the mask allowed is always accepted; after EOS the matcher is stopped.
        self._m.consume_token(token)

    @property
    def done(self) -> bool:
        return bool(self._m.is_stopped())
