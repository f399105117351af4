"""One request's state as it moves waiting → running → finished (and back, when retracted)."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from radixkv.engine.sampling.stop import TextStream
from radixkv.engine.tokens import TokenBuffer
from radixkv.engine.types import (
    FinishReason,
    RequestOptions,
    RequestOutput,
    SamplingParams,
    TokenLogprobs,
)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A request and the memory it holds while running.

    Memory layout of a running request (positions of `tokens`):
      [0, prefix_len)            slots owned by the prefix cache, locked through `handle`
      [prefix_len, capacity)     slots of `own_pages` (page j covers prefix_len + j*ps ...)
    with capacity = prefix_len + len(own_pages) * page_size, and `kv_len <= capacity` positions
    whose K/V is computed. `prefix_len` is always a whole number of pages.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    options: RequestOptions
    stream: TextStream
    generator: torch.Generator | None
    arrival: float = field(default_factory=time.perf_counter)
    # prompt + generated, in order; packed int64 so prefixes go to the cache as O(1) views
    tokens: TokenBuffer = field(default_factory=TokenBuffer)
    status: Status = Status.WAITING
    # Memory (valid while RUNNING).
    row: int = -1
    kv_len: int = 0
    prefix_len: int = 0
    handle: Any = None
    own_pages: list[int] = field(default_factory=list)
    admit_seq: int = -1  # larger = admitted later; the newest is retracted first
    # What it holds of each kind of KV besides FULL (SWA pages, a STATE slot, ...), kept by that
    # kind's memory (engine/kv/kinds.py); empty for a FULL-only model.
    kv_kinds: dict[str, Any] = field(default_factory=dict)
    # Stats.
    cached_tokens: int = 0  # prompt tokens served from the cache on first admission
    admitted_once: bool = False
    num_preemptions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    sent_tokens: int = 0  # output tokens already reported in a StreamDelta
    # n > 1: every choice shares `request_id`; choice 0 is prefilled and the others wait in its
    # `forks` (outside the scheduler) until its prompt is computed, then fork from its KV.
    index: int = 0
    forks: list[Request] = field(default_factory=list)
    matcher: Any = None  # grammar state (radixkv.engine.sampling.grammar.Matcher) for json_schema
    logprobs: list[TokenLogprobs] | None = None  # per output token, when requested

    def __post_init__(self) -> None:
        if not len(self.tokens):
            self.tokens = TokenBuffer(self.prompt_ids)

    @property
    def namespace(self) -> Hashable | None:
        return self.options.namespace

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens.array(len(self.prompt_ids)).tolist()

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def pending(self) -> int:
        """Tokens whose K/V still has to be computed before the next token can be sampled."""
        return len(self.tokens) - self.kv_len

    @property
    def in_prefill(self) -> bool:
        return self.pending > 1

    def to_output(self) -> RequestOutput:
        ttft = self.first_token_time - self.arrival if self.first_token_time is not None else None
        latency = self.finish_time - self.arrival if self.finish_time is not None else None
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_ids),
            output_token_ids=self.output_ids,
            text=self.stream.text,
            finish_reason=self.finish_reason,
            prompt_tokens=self.num_prompt,
            cached_tokens=self.cached_tokens,
            ttft_s=ttft,
            latency_s=latency,
            error=self.error,
            index=self.index,
            logprobs=self.logprobs,
        )
