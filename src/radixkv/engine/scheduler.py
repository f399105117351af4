"""Continuous-batching scheduler: which requests run this step, and how many tokens each.

Step composition (mixed batches): every running request that is decoding contributes 1 token;
requests still in prefill contribute chunks drawn from one budget of `chunked_prefill_size` new
prompt tokens per step (oldest first), and new requests are admitted while budget, rows and memory
remain. Decodes are not charged to the budget, so long prompts never stall running streams.

Only a step's first prefill may be cut short by the budget (a prompt longer than the budget is
chunked over steps). A later prompt that does not fit whole waits for the next step rather than
starting with a partial chunk: a partial chunk makes the step, and so every first token in it,
later, without bringing its own first token any sooner than the next step would. When several
uncached prompts arrive together they therefore finish one after another instead of all at the
end (for equal prompts the mean time to first token falls by up to a third), at the cost of
slightly more steps.

Decode stall (`decode_stall_ms`, 500 by default, off at 0): while any request decodes, the
step's budget is cut to the prompt tokens the measured prefill rate computes in that many
milliseconds (at least `min_stall_chunk`). A long prompt then runs over several steps, and each of
them also advances every decoding stream by a token, instead of one step that holds every stream
for the whole prompt: the streams' tokens come sooner by about what the prompt's first token comes
later (docs/vllm.md has the measurement). While nothing decodes, the budget stays whole but a step
takes no further prompt once its prompt tokens reach that share (the first prompt always joins):
a burst of short prompts then starts decoding one group after another instead of all at the end
of one long step (mean TTFT of 8 x 256 tokens arriving together about halved, the run's duration
unchanged), and the time to first token no longer depends on whether a burst lands before a step
or is spread over a few (it did, by 2x, between two benchmark clients).

Admission order: fcfs takes arrival order; lpm the longest cached prefix first, aged by arrival
time so that no request is passed by one that arrived more than `schedule_wait_budget_s` after it.

Memory pressure: before a step, each decoding request gets a slot for its next token, evicting
unlocked cached prefixes as needed; when even that cannot fit the batch, the newest running request
is retracted to the front of the waiting queue (its computed pages go into the cache, so its
readmission mostly hits). Admission keeps a small per-request decode reserve to avoid thrashing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from radixkv.config import SchedulerConfig
from radixkv.engine.kv.kv_manager import KVManager
from radixkv.engine.request import Request, Status
from radixkv.engine.tokens import TokenBuffer

if TYPE_CHECKING:
    from radixkv.cache.policies.research.regret import RegretWindow


@dataclass
class ScheduledBatch:
    """Requests of one step, in batch order, with how many new tokens each extends by."""

    reqs: list[Request] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.reqs

    def add(self, req: Request, n: int) -> None:
        self.reqs.append(req)
        self.extend_lens.append(n)

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)


def _common_prefix(a: TokenBuffer, b: TokenBuffer, limit: int) -> int:
    n = min(len(a), len(b), limit)
    if n == 0:
        return 0
    diff = np.flatnonzero(a.array(0, n) != b.array(0, n))
    return int(diff[0]) if diff.size else n


class Scheduler:
    decode_reserve_tokens = 32  # per running request, kept free at admission
    lpm_scan_limit = 64  # waiting requests ranked per step under lpm
    admit_scan_limit = 64  # waiting requests considered for admission per step
    defer_min_gain = 16  # tokens a waiting request must gain to wait for an in-flight prefill
    min_stall_chunk = 64  # decode_stall_ms never cuts a step's prompt tokens below this
    rate_weight = 0.3  # weight of the newest step in the prefill-rate average

    def __init__(
        self, config: SchedulerConfig, kv: KVManager, regret: RegretWindow | None = None
    ) -> None:
        self.config = config
        self.kv = kv
        self.page_size = kv.page_size
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # ordered by admit_seq (oldest first)
        self._admit_seq = 0
        self.num_preemptions = 0
        # Totals over first admissions (retraction readmits are not double counted).
        self.prompt_tokens_total = 0
        self.cached_prompt_tokens_total = 0
        # Live regret (None: off): first admissions are recorded as page keys.
        self.regret = regret
        # Prompt positions the model computed (a forked choice computes none of its prompt).
        self.prefill_tokens_total = 0
        # Prompt tokens per second of forward time (average of recent steps with a prefill of
        # at least min_stall_chunk tokens; 0 until one ran) and this step's budget.
        self.prefill_rate = 0.0
        self._step_budget = config.chunked_prefill_size

    # -- queues --------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Drop a request from wherever it is, releasing what it holds."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self.kv.release(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        if self.regret is not None:
            self.regret.advance()  # a slice of its periodic replay, if one is in progress
        self._grow_decodes()
        batch = self._build()
        # Hybrid SWA pools can leave every running prefill without room for its next chunk;
        # retracting the newest frees its share (a lone request always fits the pool).
        while batch.empty and len(self.running) > 1:
            self.retract(self.running[-1])
            batch = self._build(admit=False)  # the retracted one waits for the next step
        return batch

    def _build(self, admit: bool = True) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self._step_budget = self._budget()
        # No further prompt joins a step whose prompt tokens reached the stall's share (the
        # first always may): the step ends sooner and its prompts start decoding.
        cap = self._stall_cap() or budget
        for req in self.running:
            if req.pending == 1:
                batch.add(req, 1)
            elif budget > 0 and self._step_budget - budget < cap:
                budget -= self._add_chunk(batch, req, budget)
        if budget > 0 and admit and self._step_budget - budget < cap:
            for req in self._admit(budget, cap - (self._step_budget - budget)):
                budget -= self._add_chunk(batch, req, budget)
        return batch

    def _fits(self, pending: int, budget: int) -> bool:
        """Whether a prefill of `pending` tokens may start in what is left of the step's budget:
        whole, or cut short only as the step's first prefill (invariant: at most one prefill
        per step is cut by the budget, and it is the first)."""
        return pending <= budget or budget == self._step_budget

    def _budget(self) -> int:
        """This step's prompt tokens: the whole chunked_prefill_size, or while a request decodes
        and decode_stall_ms is set, what the prefill rate computes in that time."""
        full = self.config.chunked_prefill_size
        cap = self._stall_cap()
        if cap is None or not any(r.pending == 1 for r in self.running):
            return full
        return min(full, cap)

    def _stall_cap(self) -> int | None:
        """The prompt tokens the prefill rate computes in decode_stall_ms (at least
        min_stall_chunk); None while the stall is off or no rate was measured yet."""
        stall_s = self.config.decode_stall_ms / 1000
        if stall_s <= 0 or self.prefill_rate <= 0:
            return None
        return max(self.min_stall_chunk, int(self.prefill_rate * stall_s))

    def observe_step(self, batch: ScheduledBatch, forward_s: float) -> None:
        """Fold one forward's time into the prefill rate (steps of min_stall_chunk or more
        prompt tokens only: the rate of a few tokens is the decode rows' weight reads)."""
        prompt = sum(n for n in batch.extend_lens if n > 1)
        if prompt < self.min_stall_chunk or forward_s <= 0:
            return
        rate = prompt / forward_s
        w = self.rate_weight if self.prefill_rate > 0 else 1.0
        self.prefill_rate = (1 - w) * self.prefill_rate + w * rate

    def _add_chunk(self, batch: ScheduledBatch, req: Request, budget: int) -> int:
        """Schedule a prefill chunk of `req` (cut at the next STATE checkpoint boundary, with
        its SWA slots); returns the tokens taken from the budget (0: skipped this step)."""
        if not self._fits(req.pending, budget):
            return 0
        n = min(req.pending, budget, self.kv.chunk_cap(req))
        if not self.kv.prepare_chunk(req, n):
            return 0
        batch.add(req, n)
        return n

    def after_forward(self, batch: ScheduledBatch) -> None:
        """Advance kv_len; hand finished prefill pages to the cache (moving the lock)."""
        for req, n in zip(batch.reqs, batch.extend_lens, strict=True):
            was_prefill = req.pending > 1
            self.prefill_tokens_total += max(0, min(req.kv_len + n, req.num_prompt) - req.kv_len)
            req.kv_len += n
            if was_prefill:
                self.kv.commit_prefix(req)
            self.kv.after_step(req, was_prefill)

    def adopt(self, req: Request) -> None:
        """Run a choice forked from a running request (its memory is already bound)."""
        req.status = Status.RUNNING
        req.admitted_once = True
        req.admit_seq = self._admit_seq
        self._admit_seq += 1
        self.running.append(req)

    @property
    def has_free_row(self) -> bool:
        return len(self.running) < self.config.max_running_requests

    # -- memory pressure -----------------------------------------------------------------------
    def _grow_decodes(self) -> None:
        """Give each decoding request a slot for its next token; retract the newest when short."""
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.pending != 1:
                continue
            while not self.kv.grow(req, req.kv_len + 1):
                victim = self.running[-1]
                self.retract(victim)
                if victim is req:
                    break

    def retract(self, req: Request) -> None:
        """Preempt `req` back to the head of the waiting queue; its output so far is kept and its
        context is recomputed (mostly from the cache) on readmission."""
        self.running.remove(req)
        self.kv.release(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, req)

    # -- admission -----------------------------------------------------------------------------
    def _waiting_order(self) -> list[Request]:
        if self.config.schedule_policy != "lpm" or self.kv.cache is None:
            return list(self.waiting)
        head = self.waiting[: self.lpm_scan_limit]
        cache = self.kv.cache
        # Peek only (record=False): ranking must not count as hits nor refresh recency.
        score = {
            id(r): cache.match(r.tokens[: len(r.tokens) - 1], r.namespace, record=False).length
            for r in head
        }
        # Aging: a cached prefix buys at most `budget` seconds of arrival order (the longest
        # match in the queue the whole budget, the others their share). Requests arriving
        # together still go longest prefix first, but no request is passed by one that arrived
        # more than `budget` seconds after it, so a cold prompt never waits out a warm stream.
        budget = self.config.schedule_wait_budget_s
        top = max(score.values(), default=0) or 1
        ranked = sorted(head, key=lambda r: r.arrival - budget * score[id(r)] / top)
        return ranked + self.waiting[self.lpm_scan_limit :]

    def _should_defer(self, req: Request) -> bool:
        """True when an in-flight prefill is computing a longer prefix of `req` than the cache
        holds now: waiting a few steps turns that into a hit instead of computing it twice."""
        cache = self.kv.cache
        if cache is None:
            return False
        limit = len(req.tokens) - 1
        inflight = [r for r in self.running if r.in_prefill and r.namespace == req.namespace]
        if not inflight:
            return False
        have = cache.match(req.tokens[:limit], req.namespace, record=False).length
        for other in inflight:
            shared = _common_prefix(req.tokens, other.tokens, limit)
            if shared // self.page_size * self.page_size - have >= max(
                self.defer_min_gain, self.page_size
            ):
                return True
        return False

    def _reserve_pages(self, extra: Request | None, extra_len: int) -> int:
        """Pages kept back for the next few decode tokens of running requests (and `extra`)."""
        total = 0
        alloc = self.kv.allocator
        items = [(r, KVManager.capacity(r, self.page_size)) for r in self.running]
        if extra is not None:
            items.append((extra, alloc.pages_for(extra_len) * self.page_size))
        for r, cap in items:
            final = r.num_prompt + r.sampling.max_tokens
            want = min(final, len(r.tokens) + self.decode_reserve_tokens)
            total += max(0, alloc.pages_for(want) - cap // self.page_size)
        return total

    def _admit(self, budget: int, room: int) -> list[Request]:
        """Requests admitted for this step, in order, while `budget` prompt tokens remain and
        the prompts taken stay under `room` (the last one may pass it)."""
        admitted: list[Request] = []
        # Bounded scan: per-step admission cost must not grow with the queue length.
        for req in self._waiting_order()[: self.admit_scan_limit]:
            if budget <= 0 or room <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self._should_defer(req):
                continue
            # The tree is asked only when the whole prompt would not fit (usually it does).
            if not self._fits(req.pending, budget) and not self._fits(self._uncached(req), budget):
                break  # it starts next step, as that step's first prefill; none passes it
            if not self._try_admit(req):
                break  # out of memory: do not let smaller requests starve this one
            admitted.append(req)
            took = min(req.pending, budget)
            budget -= took
            room -= took
        return admitted

    def _uncached(self, req: Request) -> int:
        """Prompt tokens `req` would compute if admitted now (a peek: no hit recorded)."""
        cache = self.kv.cache
        if cache is None:
            return req.pending
        limit = len(req.tokens) - 1
        have = cache.match(req.tokens[:limit], req.namespace, record=False).length
        return len(req.tokens) - have

    def _try_admit(self, req: Request) -> bool:
        reserve = self._reserve_pages(req, len(req.tokens)) if self.running else 0
        prefix_len = self.kv.admit(req, reserve)
        if prefix_len is None:
            return False
        self.waiting.remove(req)
        req.status = Status.RUNNING
        req.admit_seq = self._admit_seq
        self._admit_seq += 1
        self.running.append(req)
        if not req.admitted_once:
            req.admitted_once = True
            req.cached_tokens = prefix_len
            self.prompt_tokens_total += req.num_prompt
            self.cached_prompt_tokens_total += prefix_len
            if self.regret is not None:
                query = req.tokens[: len(req.tokens) - 1]  # what `kv.admit` matched
                self.regret.record(query, req.namespace, req.num_prompt, prefix_len)
        return True
