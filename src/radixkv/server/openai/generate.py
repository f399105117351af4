"""A tokenized request into the engine, and its answer: the sampling parameters a request runs
with (the context bound applied), its submission as a `Generation`, and the HTTP response — one
JSON body, or an SSE stream whose end always releases the request. Shared by the OpenAI routes
(app.py) and the agent APIs (server/apis), so every API runs the same engine path."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from radixkv.engine.types import RequestError, SamplingParams
from radixkv.server.openai.protocol import APIError
from radixkv.server.openai.serving import Generation, Kind
from radixkv.server.tool_calling.tools import ToolPlan

if TYPE_CHECKING:
    from radixkv.server.app import ServerState

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 512


def sampling_for(
    state: ServerState,
    kind: Kind,
    req: Any,
    prompt_ids: list[int],
    tool_plan: ToolPlan | None = None,
    prompt_param: str | None = None,
) -> SamplingParams:
    """The request's SamplingParams for this prompt (400, naming `prompt_param`, if the prompt
    fills the context)."""
    default_max = DEFAULT_CHAT_MAX_TOKENS if kind == "chat" else DEFAULT_COMPLETION_MAX_TOKENS
    limit = state.max_model_len
    if limit is not None:
        if len(prompt_ids) >= limit:
            raise APIError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {limit} "
                "(prompt + output); shorten the prompt",
                param=prompt_param or ("messages" if kind == "chat" else "prompt"),
                code="context_length_exceeded",
            )
        default_max = min(default_max, limit - len(prompt_ids))  # an unset max_tokens fits
    params: SamplingParams = req.sampling(default_max, state.vocab_size)
    if tool_plan is not None and tool_plan.grammar is not None and params.json_schema is None:
        params = dataclasses.replace(params, grammar=tool_plan.grammar)
    return params


async def start_generation(
    state: ServerState,
    kind: Kind,
    req: Any,
    prompt_ids: list[int],
    request_id: str,
    tool_plan: ToolPlan | None = None,
    prompt_param: str | None = None,
) -> Generation:
    """Submit the request; the Generation that follows it (its owner must end it: `collect`,
    or a stream whose response runs `finish()`)."""
    t0 = time.perf_counter()
    sampling = sampling_for(state, kind, req, prompt_ids, tool_plan, prompt_param)
    try:
        stream = await state.engine.submit(request_id, prompt_ids, sampling, req.options())
    except RequestError as exc:  # the grammar of a forced tool_choice comes from the tools
        from_tools = tool_plan is not None and (tool_plan.forced or tool_plan.grammar)
        if from_tools and exc.param == "response_format":
            msg = str(exc).replace("JSON schema", "tool schema")
            raise RequestError(msg, exc.code, "tools") from None
        raise
    echo = None
    if kind == "completion" and req.echo:
        p = req.prompt_text_or_ids()
        echo = p if isinstance(p, str) else state.tokenizer.decode(p)
    gen = Generation(
        state,
        kind,
        request_id,
        stream,
        len(prompt_ids),
        t0,
        req.session_id,
        req.include_usage,
        n=sampling.n,
        logprobs=sampling.logprobs is not None,
        echo=echo,
        tool_plan=tool_plan,
    )
    gen.cache_salt = req.options().cache_salt  # for the dashboard's (hashed) namespace column
    return gen


def event_stream(body: AsyncIterator[str], gen: Generation) -> StreamingResponse:
    """An SSE response over `body` (which should run `gen.finish()` in its own `finally`)."""
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        # Runs even if the client left before the body iterator started (then the body's own
        # `finally` never runs): the request is still aborted and accounted.
        background=BackgroundTask(gen.finish),
    )


async def respond(
    state: ServerState,
    request: Request,
    kind: Kind,
    req: Any,
    prompt_ids: list[int],
    tool_plan: ToolPlan | None = None,
) -> Response:
    """Submit an OpenAI completions / chat request and answer it as JSON or as an SSE stream."""
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    gen = await start_generation(state, kind, req, prompt_ids, request_id, tool_plan)
    if req.stream:
        return event_stream(gen.sse(), gen)
    return JSONResponse(await gen.collect(request))
