"""When a request waits for its storage (L3) pages: the prefetch policies and their cost model.

Only the storage part of a match is ever waited for: what L1 and L2 hold is used at admission
(L2 pages are copied into the device pool then), and a request whose pages are all in L1/L2 is
never held. For the pages past them, SGLang's policies keep their meaning:

- `best_effort`: never wait; whatever has landed in L2 by admission is used;
- `wait_complete`: wait until the fetch is done (at most WAIT_COMPLETE_CAP_S);
- `timeout`: wait until the fetch is done, at most `--hicache-prefetch-timeout`;
- `cost_aware` (the default): wait exactly when loading is predicted to be cheaper than
  recomputing, from two running estimates:

      load(n pages)      = round trips × rtt + bytes / bandwidth
                           (the backend's measured fetches, the fetch queue ahead included)
      recompute(N tok.)  = prefill steps × step overhead + N / prefill speed
                           (the engine's measured prefill steps, chunked as the scheduler does)

  wait iff the backend is healthy and load < recompute, for at most recompute (and never past
  WAIT_COMPLETE_CAP_S): once a fetch has taken as long as recomputing would have, waiting
  longer no longer pays, so a wrong estimate costs at most the recompute time again. An
  unhealthy backend (in backoff after an error) or a slower one is not waited for: the request
  recomputes, and the fetch still runs in the background (best effort) for later requests and
  to keep measuring. Before the first measurement (a fresh server), the request waits, bounded
  by `--hicache-prefetch-timeout` (and the recompute, once measured): its own fetch measures
  the backend. Round trips that only missed measure the
  latency alone; the load they predict is a lower bound, already enough to say "slower".

  Whether the pages are there at all is measured too: per fetch, the share of the pages asked
  that were found (`FoundRate`), by what the replica knew of the first page asked (FIRST_KINDS):
  "known" (it wrote or read that page in L3), "extension" (no record of it, but it continues a
  prefix the replica holds in L1/L2: typically a conversation's new turn, never stored, a sure
  miss), "cold" (no record and nothing of the prompt held locally: a restarted server's or a
  new replica's prompt, which another process may well have stored). For known and extension
  first pages, loading saves that share of the recompute in expectation, so a request waits
  only if found share x recompute > load; otherwise it is not held ("miss") and its fetch still
  runs in the background, so a store that starts hitting (another replica wrote) is learnt
  from. Before the first fetch of its kind a known page counts as found and an extension waits
  unmeasured; a cold prompt is always decided as before (its first request after a restart
  must find its prefix in L3, whatever missed before it). The leading pages of the request's
  own fetch that the replica itself confirmed in L3 (`known_pages`) are a floor of the share:
  a found rate pulled down by other fetches (say, of prefixes still being computed elsewhere)
  does not make it recompute what it knows is stored. A page it knew that a fetch then misses
  is forgotten (the store lost it), so the floor never outlives the pages.

Each estimate is a line y = a + b*x fitted by exponentially weighted least squares
(`RunningLine`): recent observations weigh most, so the estimates follow a backend or a load
that changes. Everything here is plain Python on the engine thread; the decision is a pure
function of the inputs (`PrefetchPolicy.decide`), unit-tested without storage or a model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixkv.engine.request import Request

WAIT_COMPLETE_CAP_S = 60.0  # no request waits forever, even under wait_complete
COST_AWARE = "cost_aware"
# Why a request did (not) wait; "refused": the fetch could not be queued (queue full).
# What a replica knows of the first page it asks storage for (see the module doc).
FIRST_KINDS = ("known", "extension", "cold")
# "miss": the found share measured for pages like these makes waiting a likely loss.
REASONS = ("policy", "cheaper", "unmeasured", "slower", "unhealthy", "refused", "miss")


class RunningLine:
    """y ≈ a + b·x by least squares over the observations, each one weighing `decay` times
    less than the next (half the weight lies in the last `half_life` observations)."""

    def __init__(self, half_life: float = 16.0) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.count = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, x: float, y: float) -> None:
        d = self.decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + x
        self._y = self._y * d + y
        self._xx = self._xx * d + x * x
        self._xy = self._xy * d + x * y
        self.count += 1

    def fit(self) -> tuple[float | None, float | None]:
        """(a, b); None where the observations do not determine it: both without any, b when
        every observation had x == 0. Never negative: a fit with a < 0 goes through the origin
        (a = 0), one with b <= 0 (noise) is flat (b = 0). All x equal: the whole cost is the
        slope's (a = 0), which is exact at that x and proportional elsewhere."""
        if self._w <= 0:
            return None, None
        mx, my = self._x / self._w, self._y / self._w
        if self._xx <= 0:
            return my, None
        var = self._xx / self._w - mx * mx
        if var <= 1e-9 * mx * mx:
            return 0.0, my / mx
        b = (self._xy / self._w - mx * my) / var
        if b <= 0:
            return my, 0.0
        a = my - b * mx
        if a < 0:
            return 0.0, self._xy / self._xx
        return a, b


class FoundRate:
    """The share of the pages asked that fetches found, weighted as RunningLine weighs (half
    the weight in the last `half_life` fetches); None before the first."""

    def __init__(self, half_life: float = 8.0) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.count = 0
        self._w = self._found = 0.0

    def observe(self, found: int, asked: int) -> None:
        if asked <= 0:
            return
        self._w = self._w * self.decay + 1.0
        self._found = self._found * self.decay + min(found, asked) / asked
        self.count += 1

    @property
    def value(self) -> float | None:
        return self._found / self._w if self._w > 0 else None


@dataclass(frozen=True)
class Decision:
    """Whether one request waits for its storage pages, and for how long at most."""

    wait: bool
    bound_s: float  # the longest the request may be held (0 when it is not)
    reason: str  # one of REASONS
    load_s: float | None = None  # the predicted fetch time (cost_aware)
    recompute_s: float | None = None  # the predicted prefill time of the same tokens


@dataclass
class PrefetchCounters:
    waited: int = 0  # requests held for their storage pages
    skipped: int = 0  # requests with storage pages to fetch that did not wait
    timed_out: int = 0  # held requests released at their bound before the fetch finished
    wait_s: float = 0.0  # total time requests were held
    reasons: dict[str, int] = field(default_factory=dict)  # decisions by Decision.reason


class PrefetchPolicy:
    """One engine's prefetch policy with its running estimates and decision counters."""

    def __init__(
        self,
        name: str = COST_AWARE,
        timeout_s: float = 2.0,
        chunk_tokens: int = 2048,
        fetch_batch: int = 32,
    ) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.chunk_tokens = max(1, chunk_tokens)
        self.fetch_batch = max(1, fetch_batch)
        self.fetch = RunningLine()  # seconds per backend round trip vs bytes it returned
        self.prefill = RunningLine()  # seconds per forward step vs tokens in it (with prefill)
        # Share of the pages asked that fetches found, by FIRST_KINDS of their first page.
        self.found = {kind: FoundRate() for kind in FIRST_KINDS}
        self.counters = PrefetchCounters()
        self.last: Decision | None = None

    # -- measurements ----------------------------------------------------------------------------
    def observe_fetch(self, samples: list[tuple[int, float]]) -> None:
        """Round trips of one finished fetch job: (bytes returned, seconds), misses included."""
        for nbytes, seconds in samples:
            self.fetch.observe(float(nbytes), seconds)

    def observe_found(self, first: str, found: int, asked: int) -> None:
        """A finished fetch found `found` of the `asked` pages; `first`: what was known of its
        first page when it was asked for (FIRST_KINDS)."""
        self.found[first].observe(found, asked)

    def expected_found(self, first: str) -> float | None:
        """The share of the pages a fetch is expected to find, or None where the decision does
        not use one (a cold prompt; an extension before any was fetched)."""
        if first == "cold":
            return None
        share = self.found[first].value
        return 1.0 if share is None and first == "known" else share

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """One forward step that prefilled: all its tokens, its wall time."""
        if tokens > 0 and seconds > 0:
            self.prefill.observe(float(tokens), seconds)

    # -- predictions -----------------------------------------------------------------------------
    def predict_load(
        self, pages: int, page_bytes: int, queued_pages: int = 0
    ) -> tuple[float | None, bool]:
        """(seconds until `pages` pages are fetched behind `queued_pages` pages queued first,
        whether the bandwidth is measured). Round trips that all missed measure only the
        latency: the prediction is then a lower bound (infinite bandwidth)."""
        a, b = self.fetch.fit()
        if a is None:
            return None, False
        total = pages + queued_pages
        return math.ceil(total / self.fetch_batch) * a + total * page_bytes * (b or 0.0), (
            b is not None
        )

    def predict_recompute(self, tokens: int) -> float | None:
        """Seconds of prefill for `tokens` tokens, in chunks of the scheduler's prefill budget."""
        a, b = self.prefill.fit()
        if a is None or b is None:
            return None
        return math.ceil(tokens / self.chunk_tokens) * a + tokens * b

    # -- the decision ----------------------------------------------------------------------------
    def decide(
        self,
        pages: int,
        page_size: int,
        page_bytes: int,
        healthy: bool = True,
        queued_pages: int = 0,
        first: str = "known",
        known_pages: int = 0,
    ) -> Decision:
        """Should a request wait for `pages` storage pages (the part past L1 and L2), with
        `queued_pages` pages of other fetches queued before them? `first`: what is known of the
        first of them (FIRST_KINDS); `known_pages`: how many of them, from the first, this
        replica confirmed in L3 (a floor of the share found). Pure: `count` records it."""
        if self.name == "best_effort":
            return Decision(False, 0.0, "policy")
        if self.name == "wait_complete":
            return Decision(True, WAIT_COMPLETE_CAP_S, "policy")
        if self.name == "timeout":
            return Decision(True, self.timeout_s, "policy")
        if self.name != COST_AWARE:
            raise ValueError(f"unknown prefetch policy {self.name!r}")
        load, bandwidth_known = self.predict_load(pages, page_bytes, queued_pages)
        recompute = self.predict_recompute(pages * page_size)
        if not healthy:
            return Decision(False, 0.0, "unhealthy", load, recompute)
        # Measured, the wait is bounded by the predicted recompute (past it, waiting no longer
        # pays), not by the fixed timeout: on a slow prefill (a loaded CPU) a 7 s load beats a
        # 46 s recompute, and a 2 s cap would recompute it. The timeout bounds a fresh server.
        bound = self.timeout_s if recompute is None else min(WAIT_COMPLETE_CAP_S, recompute)
        if load is not None and load >= bound:  # even a lower bound of the load: no gain
            return Decision(False, 0.0, "slower", load, recompute)
        share = self.expected_found(first)
        if known_pages > 0:
            floor = min(1.0, known_pages / max(1, pages))
            share = floor if share is None else max(share, floor)
        if share is not None and _not_worth(share, load, recompute):
            return Decision(False, 0.0, "miss", load, recompute)
        if load is None or not bandwidth_known or recompute is None:
            return Decision(True, bound, "unmeasured", load, recompute)
        return Decision(True, bound, "cheaper", load, recompute)

    def count(self, d: Decision) -> None:
        """The decision that was carried out."""
        c = self.counters
        if d.wait:
            c.waited += 1
        else:
            c.skipped += 1
        c.reasons[d.reason] = c.reasons.get(d.reason, 0) + 1
        self.last = d

    def released(self, waited_s: float, timed_out: bool) -> None:
        """A held request was released (its fetch finished, or its bound passed)."""
        self.counters.wait_s += waited_s
        self.counters.timed_out += timed_out

    # -- reporting -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Numbers only (they become `radixkv_hicache_*` gauges): the decision counts (in all,
        and by reason), the estimates (0 while undetermined), the last decision's predictions
        (-1: none)."""
        c = self.counters
        fa, fb = self.fetch.fit()
        pa, pb = self.prefill.fit()
        last = self.last
        out: dict[str, Any] = {
            "prefetch_waited": c.waited,
            "prefetch_skipped": c.skipped,
            "prefetch_timed_out": c.timed_out,
            "prefetch_wait_s_total": round(c.wait_s, 6),
            "prefetch_est_fetch_bytes_per_s": _inverse(fb),
            "prefetch_est_fetch_rtt_s": fa or 0.0,
            "prefetch_est_fetch_samples": self.fetch.count,
            "prefetch_est_prefill_tokens_per_s": _inverse(pb),
            "prefetch_est_prefill_step_s": pa or 0.0,
            "prefetch_est_prefill_samples": self.prefill.count,
            "prefetch_last_load_s": _or_none(last.load_s if last else None),
            "prefetch_last_recompute_s": _or_none(last.recompute_s if last else None),
            "prefetch_last_waited": int(last.wait) if last else -1,
        }
        for kind, rate in self.found.items():  # the share of pages found, by first page (-1)
            out[f"prefetch_est_found_{kind}"] = _or_none(rate.value)
        for reason in REASONS:
            out[f"prefetch_decided_{reason}"] = c.reasons.get(reason, 0)
        return out


def _not_worth(share: float, load: float | None, recompute: float | None) -> bool:
    """Waiting does not pay in expectation: the recompute it saves (`share` of it) is no more
    than the load (a lower bound of it, or 0 while unmeasured). An unmeasured recompute counts
    as worth any wait unless nothing is expected to be found."""
    if share <= 0.0:
        return True
    return recompute is not None and share * recompute <= (load or 0.0)


def _inverse(b: float | None) -> float:
    return 1.0 / b if b else 0.0


def _or_none(x: float | None) -> float:
    return -1.0 if x is None else x


class PrefetchHold:
    """Requests held back at arrival until their L3 prefetch lands or their bound passes (the
    policy above decides who is held and for how long; no request is held past its bound)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Request, float]] = {}  # request id -> (request, deadline)

    def __len__(self) -> int:
        return len(self._held)

    def add(self, req: Request, bound_s: float) -> None:
        self._held[req.request_id] = (req, time.monotonic() + bound_s)

    def drop(self, request_id: str) -> None:
        """The request was aborted while held."""
        self._held.pop(request_id, None)

    def due(self, pending: Callable[[str], bool]) -> list[Request]:
        """Take out, in arrival order, the held requests whose fetch is no longer `pending` or
        whose deadline has passed."""
        if not self._held:
            return []
        now = time.monotonic()
        out = [r for rid, (r, end) in self._held.items() if not pending(rid) or now >= end]
        for r in out:
            del self._held[r.request_id]
        return out
