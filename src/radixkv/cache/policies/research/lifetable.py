"""An online life table: how likely a cached span is to be reused at each age, per class.

A *life* is a span of cached tokens from one access (its birth) to the next: it ends with a
reuse (a recorded match covering it, or its ghost being inserted again) or is censored (its
ghost is forgotten, or it is never seen again). Ages are in ticks of the cache's logical clock,
grouped in log-spaced buckets (four per octave: `age_bucket`), so the table has no time scale
to tune. Per class it keeps, in tokens, the reuses in each age bucket and the *at-risk* mass:
tokens of lives that reached the bucket's lower edge while still tracked. Their ratio is the
Kaplan-Meier hazard (the chance a life still unused at the bucket's start is reused within it),
unbiased under censoring: a life counts as at risk when it reaches an age, not when it ends, so
long lives that are still running are never missing from the denominator.

At-risk mass is counted as lives cross bucket edges, from a ring of live tokens per birth tick:
exact ticks for the first `FINE` ticks of a life, then slots of `COARSE` ticks up to `HORIZON`
(where every bucket is at least 8 slots wide); a life older than that is no longer tracked.
Every `period` ticks (at doubling ticks from WARMUP until then, so a fresh cache starts learning
early) the table is decayed (an exponentially weighted memory) and refitted into
an index per (class, age bucket): the Gittins-style hit density
`max over T of E[reused tokens in (age, T)] / E[token-ticks held in (age, T)]`, which is the
shadow price per token-tick below which holding the span is not worth its space (see
docs/eviction.md). A sparse class borrows strength from its group, and a group from all
classes (additive smoothing with `prior` tokens of pseudo-evidence).

Costs: O(1) per birth / end; O(classes x buckets) numpy work per tick; O(classes x buckets^2)
per refit. Memory O(classes x (FINE + SLOTS)) integers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FINE = 1 << 10  # a life's first FINE ticks are tracked by exact birth tick
COARSE = 1 << 5  # then in birth slots of COARSE ticks
SLOTS = 1 << 11
HORIZON = SLOTS * COARSE  # lives are tracked up to about this age (65,536 ticks)
WARMUP = 128  # the first refit; then at doubling ticks until `period` apart


def age_bucket(age: int) -> int:
    """Log-spaced age bucket: ages 0..7 have their own bucket, then four buckets per octave
    (`[4, 5, 6, 7] << k`); ages from HORIZON on share the last bucket (untracked)."""
    if age < 8:
        return age if age > 0 else 0
    bl = age.bit_length()
    b = 4 * bl - 8 + ((age >> (bl - 3)) & 3)
    return b if b < NB else NB - 1


def _bucket_edges(n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    lo = np.zeros(n, dtype=np.int64)
    width = np.ones(n, dtype=np.int64)
    for b in range(8, n):
        bl, sub = (b + 8) // 4, (b + 8) % 4
        lo[b] = (4 + sub) << (bl - 3)
        width[b] = 1 << (bl - 3)
    lo[:8] = np.arange(8)
    return lo, width


NB = 4 * (HORIZON.bit_length()) - 8 + 1  # bucket of HORIZON (a power of two) is the last
LO, WIDTH = _bucket_edges(NB)
_C0 = int(np.searchsorted(LO, FINE))  # buckets 1.._C0-1 have fine edges, _C0..NB-2 coarse
_FINE_LO = LO[1:_C0]
_COARSE_LO = LO[_C0 : NB - 1]
assert (_COARSE_LO % COARSE == 0).all() and (WIDTH[_C0:] >= 8 * COARSE).all()


class LifeTable:
    """Reuse / at-risk histograms per class and the index they imply (module docstring).

    Invariant (`live_tokens`): the rings hold exactly the tokens of tracked lives (born less
    than about HORIZON ticks ago and not ended), each at its birth tick's slot. Arrays are
    stored bucket- / slot-major (rows), so each tick's work is whole-row numpy operations;
    `reuse` and `risk` are their [class, bucket] views."""

    def __init__(self, groups: Sequence[int], *, period: int, decay: float, prior: float) -> None:
        n = len(groups)
        self.classes = n
        self.group = np.asarray(groups, dtype=np.int64)  # class -> backoff group
        self.period = period
        self.decay = decay
        self.prior = prior
        self._reuse = np.zeros((NB, n))
        self._risk = np.zeros((NB, n))
        self.reuse = self._reuse.T  # [class, bucket] views of the same memory
        self.risk = self._risk.T
        self.fine = np.zeros((FINE, n), dtype=np.int64)  # [birth tick % FINE, class]
        self.coarse = np.zeros((SLOTS, n), dtype=np.int64)  # [birth slot % SLOTS, class]
        self.index: list[list[float]] = [[0.0] * NB for _ in range(n)]  # 0: nothing known
        self.now = 0  # last tick processed
        self._refit_at = min(period, WARMUP)
        self.refits = 0

    # ---------------------------------------------------------------- clock

    def advance(self, now: int) -> None:
        """Process every tick up to `now`: lives crossing a bucket edge join its at-risk mass;
        lives FINE ticks old move to their coarse slot. Call before any event at `now`."""
        t = self.now
        if t >= now:
            return
        fine, coarse, risk = self.fine, self.coarse, self._risk
        while t < now:
            t += 1
            old = t - FINE  # births at `old` are FINE ticks old now: move them
            if old >= 0:
                s = (old // COARSE) % SLOTS
                if old % COARSE == 0:
                    coarse[s] = 0  # the slot's previous lives are past the horizon
                coarse[s] += fine[t % FINE]
            fine[t % FINE] = 0
            risk[1:_C0] += fine.take((t - _FINE_LO) % FINE, axis=0)
            if t % COARSE == COARSE - 1:  # a whole coarse slot reaches each coarse edge
                slots = ((t - COARSE + 1 - _COARSE_LO) // COARSE) % SLOTS
                risk[_C0 : NB - 1] += coarse.take(slots, axis=0)
            if t >= self._refit_at:  # at a fixed tick, however often `advance` is called
                self._refit_at = min(2 * t, t + self.period)  # warm-up: at doubling ticks
                self.refit()
        self.now = t

    # ---------------------------------------------------------------- lives

    def birth(self, c: int, tokens: int, now: int) -> None:
        """`tokens` start a life of class `c` at tick `now` (after `advance(now)`)."""
        self.fine[now % FINE, c] += tokens
        self._risk[0, c] += tokens

    def tracked(self, born: int, now: int) -> bool:
        return now < born - born % COARSE + HORIZON + FINE

    def end(self, c: int, born: int, tokens: int, now: int, reused: bool) -> None:
        """End `tokens` of a life of class `c` born at `born`: a reuse now, or censored."""
        age = now - born
        b = age_bucket(age)
        if age < FINE:
            self.fine[born % FINE, c] -= tokens
        elif self.tracked(born, now):
            self.coarse[(born // COARSE) % SLOTS, c] -= tokens
            if b == NB - 1:
                return  # past the last edge: no longer at risk anywhere
            if now < born - born % COARSE + COARSE - 1 + LO[b]:
                self._risk[b, c] += tokens  # its slot has not crossed this edge yet
        else:
            return  # its slot was recycled: neither at risk nor a reuse
        if reused:
            self._reuse[b, c] += tokens

    def clear_lives(self) -> None:
        """Forget every running life (the cache was reset); the learned histograms stay."""
        self.fine[:] = 0
        self.coarse[:] = 0

    def live_tokens(self) -> int:
        return int(self.fine.sum() + self.coarse.sum())

    def value(self, c: int, age: int) -> float:
        return self.index[c][age_bucket(age)]

    # ---------------------------------------------------------------- model

    def hazards(self) -> npt.NDArray[np.float64]:
        """Per class and bucket: the smoothed reuse probability within the bucket."""
        k0 = self.prior
        pooled_r, pooled_k = self.reuse.sum(0), self.risk.sum(0)
        h_all = _ratio(pooled_r, pooled_k)
        ng = int(self.group.max()) + 1
        gr = np.zeros((ng, NB))
        gk = np.zeros((ng, NB))
        np.add.at(gr, self.group, self.reuse)
        np.add.at(gk, self.group, self.risk)
        h_g = _ratio(gr + k0 * h_all, gk + k0)
        h = _ratio(self.reuse + k0 * h_g[self.group], self.risk + k0)
        h[:, pooled_k <= 0] = 0.0  # ages no life has reached yet: nothing known
        return np.asarray(np.clip(h, 0.0, 1.0), dtype=np.float64)

    def refit(self) -> None:
        """Recompute the index from the histograms, then decay them."""
        seen = np.nonzero(self.risk.sum(0) > 0)[0]
        known = int(seen[-1]) + 1 if len(seen) else 0
        self.index = gittins_index(self.hazards(), known).tolist()
        self.reuse *= self.decay
        self.risk *= self.decay
        self.refits += 1


def _ratio(num: npt.NDArray[np.float64], den: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def gittins_index(h: npt.NDArray[np.float64], known: int) -> npt.NDArray[np.float64]:
    """index[c, b] = max over e >= b of (expected reuses in buckets b..e) / (expected ticks
    held in b..e), for a life of class c alive at the start of bucket b; 0 beyond `known`
    (the first `known` buckets have data). A reuse in a bucket is taken to come halfway
    through it. Survival is conditional on reaching b (log space, so a certain reuse or a
    long run of likely ones never turns a window into 0/0). Vectorised over classes:
    O(classes x known^2)."""
    n = h.shape[0]
    out = np.zeros((n, NB))
    if known <= 0:
        return out
    hk = np.clip(h[:, :known], 0.0, 1.0 - 1e-12)
    logs = np.concatenate([np.zeros((n, 1)), np.cumsum(np.log1p(-hk), axis=1)[:, :-1]], axis=1)
    upper = np.triu(np.ones((known, known), dtype=bool))[None]  # [b, x]: x >= b
    surv = np.where(upper, np.exp(np.minimum(logs[:, None, :] - logs[:, :, None], 0.0)), 0.0)
    hits = np.cumsum(surv * hk[:, None, :], axis=2)
    ticks = np.cumsum(surv * ((1.0 - hk / 2) * WIDTH[:known])[:, None, :], axis=2)
    ratio = np.where(upper & (ticks > 0), hits / np.where(ticks > 0, ticks, 1.0), 0.0)
    out[:, :known] = ratio.max(axis=2)
    return out
