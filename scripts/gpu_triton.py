"""The Triton kernels' part of the device check (scripts/gpu_check.py): on a CUDA device, the
paged-attention kernels (radixkv.model.triton) compiled, not interpreted, against the float64
reference and for bit invariance (the problems the unit tests run under the interpreter), the
element-wise kernels (pointwise.py) against their torch formulas and for row invariance, then
timed with triton.testing.do_bench: decode as GB/s of K/V read against the device's measured copy
bandwidth (and an H200's nominal 4.8 TB/s), extend as TFLOP/s against an H200's nominal dense
bf16 rate, next to torch's SDPA on the same shape with K/V contiguous. Skipped, saying why,
without CUDA or Triton, or under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

H200_GBPS = 4800.0  # nominal HBM3e bandwidth
H200_BF16_TFLOPS = 989.0  # nominal dense bf16 tensor-core rate (SXM)
# (name, query heads, KV heads, head dim): the 1B shape (Llama 3.2 1B) and the default model.
SHAPES = (("1b", 32, 8, 64), ("smollm2-135m", 9, 3, 64))
DECODE = ((32, 1024), (32, 4096), (8, 16384))  # (requests, context per request)
EXTEND = ((2048, 0), (2048, 6144))  # (new tokens, cached prefix) of one request


def skip_reason(device: str) -> str | None:
    """Why the Triton stage cannot run here, or None."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return "needs a CUDA device (the unit tests run these checks under the interpreter)"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "TRITON_INTERPRET=1: the kernels would be interpreted, not compiled"
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not importable: {e}"
    return None


def _paged_pool(
    reqs: int, ctx: int, kv: int, dim: int, device: str, page: int = 16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V of `reqs` contexts of `ctx` keys in pages of `page` slots at shuffled places, and the
    slot table reaching them (one slot per position, as the ForwardBatch has it)."""
    pages = reqs * -(-ctx // page)
    k = torch.randn(pages * page, kv, dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    order = torch.randperm(pages, device=device).view(reqs, -1)
    pos = torch.arange(ctx, device=device)
    table = order[:, pos // page] * page + pos % page
    return k, v, table


def bench_decode(device: str, bench: Callable[..., float], bw_gbps: float) -> list[dict]:
    from radixkv.model.triton.paged_attention import decode_attention

    rows = []
    for name, heads, kv, dim in SHAPES:
        for reqs, ctx in DECODE:
            k, v, table = _paged_pool(reqs, ctx, kv, dim, device)
            q = torch.randn(reqs, heads, dim, device=device, dtype=torch.bfloat16)
            lens = torch.full((reqs,), ctx, device=device)
            kw = {"scale": dim**-0.5, "max_seq_len": ctx}
            ms = bench(lambda: decode_attention(q, k, v, table, lens, **kw))  # noqa: B023
            gbps = reqs * ctx * kv * dim * 2 * 2 / ms / 1e6  # K and V, bf16
            rows.append({"kind": "decode", "shape": name, "requests": reqs, "context": ctx,
                         "ms": ms, "GB/s": gbps, "of_measured_bw": gbps / bw_gbps,
                         "of_h200_nominal": gbps / H200_GBPS})  # fmt: skip
    return rows


def bench_extend(device: str, bench: Callable[..., float]) -> list[dict]:
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from radixkv.model.triton.paged_attention import extend_attention

    rows = []
    for name, heads, kv, dim in SHAPES:
        for new, prefix in EXTEND:
            n = new + prefix
            k, v, table = _paged_pool(1, n, kv, dim, device)
            q = torch.randn(new, heads, dim, device=device, dtype=torch.bfloat16)
            lens, starts = torch.tensor([n], device=device), torch.tensor([0, new], device=device)
            ms = bench(lambda: extend_attention(q, k, v, table, lens, starts, scale=dim**-0.5))  # noqa: B023
            visible = new * prefix + new * (new + 1) / 2  # keys summed over the new rows
            tflops = 4 * heads * dim * visible / ms / 1e9
            # SDPA on contiguous K/V: causal, or a bottom-right mask after a cached prefix.
            qt = q.transpose(0, 1)[None].contiguous()
            kt = k[table[0]].transpose(0, 1)[None].repeat_interleave(heads // kv, 1).contiguous()
            vt = v[table[0]].transpose(0, 1)[None].repeat_interleave(heads // kv, 1).contiguous()
            mask = None
            if prefix:
                mask = torch.ones(new, n, dtype=torch.bool, device=device).tril(prefix)
            sdpa_ms = bench(lambda: sdpa(qt, kt, vt, attn_mask=mask, is_causal=mask is None))  # noqa: B023
            rows.append({"kind": "extend", "shape": name, "new": new, "prefix": prefix,
                         "ms": ms, "TFLOP/s": tflops, "of_h200_bf16": tflops / H200_BF16_TFLOPS,
                         "sdpa_contiguous_ms": sdpa_ms})  # fmt: skip
    return rows


def copy_bandwidth(device: str, bench: Callable[..., float]) -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() / ms / 1e6


def correctness(device: str) -> dict[str, Any]:
    """Every case against the reference and every invariance pair, compiled on the device."""
    from radixkv.model.triton.checks import CASES, INVARIANCE, check_case, invariance_pairs

    cases = [check_case(c, device) for c in CASES]
    pairs = []
    for kind in INVARIANCE:
        for dtype in (torch.float32, torch.bfloat16):
            for window in (None, 37):
                for label, a, b in invariance_pairs(kind, dtype, device, window):
                    diff = float((a.float() - b.float()).abs().max())
                    pairs.append({"label": label, "dtype": str(dtype).removeprefix("torch."),
                                  "window": window, "equal": torch.equal(a, b),
                                  "max_diff": diff})  # fmt: skip
    ok = all(c["within_tolerance"] and c["parts_equal"] for c in cases)
    ok = ok and all(p["equal"] for p in pairs)
    return {"cases": cases, "invariance": pairs, "ok": ok}


def triton_check(device: str, timings: bool = True) -> dict[str, Any]:
    """The stage: {"skipped": reason} or correctness (+ timings) with "ok"."""
    reason = skip_reason(device)
    if reason is not None:
        return {"skipped": reason, "ok": True}
    from triton.testing import do_bench

    def bench(fn: Callable[[], Any]) -> float:
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    from radixkv.model.triton.pointwise_checks import pointwise_results

    t0 = time.perf_counter()
    out = correctness(device)
    out["pointwise"] = pointwise_results(device)
    out["ok"] = out["ok"] and all(
        r["within_tolerance"] and r["rows_invariant"] and r.get("equal_torch", True)
        for r in out["pointwise"]
    )
    out["correctness_s"] = time.perf_counter() - t0
    for c in out["cases"]:
        print("triton case", c, flush=True)
    for r in out["pointwise"]:
        print("triton pointwise", r, flush=True)
    bad = [p for p in out["invariance"] if not p["equal"]]
    print(f"triton invariance: {len(out['invariance']) - len(bad)} equal, {len(bad)} differ",
          bad[:5], flush=True)  # fmt: skip
    if timings:
        bw = copy_bandwidth(device, bench)
        out["copy_GB/s"] = bw
        print(f"triton: device copy bandwidth {bw:.0f} GB/s (H200 nominal {H200_GBPS:.0f})")
        out["bench"] = bench_decode(device, bench, bw) + bench_extend(device, bench)
        for row in out["bench"]:
            print("triton bench", {k: round(v, 4) if isinstance(v, float) else v
                                   for k, v in row.items()}, flush=True)  # fmt: skip
    return out
