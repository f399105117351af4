"""The checks the Triton kernels must pass, shared by the unit tests (CPU, under the
interpreter) and the device script (scripts/gpu_check.py, compiled on a GPU), so both machines
run the same problems:

- `check_case`: a ragged batch against the float64 reference, through the extend launcher (one
  part per tile) and again split-K (decode's parts for every row); the two must agree bit for bit.
- `invariance_pairs`: outputs that must be the same bits: a request alone vs in a batch, a prompt
  whole vs in chunks after cached prefixes, every extend row vs the decode kernel at its
  position, 1 vs several parts, a page table vs the equivalent slot table (int32).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.model.triton.paged_attention import (
    decode_attention,
    decode_parts,
    extend_attention,
    paged_attention,
)
from radixkv.model.triton.reference import Problem, problem, reference

# (atol, rtol) against the float64 reference, by dtype (the output's rounding dominates in
# 16-bit: bfloat16 keeps 8 bits, and the weights are rounded to it before the values product).
TOLERANCE = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (1e-2, 2e-2),
}


@dataclass(frozen=True)
class Case:
    """A ragged batch: request r has a context of ctx[r] tokens, the last new[r] of them new
    (new 1: a decode row; new < ctx: a cached prefix)."""

    name: str
    heads: int
    kv: int
    dim: int
    dtype: torch.dtype
    window: int | None
    ctx: tuple[int, ...]
    new: tuple[int, ...]
    page_size: int = 1

    def problem(self, device: str | torch.device = "cpu") -> Problem:
        p = problem(list(self.ctx), list(self.new), heads=self.heads, kv=self.kv, dim=self.dim,
                    dtype=self.dtype, page_size=self.page_size, device=device)  # fmt: skip
        if self.window is not None:
            poison_outside_windows(p, self.window)
        return p


# Small enough for the interpreter; one context crosses a split (512 keys) in each dtype.
CASES = (
    Case("g1-d64-f32", 2, 2, 64, torch.float32, None, (530, 33, 80, 5), (1, 33, 20, 1)),
    Case("g3-d64-bf16-w16", 6, 2, 64, torch.bfloat16, 16, (70, 40, 9), (1, 30, 9)),
    Case("g4-d128-f32-w100", 4, 1, 128, torch.float32, 100, (300, 120), (1, 50)),
    Case("g4-d128-bf16", 8, 2, 128, torch.bfloat16, None, (520, 24, 61), (1, 24, 13)),
    Case("g3-d128-f32-page16", 3, 1, 128, torch.float32, None, (90, 47, 5), (30, 1, 5), 16),
    Case("g4-d64-bf16-w1", 4, 1, 64, torch.bfloat16, 1, (40, 7), (12, 1)),
    Case("g2-d80-f16", 4, 2, 80, torch.float16, None, (64, 3), (1, 3)),
)


def poison_outside_windows(p: Problem, window: int) -> None:
    """Point every table entry no query of the batch can see (before its first new token's
    window) at the pool's spare page, filled with NaN, as a sliding-window pool may free and
    reuse them: a kernel that reads one returns NaN."""
    spare = p.k.shape[0] // p.page_size - 1  # no table entry points there (reference.problem)
    p.k[spare * p.page_size :] = float("nan")
    p.v[spare * p.page_size :] = float("nan")
    for r, new in enumerate(p.new_lens):
        first = int(p.seq_lens[r]) - new - window + 1  # oldest key of the first new token
        if first >= p.page_size:  # whole slots (or pages) before it
            p.table[r, : first // p.page_size] = spare


def check_case(case: Case, device: str | torch.device = "cpu") -> dict[str, object]:
    """The case's errors against the reference, through one part and through split-K."""
    p = case.problem(device)
    scale = case.dim**-0.5
    args = (p.q, p.k, p.v, p.table, p.seq_lens, p.q_start)
    one = extend_attention(*args, scale=scale, window=case.window, page_size=case.page_size)
    parts = decode_parts(max(case.ctx), case.window) + 1
    split = paged_attention(*args, scale=scale, window=case.window, page_size=case.page_size,
                            num_parts=parts)  # fmt: skip
    ref = reference(p, case.window, scale)
    atol, rtol = TOLERANCE[case.dtype]
    err = (one.double() - ref).abs()
    bound = atol + rtol * ref.abs()
    return {
        "case": case.name,
        "max_abs_err": float(err.max()),
        "worst_over_tolerance": float((err / bound).max()),
        "within_tolerance": bool((err <= bound).all()),
        "parts_equal": torch.equal(one, split),
    }


def _alone_vs_batch(dtype: torch.dtype, device: str | torch.device, window: int | None) -> list:
    # Request 1 (40 new tokens after a cached prefix of 90) alone and between three others.
    p = problem([57, 130, 1, 300], [57, 40, 1, 1], heads=6, kv=2, dim=64, dtype=dtype,
                device=device)  # fmt: skip
    kw: dict[str, Any] = {"scale": 0.125, "window": window}
    batch = extend_attention(p.q, p.k, p.v, p.table, p.seq_lens, p.q_start, **kw)
    rows = slice(int(p.q_start[1]), int(p.q_start[2]))
    alone_start = torch.tensor([0, 40], device=device)
    alone = extend_attention(p.q[rows], p.k, p.v, p.table[1:2], p.seq_lens[1:2], alone_start, **kw)
    return [("alone vs batch", alone, batch[rows])]


def _chunks(dtype: torch.dtype, device: str | torch.device, window: int | None) -> list:
    # A 150-token prompt whole, then in chunks of 50, 1, 70, 29 (each after the cached rest),
    # then all four chunks in one batch as separate requests.
    n, cuts = 150, [0, 50, 51, 121, 150]
    p = problem([n], [n], heads=4, kv=1, dim=64, dtype=dtype, device=device)
    kw: dict[str, Any] = {"scale": 0.125, "window": window}
    whole = extend_attention(p.q, p.k, p.v, p.table, p.seq_lens, p.q_start, **kw)
    pieces = []
    for a, b in itertools.pairwise(cuts):
        lens, start = torch.tensor([b], device=device), torch.tensor([0, b - a], device=device)
        pieces.append(extend_attention(p.q[a:b], p.k, p.v, p.table, lens, start, **kw))
    lens = torch.tensor(cuts[1:], device=device)
    table = p.table.expand(len(cuts) - 1, -1).contiguous()
    starts = torch.tensor(cuts, device=device)
    together = extend_attention(p.q, p.k, p.v, table, lens, starts, **kw)
    return [
        ("whole vs chunks", whole, torch.cat(pieces)),
        ("whole vs chunk batch", whole, together),
    ]


def _decode_rows(dtype: torch.dtype, device: str | torch.device, window: int | None) -> list:
    # A 600-token prompt (two splits) whole; the decode kernel for positions around the split
    # and block edges, all in one decode batch.
    n, at = 600, [599, 513, 512, 511, 64, 63, 0]
    p = problem([n], [n], heads=2, kv=1, dim=64, dtype=dtype, device=device)
    whole = extend_attention(p.q, p.k, p.v, p.table, p.seq_lens, p.q_start, scale=0.125,
                             window=window)  # fmt: skip
    pos = torch.tensor(at, device=device)
    table = p.table.expand(len(at), -1).contiguous()
    dec = decode_attention(p.q[pos], p.k, p.v, table, pos + 1, scale=0.125, max_seq_len=n,
                           window=window)  # fmt: skip
    return [("extend rows vs decode", whole[pos], dec)]


def _parts_and_pages(dtype: torch.dtype, device: str | torch.device, window: int | None) -> list:
    # One batch in pages of 16 through 1, 2 and 5 parts, and through the slot table.
    p = problem([700, 20, 1], [30, 20, 1], heads=4, kv=2, dim=64, dtype=dtype, page_size=16,
                device=device)  # fmt: skip
    args = (p.q, p.k, p.v, p.table, p.seq_lens, p.q_start)
    kw: dict[str, Any] = {"scale": 0.125, "window": window, "page_size": 16}
    outs = [paged_attention(*args, num_parts=n, **kw) for n in (1, 2, 5)]
    # The slot table and the lengths as int32 (the page table's are int64).
    slots = torch.full((3, 700), -1, dtype=torch.int32, device=device)
    for r in range(3):
        slots[r, : int(p.seq_lens[r])] = p.slots(r)
    lens, starts = p.seq_lens.int(), p.q_start.int()
    by_slot = extend_attention(p.q, p.k, p.v, slots, lens, starts, scale=0.125, window=window)
    return [
        ("1 vs 2 parts", outs[0], outs[1]),
        ("1 vs 5 parts", outs[0], outs[2]),
        ("page table vs int32 slot table", outs[0], by_slot),
    ]


INVARIANCE = {
    "batch": _alone_vs_batch,
    "chunks": _chunks,
    "decode": _decode_rows,
    "parts": _parts_and_pages,
}


def invariance_pairs(
    kind: str, dtype: torch.dtype, device: str | torch.device = "cpu", window: int | None = None
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, a, b) pairs that must be equal bit for bit (torch.equal); kind: INVARIANCE's
    keys."""
    return INVARIANCE[kind](dtype, device, window)
