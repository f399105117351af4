"""`radixkv bench tiers`: what the host (L2) and storage (L3) tiers buy, in-process.

Multi-turn: `--clients` conversations, `--rounds` rounds; in each round every client sends its
whole history (earlier prompts and answers) plus a new `--turn-len`-token turn, `--concurrency`
requests in flight. The device pool (L1) is sized to `--l1-frac` of the final working set, L2 to
`--l2-frac`; L3 is a file directory in a temporary folder. Modes side by side: L1 only, L1+L2,
L1+L2+L3. Per round: effective input throughput (all prompt tokens of the round ÷ its wall
time) and the token hit rate, plus which tier served the hits.

Restart: a `--prefix-len`-token shared prefix is computed by one engine, which then shuts down
cleanly (flushing L3); a fresh engine (empty tree, empty L2: a restarted server) answers a new
request on that prefix: its TTFT with L3 vs without.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from typing import Any

MODES = ("L1", "L1+L2", "L1+L2+L3")


def register(subparsers: Any) -> None:
    from radixkv.engine.args import add_engine_args

    p = subparsers.add_parser("tiers", help="hierarchical cache benchmark: L1 vs L1+L2 vs +L3")
    add_engine_args(p)
    w = p.add_argument_group("workload")
    w.add_argument("--clients", type=int, default=8, help="conversations")
    w.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    w.add_argument("--rounds", type=int, default=3, help="turns per conversation")
    w.add_argument("--turn-len", type=int, default=128, help="new user tokens per turn")
    w.add_argument("--output-len", type=int, default=8, help="answer tokens per turn")
    w.add_argument("--l1-frac", type=float, default=0.25, help="device pool / working set")
    w.add_argument("--l2-frac", type=float, default=0.5, help="host pool / working set")
    w.add_argument("--prefix-len", type=int, default=1024, help="restart test: shared prefix")
    w.add_argument("--modes", default=",".join(MODES), help="comma list of " + "|".join(MODES))
    w.add_argument("--skip-restart", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--plot", default=None, help="also plot hit rate and throughput per round (PNG)")
    p.set_defaults(func=main)


def _ids(vocab: int) -> tuple[int, int]:
    return min(1000, vocab // 4), min(30000, vocab)


def conversations(args: argparse.Namespace, seed: int, vocab: int) -> list[list[list[int]]]:
    """prompts[round][client]: each client's whole history plus its new turn."""
    rng = random.Random(seed)
    lo, hi = _ids(vocab)
    history: list[list[int]] = [[] for _ in range(args.clients)]
    rounds: list[list[list[int]]] = []
    for _ in range(args.rounds):
        this = []
        for c in range(args.clients):
            history[c] = history[c] + [rng.randrange(lo, hi) for _ in range(args.turn_len)]
            this.append(list(history[c]))
            # The answer becomes history; synthetic ids keep every mode's prompts identical.
            history[c] += [rng.randrange(lo, hi) for _ in range(args.output_len)]
        rounds.append(this)
    return rounds


def _mode_config(
    base: Any, mode: str, working_set: int, args: argparse.Namespace, tmp: str, token_bytes: int
) -> Any:
    page = base.cache.page_size
    # The requests in flight must fit together, or L1 thrashes in every mode alike.
    longest = args.concurrency * (args.rounds * (args.turn_len + args.output_len) + page)
    l1 = max(longest, int(working_set * args.l1_frac)) // page * page + page
    cfg = base.override(num_slots=l1, max_running_requests=args.concurrency)
    if mode == "L1":
        return cfg
    l2_mb = max(working_set * args.l2_frac * token_bytes / 2**20, 0.01)
    cfg = cfg.override(enable_hierarchical_cache=True, hicache_size=l2_mb)
    if mode == "L1+L2+L3":
        cfg = cfg.override(
            hicache_storage_backend="file",
            hicache_storage_url=tmp,
            hicache_storage_prefetch_policy="wait_complete",
        )
    return cfg


def run_mode(
    lm: Any, cfg: Any, rounds: list[list[list[int]]], args: argparse.Namespace
) -> dict[str, Any]:
    from radixkv.bench.engine_driver import drive
    from radixkv.bench.workloads import BenchRequest
    from radixkv.engine.engine import Engine

    engine = Engine(lm, config=cfg)
    per_round = []
    try:
        for r, prompts in enumerate(rounds):
            before = engine.metrics().cached_tokens_by_tier
            reqs = [BenchRequest(i, p, args.output_len, f"c{i}") for i, p in enumerate(prompts)]
            res = drive(engine, reqs, concurrency=args.concurrency)
            engine.check_memory()
            s = res.summary()
            print(f"  round {r + 1}: {s['wall_s']:.1f}s", file=sys.stderr, flush=True)
            after = engine.metrics().cached_tokens_by_tier
            tiers = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            per_round.append(
                {
                    "round": r + 1,
                    "prompt_tokens": s["prompt_tokens"],
                    "wall_s": s["wall_s"],
                    "effective_input_tok_per_s": s["effective_input_tok_per_s"],
                    "token_hit_rate": s["token_hit_rate"],
                    "ttft_mean_s": s["ttft_mean_s"],
                    "hits_by_tier": tiers,
                }
            )
        stats = engine.metrics().tier_stats
    finally:
        engine.close()
    prompt = sum(r["prompt_tokens"] for r in per_round)
    wall = sum(r["wall_s"] for r in per_round)
    return {
        "rounds": per_round,
        "effective_input_tok_per_s": prompt / max(wall, 1e-9),
        "token_hit_rate": sum(r["token_hit_rate"] * r["prompt_tokens"] for r in per_round) / prompt,
        "num_slots": cfg.cache.num_slots,
        "hicache_size_mb": cfg.cache.hicache_size,
        "tier_stats": stats,
    }


def restart_ttft(lm: Any, base: Any, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """TTFT of a new request on a long shared prefix right after a restart, with/without L3."""
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

    rng = random.Random(7)
    lo, hi = _ids(int(lm.config.vocab_size))
    prefix = [rng.randrange(lo, hi) for _ in range(args.prefix_len)]
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    with_l3 = base.override(
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_storage_url=tmp,
        hicache_storage_prefetch_policy="wait_complete",
    )
    first = Engine(lm, config=with_l3)
    first.generate([prefix + [rng.randrange(lo, hi) for _ in range(16)]], sp)
    first.close()
    out: dict[str, Any] = {"prefix_len": args.prefix_len}
    for name, cfg in (("without_l3", base), ("with_l3", with_l3)):
        engine = Engine(lm, config=cfg)  # a restarted server: empty tree, empty host pool
        q = prefix + [rng.randrange(lo, hi) for _ in range(16)]
        t0 = time.perf_counter()
        got = engine.generate([q], sp)[0]
        out[name] = {"ttft_s": time.perf_counter() - t0, "cached_tokens": got.cached_tokens}
        engine.close()
    out["speedup"] = out["without_l3"]["ttft_s"] / max(out["with_l3"]["ttft_s"], 1e-9)
    return out


def format_table(results: dict[str, Any]) -> str:
    lines = [
        f"{'mode':<10} {'round':>5} {'prompt tok':>10} {'eff. input tok/s':>16} {'hit rate':>8} "
        f"{'device/host/storage hits':>26}"
    ]
    for mode, res in results["modes"].items():
        for r in res["rounds"]:
            t = r["hits_by_tier"]
            split = f"{t.get('device', 0)}/{t.get('host', 0)}/{t.get('storage', 0)}"
            lines.append(
                f"{mode:<10} {r['round']:>5} {r['prompt_tokens']:>10} "
                f"{r['effective_input_tok_per_s']:>16.0f} {100 * r['token_hit_rate']:>7.1f}% "
                f"{split:>26}"
            )
        lines.append(
            f"{mode:<10} {'all':>5} {'':>10} {res['effective_input_tok_per_s']:>16.0f} "
            f"{100 * res['token_hit_rate']:>7.1f}%"
        )
    rs = results.get("restart")
    if rs:
        lines.append("")
        lines.append(
            f"restart, {rs['prefix_len']}-token prefix: TTFT without L3 "
            f"{1000 * rs['without_l3']['ttft_s']:.0f} ms "
            f"(cached {rs['without_l3']['cached_tokens']}), with L3 "
            f"{1000 * rs['with_l3']['ttft_s']:.0f} ms (cached {rs['with_l3']['cached_tokens']}): "
            f"{rs['speedup']:.2f}x"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import torch

    from radixkv.bench.engine_driver import load_for_bench

    base, lm, _, dtype = load_for_bench(args)
    mc = lm.config
    elem = torch.empty((), dtype=dtype).element_size()
    token_bytes = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * elem
    rounds = conversations(args, base.scheduler.seed, int(mc.vocab_size))
    working_set = args.clients * (args.rounds * (args.turn_len + args.output_len))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, Any] = {"working_set_tokens": working_set, "modes": {}}
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        with tempfile.TemporaryDirectory(prefix="radixkv-l3-") as tmp:
            cfg = _mode_config(base, mode, working_set, args, tmp, token_bytes)
            print(f"running {mode} (L1 {cfg.cache.num_slots} slots)...", file=sys.stderr)
            results["modes"][mode] = run_mode(lm, cfg, rounds, args)
    if not args.skip_restart:
        with tempfile.TemporaryDirectory(prefix="radixkv-l3-") as tmp:
            results["restart"] = restart_ttft(lm, base, args, tmp)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot_rounds(results, args.plot)
    return 0


def plot_rounds(results: dict[str, Any], path: str) -> None:
    """Two panels: token hit rate and effective input tok/s per round, one line per mode."""
    from radixkv.bench.plots import pyplot

    plt = pyplot()
    fig, (ax_hit, ax_tput) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, res in results["modes"].items():
        rounds = [r["round"] for r in res["rounds"]]
        ax_hit.plot(rounds, [100 * r["token_hit_rate"] for r in res["rounds"]], "o-", label=mode)
        ax_tput.plot(rounds, [r["effective_input_tok_per_s"] for r in res["rounds"]], "o-")
    ax_hit.set(xlabel="round", ylabel="token hit rate (%)", title="hit rate per round")
    ax_tput.set(xlabel="round", ylabel="prompt tokens / s", title="effective input throughput")
    for ax in (ax_hit, ax_tput):
        ax.set_xticks(range(1, 1 + max(len(r["rounds"]) for r in results["modes"].values())))
    ax_hit.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
