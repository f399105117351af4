"""`radixkv` command line.

serve | demo | generate | chat | replay | cluster up | bench {tree, engine, tiers, storage,
tierload, eviction, serve, compare, grammar, answers, cluster, agent}. (The maintainers' tools,
e.g. the report that writes docs/benchmarks.md and the head-to-head against vLLM, are scripts
outside the package, run from a checkout: `python scripts/report.py`, `python -m scripts.peers`.)

Each subcommand lives next to the code it drives and exposes `register(subparsers)`, which adds
its parser and sets `func` (called with the parsed args, returning an exit code). Registration
must stay cheap: modules import torch lazily, inside `func`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (module, is_bench_subcommand); each module exposes register(subparsers).
_COMMANDS: tuple[tuple[str, bool], ...] = (
    ("radixkv.server.cli", False),  # serve, generate, chat
    ("radixkv.server.demo", False),  # demo
    ("radixkv.bench.replay_cli", False),  # replay
    ("radixkv.cluster.cli", False),  # cluster up
    ("radixkv.bench.tree", True),  # bench tree
    ("radixkv.bench.engine", True),  # bench engine
    ("radixkv.bench.tiers.cli", True),  # bench tiers
    ("radixkv.bench.tiers.storage", True),  # bench storage
    ("radixkv.bench.tiers.tier_load", True),  # bench tierload
    ("radixkv.bench.eviction", True),  # bench eviction
    ("radixkv.bench.serving.serve", True),  # bench serve
    ("radixkv.bench.serving.compare", True),  # bench compare
    ("radixkv.bench.grammar", True),  # bench grammar
    ("radixkv.bench.serving.answers", True),  # bench answers
    ("radixkv.bench.cluster.cli", True),  # bench cluster
    ("radixkv.bench.agent.cli", True),  # bench agent
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixkv", description="RadixKV: LLM serving with a radix-tree KV cache."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks (tree, engine, serve, compare, ...)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    for module_name, is_bench in _COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(bench_sub if is_bench else sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
