"""A small deterministic engine that follows the Engine contract (radixkv.engine.types).

Used to test the server's threading, protocol and fault handling in isolation and fast; the
end-to-end tests run the real engine. Its "model" emits lowercase letters derived from the
context; its "prefix cache" remembers finished sequences per namespace and reports the longest
shared prefix (capped at len(prompt) - 1), and it keeps a slot census like the real one:
free + cached + held == pool, checked by check_memory().
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from radixkv.engine.types import (
    EngineConfig,
    EngineMetrics,
    RequestError,
    RequestOptions,
    SamplingParams,
    StreamDelta,
)

EOS = 1
_NO_OPTIONS = RequestOptions()


class FakeTokenizer:
    vocab_size = 260
    eos_token_ids = (EOS,)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [min(ord(c), 255) + 4 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 4) for i in ids if i >= 4)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return self.encode(text + ("<assistant>" if add_generation_prompt else ""))


@dataclass
class _Req:
    rid: str
    ids: list[int]
    sampling: SamplingParams
    options: RequestOptions
    prompt_len: int
    cached: int
    out: list[int] = field(default_factory=list)


class FakeEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        step_delay: float = 0.0,
        fail_at_step: int | None = None,
    ) -> None:
        self.config = config or EngineConfig(num_slots=4096, max_model_len=512)
        self.tokenizer = FakeTokenizer()
        self.step_delay = step_delay
        self.fail_at_step = fail_at_step  # step() raises from this step on (a crash)
        self.pool = self.config.cache.num_slots or 4096
        self.max_model_len = self.config.scheduler.max_model_len or 512
        self.running: dict[str, _Req] = {}
        self.stored: dict[object, list[list[int]]] = {}
        self.tree_tokens = 0
        self.prompt_total = 0
        self.cached_total = 0
        self.generated = 0
        self.finished = 0
        self.steps = 0
        self.fail_next_step = False

    def add_request(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        options: RequestOptions = _NO_OPTIONS,
    ) -> str:
        sampling.validate()
        if len(prompt_ids) + sampling.max_tokens > self.max_model_len:
            raise RequestError("prompt + max_tokens exceed the context", param="max_tokens")
        if len(self.running) >= self.config.scheduler.max_queued_requests:
            raise RequestError("queue full", 503)
        rid = request_id or f"r{len(self.running)}"
        cached = 0
        if self.config.prefix_cache_enabled:
            for seq in self.stored.get(options.namespace, []):
                n = 0
                while n < min(len(seq), len(prompt_ids) - 1) and seq[n] == prompt_ids[n]:
                    n += 1
                cached = max(cached, n)
        self.running[rid] = _Req(rid, list(prompt_ids), sampling, options, len(prompt_ids), cached)
        self.prompt_total += len(prompt_ids)
        self.cached_total += cached
        return rid

    def step(self) -> list[StreamDelta]:
        crash_now = self.fail_at_step is not None and self.steps >= self.fail_at_step
        if self.fail_next_step or crash_now:
            raise RuntimeError("injected failure")
        time.sleep(self.step_delay)
        self.steps += 1
        deltas = []
        for req in list(self.running.values()):
            tok = (sum(req.ids[-3:]) * 31 + 7) % 26 + ord("a") + 4
            req.ids.append(tok)
            req.out.append(tok)
            self.generated += 1
            done = len(req.out) >= req.sampling.max_tokens
            deltas.append(self._delta(req, [tok], done, "length" if done else None))
            if done:
                self._finish(req, store=True)
        return deltas

    def _delta(self, req: _Req, new: list[int], done: bool, reason: str | None) -> StreamDelta:
        return StreamDelta(
            req.rid,
            new,
            self.tokenizer.decode(new),
            finished=done,
            finish_reason=reason,  # type: ignore[arg-type]
            prompt_tokens=req.prompt_len,
            cached_tokens=req.cached,
            completion_tokens=len(req.out),
        )

    def _finish(self, req: _Req, store: bool) -> None:
        del self.running[req.rid]
        self.finished += 1
        if store and self.config.prefix_cache_enabled:
            self.stored.setdefault(req.options.namespace, []).append(req.ids)
            self.tree_tokens += len(req.ids)

    def has_unfinished(self) -> bool:
        return bool(self.running)

    def abort(self, request_id: str) -> StreamDelta | None:
        req = self.running.get(request_id)
        if req is None:
            return None
        self._finish(req, store=False)
        return self._delta(req, [], True, "abort")

    def flush_cache(self) -> bool:
        self.stored.clear()
        self.tree_tokens = 0
        return True

    def held(self) -> int:
        return sum(len(r.ids) for r in self.running.values())

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            running_requests=len(self.running),
            waiting_requests=0,
            pool_slots=self.pool,
            free_slots=self.pool - self.held() - self.tree_tokens,
            cached_tokens_in_tree=self.tree_tokens,
            evictable_tokens=self.tree_tokens,
            prompt_tokens_total=self.prompt_total,
            cached_prompt_tokens_total=self.cached_total,
            generated_tokens_total=self.generated,
            num_preemptions=0,
            finished_requests=self.finished,
        )

    def check_memory(self) -> None:
        m = self.metrics()
        if m.free_slots + m.cached_tokens_in_tree + self.held() != self.pool:
            raise AssertionError("census broken")


def broken_factory() -> FakeEngine:
    """An engine factory that fails like a bad model path does (for start-up error tests)."""
    raise FileNotFoundError("no model at /nowhere/config.json")
