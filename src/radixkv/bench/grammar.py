"""`radixkv bench grammar` / `python -m radixkv.bench.grammar`: what structured output costs per
decode step, measured on the engine's own path (radixkv.engine.sampling.grammar).

For each schema, a valid compact JSON instance is tokenized with the model's tokenizer and walked
token by token through a matcher: per step, the llguidance mask (`mask`), unpacking it and
masking one f32 logits row of the model's vocabulary (`apply`), and advancing by the token
(`advance`). For scale, `sample` is one plain temperature sampling of that row (softmax +
multinomial), which every sampled step pays anyway. Also: the first compile of each schema and a
cache hit (a deep copy). Prints a table; `--json PATH` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "flat object": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "email": {"type": "string"},
            },
            "required": ["name", "age", "email"],
        },
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"},
    ),
    "enums + array": (
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "sizes": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "ok": {"type": "boolean"},
            },
            "required": ["color", "sizes", "ok"],
            "additionalProperties": False,
        },
        {"color": "green", "sizes": [3, 14, 15, 92, 65], "ok": True},
    ),
    "nested $ref": (
        {
            "$defs": {
                "item": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "title": {"type": "string"}},
                    "required": ["id", "title"],
                }
            },
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
            "required": ["items"],
        },
        {"items": [{"id": 1, "title": "radix trees"}, {"id": 2, "title": "paged attention"}]},
    ),
    "json_object": ({"type": "object"}, {"any": ["thing", 1, {"goes": None}]}),
}


def _us(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "median_us": 1e6 * statistics.median(xs),
        "p99_us": 1e6 * xs[min(len(xs) - 1, int(0.99 * len(xs)))],
        "mean_us": 1e6 * statistics.fmean(xs),
    }


def bench_schema(compiler: Any, tokenizer: Any, schema: dict[str, Any], instance: Any) -> dict:
    import torch

    from radixkv.engine.sampling.sampler import make_generator

    text = json.dumps(schema)
    t0 = time.perf_counter()
    matcher = compiler.matcher(text)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    matcher = compiler.matcher(text)
    hit_s = time.perf_counter() - t0
    ids = tokenizer.encode(json.dumps(instance, separators=(",", ":")))
    row = torch.randn(compiler.vocab_size, generator=make_generator(0))
    gen = make_generator(1)
    mask_t, apply_t, advance_t, sample_t = [], [], [], []
    for tok in ids:
        t0 = time.perf_counter()
        allowed = matcher.allowed()
        t1 = time.perf_counter()
        masked = row.clone()
        masked[: allowed.shape[0]].masked_fill_(~allowed, float("-inf"))
        t2 = time.perf_counter()
        if not bool(allowed[tok]):
            raise RuntimeError(f"the grammar refused token {tok} of a valid instance")
        matcher.advance(tok)
        t3 = time.perf_counter()
        torch.multinomial(torch.softmax(row / 0.7, dim=-1), 1, generator=gen)
        t4 = time.perf_counter()
        mask_t.append(t1 - t0)
        apply_t.append(t2 - t1)
        advance_t.append(t3 - t2)
        sample_t.append(t4 - t3)
    return {
        "steps": len(ids),
        "compile_ms": 1e3 * compile_s,
        "cache_hit_ms": 1e3 * hit_s,
        "mask": _us(mask_t),
        "apply": _us(apply_t),
        "advance": _us(advance_t),
        "sample": _us(sample_t),
    }


def format_table(results: dict[str, dict]) -> str:
    head = (
        f"{'schema':<14} {'steps':>5} {'compile ms':>10} {'hit ms':>7} {'mask µs':>8} "
        f"{'apply µs':>8} {'advance µs':>10} {'total µs':>8} {'sample µs':>9} {'ratio':>6}"
    )
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        total = r["mask"]["median_us"] + r["apply"]["median_us"] + r["advance"]["median_us"]
        lines.append(
            f"{name:<14} {r['steps']:>5} {r['compile_ms']:>10.2f} {r['cache_hit_ms']:>7.3f} "
            f"{r['mask']['median_us']:>8.1f} {r['apply']['median_us']:>8.1f} "
            f"{r['advance']['median_us']:>10.1f} {total:>8.1f} "
            f"{r['sample']['median_us']:>9.1f} {total / r['sample']['median_us']:>6.2f}"
        )
    lines.append("(medians per decode step; ratio = grammar total / one plain sampling)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from radixkv.engine.sampling.grammar import GrammarCompiler
    from radixkv.model import default_model_path
    from radixkv.model.tokenizer import Tokenizer

    torch.set_num_threads(1)
    path = args.model or default_model_path()
    tok = Tokenizer.from_pretrained(path)
    with open(f"{path}/config.json") as f:
        vocab = int(json.load(f)["vocab_size"])
    compiler = GrammarCompiler(tok.backend.to_str(), vocab, list(tok.eos_token_ids))
    t0 = time.perf_counter()
    _ = compiler.tokenizer
    tok_s = time.perf_counter() - t0
    results = {name: bench_schema(compiler, tok, s, inst) for name, (s, inst) in SCHEMAS.items()}
    print(f"vocab {vocab}; llguidance tokenizer built once in {tok_s:.2f} s")
    print(format_table(results))
    if args.json_path:
        import llguidance

        payload = {
            "vocab_size": vocab,
            "library": f"llguidance {getattr(llguidance, '__version__', '')}".strip(),
            "tokenizer_build_s": tok_s,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "results": results,
        }
        with open(args.json_path, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.json_path}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint dir (default: embedded SmolLM2)")
    p.add_argument("--json", dest="json_path", default=None, help="write results as JSON")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("grammar", help="structured-output mask cost per decode step")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixkv.bench.grammar", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
