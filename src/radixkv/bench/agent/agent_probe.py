"""The TTFT probe of `radixkv bench agent`: what a turn costs once its history is cached.

A session's history of about H tokens (a system prompt, then user / assistant turns of seeded
filler) is sent once so the server caches it. Then, `reps` times, a new user message of N tokens
is sent two ways: alone, as the first message of a fresh chat (cold: nothing of it cached), and
after the cached history. Both stream up to 2 tokens; the ratio of their median TTFTs is what a
cached history adds to a turn (1.0: nothing; the attention of the N new tokens over the H cached
ones is the part no cache can save). `computed` is prompt - cached tokens, as the server reported.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import aiohttp

from radixkv.bench.agent.agent_session import Target, TurnRecord, chat_turn
from radixkv.bench.agent.agent_tools import Count, filler

MESSAGE_TOKENS = 1024  # filler per history message
TEMPLATE_SLACK = 8  # template tokens per message, at most, in the history estimate


def history(count: Count, tokens: int, seed: int) -> list[dict[str, Any]]:
    """System + alternating user / assistant messages whose contents total about `tokens`."""
    rng = random.Random(seed)
    msgs: list[dict[str, Any]] = []
    left = tokens
    while left > TEMPLATE_SLACK:
        n = min(MESSAGE_TOKENS, left - TEMPLATE_SLACK)
        role = "system" if not msgs else ("user" if len(msgs) % 2 else "assistant")
        msgs.append({"role": role, "content": filler(count, n, rng)})
        left -= n + TEMPLATE_SLACK
    if msgs and msgs[-1]["role"] == "user":  # the probe's own user message comes next
        msgs.append({"role": "assistant", "content": "Done."})
    return msgs


def _body(target: Target, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": target.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _side(recs: list[TurnRecord]) -> dict[str, Any]:
    ok = [r for r in recs if r.ok and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    return {
        "ttft_s": [round(t, 6) for t in ttfts],
        "ttft_median_s": statistics.median(ttfts) if ttfts else None,
        "prompt_tokens": [r.prompt_tokens for r in ok],
        "cached_tokens": [r.cached_tokens for r in ok],
        "computed_tokens": [r.prompt_tokens - r.cached_tokens for r in ok],
        "errors": [r.error for r in recs if not r.ok],
    }


async def ttft_probe(
    target: Target, count: Count, history_tokens: int, new_tokens: int, reps: int, seed: int = 0
) -> dict[str, Any]:
    """Run the probe (module doc) against `target`; its JSON-ready result."""
    if history_tokens + new_tokens + 2 > target.max_model_len:
        raise ValueError(
            f"history {history_tokens} + new {new_tokens} tokens exceed the model's "
            f"{target.max_model_len}-token context"
        )
    url = target.base_url.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    hist = history(count, history_tokens, seed)
    rng = random.Random(seed + 1)
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    t0 = time.perf_counter()
    alone: list[TurnRecord] = []
    after: list[TurnRecord] = []
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        warm = TurnRecord(session=0, turn=0)
        await chat_turn(
            http, url, _body(target, [*hist, {"role": "user", "content": "Go."}], 1), warm, t0
        )
        if not warm.ok:
            raise RuntimeError(f"the probe's history was refused: {warm.error}")
        for i in range(reps):
            new = {"role": "user", "content": f"Step {i}: " + filler(count, new_tokens, rng)}
            for messages, into in (([new], alone), ([*hist, new], after)):
                rec = TurnRecord(session=0, turn=i + 1)
                await chat_turn(http, url, _body(target, messages, 2), rec, t0)
                into.append(rec)
    a, h = _side(alone), _side(after)
    ratio = None
    if a["ttft_median_s"] and h["ttft_median_s"]:
        ratio = h["ttft_median_s"] / a["ttft_median_s"]
    return {
        "history_tokens": warm.prompt_tokens,
        "history_warm_s": warm.e2e_s,
        "new_tokens": new_tokens,
        "reps": reps,
        "alone": a,
        "after_history": h,
        "ttft_ratio": ratio,
    }
