"""`python scripts/grammar_libs.py`: compare JSON-Schema grammar libraries on this CPU with
the default model's tokenizer — llguidance (our dependency), xgrammar and outlines-core (only if
installed; xgrammar depends on torch, so install it with `pip install --no-deps xgrammar
apache-tvm-ffi`). Per library: tokenizer set-up time, schema compile time, mask time per step
while walking a valid compact instance, and which of a set of schema constructs compile.

Coverage only says "compiles"; whether a construct is *enforced* is a separate question (xgrammar
and outlines-core accept keywords they then ignore; llguidance refuses them by name). Prints JSON.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

COVERAGE: dict[str, dict[str, Any]] = {
    "enum+const": {"type": "object", "properties": {"c": {"enum": ["r", "g"]}, "k": {"const": 3}}},
    "anyOf": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    "allOf": {"allOf": [{"type": "object"}, {"properties": {"b": {"type": "string"}}}]},
    "$ref/$defs": {
        "$defs": {"p": {"type": "integer"}},
        "type": "array",
        "items": {"$ref": "#/$defs/p"},
    },
    "recursive": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            }
        },
        "$ref": "#/$defs/n",
    },
    "pattern": {"type": "string", "pattern": "^[0-9]{5}$"},
    "format date-time": {"type": "string", "format": "date-time"},
    "min/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "min/maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    "numeric bounds": {"type": "integer", "minimum": 1, "maximum": 120},
    "patternProperties": {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}},
    "if/then/else": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
}
WALK_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}
WALK_INSTANCE = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry", "engines"]}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _walk(ids: list[int], step: Callable[[int], None]) -> dict[str, float]:
    times = []
    for t in ids:
        t0 = time.perf_counter()
        step(t)
        times.append(time.perf_counter() - t0)
    return {"mask_median_us": 1e6 * statistics.median(times), "mask_max_us": 1e6 * max(times)}


def bench_llguidance(tok_json: str, eos: int, ids: list[int]) -> dict[str, Any]:
    import llguidance as llg
    import numpy as np

    lt, tok_s = _timed(lambda: llg.LLTokenizer(tok_json, eos_token=eos))
    opts: Any = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

    def compile_(s: dict[str, Any]) -> Any:
        m = llg.LLMatcher(lt, llg.LLMatcher.grammar_from_json_schema(s, defaults=opts))
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    cov = {k: _try(functools.partial(compile_, s)) for k, s in COVERAGE.items()}
    m, comp_s = _timed(lambda: compile_(WALK_SCHEMA))
    buf = np.zeros((lt.vocab_size + 31) // 32, dtype=np.int32)

    def step(t: int) -> None:
        m.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)
        m.consume_token(t)

    return {"tokenizer_s": tok_s, "compile_ms": 1e3 * comp_s, **_walk(ids, step), "coverage": cov}


def bench_xgrammar(tok_json: str, eos: int, ids: list[int]) -> dict[str, Any]:
    import xgrammar as xgr
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok_json))
    info, tok_s = _timed(
        lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=[eos])
    )
    gc = xgr.GrammarCompiler(info, cache_enabled=False)
    kw: Any = {"any_whitespace": False, "separators": (",", ":")}

    def compile_(s: dict[str, Any]) -> Any:
        return gc.compile_json_schema(json.dumps(s), **kw)

    cov = {k: _try(functools.partial(compile_, s)) for k, s in COVERAGE.items()}
    cg, comp_s = _timed(lambda: gc.compile_json_schema(json.dumps(WALK_SCHEMA), **kw))
    m = xgr.GrammarMatcher(cg)
    bitmask = xgr.allocate_token_bitmask(1, len(hf))

    def step(t: int) -> None:
        m.fill_next_token_bitmask(bitmask)
        m.accept_token(t)

    return {"tokenizer_s": tok_s, "compile_ms": 1e3 * comp_s, **_walk(ids, step), "coverage": cov}


def bench_outlines_core(tok_json: str, eos: int, ids: list[int]) -> dict[str, Any]:
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    vocab: dict[bytes, list[int]] = {}
    for text, tid in json.loads(tok_json)["model"]["vocab"].items():
        if tid != eos:
            vocab.setdefault(_bytelevel_to_bytes(text), []).append(tid)
    voc, tok_s = _timed(lambda: oc.Vocabulary(eos, vocab))

    def regex_of(s: dict[str, Any]) -> Any:
        return build_regex_from_schema(json.dumps(s))

    cov = {k: _try(functools.partial(regex_of, s)) for k, s in COVERAGE.items()}
    regex = build_regex_from_schema(json.dumps(WALK_SCHEMA))
    index, comp_s = _timed(lambda: oc.Index(regex, voc))
    guide = oc.Guide(index)

    def step(t: int) -> None:
        guide.get_tokens()
        guide.advance(t)

    return {"tokenizer_s": tok_s, "compile_ms": 1e3 * comp_s, **_walk(ids, step), "coverage": cov}


def _bytelevel_to_bytes(text: str) -> bytes:
    """GPT-2 byte-level token text → its bytes."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {chr(b): b for b in printable}
    extra = [b for b in range(256) if b not in printable]
    table.update({chr(256 + i): b for i, b in enumerate(extra)})
    try:
        return bytes(table[ch] for ch in text)
    except KeyError:
        return text.encode()


def _try(fn: Callable[[], Any]) -> str:
    try:
        fn()
        return "ok"
    except Exception as exc:
        return f"error: {str(exc)[:120]}"


def main() -> int:
    from radixkv.model import default_model_path
    from radixkv.model.tokenizer import Tokenizer

    path = default_model_path()
    tok = Tokenizer.from_pretrained(path)
    tok_json = tok.backend.to_str()
    eos = tok.eos_token_ids[0]
    ids = tok.encode(json.dumps(WALK_INSTANCE, separators=(",", ":")))
    out: dict[str, Any] = {"vocab_size": tok.vocab_size, "walk_steps": len(ids)}
    for name, fn in [
        ("llguidance", bench_llguidance),
        ("xgrammar", bench_xgrammar),
        ("outlines-core", bench_outlines_core),
    ]:
        try:
            out[name] = fn(tok_json, eos, ids)
        except ImportError as exc:
            out[name] = {"skipped": f"not installed ({exc.name})"}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
