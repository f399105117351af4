"""`radixkv bench eviction`: eviction policies through the real engine on a trace, small pool.

A public trace (Claude Code or Mooncake) is scaled down (`--length-scale`, see
`radixkv.bench.inputs.workload_trace`) and replayed request by request, in arrival order, through
the in-process engine with a constrained KV pool (`--num-slots`), once per eviction policy. Each
request carries its trace session as `session_id`, and a session is closed after its last
request (what session-aware policies use). Per policy: token hit rate, mean and p50/p90 TTFT,
and the live-regret report (Belady over the same requests at the pool's capacity).

Sequential on purpose: with one request at a time the only difference between the runs is what
the cache kept, so TTFT differences are the policy's. Run it on a quiet machine; numbers on a
shared one are noisy (the hit rates are exact).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def register(subparsers: Any) -> None:
    from radixkv.engine.args import add_engine_args

    p = subparsers.add_parser(
        "eviction", help="eviction policies through the engine on a trace with a small KV pool"
    )
    add_engine_args(p)
    w = p.add_argument_group("trace")
    w.add_argument("--trace", required=True, help="Mooncake .jsonl or Claude Code archive")
    w.add_argument("--policies", default="lru,predict", help="comma list of eviction policies")
    w.add_argument("--max-requests", type=int, default=40)
    w.add_argument("--max-sessions", type=int, default=None, help="Claude Code: first N")
    w.add_argument("--length-scale", type=int, default=64, help="divide lengths by this")
    w.add_argument("--output-len", type=int, default=2, help="output tokens per request")
    w.add_argument("--max-prompt-len", type=int, default=2000)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.set_defaults(func=main)


def _requests(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], int, str]]:
    """(prompt ids, max tokens, session) per request, in arrival order."""
    from radixkv.bench.inputs.tokens import id_source
    from radixkv.bench.inputs.workload_trace import trace_workload

    wl = trace_workload(
        id_source(id_range=(0, vocab)),
        trace=args.trace,
        length_scale=args.length_scale,
        max_requests=args.max_requests,
        max_sessions=args.max_sessions,
        max_prompt_len=args.max_prompt_len,
        output_len=args.output_len,
    )
    return [(r.prompt_ids, r.max_tokens, r.group) for r in wl.requests]


def run_policy(lm: Any, base: Any, policy: str, reqs: list[tuple[list[int], int, str]]) -> Any:
    """One pass of `reqs` through a fresh engine with `policy`; a summary dict."""
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import RequestOptions, SamplingParams

    engine = Engine(lm, config=base.override(eviction_policy=policy))
    last = {sess: i for i, (_, _, sess) in enumerate(reqs)}
    ttft: list[float] = []
    prompt = cached = 0
    t0 = time.perf_counter()
    for i, (ids, out, sess) in enumerate(reqs):
        sp = SamplingParams(max_tokens=out, temperature=0, ignore_eos=True)
        res = engine.generate([ids], sp, options=RequestOptions(session_id=sess or None))[0]
        ttft.append(res.ttft_s or 0.0)
        prompt += res.prompt_tokens
        cached += res.cached_tokens
        if sess and last[sess] == i:
            engine.close_session(sess)
    wall = time.perf_counter() - t0
    engine.check_memory()
    q = statistics.quantiles(ttft, n=10) if len(ttft) > 1 else ttft * 9
    return {
        "policy": policy,
        "requests": len(reqs),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "mean_ttft_ms": 1000 * statistics.fmean(ttft),
        "p50_ttft_ms": 1000 * q[4],
        "p90_ttft_ms": 1000 * q[8],
        "wall_s": wall,
        "regret": engine.regret_stats(),
    }


def main(args: argparse.Namespace) -> int:
    from radixkv.bench.engine_driver import load_for_bench

    base, lm, device, _ = load_for_bench(args)
    reqs = _requests(args, int(lm.config.vocab_size))
    print(f"{len(reqs)} requests, {sum(len(r[0]) for r in reqs):,} prompt tokens", flush=True)
    rows = []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        row = run_policy(lm, base, policy, reqs)
        rows.append(row)
        reg = row["regret"]
        print(
            f"{policy:>12}: hit {row['token_hit_rate']:.1%}  TTFT mean {row['mean_ttft_ms']:.0f}"
            f" ms p50 {row['p50_ttft_ms']:.0f} p90 {row['p90_ttft_ms']:.0f}  belady bound "
            f"{reg.get('belady_hit_rate', 0.0):.1%}  wall {row['wall_s']:.0f} s",
            flush=True,
        )
    if args.json:
        doc = {"config": base.describe(), "device": device, "results": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
    return 0
