"""Workload flags shared by `bench serve` and `bench compare`, and building a workload from them.

Every workload flag defaults to None, meaning "the generator's own default" (see `WORKLOADS`), so
one flag name (e.g. --output-len) can carry a different default per workload.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixkv.bench.inputs import workloads as wl
from radixkv.bench.inputs.tokens import (
    DEFAULT_ID_RANGE,
    TokenSource,
    id_source,
    load_tokenizer,
    text_source,
)


@dataclass(frozen=True)
class WorkloadSpec:
    help: str  # the one line shown in --help
    build: Callable[..., wl.Workload]
    flags: tuple[str, ...]  # argparse dests the builder accepts as keyword arguments


def _trace_builder(tokens: TokenSource, **kw: Any) -> wl.Workload:
    from radixkv.bench.inputs.workload_trace import (
        trace_workload,  # imports the trace loaders lazily
    )

    return trace_workload(tokens, **kw)


WORKLOADS: dict[str, WorkloadSpec] = {
    "shared-prefix": WorkloadSpec(
        "G groups x P prompts; each = its group's S-token system prompt + a Q-token question "
        "(defaults 64x16, 2048+128, 256 out)",
        wl.shared_prefix,
        ("num_groups", "prompts_per_group", "system_len", "question_len", "output_len", "shuffle"),
    ),
    "multi-turn": WorkloadSpec(
        "C conversations x T turns; each turn resends the whole history (earlier prompts + "
        "synthetic answers) + a Q-token question, closed loop (defaults 16x8, 128 q, 128 out)",
        wl.multi_turn,
        ("num_conversations", "num_turns", "system_len", "question_len", "output_len"),
    ),
    "tree-of-thought": WorkloadSpec(
        "N trees: a R-token root problem, every node expands into B branches to depth D, each "
        "branch = parent context + parent answer + Q-token thought (defaults 4 trees, 1024, B3 D3)",
        wl.tree_of_thought,
        ("num_trees", "root_len", "branches", "depth", "question_len", "output_len"),
    ),
    "agent": WorkloadSpec(
        "A sessions x K steps sharing a tool list + system prompt; each step appends the last "
        "thought/action + an observation (defaults 8x8, 1024 tools + 512 system, 256 obs)",
        wl.agent,
        (
            "num_sessions",
            "num_steps",
            "tools_len",
            "system_len",
            "question_len",
            "observation_len",
            "output_len",
        ),
    ),
    "trace": WorkloadSpec(
        "replay a Mooncake jsonl / Claude Code trace (--trace) with arrival times x "
        "--time-scale and lengths / --length-scale, hash ids -> deterministic token blocks",
        _trace_builder,
        (
            "trace",
            "time_scale",
            "length_scale",
            "max_requests",
            "max_sessions",
            "max_prompt_len",
            "output_len",
            "tools_len",
        ),
    ),
}


def workloads_help() -> str:
    """One line per workload, for a parser's description (use RawDescriptionHelpFormatter)."""
    width = max(len(k) for k in WORKLOADS)
    return "workloads:\n" + "\n".join(f"  {k.ljust(width)}  {v.help}" for k, v in WORKLOADS.items())


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """Add --workload and every workload flag (all optional, generator defaults otherwise)."""
    p.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="shared-prefix",
        help="which workload (one line each above)",
    )
    g = p.add_argument_group("workload shape (default: the workload's own)")
    for flag, help_ in (
        ("--num-groups", "shared-prefix: groups G"),
        ("--prompts-per-group", "shared-prefix: prompts per group P"),
        ("--num-conversations", "multi-turn: conversations C"),
        ("--num-turns", "multi-turn: turns T"),
        ("--num-trees", "tree-of-thought: trees"),
        ("--root-len", "tree-of-thought: root problem tokens R"),
        ("--branches", "tree-of-thought: branches per node B"),
        ("--depth", "tree-of-thought: depth D"),
        ("--num-sessions", "agent: sessions A"),
        ("--num-steps", "agent: steps K"),
        ("--tools-len", "agent: tool-list tokens; trace: a shared tool list before each request"),
        ("--observation-len", "agent: observation tokens per step"),
        ("--system-len", "system prompt tokens S"),
        ("--question-len", "question / thought tokens Q"),
        ("--output-len", "output tokens per request (trace: overrides the trace's)"),
        ("--max-requests", "trace: use the first N requests"),
        ("--max-sessions", "trace (Claude Code): load the first N sessions only"),
        ("--max-prompt-len", "trace: truncate prompts to N tokens (after scaling)"),
    ):
        g.add_argument(flag, type=int, default=None, help=help_)
    g.add_argument("--no-shuffle", dest="shuffle", action="store_const", const=False, default=None)
    g.add_argument(
        "--trace",
        default=None,
        help="trace: a Mooncake .jsonl or Claude Code file/dir, or a shipped trace by name "
        "(mooncake, mooncake-synthetic, claude-code; from data/traces/); default claude-code",
    )
    g.add_argument("--time-scale", type=float, default=None, help="trace: arrival times x this")
    g.add_argument("--length-scale", type=int, default=None, help="trace: lengths / this (CPU)")
    g.add_argument(
        "--prompt-format",
        choices=("ids", "text"),
        default="ids",
        help="send prompts as token-id lists (default) or as text built from vocabulary words",
    )
    g.add_argument("--tokenizer", default=None, help="model dir or tokenizer.json (text mode)")
    g.add_argument(
        "--token-range",
        default=f"{DEFAULT_ID_RANGE[0]}:{DEFAULT_ID_RANGE[1]}",
        help="ids mode: draw ids from LO:HI (special tokens excluded when --tokenizer is set)",
    )


def token_source(args: argparse.Namespace) -> TokenSource:
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    if args.prompt_format == "text":
        if tokenizer is None:
            raise SystemExit("--prompt-format text needs --tokenizer (or --model PATH)")
        return text_source(tokenizer)
    lo, _, hi = str(args.token_range).partition(":")
    return id_source(tokenizer, (int(lo), int(hi)))


def build_workload(args: argparse.Namespace, tokens: TokenSource | None = None) -> wl.Workload:
    """The workload `args.workload`, seeded by `args.seed`, in the requested prompt mode."""
    spec = WORKLOADS[args.workload]
    tokens = tokens if tokens is not None else token_source(args)
    kw = {k: getattr(args, k) for k in spec.flags if getattr(args, k, None) is not None}
    workload = spec.build(tokens, seed=args.seed, **kw)
    workload.params["prompt_format"] = "text" if tokens.text_mode else "ids"
    if tokens.text_mode:
        for r in workload.requests:
            r.prompt_text = tokens.to_text(r.prompt_ids)
    return workload
