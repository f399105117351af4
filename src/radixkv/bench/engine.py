"""`radixkv bench engine`: the in-process engine (no HTTP) on prefix-sharing workloads, cache off /
radix / blockhash side by side, plus the 2,048-token shared-prefix TTFT target.

For each workload (shared-prefix, multi-turn, tree-of-thought) and cache mode: mean/p50/p99 TTFT,
output tok/s, effective input tok/s (all prompt tokens ÷ wall time), token hit rate, and the
workload's ideal hit rate. One model load is shared by all modes; each mode gets a fresh engine.
Defaults are scaled for a small CPU; flags scale them up.

Target: with a P-token shared prefix and S-token suffixes, the TTFT of a request that hits the
prefix vs the TTFT of a request of only the S new tokens (goal: within 1.2x).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

MODES = ("off", "radix", "blockhash")
WORKLOADS = ("shared-prefix", "multi-turn", "tree-of-thought")


def register(subparsers: Any) -> None:
    from radixkv.engine.args import add_engine_args

    p = subparsers.add_parser(
        "engine", help="in-process engine benchmark: cache off / radix / blockhash"
    )
    add_engine_args(p)
    w = p.add_argument_group("workloads")
    w.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma list of " + "|".join(WORKLOADS)
    )
    w.add_argument("--modes", default=",".join(MODES), help="comma list of " + "|".join(MODES))
    w.add_argument("--concurrency", type=int, default=4, help="max requests in flight")
    w.add_argument("--groups", type=int, default=2, help="shared-prefix: groups")
    w.add_argument("--prompts-per-group", type=int, default=4)
    w.add_argument("--system-len", type=int, default=512, help="shared-prefix: S tokens")
    w.add_argument("--question-len", type=int, default=32, help="Q tokens (all workloads)")
    w.add_argument("--output-len", type=int, default=8, help="output tokens per request")
    w.add_argument("--conversations", type=int, default=2, help="multi-turn: conversations")
    w.add_argument("--turns", type=int, default=3, help="multi-turn: turns each")
    w.add_argument("--trees", type=int, default=1, help="tree-of-thought: trees")
    w.add_argument("--root-len", type=int, default=512, help="tree-of-thought: root prompt")
    w.add_argument("--branches", type=int, default=2)
    w.add_argument("--depth", type=int, default=2)
    t = p.add_argument_group("TTFT target")
    t.add_argument("--target-prefix", type=int, default=2048, help="shared prefix tokens")
    t.add_argument("--target-suffix", type=int, default=64, help="new tokens per request")
    t.add_argument("--target-repeats", type=int, default=5)
    t.add_argument("--skip-target", action="store_true", help="skip the TTFT target measurement")
    t.add_argument("--skip-workloads", action="store_true", help="only the TTFT target")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default). On a busy shared CPU, 1 avoids "
        "thread contention that can slow every step several-fold",
    )
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.set_defaults(func=main)


def _workloads(args: argparse.Namespace, vocab: int) -> list[Any]:
    from radixkv.bench.inputs import workloads as wl
    from radixkv.bench.inputs.tokens import id_source

    lo = min(1000, vocab // 4)
    tokens = id_source(None, (lo, min(30000, vocab)))
    made = {
        "shared-prefix": lambda: wl.shared_prefix(
            tokens,
            num_groups=args.groups,
            prompts_per_group=args.prompts_per_group,
            system_len=args.system_len,
            question_len=args.question_len,
            output_len=args.output_len,
            seed=args.seed,
        ),
        "multi-turn": lambda: wl.multi_turn(
            tokens,
            num_conversations=args.conversations,
            num_turns=args.turns,
            question_len=args.question_len,
            output_len=args.output_len,
            seed=args.seed,
        ),
        "tree-of-thought": lambda: wl.tree_of_thought(
            tokens,
            num_trees=args.trees,
            root_len=args.root_len,
            branches=args.branches,
            depth=args.depth,
            question_len=args.question_len,
            output_len=args.output_len,
            seed=args.seed,
        ),
    }
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    for n in names:
        if n not in made:
            raise SystemExit(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
    return [made[n]() for n in names]


def _mode_config(base: Any, mode: str) -> Any:
    if mode == "off":
        return base.override(disable_radix_cache=True)
    if mode in ("radix", "blockhash"):
        return base.override(disable_radix_cache=False, cache=mode)
    raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def _warmup(engine: Any) -> None:
    from radixkv.engine.types import SamplingParams

    engine.generate([[engine.vocab_size // 2] * 16], SamplingParams(max_tokens=2, temperature=0))
    engine.flush_cache()


def run_workloads(lm: Any, base: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixkv.bench.engine_driver import drive
    from radixkv.engine.engine import Engine

    rows: list[dict[str, Any]] = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for workload in _workloads(args, int(lm.config.vocab_size)):
        ideal = workload.ideal_hit_rate()
        for mode in modes:
            engine = Engine(lm, config=_mode_config(base, mode))
            _warmup(engine)
            result = drive(engine, workload.requests, args.concurrency)
            engine.check_memory()
            row = {"workload": workload.name, "cache": mode, **result.summary(ideal)}
            row["params"] = workload.params
            rows.append(row)
            print(_format_rows([row], header=not rows[:-1]), flush=True)
    return rows


def _model_forward_s(lm: Any, engine: Any, prefix: int, suffix: int, repeats: int) -> float:
    """Median time of the bare model forward that extends a `prefix`-token context by `suffix`
    tokens (no scheduler, no cache): the compute floor of a prefix hit. A hybrid model (SWA or
    state layers) gets fresh pools of every kind it declares, as the engine would."""
    import torch

    from radixkv.engine.batch import ForwardBatch
    from radixkv.engine.setup import hybrid_spec
    from radixkv.memory.hybrid import FULL, STATE, SWA
    from radixkv.memory.pool import KVPool

    n = prefix + suffix
    dtype, dev = engine.pool.config.dtype, engine.pool.config.device
    slots = torch.arange(n, dtype=torch.int64, device=dev)
    ids = torch.randint(0, int(lm.config.vocab_size), (suffix,), device=dev)
    spec = hybrid_spec(lm.config)
    if spec is None:
        pool: Any = KVPool(lm.config.pool_config(n, dtype, dev))
        batch = ForwardBatch.from_contexts(ids, [slots], [suffix])
    else:
        pool = spec.make_pools({FULL: n, SWA: n, STATE: 1}, dtype, dev)
        batch = ForwardBatch.from_contexts(
            ids,
            [slots],
            [suffix],
            kind_slots={
                **({SWA: [slots]} if SWA in spec else {}),
                **({STATE: [0]} if STATE in spec else {}),
            },
        )
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            lm.model(batch, pool)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prefix_target(lm: Any, base: Any, prefix: int, suffix: int, repeats: int) -> dict[str, Any]:
    """TTFT of a prefix hit (P cached + S new tokens) vs TTFT of S tokens alone, interleaved."""
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import RequestOptions, SamplingParams

    cfg = base.override(
        disable_radix_cache=False,
        chunked_prefill_size=max(base.scheduler.chunked_prefill_size, prefix + suffix),
        num_slots=max(base.cache.num_slots or 0, prefix + (repeats + 2) * (suffix + 2) * 2 + 64),
    )
    engine = Engine(lm, config=cfg)
    _warmup(engine)
    rng = random.Random(base.scheduler.seed)
    vocab = int(lm.config.vocab_size)

    def draw(n: int) -> list[int]:
        return [rng.randrange(min(1000, vocab // 4), min(30000, vocab)) for _ in range(n)]

    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    shared = draw(prefix)
    cold = engine.generate([shared + draw(suffix)], sp)[0]
    hits: list[float] = []
    alone: list[float] = []
    cached: list[int] = []
    for i in range(repeats):
        hit = engine.generate([shared + draw(suffix)], sp)[0]
        # Another namespace: the S-token baseline can never hit anything.
        base_out = engine.generate([draw(suffix)], sp, RequestOptions(cache_salt=f"b{i}"))[0]
        assert hit.ttft_s is not None and base_out.ttft_s is not None
        hits.append(hit.ttft_s)
        alone.append(base_out.ttft_s)
        cached.append(hit.cached_tokens)
    engine.check_memory()
    med_hit, med_alone = statistics.median(hits), statistics.median(alone)
    model_hit = _model_forward_s(lm, engine, prefix, suffix, repeats)
    model_alone = _model_forward_s(lm, engine, 0, suffix, repeats)
    return {
        # The bare model's own ratio: attention over the cached context is real compute.
        "model_extend_after_prefix_s": model_hit,
        "model_prefill_suffix_s": model_alone,
        "model_ratio": model_hit / model_alone,
        # What the engine adds on a hit (scheduling, match/lock, batch building, sampling).
        "engine_overhead_on_hit": med_hit / model_hit,
        "prefix_tokens": prefix,
        "suffix_tokens": suffix,
        "repeats": repeats,
        "cold_ttft_s": cold.ttft_s,
        "hit_cached_tokens": cached,
        "hit_ttft_s": hits,
        "suffix_only_ttft_s": alone,
        "hit_ttft_median_s": med_hit,
        "suffix_only_ttft_median_s": med_alone,
        "ratio_median": med_hit / med_alone,
        "ratio_min": min(hits) / min(alone),
        "target_ratio": 1.2,
        "met": med_hit / med_alone <= 1.2,
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:,.0f}"


def _format_rows(rows: list[dict[str, Any]], header: bool = True) -> str:
    cols = [
        ("workload", 16), ("cache", 9), ("reqs", 5), ("ttft mean ms", 13), ("p50 ms", 9),
        ("p99 ms", 9), ("out tok/s", 10), ("eff in tok/s", 13), ("hit rate", 9), ("ideal", 7),
    ]  # fmt: skip
    lines = []
    if header:
        lines.append(" ".join(name.rjust(w) for name, w in cols))
    for r in rows:
        ideal = r["ideal_hit_rate"]
        vals = [
            r["workload"], r["cache"], str(r["requests"]), _ms(r["ttft_mean_s"]),
            _ms(r["ttft_p50_s"]), _ms(r["ttft_p99_s"]), f"{r['output_tok_per_s']:.1f}",
            f"{r['effective_input_tok_per_s']:.1f}", f"{100 * r['token_hit_rate']:.1f}%",
            "-" if ideal is None else f"{100 * ideal:.1f}%",
        ]  # fmt: skip
        lines.append(" ".join(v.rjust(w) for v, (_, w) in zip(vals, cols, strict=True)))
    return "\n".join(lines)


def _format_target(t: dict[str, Any]) -> str:
    return (
        f"TTFT target: {t['prefix_tokens']}-token shared prefix + {t['suffix_tokens']} new tokens\n"
        f"  hit TTFT median {_ms(t['hit_ttft_median_s'])} ms (cached {t['hit_cached_tokens']})\n"
        f"  {t['suffix_tokens']}-token-only TTFT median {_ms(t['suffix_only_ttft_median_s'])} ms\n"
        f"  cold (full prefill) {_ms(t['cold_ttft_s'])} ms\n"
        f"  ratio hit/suffix-only: median {t['ratio_median']:.2f}x, min {t['ratio_min']:.2f}x "
        f"(target <= {t['target_ratio']}x: {'met' if t['met'] else 'NOT met'})\n"
        f"  bare model forward: {t['suffix_tokens']} tokens after {t['prefix_tokens']} cached "
        f"{_ms(t['model_extend_after_prefix_s'])} ms vs {t['suffix_tokens']} alone "
        f"{_ms(t['model_prefill_suffix_s'])} ms = {t['model_ratio']:.2f}x; engine overhead on "
        f"a hit {t['engine_overhead_on_hit']:.2f}x the bare forward"
    )


def main(args: argparse.Namespace) -> int:
    import torch

    from radixkv.bench.engine_driver import load_for_bench

    t0 = time.perf_counter()
    base, lm, device, dtype = load_for_bench(args)
    print(
        f"model {base.model.path or 'default (SmolLM2-135M-Instruct)'} on {device}/{dtype} "
        f"loaded in {time.perf_counter() - t0:.1f}s; torch threads {torch.get_num_threads()}",
        flush=True,
    )
    out: dict[str, Any] = {"config": base.describe(), "device": device}
    out["config"]["model"]["dtype_resolved"] = str(dtype)
    if not args.skip_workloads:
        out["results"] = run_workloads(lm, base, args)
    if not args.skip_target:
        target = prefix_target(
            lm, base, args.target_prefix, args.target_suffix, args.target_repeats
        )
        out["prefix_target"] = target
        print(_format_target(target), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
