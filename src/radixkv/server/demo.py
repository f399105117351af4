"""`radixkv demo`: start the server on the default model and show the cache effect over HTTP.

It serves on 127.0.0.1, sends a few chat requests that share a long system prompt (streamed, as
an OpenAI client would), and prints for each the prompt tokens, the tokens served from the radix
cache, and the time to first token. With --keep-serving it then stays up for your own clients.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from radixkv.server.cli import add_model_args
from radixkv.server.engine_link.launch import add_engine_mode_args

SYSTEM_PROMPT = (
    "You are the help desk assistant of Northwind Gardens, a plant nursery. Opening hours are "
    "9am to 6pm Monday to Saturday, and 10am to 4pm on Sunday. The nursery sells indoor plants, "
    "fruit trees, herbs, seeds, pots and soil. Deliveries within 20 km are free for orders over "
    "50 euros; otherwise delivery costs 7 euros. Plants can be returned within 30 days with the "
    "receipt if they arrive damaged. Staff can repot a plant in store for 3 euros. Every "
    "Saturday at 11am there is a free workshop for beginners on watering, light and soil. "
    "Gift cards are available in any amount from 10 euros. Answer in one or two short "
    "sentences, politely, using only these facts."
)
QUESTIONS = (
    "When are you open on Sunday?",
    "How much does delivery cost for a 30 euro order?",
    "Is there a workshop for beginners?",
)


def register(subparsers: Any) -> None:
    """Add `radixkv demo`."""
    demo = subparsers.add_parser(
        "demo", help="serve the default model and show the radix cache effect over HTTP"
    )
    add_model_args(demo)
    add_engine_mode_args(demo)
    demo.add_argument("--port", type=int, default=0, help="0 = any free port")
    demo.add_argument("--max-tokens", type=int, default=40)
    demo.add_argument(
        "--keep-serving", action="store_true", help="stay up after the demo (Ctrl-C stops)"
    )
    demo.set_defaults(func=cmd_demo)


def _chat(url: str, model: str, question: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat request; returns answer, usage and client-side TTFT."""
    import httpx

    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                text = choice["delta"].get("content")
                if text:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    parts.append(text)
            if event.get("usage"):
                usage = event["usage"]
    return {"answer": "".join(parts).strip(), "usage": usage, "ttft": ttft}


def cmd_demo(args: argparse.Namespace) -> int:
    from radixkv.server.background import BackgroundServer
    from radixkv.server.cli import config_from_args, model_name_for, setup_logging
    from radixkv.server.engine_link.engine_proc import EngineStartError
    from radixkv.server.engine_link.launch import close_server_engine, open_server_engine

    setup_logging("info")
    try:
        engine = open_server_engine(config_from_args(args))
    except EngineStartError as exc:
        logging.getLogger("radixkv.server").error("the engine could not start: %s", exc)
        return 1
    try:
        return _run_demo(args, BackgroundServer(engine, model_name_for(args), port=args.port))
    finally:
        close_server_engine(engine)


def _run_demo(args: argparse.Namespace, server: Any) -> int:
    import httpx

    name = server.state.model_name
    with server as srv:
        print(f"\nRadixKV is serving '{name}' at {srv.url}/v1 (OpenAI-compatible)")
        print(f"Live dashboard (open it in a browser): {srv.url}/dashboard\n")
        print(f"Three questions sharing one {len(SYSTEM_PROMPT.split())}-word system prompt:\n")
        for i, question in enumerate(QUESTIONS, 1):
            r = _chat(srv.url, name, question, args.max_tokens)
            u = r["usage"]
            cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            ttft = f"{r['ttft']:.2f} s" if r["ttft"] is not None else "n/a"
            print(f"{i}. Q: {question}\n   A: {r['answer']}")
            print(
                f"   prompt {u.get('prompt_tokens')} tokens, {cached} served from the radix "
                f"cache, time to first token {ttft}\n"
            )
        stats = httpx.get(srv.url + "/cache/stats", timeout=60).json()
        print(
            f"Token hit rate so far: {stats['token_hit_rate']:.0%} "
            f"({stats['cached_prompt_tokens_total']} of {stats['prompt_tokens_total']} prompt "
            f"tokens); more at {srv.url}/dashboard, {srv.url}/metrics and {srv.url}/cache/stats"
        )
        if args.keep_serving:
            print(
                f"\nStill serving; try:\n  curl {srv.url}/v1/completions -H "
                f"'Content-Type: application/json' -d '{{\"prompt\": \"Hello\"}}'\n"
                "Ctrl-C stops."
            )
            try:
                while srv.thread.is_alive():
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
    return 0
