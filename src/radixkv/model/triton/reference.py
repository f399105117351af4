"""Problems and the float64 reference the Triton kernels are checked against (the unit tests
under the interpreter, scripts/gpu_check.py on a GPU): a pool of random K/V rows, requests whose
contexts sit at scattered slots (or in scattered pages), and the naive softmax every row must
match. Built on the CPU from one seed, then moved to the device, so both machines check the same
numbers."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Problem:
    """One layer's pool and a ragged batch: request r has seq_lens[r] context tokens, the last
    new_lens[r] of them new (q rows q_start[r] .. q_start[r + 1])."""

    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [slots, KV, D]
    v: torch.Tensor
    table: torch.Tensor  # [R, W] slots (page_size 1) or page ids
    seq_lens: torch.Tensor  # [R] int64
    q_start: torch.Tensor  # [R + 1] int64
    page_size: int = 1

    @property
    def new_lens(self) -> list[int]:
        return (self.q_start[1:] - self.q_start[:-1]).tolist()

    def slots(self, r: int) -> torch.Tensor:
        """Request r's context slots, position by position."""
        n = int(self.seq_lens[r])
        pos = torch.arange(n, device=self.table.device)
        if self.page_size == 1:
            return self.table[r, :n].long()
        return self.table[r, pos // self.page_size].long() * self.page_size + pos % self.page_size


def make_pool(
    slots: int, kv: int, dim: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K/V rows; scores spread enough (x 2) that softmax weights differ a lot."""
    k = (torch.randn(slots, kv, dim, generator=gen) * 2).to(dtype)
    v = torch.randn(slots, kv, dim, generator=gen).to(dtype)
    return k, v


def page_table(
    lens: list[int], slots: int, gen: torch.Generator, page_size: int = 1
) -> torch.Tensor:
    """A table [R, W] for contexts of `lens` tokens at scattered slots (page_size 1) or in
    scattered pages of a pool of `slots` slots. Padding columns hold -1 (never read)."""
    pages = [-(-n // page_size) for n in lens]
    perm = torch.randperm(slots // page_size, generator=gen)
    if sum(pages) > perm.numel():
        raise ValueError("pool too small for these contexts")
    table = torch.full((len(lens), max(pages)), -1, dtype=torch.int64)
    off = 0
    for r, n in enumerate(pages):
        table[r, :n] = perm[off : off + n]
        off += n
    return table


def problem(
    ctx_lens: list[int],
    new_lens: list[int],
    *,
    heads: int,
    kv: int,
    dim: int,
    dtype: torch.dtype,
    seed: int = 0,
    page_size: int = 1,
    slots: int | None = None,
    device: str | torch.device = "cpu",
) -> Problem:
    """A random batch: request r's context has ctx_lens[r] tokens, the last new_lens[r] new."""
    gen = torch.Generator().manual_seed(seed)
    slots = slots or (sum(ctx_lens) + 64 * len(ctx_lens)) // page_size * page_size + page_size
    # One spare page past the table's (see checks.poison_outside_windows).
    k, v = make_pool(slots + page_size, kv, dim, dtype, gen)
    table = page_table(ctx_lens, slots, gen, page_size)
    q_start = torch.zeros(len(new_lens) + 1, dtype=torch.int64)
    q_start[1:] = torch.cumsum(torch.tensor(new_lens), 0)
    q = torch.randn(int(q_start[-1]), heads, dim, generator=gen).to(dtype)
    return Problem(
        q.to(device), k.to(device), v.to(device), table.to(device),
        torch.tensor(ctx_lens).to(device), q_start.to(device), page_size,
    )  # fmt: skip


def reference(p: Problem, window: int | None, scale: float) -> torch.Tensor:
    """Naive softmax in float64 over each row's visible keys (HF semantics: key j visible to the
    query at i iff j <= i and j > i - window)."""
    heads, kv = p.q.shape[1], p.k.shape[1]
    group = heads // kv
    out = torch.empty(p.q.shape, dtype=torch.float64, device=p.q.device)
    for r, new in enumerate(p.new_lens):
        n = int(p.seq_lens[r])
        # Keys before the first new token's window are never read (a pool may reuse them).
        first = 0 if window is None else max(0, n - new - window + 1)
        sl = p.slots(r)[first:]
        keys = p.k[sl].double().repeat_interleave(group, dim=1)  # [n - first, H, D]
        vals = p.v[sl].double().repeat_interleave(group, dim=1)
        rows = slice(int(p.q_start[r]), int(p.q_start[r + 1]))
        q = p.q[rows].double()  # [e, H, D]
        qpos = torch.arange(n - new, n, device=p.q.device)[:, None]
        kpos = torch.arange(first, n, device=p.q.device)[None, :]
        visible = kpos <= qpos
        if window is not None:
            visible &= kpos > qpos - window
        scores = torch.einsum("thd,khd->htk", q, keys) * scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[rows] = torch.einsum("htk,khd->thd", torch.softmax(scores, -1), vals)
    return out
