"""Public types of the in-process Engine API (shared by the engine, the server and benchmarks).

The Engine (radixkv.engine.engine.Engine) contract, which the server and benchmarks build on:

    engine = Engine(model=None | "path/to/hf_dir", config=EngineConfig(...))  # None → default model
    engine.tokenizer                      # radixkv.model.tokenizer.Tokenizer
    engine.config                         # the EngineConfig in force (radixkv.config)
    engine.generate(prompts, sampling)    # str | list[int] | list[str] | list[list[int]]
                                          #   → list[RequestOutput] (blocking, batched; with
                                          #   n > 1, every choice of each prompt, in order)
    engine.stream(prompt, sampling)       # → Iterator[StreamDelta] (blocking, one request)
    engine.add_request(prompt_ids, sampling, request_id=None, options=RequestOptions())
                                          #   → request_id; raises RequestError on bad input
    engine.step()                         # one scheduler step → list[StreamDelta] (one per choice
                                          #   that produced tokens or finished this step)
    engine.has_unfinished()               # → bool
    engine.abort(request_id)              # frees/unlocks what the request held; its last delta
                                          #   has finish_reason="abort"
    engine.flush_cache()                  # drops every unlocked cached prefix → bool
    engine.metrics()                      # → EngineMetrics snapshot
    engine.check_memory()                 # raises if free + cached + held != pool size

The engine is single-threaded: one thread owns it and calls step(); a server wraps it in a loop
thread and hands requests in through a thread-safe queue.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

# The configuration chain lives in radixkv.config; re-exported here for callers of the flat era.
from radixkv.config import EngineConfig as EngineConfig

FinishReason = Literal["stop", "length", "abort", "error"]
MAX_LOGPROBS = 20  # top alternatives per position (OpenAI's chat cap)
# One token's log-probabilities: (sampled token's logprob, [(token id, logprob)] best first).
TokenLogprobs = tuple[float, list[tuple[int, float]]]


class RequestError(ValueError):
    """Bad input for one request (too long, token id out of vocab, bad sampling values...).

    `code` is an HTTP-ish status the server can map directly (400 invalid, 413 too large,
    503/429 overloaded).
    """

    def __init__(self, message: str, code: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param

    def __reduce__(self) -> tuple[type[RequestError], tuple[str, int, str | None]]:
        # Keep code and param when the error crosses from the engine process to the server.
        return (RequestError, (str(self), self.code, self.param))


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 / 0 → disabled
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Parallel sampling: n choices forked from one prefill of the prompt (engine caps it).
    n: int = 1
    # Log-probabilities of the raw logits (f32 log-softmax before temperature, penalties, bias
    # and grammar): None → none; k >= 0 → the sampled token's plus the top k per position.
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    presence_penalty: float = 0.0  # OpenAI: minus this once for any token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this per earlier occurrence in the output
    repetition_penalty: float = 1.0  # HF/vLLM: >1 discourages prompt+output tokens
    # Structured output: a JSON Schema as JSON text (plain data: the engine compiles it), or
    # a grammar in llguidance's Lark syntax (e.g. tool calls inside free text); not both.
    json_schema: str | None = None
    grammar: str | None = None

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise RequestError("max_tokens must be >= 1", param="max_tokens")
        if self.n < 1:
            raise RequestError("n must be >= 1", param="n")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_LOGPROBS}]", param="logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise RequestError(f"{name} must be in [-2, 2]", param=name)
        if self.repetition_penalty <= 0:
            raise RequestError("repetition_penalty must be > 0", param="repetition_penalty")
        for _, bias in self.logit_bias:
            if not -100.0 <= bias <= 100.0:
                raise RequestError("logit_bias values must be in [-100, 100]", param="logit_bias")
        if self.temperature < 0:
            raise RequestError("temperature must be >= 0", param="temperature")
        if not 0 < self.top_p <= 1:
            raise RequestError("top_p must be in (0, 1]", param="top_p")
        if self.top_k < -1:
            raise RequestError("top_k must be -1 (off) or >= 0", param="top_k")
        if self.json_schema is not None and self.grammar is not None:
            raise RequestError("a JSON schema and a grammar cannot both constrain one request")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def processed(self) -> bool:
        """True when the logits are changed before sampling (penalties, bias, grammar)."""
        return bool(
            self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.json_schema is not None
            or self.grammar is not None
        )


@dataclass(frozen=True)
class RequestOptions:
    """Per-request cache controls."""

    cache_salt: str | None = None  # a namespace: different salts never share KV
    priority: int = 0  # for the `priority` eviction policy (lower evicted first)
    session_id: str | None = None  # plumbed through for session stats / session-aware eviction

    @property
    def namespace(self) -> Hashable | None:
        return self.cache_salt


@dataclass
class StreamDelta:
    """What one choice of a request produced in one step (new tokens and text), or its finish.

    A request with n choices reports each choice under the same `request_id` with its `index`.
    `finish_reason` set ⇒ that choice is done; `finished` ⇒ the whole request is done (set on
    exactly one delta per request, the last one). With n == 1 the two coincide.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0  # this choice's total so far
    index: int = 0  # the choice
    logprobs: list[TokenLogprobs] | None = None  # one per new token, when requested


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float | None = None  # time from arrival to the first output token
    latency_s: float | None = None
    error: str | None = None
    index: int = 0  # the choice (generate() returns every choice of an n > 1 request)
    logprobs: list[TokenLogprobs] | None = None


@dataclass(frozen=True)
class EngineMetrics:
    running_requests: int
    waiting_requests: int
    pool_slots: int
    free_slots: int
    cached_tokens_in_tree: int
    evictable_tokens: int
    prompt_tokens_total: int
    cached_prompt_tokens_total: int
    generated_tokens_total: int
    num_preemptions: int
    finished_requests: int
    # Per component pool ("full", "swa", "state"): size, free, cached (in the tree), held (by
    # running requests), all in slots; only the components the model has.
    component_pools: dict[str, dict[str, int]] = field(default_factory=dict)
    # Live regret over the recent window (see radixkv.cache.policies.research.regret): the
    # cache's token hit rate and Belady's at the same capacity, from the last periodic computation.
    window_requests: int = 0
    window_hit_rate: float = 0.0
    window_belady_hit_rate: float = 0.0
    # Prompt positions whose K/V the model computed (not served by the cache nor by a fork).
    prefill_tokens_total: int = 0
    forked_choices_total: int = 0  # choices of n > 1 requests that forked from a prefill
    # Hierarchical cache: prompt tokens served per tier (first admission; device = L1 tree hit,
    # host = loaded from L2, storage = fetched from L3; all device without tiers), and the
    # tiers' own figures (host pool census in pages, storage health, I/O, the prefetch policy's
    # decisions and estimates); empty without tiers.
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    tier_stats: dict[str, float] = field(default_factory=dict)
    # Decode as CUDA graphs (engine/graph_runner.py): steps replayed, and steps run eagerly by
    # reason (GraphRunner.why_eager: "prefill", "batch too large", ...); None when the engine
    # captured no graphs.
    graph_replays: int | None = None
    graph_fallbacks: dict[str, int] = field(default_factory=dict)

    @property
    def token_hit_rate(self) -> float:
        return (
            self.cached_prompt_tokens_total / self.prompt_tokens_total
            if self.prompt_tokens_total
            else 0.0
        )

    @property
    def pool_usage(self) -> float:
        return 1.0 - self.free_slots / self.pool_slots if self.pool_slots else 0.0
