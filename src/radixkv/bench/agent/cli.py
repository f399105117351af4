"""`radixkv bench agent`: agent sessions through an OpenAI-compatible server's chat API.

N concurrent sessions (default 4), each a closed loop of T turns (default 20): a shared tool list
of about `--tools-tokens` tokens (default 6,000, by the model's tokenizer) sent as `tools` on
every request, a system prompt and a growing history (every turn appends the reply as the server
returned it and a tool result of `--result-tokens`), answers of `--answer-tokens` (max_tokens with
ignore_eos). Per turn: prompt and cached tokens (from `usage`), TTFT, TPOT, E2E; the report checks
that every turn after the first serves >= 95% of its prompt from the cache. Then a TTFT probe
(radixkv.bench.agent.agent_probe): a turn after H cached tokens against the same new tokens alone.

Against `--base-url` (any server, e.g. a vLLM you started), or it starts the servers itself
(`--engines radixkv,vllm`, one at a time, fresh per dtype, the same checkpoint, dtype and KV
budget; vLLM from `--vllm-python`). For a ChatML model whose template ignores `tools` (the default
SmolLM2) both engines serve a view of the checkpoint with a Hermes tool template
(radixkv.bench.agent.agent_model); `--tools-mode system` puts the tool list in the system prompt
instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from radixkv.bench.agent import agent_model, agent_report
from radixkv.bench.agent.agent_probe import ttft_probe
from radixkv.bench.agent.agent_session import AgentPlan, AgentShape, Target, build_plan, run_session

PROBE_SLACK = 64  # tokens kept free under the context by the default probe history


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


async def run_agent(plan: AgentPlan, target: Target, stagger_s: float = 0.0) -> dict[str, Any]:
    """Every session concurrently; the records, summary and per-turn rows (JSON-ready)."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    t0 = time.perf_counter()

    async def one(http: aiohttp.ClientSession, s: int) -> Any:
        await asyncio.sleep(s * stagger_s)
        return await run_session(http, plan, target, s, t0)

    async with aiohttp.ClientSession(timeout=timeout, headers=headers, connector=connector) as h:
        done = await asyncio.gather(*(one(h, s) for s in range(plan.shape.sessions)))
    wall = time.perf_counter() - t0
    records = [r for recs, _ in done for r in recs]
    ended = {s: why for s, (_, why) in enumerate(done)}
    return {
        "summary": agent_report.summary(records, wall, ended),
        "turns": agent_report.per_turn(records),
        "ttft_by_history": agent_report.ttft_by_history(records),
        "records": [r.to_dict() for r in records],
    }


async def _model_card(base_url: str, api_key: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=headers) as s,
        s.get(base_url.rstrip("/") + "/v1/models") as r,
    ):
        r.raise_for_status()
        return dict((await r.json())["data"][0])


async def _warm_and_flush(target: Target, n: int) -> bool:
    """`n` short unrelated chats (first-request costs), then the prefix cache dropped."""
    from radixkv.bench.serving.serve import _flush

    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    url = target.base_url.rstrip("/") + "/v1/chat/completions"
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in range(n):
            body = {
                "model": target.model,
                "max_tokens": 4,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Warm-up {i}: say hello."}],
            }
            async with http.post(url, json=body) as r:
                await r.read()
    return await _flush(target.base_url, target.api_key)


def measure(args: argparse.Namespace, url: str, plan: AgentPlan | None, count: Any) -> dict:
    """The agent run and the probe against a running server at `url`."""
    card = asyncio.run(_model_card(url, args.api_key))
    max_len = int(card.get("max_model_len") or args.max_model_len or 8192)
    target = Target(url, str(card["id"]), max_len, args.api_key, args.request_timeout)
    out: dict[str, Any] = {"model": target.model, "max_model_len": max_len}
    out["flushed"] = asyncio.run(_warm_and_flush(target, args.warmup))
    if plan is not None:
        out.update(asyncio.run(run_agent(plan, target, args.stagger)))
    if args.probe_new > 0:
        hist = args.probe_history or min(32768, max_len) - args.probe_new - PROBE_SLACK
        asyncio.run(_warm_and_flush(target, 0))
        out["probe"] = asyncio.run(
            ttft_probe(target, count, hist, args.probe_new, args.probe_reps, args.seed)
        )
    return out


@contextlib.contextmanager
def _server(args: argparse.Namespace, engine: str, dtype: str, ckpt: Path) -> Iterator[Any]:
    from radixkv.bench.serving.peer_server import PeerServer, vllm_env
    from radixkv.bench.serving.server_proc import LocalServer

    log = Path(args.out) / f"server-{engine}-{dtype}.log"
    kv_gb = args.kv_cache_gb
    if engine == "radixkv":
        flags = ["--dtype", dtype, "--kv-cache-mb", str(int(kv_gb * 1024))]
        flags += shlex.split(args.radixkv_args)
        srv: Any = LocalServer(str(ckpt), flags, log, args.startup_timeout)
    else:
        import os

        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt)]
        cmd += ["--served-model-name", "peer", "--dtype", dtype, "--enable-prompt-tokens-details"]
        if args.max_model_len:
            cmd += ["--max-model-len", str(args.max_model_len)]
        if args.tools_mode == "native" and args.tool_choice != "none":
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        env = {**vllm_env(os.cpu_count() or 1), "VLLM_CPU_KVCACHE_SPACE": f"{kv_gb:g}"}
        srv = PeerServer([*cmd, *shlex.split(args.vllm_args)], env, log, args.startup_timeout)
    with srv:
        yield srv


def serve_dir(args: argparse.Namespace) -> Path:
    """The checkpoint the started servers load: the model's own, or its Hermes tool view."""
    ckpt = agent_model.model_dir(args.model)
    if args.tools_mode == "native" and not args.probe_only and not agent_model.renders_tools(ckpt):
        ckpt = agent_model.hermes_view(ckpt, Path(args.out))
    return ckpt


def run(args: argparse.Namespace) -> dict[str, Any]:
    from radixkv.bench.inputs.tokens import load_tokenizer
    from radixkv.bench.serving.compare import machine_info

    Path(args.out).mkdir(parents=True, exist_ok=True)
    tok_dir = args.tokenizer or agent_model.model_dir(args.model)
    tok = load_tokenizer(tok_dir)

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    shape = AgentShape(
        args.sessions,
        args.turns,
        args.tools_tokens,
        args.system_tokens,
        args.task_tokens,
        _range(args.result_tokens),
        _range(args.answer_tokens),
        args.tool_choice,
        args.tools_mode,
        args.seed,
    )
    plan = None if args.probe_only else build_plan(shape, count)
    runs: list[dict[str, Any]] = []
    if args.base_url:
        runs.append(
            {
                "engine": args.engine_name,
                "dtype": None,
                "base_url": args.base_url,
                **measure(args, args.base_url, plan, count),
            }
        )
    else:
        ckpt = serve_dir(args)
        for dtype in args.dtypes.split(","):
            for engine in args.engines.split(","):
                print(f"[{engine} {dtype}] starting", file=sys.stderr)
                try:
                    with _server(args, engine, dtype, ckpt) as srv:
                        res = measure(args, srv.url, plan, count)
                        runs.append({"engine": engine, "dtype": dtype, "server": srv.describe()})
                        runs[-1].update(res)
                except (RuntimeError, OSError, ValueError, aiohttp.ClientError) as exc:
                    # One engine failing (a start, a refused probe) leaves the others' results.
                    print(f"[{engine} {dtype}] failed: {exc}", file=sys.stderr)
                    runs.append({"engine": engine, "dtype": dtype, "error": str(exc)[-2000:]})
                # What is done so far survives an interrupted run.
                partial = Path(args.out) / "agent.partial.json"
                partial.write_text(json.dumps({"shape": shape.__dict__, "runs": runs}, indent=1))
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(["radixkv", *sys.argv[1:]]),
        "machine": machine_info(),
        "shape": {**shape.__dict__, "tools": len(plan.tools) if plan else None},
        "runs": runs,
    }


def _cmd_agent(args: argparse.Namespace) -> int:
    from radixkv.bench.serving.peer_server import scrub

    if not args.base_url and "vllm" in args.engines.split(",") and not args.vllm_python:
        print("--engines vllm needs --vllm-python", file=sys.stderr)
        return 2
    result = run(args)
    out = Path(args.out)
    done = [r for r in result["runs"] if "error" not in r]
    md = "\n\n".join(agent_report.format_run(r) for r in done)
    md += "".join(
        f"\n\n{r['engine']} ({r['dtype']}) failed: {r['error']}"
        for r in result["runs"]
        if "error" in r
    )
    if len(done) > 1:
        md += "\n\n" + agent_report.compare(done)
    paths = (args.vllm_python or "", None, args.out, str(agent_model.model_dir(args.model)))
    (out / "agent.json").write_text(scrub(json.dumps(result, indent=1), *paths))
    (out / "agent.md").write_text(scrub(md, *paths) + "\n")
    print(scrub(md, *paths))
    print(f"json: {out / 'agent.json'}\ntable: {out / 'agent.md'}")
    ok = all(
        "error" not in r and r.get("summary", {}).get("turns_failed", 0) == 0
        for r in result["runs"]
    )
    return 0 if ok else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "agent",
        help="agent sessions (tool list + growing history) through the chat API, vs vLLM",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_argument_group("server (a URL, or servers started here)")
    where.add_argument("--base-url", default=None, help="a running OpenAI-compatible server")
    where.add_argument("--engine-name", default="server", help="its label (with --base-url)")
    where.add_argument("--api-key", default=None)
    where.add_argument("--engines", default="radixkv", help="started here: radixkv,vllm")
    where.add_argument(
        "--model",
        default="default",
        help="default (SmolLM2-135M), tiny, tiny-32k, 1b, gemma3-270m, or a checkpoint dir "
        "(with --base-url: the tokenizer used to size the prompts)",
    )
    where.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model's)")
    where.add_argument("--dtypes", default="bfloat16", help="comma list, each a fresh server")
    where.add_argument("--kv-cache-gb", type=float, default=2.0, help="KV budget of each engine")
    where.add_argument("--max-model-len", type=int, default=None, help="context (default: model)")
    where.add_argument("--vllm-python", default=None, help="python of a vllm-cpu virtualenv")
    where.add_argument("--radixkv-args", default="", help="extra flags for `radixkv serve`")
    where.add_argument("--vllm-args", default="", help="extra flags for vLLM's api_server")
    where.add_argument("--startup-timeout", type=float, default=900.0)
    shape = p.add_argument_group("sessions (sizes in tokens of the model's tokenizer)")
    shape.add_argument("--sessions", type=int, default=4, help="concurrent sessions")
    shape.add_argument("--turns", type=int, default=20, help="turns per session")
    shape.add_argument("--tools-tokens", type=int, default=6000, help="the shared tool list")
    shape.add_argument("--system-tokens", type=int, default=200, help="system prompt filler")
    shape.add_argument("--task-tokens", type=int, default=100, help="each session's first ask")
    shape.add_argument("--result-tokens", default="100:300", help="LO:HI per tool result")
    shape.add_argument("--answer-tokens", default="50:200", help="LO:HI max_tokens per answer")
    shape.add_argument("--tool-choice", choices=("none", "auto", "required"), default="auto")
    shape.add_argument(
        "--tools-mode",
        choices=("native", "system"),
        default="native",
        help="native: `tools` in each request (a ChatML model without a tool template is served "
        "through a Hermes-template view); system: the list as text in the system prompt",
    )
    shape.add_argument("--stagger", type=float, default=0.0, help="seconds between session starts")
    shape.add_argument("--seed", type=int, default=0)
    probe = p.add_argument_group("TTFT probe")
    probe.add_argument(
        "--probe-history",
        type=int,
        default=None,
        help="cached history tokens (default: min(32768, context) - new - 64)",
    )
    probe.add_argument("--probe-new", type=int, default=256, help="new tokens (0: no probe)")
    probe.add_argument("--probe-reps", type=int, default=3)
    probe.add_argument("--probe-only", action="store_true", help="skip the sessions")
    p.add_argument("--warmup", type=int, default=2, help="unrelated chats before each run")
    p.add_argument("--request-timeout", type=float, default=3600.0)
    p.add_argument("--out", default="bench-results/agent")
    p.set_defaults(func=_cmd_agent)
