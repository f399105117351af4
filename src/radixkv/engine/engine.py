"""The in-process Engine (contract in radixkv.engine.types): model + KV pool + allocator + request
table + prefix cache + scheduler + runner + sampler, driven one `step()` at a time.

This module is the request API and the step loop (admit, forward, sample, hand out deltas). The
memory is built by engine/kv/memory_factory.py, the counters and metrics live in engine/stats.py,
the n > 1 choices in engine/sampling/choices.py, the dashboard's views in engine/introspect.py."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from radixkv.engine import graph_runner, introspect, setup, stats
from radixkv.engine.kv.memory_factory import build_memory
from radixkv.engine.request import Request, Status
from radixkv.engine.runner import ModelRunner
from radixkv.engine.sampling import choices
from radixkv.engine.sampling.logits import next_tokens
from radixkv.engine.sampling.sampler import rows_of
from radixkv.engine.scheduler import Scheduler
from radixkv.engine.stats import Totals
from radixkv.engine.tiers.manager import TierManager
from radixkv.engine.types import (
    EngineConfig,
    EngineMetrics,
    FinishReason,
    RequestError,
    RequestOptions,
    RequestOutput,
    SamplingParams,
    StreamDelta,
)

Prompt = str | list[int]


class Engine:
    """Single-threaded serving engine; see the contract in radixkv.engine.types."""

    log_interval_s = 10.0

    def __init__(
        self, model: Any = None, config: EngineConfig | None = None, **overrides: Any
    ) -> None:
        if isinstance(model, str):
            overrides.setdefault("model", model)
        # Keyword overrides use the flat field names (page_size=16); each lands in its section.
        cfg = (config or EngineConfig()).override(**overrides).validate()
        self.config = cfg
        self.device = device = setup.resolve_device(cfg.model.device)
        dtype = setup.resolve_dtype(cfg.model.dtype, device)
        # A loaded model object (anything with .model/.config/.tokenizer) is used as is.
        loaded = setup.is_loaded_model(model)
        self.lm = model if loaded else setup.load(cfg.model.path, device, dtype)
        self.tokenizer: Any = self.lm.tokenizer
        mc = self.lm.config
        self.vocab_size = int(mc.vocab_size)
        self.max_model_len = int(cfg.scheduler.max_model_len or mc.max_position_embeddings)
        self.eos_token_ids = setup.eos_token_ids(mc, self.tokenizer)
        hybrid = setup.hybrid_spec(mc, cfg) is not None
        graph_bs = min(  # no bucket larger than a step can be
            graph_runner.graph_max_bs(cfg.model.cuda_graph_max_bs, device, self.lm.model, hybrid),
            cfg.scheduler.max_running_requests,
        )
        mem = build_memory(cfg, self.lm, dtype, device, self.max_model_len, graph_bs > 0)
        self.pool, self.pools, self.table = mem.pool, mem.pools, mem.table
        self.allocator, self.kv = mem.allocator, mem.kv
        self.cache = self.kv.cache  # whichever tree there is (PrefixIndex), or None
        regret = setup.make_regret_window(cfg.cache, self.cache, self.allocator.num_slots)
        self.scheduler = Scheduler(cfg.scheduler, self.kv, regret)
        kinds = self.kv.comp if self.pools is not None else None  # a hybrid's ComponentMemory
        self.runner = ModelRunner(self.lm.model, self.pool, self.table, self.pools, kinds)
        if cfg.model.compile:
            self.runner.compile(self.kv)  # a model it cannot compile stays eager (logged)
        # Decode graphs per batch-size bucket, captured after the compile's warm-up.
        graph_runner.attach(self.runner, graph_bs, mem.scratch_slot, self.table.max_context)
        # request id → its choices (index order); n == 1 requests have one.
        self._requests: dict[str, list[Request]] = {}
        # radixkv.engine.sampling.grammar.GrammarCompiler, built on first use
        self._grammar: Any = None
        self._pending: list[StreamDelta] = []
        self._ids = itertools.count()
        self._seeds = random.Random(cfg.scheduler.seed)
        self.totals = Totals()

    # -- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: Prompt,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        options: RequestOptions | None = None,
    ) -> str:
        """Queue one request; raises RequestError (400 bad input, 503 queue full)."""
        sampling = sampling or SamplingParams()
        options = options or RequestOptions()
        sampling.validate()
        ids = self.tokenizer.encode(prompt_ids) if isinstance(prompt_ids, str) else prompt_ids
        ids = self._validate_prompt(ids, sampling)
        if (
            len(self.scheduler.waiting) + len(self.kv.held)
            >= self.config.scheduler.max_queued_requests
        ):
            raise RequestError("too many queued requests; retry later", code=503)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise RequestError(f"request id {rid!r} is already in use", param="request_id")
        seed = sampling.seed
        if seed is None:  # drawn only for sampled requests, as before n > 1 existed
            seed = 0 if sampling.greedy else self._seeds.getrandbits(63)
        group = choices.make_group(self, rid, ids, sampling, options, seed)
        self._requests[rid] = group
        self._queue(group[0])
        return rid

    @property
    def grammar(self) -> Any:
        """The structured-output compiler (llguidance), built on the first json_schema request."""
        if self._grammar is None:
            self._grammar = choices.make_grammar(self)
        return self._grammar

    def kernel_paths(self) -> dict[str, str]:
        """The CPU model and the kernel path each dtype takes in this process, as benchmark
        reports record them (radixkv.model.kernels.kernel_paths); empty off the CPU."""
        if not str(self.device).startswith("cpu"):
            return {}
        from radixkv.model.kernels import kernel_paths

        return kernel_paths()

    @property
    def tiers(self) -> TierManager | None:
        """The host/storage tiers, or None when the config asks for none."""
        t = self.kv.tiers
        return t if isinstance(t, TierManager) else None

    def _queue(self, req: Request) -> None:
        """To the scheduler, or first to the KV manager's prefetch hold when L3 may have pages
        past what L1 and L2 hold and the policy waits for them (never longer than its bound:
        no request hangs; `step` hands it to the scheduler when due)."""
        if not self.kv.hold_for_storage(req):
            self.scheduler.add(req)

    def _validate_prompt(self, ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        choices.validate(sampling, self.config.scheduler.max_n, self.vocab_size)
        ids = [int(t) for t in ids]
        if not ids:
            raise RequestError("the prompt is empty", param="prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(
                f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                param="prompt",
            )
        total = len(ids) + sampling.max_tokens
        if total > self.max_model_len:
            raise RequestError(
                f"prompt ({len(ids)} tokens) + max_tokens ({sampling.max_tokens}) = {total} "
                f"exceeds max_model_len {self.max_model_len}",
                param="max_tokens",
            )
        if self.allocator.pages_for(total) > self.allocator.num_pages:
            raise RequestError(
                f"prompt + max_tokens = {total} tokens can never fit the KV pool "
                f"({self.allocator.num_slots} slots)",
                param="max_tokens",
            )
        return ids

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or bool(self._pending) or bool(self.kv.held)

    def abort(self, request_id: str) -> bool:
        """Stop a request now; its last delta (next step()) has finish_reason='abort'."""
        group = self._requests.get(request_id)
        if group is None:
            return False
        for req in group:
            if not req.finished:
                self.kv.held.drop(req.request_id)
                self.scheduler.remove(req)  # a choice not forked yet holds nothing
                self._pending.append(self._finish(req, "abort", []))
        return True

    # -- stepping ------------------------------------------------------------------------------
    def step(self) -> list[StreamDelta]:
        """One scheduler step; deltas for requests that produced tokens or finished."""
        deltas = self._step()
        self.kv.publish_events()  # this step's KV events, as one batch
        return deltas

    def _step(self) -> list[StreamDelta]:
        deltas, self._pending = self._pending, []
        for req in self.kv.poll_tiers():  # held for storage until now
            self.scheduler.add(req)
        sched = self.scheduler.schedule()
        if sched.empty and self.kv.held:
            self.kv.tiers.poll(timeout=0.005)  # only held prefetches left: wait briefly, no spin
        if sched.empty:
            if self.scheduler.waiting and not self.scheduler.running:
                # Unreachable while admission checks hold (every queued request fits the
                # whole pool); fail loudly rather than let generate() spin forever.
                raise RuntimeError("scheduler stalled: nothing running and nothing admissible")
            return deltas
        t0 = time.perf_counter()
        logits = self.runner.forward(sched)
        forward_s = time.perf_counter() - t0
        self.scheduler.after_forward(sched)
        rows = [i for i, r in enumerate(sched.reqs) if r.pending == 0]
        reqs = [sched.reqs[i] for i in rows]
        self.totals.forked += choices.fork_ready(self, rows, reqs)
        if rows:
            t0 = time.perf_counter()
            tokens, lps = next_tokens(rows_of(logits, rows), reqs)
            now = time.perf_counter()
            forward_s += now - t0  # the device sync (an async forward) lands here
            for req, tok, lp in zip(reqs, tokens, lps, strict=True):
                deltas.append(self._on_token(req, tok, lp, now))
        if sched.num_tokens > len(sched.reqs):  # a step with prefill
            self.kv.tiers.observe_prefill(sched.num_tokens, forward_s)
            self.scheduler.observe_step(sched, forward_s)
        stats.maybe_log(self, self.log_interval_s)
        return deltas

    def _on_token(self, req: Request, tok: int, lp: Any, now: float) -> StreamDelta:
        req.tokens.append(tok)
        if req.logprobs is not None:
            req.logprobs.append(lp)
        self.totals.generated += 1
        if req.first_token_time is None:
            req.first_token_time = now
            if req.index == 0:  # as the scheduler's totals: forks add no prompt tokens
                self.totals.count_tier_hits(req, self.kv.tiers)
        sp = req.sampling
        reason: FinishReason | None = None
        if tok in sp.stop_token_ids or (not sp.ignore_eos and tok in self.eos_token_ids):
            reason = "stop"  # the stop token's text is not part of the output
        elif req.stream.push(tok) or (req.matcher is not None and req.matcher.done):
            reason = "stop"
        if reason is None and req.num_output >= sp.max_tokens:
            reason = "length"
        if reason is not None:
            self.scheduler.remove(req)
            return self._finish(req, reason, [tok])
        req.sent_tokens = req.num_output
        return self._delta(req, [tok], req.stream.take(final=False))

    def _finish(self, req: Request, reason: FinishReason, new_ids: list[int]) -> StreamDelta:
        if reason != "stop" and req.stream.flush():
            reason = "stop"  # the held-back tail completed a stop string
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        req.sent_tokens = req.num_output
        group = self._requests.get(req.request_id, [])
        last = all(c.finished for c in group)
        self.kv.tiers.forget(req)
        if last:
            self._requests.pop(req.request_id, None)
            self.totals.finished += 1
        return self._delta(req, new_ids, req.stream.take(final=True), reason, last)

    def _delta(
        self,
        req: Request,
        ids: list[int],
        text: str,
        reason: FinishReason | None = None,
        last: bool = False,
    ) -> StreamDelta:
        lps = None
        if req.logprobs is not None:
            lps = req.logprobs[len(req.logprobs) - len(ids) :] if ids else []
        return StreamDelta(
            request_id=req.request_id,
            new_token_ids=ids,
            new_text=text,
            finished=last,
            finish_reason=reason,
            prompt_tokens=req.num_prompt,
            cached_tokens=req.cached_tokens,
            completion_tokens=req.num_output,
            index=req.index,
            logprobs=lps,
        )

    def close(self, timeout_s: float | None = None) -> bool:
        """Clean shutdown: flush pending L3 writes (bounded) and stop the storage threads; True
        when nothing was left unwritten. The engine must not be stepped afterwards."""
        self.kv.events.close()
        timeout = self.config.cache.hicache_flush_timeout_s if timeout_s is None else timeout_s
        return self.kv.tiers.close(self.kv.tree_pages(), timeout)

    # -- blocking helpers ----------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        options: RequestOptions | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion (batched with anything already queued)."""
        batch = setup.normalize_prompts(prompts)
        params = setup.normalize_sampling(sampling, len(batch))
        reqs: list[Request] = []  # every choice of every prompt, in order
        try:
            for p, sp in zip(batch, params, strict=True):
                reqs.extend(self._requests[self.add_request(p, sp, options=options)])
        except RequestError:
            for r in reqs:
                self.abort(r.request_id)
            # Nobody else knows these ids: drop their abort deltas instead of emitting them.
            gone = {r.request_id for r in reqs}
            self._pending = [d for d in self._pending if d.request_id not in gone]
            raise
        mine = {r.request_id for r in reqs}
        while any(not r.finished for r in reqs):
            # Deltas of other requests (added through add_request) are kept for step()'s caller.
            self._pending.extend(d for d in self.step() if d.request_id not in mine)
        return [r.to_output() for r in reqs]

    def stream(
        self,
        prompt: Prompt,
        sampling: SamplingParams | None = None,
        options: RequestOptions | None = None,
    ) -> Iterator[StreamDelta]:
        """Yield this request's deltas as they are produced (other requests keep running)."""
        rid = self.add_request(prompt, sampling, options=options)
        done = False
        try:
            while not done:
                for d in self.step():
                    if d.request_id != rid:
                        self._pending.append(d)
                        continue
                    done = done or d.finished
                    yield d
        finally:
            if not done:
                self.abort(rid)

    # -- cache and introspection ---------------------------------------------------------------
    def flush_cache(self) -> bool:
        """Drop every unlocked cached prefix; True when the cache is now empty of them."""
        self.kv.flush(idle=not self.scheduler.running)
        self.kv.publish_events()
        return self.cache is None or self.cache.evictable_size == 0

    def metrics(self) -> EngineMetrics:
        """Counters and the pool census now (engine/stats.py)."""
        return stats.snapshot(self)

    def regret_stats(self) -> dict[str, Any]:
        """The live-regret report (Belady over the recent window at the pool's capacity) as
        plain data, recomputed now when idle (engine/stats.py); `enabled` False without a
        window."""
        return stats.regret_stats(self.scheduler.regret, busy=self.scheduler.has_work)

    def close_session(self, session_id: str) -> bool:
        """Drop the session's references on the cache (session-aware eviction); False if it
        held none."""
        return self.kv.close_session(session_id)

    def dashboard_state(self, key: bytes = b"", limit: int = 50) -> dict[str, Any]:
        """Pool census, hit counters and running/waiting requests for the dashboard (plain data;
        sizes, counts, ages and keyed short hashes only; see radixkv.engine.introspect)."""
        return introspect.dashboard_state(self, key, limit)

    def cache_tree(self, top_k: int = 40, max_depth: int = 8, key: bytes = b"") -> dict[str, Any]:
        """The largest `top_k` subtrees of depth <= `max_depth`, without token ids (see
        radixkv.cache.tree_view)."""
        return introspect.cache_tree(self, top_k, max_depth, key)

    def check_memory(self) -> None:
        """Raise RuntimeError unless free + cached + held == pool size (and owners are sane)."""
        self.kv.check(self.scheduler.running)
