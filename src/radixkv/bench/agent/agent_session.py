"""The agent loop of `radixkv bench agent`: sessions that each resend a shared tool list, a system
prompt and their whole growing history to /v1/chat/completions, turn after turn (closed loop).

A session's turn k sends [system, task, (reply 1, result 1), ..., (reply k-1, result k-1)] with
the tools (as `tools`, or inside the system prompt), streams the answer and times it. The reply is
sent back as the server returned it (its text, or its `tool_calls` followed by one `tool` message
per call), so a server that caches what it generated can serve the next turn's whole history from
its cache; the result that follows is seeded filler of a drawn size (the same on every engine).
A session stops early, rather than fail, when its next turn would not fit the model's context.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from radixkv.bench.agent.agent_tools import Count, filler, system_with_tools, tool_list, words


@dataclass(frozen=True)
class AgentShape:
    """N sessions x T turns over a shared tool list; sizes in tokens of the model's tokenizer."""

    sessions: int = 4
    turns: int = 20
    tools_tokens: int = 6000
    system_tokens: int = 200
    task_tokens: int = 100
    result_tokens: tuple[int, int] = (100, 300)
    answer_tokens: tuple[int, int] = (50, 200)
    tool_choice: str = "auto"  # none | auto | required
    tools_mode: str = "native"  # native: `tools` in the request; system: in the system prompt
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1:
            raise ValueError("sessions and turns must be >= 1")
        for lo, hi in (self.result_tokens, self.answer_tokens):
            if not 0 <= lo <= hi:
                raise ValueError(f"bad range {lo}:{hi}")
        if self.tools_mode not in ("native", "system"):
            raise ValueError("tools_mode is native or system")
        if self.tool_choice not in ("none", "auto", "required"):
            raise ValueError("tool_choice is none, auto or required")


@dataclass
class AgentPlan:
    """Everything a run sends apart from the replies: seeded, so identical on every engine."""

    shape: AgentShape
    system: str
    tools: list[dict[str, Any]]
    tasks: list[str]  # the first user message of each session
    results: list[list[str]]  # results[s][k]: what follows session s's reply of turn k
    result_lens: list[list[int]]  # its length in tokens
    max_tokens: list[list[int]]  # max_tokens[s][k]

    def first_messages(self, s: int) -> list[dict[str, Any]]:
        system = self.system
        if self.shape.tools_mode == "system":
            system = system_with_tools(system, self.tools)
        return [{"role": "system", "content": system}, {"role": "user", "content": self.tasks[s]}]


def build_plan(shape: AgentShape, count: Count) -> AgentPlan:
    rng = random.Random(shape.seed)
    system = "You are a coding agent working in a repository. " + filler(
        count, shape.system_tokens, rng, "lines"
    )
    tasks = [f"Task {s + 1}: " + words(rng, shape.task_tokens) for s in range(shape.sessions)]
    result_lens = [
        [rng.randint(*shape.result_tokens) for _ in range(shape.turns)]
        for _ in range(shape.sessions)
    ]
    results = [[filler(count, n, rng) for n in row] for row in result_lens]
    max_tokens = [
        [max(1, rng.randint(*shape.answer_tokens)) for _ in range(shape.turns)]
        for _ in range(shape.sessions)
    ]
    tools = tool_list(count, shape.tools_tokens, shape.seed)
    return AgentPlan(shape, system, tools, tasks, results, result_lens, max_tokens)


@dataclass
class TurnRecord:
    session: int
    turn: int  # 1-based
    ok: bool = False
    error: str | None = None
    send_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reply:
    content: str = ""
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def message(self) -> dict[str, Any]:
        """The assistant message to send back, in OpenAI's shape."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return msg

    def feed(self, delta: dict[str, Any]) -> bool:
        """Add a streamed delta; True when it carried output (text or a tool call)."""
        seen = False
        if delta.get("content"):
            self.content += delta["content"]
            seen = True
        for tc in delta.get("tool_calls") or []:
            call = self.calls.setdefault(
                int(tc.get("index", 0)),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = tc.get("id") or call["id"]
            fn = tc.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
            seen = True
        return seen


async def chat_turn(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], rec: TurnRecord, t0: float
) -> Reply:
    """Stream one chat completion into `rec` (timings, usage); the reply. Never raises on a
    server's failure: `rec.error` says what went wrong."""
    reply = Reply()
    start = time.perf_counter()
    rec.send_s = start - t0
    try:
        async with http.post(url, json=body) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return reply
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    rec.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return reply
                for choice in chunk.get("choices") or []:
                    if reply.feed(choice.get("delta") or {}) and rec.ttft_s is None:
                        rec.ttft_s = time.perf_counter() - start
                    rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    rec.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = int(details.get("cached_tokens") or 0)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        return reply
    rec.e2e_s = time.perf_counter() - start
    rec.ttft_s = rec.e2e_s if rec.ttft_s is None else rec.ttft_s
    if rec.completion_tokens > 1:
        rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (rec.completion_tokens - 1)
    rec.tool_calls = len(reply.calls)
    rec.ok = True
    return reply


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    max_model_len: int
    api_key: str | None = None
    timeout_s: float = 3600.0


def _body(plan: AgentPlan, target: Target, messages: list[dict[str, Any]], k: int, s: int) -> dict:
    body: dict[str, Any] = {
        "model": target.model,
        "messages": messages,
        "max_tokens": plan.max_tokens[s][k],
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if plan.shape.tools_mode == "native":
        body["tools"] = plan.tools
        body["tool_choice"] = plan.shape.tool_choice
    return body


def _follow_up(reply: Reply, result: str) -> list[dict[str, Any]]:
    """The reply as sent back, then the result: to each tool call (the first gets the text, the
    others a short acknowledgement), or as the next user message when no tool was called."""
    out = [reply.message()]
    if not reply.calls:
        return [*out, {"role": "user", "content": result}]
    for n, i in enumerate(sorted(reply.calls)):
        call = reply.calls[i]
        call["id"] = call["id"] or f"call_{i}"
        text = result if n == 0 else "ok"
        out.append({"role": "tool", "tool_call_id": call["id"], "content": text})
    return out


async def run_session(
    http: aiohttp.ClientSession, plan: AgentPlan, target: Target, s: int, t0: float
) -> tuple[list[TurnRecord], str]:
    """Session `s`'s turns in order; the records and why it ended (done, error, context)."""
    url = target.base_url.rstrip("/") + "/v1/chat/completions"
    messages = plan.first_messages(s)
    records: list[TurnRecord] = []
    for k in range(plan.shape.turns):
        rec = TurnRecord(session=s, turn=k + 1)
        reply = await chat_turn(http, url, _body(plan, target, messages, k, s), rec, t0)
        records.append(rec)
        if not rec.ok:
            return records, "error"
        if k + 1 == plan.shape.turns:
            break
        # The next prompt: this one, the reply, the result and some template tokens.
        grows = rec.completion_tokens + plan.result_lens[s][k] + 32
        if rec.prompt_tokens + grows + plan.max_tokens[s][k + 1] > target.max_model_len:
            return records, "context"
        messages = [*messages, *_follow_up(reply, plan.results[s][k])]
    return records, "done"
