"""Generation handlers shared by /v1/completions and /v1/chat/completions.

One `Generation` follows one request (all of its n choices) from submission to its finished
delta, building either a single JSON response or an SSE stream of chunks (OpenAI wire format).
Each delta belongs to one choice (`delta.index`); a choice is done when its delta carries a
finish_reason, the request when a delta has `finished`. Invariant: however the response ends —
finished, client gone, server error — `finish()` runs exactly once, and if the engine did not
report the request finished, the request is aborted so every choice's slots and locks are
released. Usage counts the prompt once and sums completion tokens over the choices. With a tool
plan each chat choice reads its output through a ToolCallStream (tool_stream.py): its message gets
`tool_calls`, its stream `tool_calls` deltas, and a choice that called a tool and stopped
finishes with "tool_calls".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from starlette.requests import Request

from radixkv.engine.types import StreamDelta
from radixkv.server.openai.logprobs import LogprobsBuilder
from radixkv.server.openai.protocol import APIError
from radixkv.server.tool_calling.tool_stream import ToolCallStream
from radixkv.server.tool_calling.tools import ToolPlan

if TYPE_CHECKING:
    from radixkv.server.app import ServerState

Kind = Literal["completion", "chat"]


class Generation:
    """State of one in-flight generation request, from its first delta to its finish."""

    def __init__(
        self,
        state: ServerState,
        kind: Kind,
        request_id: str,
        stream: asyncio.Queue[StreamDelta],
        prompt_len: int,
        t0: float,
        session_id: str | None,
        include_usage: bool,
        n: int = 1,
        logprobs: bool = False,
        echo: str | None = None,
        tool_plan: ToolPlan | None = None,
    ) -> None:
        self.state = state
        self.kind = kind
        self.request_id = request_id
        self.stream = stream
        self.t0 = t0
        self.session_id = session_id
        self.include_usage = include_usage
        self.created = int(time.time())
        self.prompt_tokens = prompt_len
        self.cached_tokens = 0
        self.echo = echo  # completions echo: the prompt text starts every choice
        self.choices = [_Choice(i) for i in range(n)]
        if logprobs:
            offset = len(echo or "")
            for c in self.choices:
                c.logprobs = LogprobsBuilder(kind, state.token_text, offset)
        if tool_plan is not None and kind == "chat":
            for c in self.choices:
                c.tools = ToolCallStream(tool_plan.parser, single=tool_plan.single)
        self.finish_reason: str | None = None  # of the request: set when it ended
        self.error: str | None = None
        self._first_token = False
        self.ttft_s: float | None = None
        self.cache_salt: str | None = None
        self._done = False
        self._ended = False  # the engine reported the request finished

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    # ---- delta bookkeeping ----
    async def next_delta(self) -> StreamDelta:
        delta = await self.stream.get()
        if delta.prompt_tokens:
            self.prompt_tokens = delta.prompt_tokens
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        choice = self.choices[delta.index] if delta.index < len(self.choices) else None
        if choice is not None:
            choice.parts.append(delta.new_text)
            choice.token_ids.extend(delta.new_token_ids)
            choice.completion_tokens = max(choice.completion_tokens, delta.completion_tokens)
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason
        if delta.new_token_ids and not self._first_token:
            self._first_token = True
            self.ttft_s = time.perf_counter() - self.t0
            self.state.metrics.ttft.observe(self.ttft_s)
        if delta.finish_reason in ("abort", "error"):
            self.finish_reason = delta.finish_reason  # any failed choice fails the request
            self.error = delta.error
        if delta.finished:
            self._ended = True
            self.finish_reason = self.finish_reason or delta.finish_reason or "stop"
            self.error = self.error or delta.error
        return delta

    def _logprobs(self, delta: StreamDelta) -> dict[str, Any] | None:
        """The logprobs piece for this delta's tokens (None when not requested)."""
        choice = self.choices[delta.index]
        if choice.logprobs is None:
            return None
        return choice.logprobs.add(delta.new_token_ids, delta.logprobs or [])

    def finish(self) -> None:
        """Release and account the request; idempotent, safe from `finally`."""
        if self._done:
            return
        self._done = True
        if not self._ended:  # client went away or we failed: free what it holds
            self.state.engine.abort(self.request_id)
            self.finish_reason = self.finish_reason or "abort"
        m = self.state.metrics
        m.finished.labels(self.finish_reason).inc()
        m.latency.observe(time.perf_counter() - self.t0)
        m.request_prompt_tokens.inc(self.prompt_tokens)
        m.request_cached_tokens.inc(self.cached_tokens)
        self.state.recent.record(self, self.cache_salt)
        if self.session_id is not None:
            self.state.sessions.record(
                self.session_id, self.prompt_tokens, self.cached_tokens, self.completion_tokens
            )

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _failure(self) -> APIError:
        if self.finish_reason == "abort":
            return APIError("request aborted", 503, type="server_error", code="aborted")
        return APIError(self.error or "generation failed", 500, type="server_error")

    # ---- non-streaming ----
    async def collect(self, request: Request) -> dict[str, Any]:
        """Run to completion; a client disconnect aborts the request."""
        watcher = asyncio.create_task(_abort_on_disconnect(request, self))
        try:
            while True:
                delta = await self.next_delta()
                if delta.index < len(self.choices) and delta.new_token_ids:
                    self._logprobs(delta)
                if delta.finished:
                    break
        finally:
            watcher.cancel()
            self.finish()
        if self.finish_reason in ("abort", "error"):
            raise self._failure()
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": [self._final_choice(c) for c in self.choices],
            "usage": self.usage(),
        }

    def _final_choice(self, c: _Choice) -> dict[str, Any]:
        text = "".join(c.parts)
        lps = c.logprobs.total() if c.logprobs is not None else None
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if c.tools is not None:
                message = c.tools.message(text)
            return {
                "index": c.index,
                "message": message,
                "logprobs": lps,
                "finish_reason": c.final_reason(),
            }
        return {
            "index": c.index,
            "text": (self.echo or "") + text,
            "logprobs": lps,
            "finish_reason": c.finish_reason,
        }

    # ---- streaming ----
    def _chunk(
        self,
        text: str | None,
        finish_reason: str | None,
        role: bool = False,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        tool_delta: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if tool_delta is not None:
                delta.update(tool_delta)
            elif text:
                delta["content"] = text
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        else:
            choice = {
                "index": index,
                "text": text or "",
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        return self._event(choices=[choice])

    def _event(self, choices: list[Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return body

    async def sse(self) -> AsyncIterator[str]:
        """SSE events ending with `data: [DONE]`; cancellation (disconnect) aborts via finish()."""
        try:
            try:
                async for body in self.chunks():
                    yield f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
            except APIError as err:  # the request failed after its response started
                yield f"data: {json.dumps(err.body())}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.finish()

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunk bodies (chat.completion.chunk / text_completion), the usage chunk
        last when asked for. If the request fails, any text it still produced comes first, then
        the failure is raised (APIError). The caller runs `finish()` (sse() does)."""
        for c in self.choices:
            if self.kind == "chat":
                yield self._chunk(None, None, role=True, index=c.index)
            elif self.echo:
                yield self._chunk(self.echo, None, index=c.index)
        while True:
            delta = await self.next_delta()
            if self.finish_reason in ("abort", "error"):
                if delta.new_text:
                    yield self._chunk(delta.new_text, None, index=delta.index)
                raise self._failure()
            lps = self._logprobs(delta) if delta.new_token_ids else None
            choice = self.choices[delta.index] if delta.index < len(self.choices) else None
            if choice is not None and choice.tools is not None:
                tool_delta = choice.tools.feed(delta.new_text)
                if delta.finish_reason:
                    tool_delta = _merge(tool_delta, choice.tools.finish())
                if tool_delta or delta.finish_reason or lps is not None:
                    reason = choice.final_reason() if delta.finish_reason else None
                    yield self._chunk(
                        None, reason, index=delta.index, logprobs=lps, tool_delta=tool_delta
                    )
            elif delta.new_text or delta.finish_reason or lps is not None:
                yield self._chunk(
                    delta.new_text, delta.finish_reason, index=delta.index, logprobs=lps
                )
            if delta.finished:
                break
        if self.include_usage:
            yield self._event(choices=[], usage=self.usage())


class _Choice:
    """One choice's accumulated output."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.parts: list[str] = []  # the output text as the engine streamed it
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.logprobs: LogprobsBuilder | None = None
        self.tools: ToolCallStream | None = None

    def final_reason(self) -> str | None:
        """OpenAI's finish_reason: "tool_calls" when the model stopped after calling a tool."""
        if self.tools is not None and self.tools.called and self.finish_reason == "stop":
            return "tool_calls"
        return self.finish_reason


def _merge(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """Two chunk deltas as one: content concatenated, tool_call items in order."""
    out = dict(first)
    if "content" in last:
        out["content"] = out.get("content", "") + last["content"]
    if "tool_calls" in last:
        out["tool_calls"] = out.get("tool_calls", []) + last["tool_calls"]
    return out


async def _abort_on_disconnect(request: Request, gen: Generation) -> None:
    """Wait for the client to hang up (non-streaming requests) and abort its request."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gen.finish()
            return
