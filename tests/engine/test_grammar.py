"""The structured-output layer (llguidance) on the default model's tokenizer: compact JSON,
unsupported constructs named, the compiled-grammar cache, and the bench's per-step walk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from radixkv.bench.grammar import SCHEMAS, bench_schema, format_table
from radixkv.engine.sampling.grammar import GrammarCompiler
from radixkv.engine.types import RequestError
from radixkv.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def compiler(tok: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tok.backend.to_str(), 49152, list(tok.eos_token_ids))


def _walk(compiler: GrammarCompiler, tok: Tokenizer, schema: Any, text: str) -> bool:
    """True when every token of `text` (then EOS) is allowed by the grammar."""
    m = compiler.matcher(json.dumps(schema))
    for t in [*tok.encode(text), tok.eos_token_ids[0]]:
        if not bool(m.allowed()[t]):
            return False
        m.advance(t)
    return m.done


def test_compact_by_default(compiler: GrammarCompiler, tok: Tokenizer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert _walk(compiler, tok, schema, '{"a":1}')
    assert not _walk(compiler, tok, schema, '{"a": 1}')
    assert not _walk(compiler, tok, schema, '{ "a":1}')


def test_unsupported_construct_is_named(compiler: GrammarCompiler) -> None:
    with pytest.raises(RequestError) as exc:
        compiler.matcher(json.dumps({"type": "array", "uniqueItems": True}))
    assert "uniqueItems" in str(exc.value) and exc.value.code == 400
    with pytest.raises(RequestError, match="not valid JSON"):
        compiler.matcher("{nope")


def test_cache_compiles_once_and_matchers_are_independent(
    compiler: GrammarCompiler, tok: Tokenizer
) -> None:
    text = json.dumps({"enum": ["yes", "no"]})
    before = compiler.compiled
    a, b = compiler.matcher(text), compiler.matcher(text)
    assert compiler.compiled == before + 1
    a.advance(tok.encode('"')[0])
    assert not torch.equal(a.allowed(), b.allowed())  # separate states


def test_mask_applies_minus_inf(compiler: GrammarCompiler) -> None:
    m = compiler.matcher(json.dumps({"type": "boolean"}))
    row = torch.zeros(49152 + 64)  # a padded model vocabulary
    m.apply(row)
    assert torch.isinf(row[49152:]).all() and 0 < int(torch.isfinite(row).sum()) < 100


def test_bench_walks_every_schema(compiler: GrammarCompiler, tok: Tokenizer) -> None:
    results = {n: bench_schema(compiler, tok, s, i) for n, (s, i) in SCHEMAS.items()}
    assert all(r["steps"] > 5 for r in results.values())
    assert "flat object" in format_table(results)
