"""`radixkv serve | generate | chat` (`radixkv demo`, built on them, is demo.py).

    radixkv serve                       # default model on http://127.0.0.1:8000 (engine process)
    radixkv serve --model DIR --port 9000 --api-key KEY --page-size 16
    radixkv generate "What is the capital of France?" --chat --max-tokens 32
    radixkv chat                        # multi-turn REPL; prints cached tokens per turn

Registration is cheap (argparse only); torch, the engine and uvicorn are imported inside the
command functions.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from radixkv.engine.types import RequestOptions, SamplingParams, StreamDelta
from radixkv.server.engine_link.launch import DEFAULT_MODEL_NAME

if TYPE_CHECKING:
    from radixkv.config import EngineConfig

log = logging.getLogger("radixkv.server")


def register(subparsers: Any) -> None:
    from radixkv.config import ServerConfig

    serve = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_model_args(serve)
    # No torch.compile by default: every numeric step of the Llama path is a C++ op, so the
    # compiled and eager models run equally fast (docs/determinism.md) and eager starts ~6 s sooner.
    # --host, --port, --api-key, --served-model-name, --log-level, --threads, --in-process
    ServerConfig.add_args(serve)
    serve.set_defaults(func=cmd_serve)

    gen = subparsers.add_parser("generate", help="one-shot generation, streamed to the terminal")
    gen.add_argument("prompt", help="prompt text (raw, or a user message with --chat)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--system", default=None, help="system message (with --chat)")
    add_model_args(gen)
    _add_sampling_args(gen, default_max_tokens=128)
    gen.set_defaults(func=cmd_generate)

    chat = subparsers.add_parser("chat", help="interactive multi-turn chat (reads stdin)")
    chat.add_argument("--system", default=None, help="system message")
    add_model_args(chat)
    _add_sampling_args(chat, default_max_tokens=256)
    chat.set_defaults(func=cmd_chat)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The engine flags (`--model`, the cache, scheduler and device) every model command takes."""
    from radixkv.engine.args import add_engine_args

    add_engine_args(parser)  # includes --model (default: the embedded SmolLM2-135M-Instruct)


def _add_sampling_args(parser: argparse.ArgumentParser, default_max_tokens: int) -> None:
    parser.add_argument("--max-tokens", type=int, default=default_max_tokens)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")


def _sampling(args: argparse.Namespace) -> SamplingParams:
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        # --seed (an engine flag) seeds unseeded sampling, so runs are reproducible.
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
    params.validate()
    return params


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The validated configuration chain the flags describe. An invalid one ends the command
    before any model is loaded, with every problem listed by flag (exit status 2)."""
    from radixkv.config import ConfigError, EngineConfig

    try:
        return EngineConfig.from_args(args).validate()
    except ConfigError as exc:
        print(f"radixkv: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def build_engine(args: argparse.Namespace) -> Any:
    """The Engine the flags describe, built in this process, after the configuration printout."""
    from radixkv.server.engine_link.launch import build_engine_from_config

    config = config_from_args(args)
    log.info("%s", config.format())
    return build_engine_from_config(config)


def model_name_for(args: argparse.Namespace) -> str:
    if getattr(args, "served_model_name", None):
        return str(args.served_model_name)
    model = getattr(args, "model", None)
    return Path(model).resolve().name if model else DEFAULT_MODEL_NAME


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from radixkv.server.app import create_app
    from radixkv.server.engine_link.engine_proc import EngineStartError
    from radixkv.server.engine_link.launch import close_server_engine, open_server_engine
    from radixkv.server.openai.prompts import load_chat_template

    setup_logging(args.log_level)
    config = config_from_args(args)
    srv = config.server
    log.info("%s", config.format())
    if srv.chat_template is not None:  # a bad path fails here, not after the model loads
        try:
            load_chat_template(srv.chat_template)
        except ValueError as exc:
            log.error("%s", exc)
            return 2
    try:
        engine = open_server_engine(config)
    except EngineStartError as exc:
        log.error("the engine could not start: %s", exc)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while the model loads (the engine process is ended)
        return 130
    try:
        name = model_name_for(args)
        app = create_app(engine, name, api_key=srv.api_key, config=config)
        log.info(
            "serving '%s' at http://%s:%d/v1 (auth: %s, engine %s); metrics at /metrics, cache "
            "stats at /cache/stats, live dashboard at /dashboard",
            name,
            srv.host,
            srv.port,
            "Bearer key required" if srv.api_key else "none",
            "in-process" if srv.in_process else f"process pid {engine.pid}",
        )
        # Bounded graceful shutdown: open streams are cut (and aborted) after 5 s; the app's
        # lifespan then stops the engine process.
        uvicorn.run(
            app,
            host=srv.host,
            port=srv.port,
            log_level=srv.log_level,
            timeout_graceful_shutdown=5,
        )
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
    finally:
        close_server_engine(engine)
    return 0


def run_one(
    engine: Any,
    prompt_ids: list[int],
    sampling: SamplingParams,
    on_text: Callable[[str], None],
    options: RequestOptions | None = None,
) -> tuple[str, StreamDelta, float | None]:
    """Run one request to completion in-process; returns (text, final delta, TTFT seconds).

    Ctrl-C aborts the request (its slots are released) and returns what was generated so far.
    """
    t0 = time.perf_counter()
    rid = engine.add_request(prompt_ids, sampling, options=options or RequestOptions())
    parts: list[str] = []
    ttft: float | None = None
    final: StreamDelta | None = None
    while final is None:
        try:
            deltas = engine.step()
        except KeyboardInterrupt:
            aborted = engine.abort(rid)
            final = aborted if isinstance(aborted, StreamDelta) else StreamDelta(rid, [], "", True)
            final.finish_reason = "abort"
            break
        for delta in deltas:
            if delta.request_id != rid:
                continue
            if delta.new_token_ids and ttft is None:
                ttft = time.perf_counter() - t0
            if delta.new_text:
                parts.append(delta.new_text)
                on_text(delta.new_text)
            if delta.finished:
                final = delta
        if final is None and not engine.has_unfinished():
            raise RuntimeError("engine lost the request")
    if final.error:
        raise RuntimeError(f"generation failed: {final.error}")
    return "".join(parts), final, ttft


def _stats_line(final: StreamDelta, ttft: float | None, elapsed: float, prefix: str = "") -> str:
    pct = 100.0 * final.cached_tokens / final.prompt_tokens if final.prompt_tokens else 0.0
    rate = final.completion_tokens / elapsed if elapsed > 0 else 0.0
    ttft_s = f"{ttft:.3f} s" if ttft is not None else "n/a"
    return (
        f"[{prefix}prompt {final.prompt_tokens} tokens, cached {final.cached_tokens} "
        f"({pct:.0f}%), generated {final.completion_tokens}, TTFT {ttft_s}, {rate:.1f} tok/s, "
        f"finish={final.finish_reason}]"
    )


def _emit(out: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        out.write(text)
        out.flush()

    return write


def cmd_generate(args: argparse.Namespace) -> int:
    setup_logging("warning")
    sampling = _sampling(args)
    engine = build_engine(args)
    tok = engine.tokenizer
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": args.prompt})
        ids = list(tok.apply_chat_template(messages, add_generation_prompt=True))
    else:
        ids = list(tok.encode(args.prompt))
    t0 = time.perf_counter()
    _, final, ttft = run_one(engine, ids, sampling, _emit(sys.stdout))
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(_stats_line(final, ttft, time.perf_counter() - t0), file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """Multi-turn chat on the model's template; each turn re-sends the whole conversation, so
    everything up to the last answer is served from the radix cache (shown per turn)."""
    setup_logging("warning")
    sampling = _sampling(args)
    engine = build_engine(args)
    tok = engine.tokenizer
    interactive = sys.stdin.isatty()
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    out = sys.stdout
    if interactive:
        out.write("radixkv chat: /reset clears the conversation, /exit or Ctrl-D quits.\n")
    turn = 0
    while True:
        if interactive:
            out.write("you> ")
            out.flush()
        line = sys.stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages = list(system)
            out.write("[conversation reset]\n")
            continue
        turn += 1
        messages.append({"role": "user", "content": text})
        ids = list(tok.apply_chat_template(messages, add_generation_prompt=True))
        out.write("assistant> ")
        t0 = time.perf_counter()
        options = RequestOptions(session_id="cli-chat")
        reply, final, ttft = run_one(engine, ids, sampling, _emit(out), options)
        out.write(
            "\n" + _stats_line(final, ttft, time.perf_counter() - t0, f"turn {turn}: ") + "\n"
        )
        out.flush()
        messages.append({"role": "assistant", "content": reply})
    return 0
