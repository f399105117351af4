"""Request bodies into prompts: a body read within its size bound, parsed and checked, and its
prompt tokenized (a completion's text or ids; a chat's messages, and tools, through the model's
chat template), with how a chat's output is read for tool calls. Every bad input is an
OpenAI-style 4xx (APIError), never FastAPI's 422."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import Request
from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixkv.server.openai.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)
from radixkv.server.tool_calling.tools import (
    ToolPlan,
    auto_grammar,
    output_parser,
    render_with_tools,
)

if TYPE_CHECKING:
    from radixkv.server.app import ServerState

MAX_BODY_BYTES = 32 * 2**20  # far above any context we serve; bounds memory per request


async def read_body(request: Request) -> bytes:
    """The request body, refusing (413) anything larger than MAX_BODY_BYTES before buffering it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(f"request body over {MAX_BODY_BYTES} bytes", 413, code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise APIError(f"request body over {MAX_BODY_BYTES} bytes", 413, code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def completion_prompt(state: ServerState, req: CompletionRequest) -> list[int]:
    prompt = req.prompt_text_or_ids()
    if isinstance(prompt, str):
        ids = list(state.tokenizer.encode(prompt, req.add_special_tokens))
    else:
        ids = prompt
        bad = [t for t in ids if not 0 <= t < state.vocab_size]
        if bad:
            raise APIError(
                f"prompt token id {bad[0]} is outside the vocabulary [0, {state.vocab_size})",
                param="prompt",
                code="invalid_value",
            )
    if not ids:
        raise APIError("prompt is empty", param="prompt", code="invalid_value")
    return ids


async def parse_completion(
    state: ServerState, request: Request
) -> tuple[CompletionRequest, list[int]]:
    """A /v1/completions body, checked, and its prompt's token ids."""
    req = parse_body(CompletionRequest, await read_body(request))
    state.check_model(req.model)
    req.check(state.vocab_size)
    # Tokenizing a long prompt takes milliseconds: keep it off the event loop.
    return req, await asyncio.to_thread(completion_prompt, state, req)


async def parse_chat(
    state: ServerState, request: Request
) -> tuple[ChatCompletionRequest, list[int], ToolPlan | None]:
    """A /v1/chat/completions body, checked, its messages (and tools) rendered by the chat
    template, and how its output is read for tool calls (None: as plain content)."""
    req = parse_body(ChatCompletionRequest, await read_body(request))
    state.check_model(req.model)
    req.check(state.vocab_size)
    ids, plan = await chat_prompt(state, req)
    return req, ids, plan


async def chat_prompt(
    state: ServerState, req: ChatCompletionRequest, param: str = "messages"
) -> tuple[list[int], ToolPlan | None]:
    """A checked chat request's prompt token ids (its messages and tools through the model's chat
    template) and its tool plan; a template failure is a 400 naming `param`."""
    try:
        if req.uses_tools:
            text = await asyncio.to_thread(
                render_with_tools, state.tokenizer, req.template_messages(), req.tools
            )
            ids = await asyncio.to_thread(state.tokenizer.encode, text)
        else:
            ids = await asyncio.to_thread(
                state.tokenizer.apply_chat_template, req.template_messages(), True
            )
    except APIError:
        raise
    except Exception as exc:  # template errors (e.g. role order) are the caller's input
        raise APIError(f"chat template failed: {exc}", param=param) from None
    return list(ids), tool_plan(state, req)


def tool_plan(state: ServerState, req: ChatCompletionRequest) -> ToolPlan | None:
    """The parser for this request's output; 400 for `auto` when no format is known."""
    mode, name = req.tool_mode()
    if mode == "none":
        return None
    parser = output_parser(mode, name, state.tool_call_parser)
    if parser is None:
        raise APIError(
            "tool_choice 'auto' needs the model's tool-call format, which its chat template does "
            "not reveal: start the server with --tool-call-parser",
            param="tool_choice",
            code="unsupported",
        )
    grammar = None
    if mode == "auto" and req.response_format in (None, {"type": "text"}):
        grammar = auto_grammar(state.tool_call_parser, req.tools or [])
    forced = mode != "auto"
    return ToolPlan(parser, single=not req.parallel_tool_calls, forced=forced, grammar=grammar)


def load_chat_template(value: str) -> str:
    """The template `--chat-template` names: the text of the file at `value`, else `value` itself
    when it reads as a Jinja template ('{{' or '{%'); ValueError for anything else (a mistyped
    path must not become the template), or a template Jinja cannot compile."""
    path = Path(value).expanduser()
    if "{{" not in value and "{%" not in value:
        if not path.is_file():
            raise ValueError(f"--chat-template: no such file: {value}")
        value = path.read_text()
    try:  # parsed with the extension the tokenizer compiles templates with (model/tokenizer.py)
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(value)
    except TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template does not compile: {exc}") from None
    return value
