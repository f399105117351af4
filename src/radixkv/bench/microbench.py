"""Micro-benchmarks of the model layer (no engine): `python -m radixkv.bench.microbench`.

1. Attention kernels on CPU: torch SDPA vs gather + matmul/softmax vs the C++ kernels (all through
   our TorchAttention), for a causal prefill of one request and a batched one-query decode, in
   float32 and bfloat16, with the default model's head layout (9 query heads, 3 KV heads,
   head_dim 64). Every variant reads K/V from a pool by slot index, so the gather cost is
   included in the torch ones.
2. The default model end to end: prefill tokens/s and single-request decode tokens/s.
3. `--steps-ab plain,packed,compiled`: one decode step of B requests after P-token prompts for
   each variant of the default model (plain F.linear weights / oneDNN-packed / packed + compiled),
   the variants' steps interleaved so a shared machine's load hits them alike; `--profile` adds a
   torch.profiler table of the last variant's steps.
Times are the best of several runs (on a shared machine the minimum is the least disturbed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from radixkv.memory.pool import KVPool
from radixkv.model.attention import TorchAttention
from radixkv.model.batch import ForwardBatch
from radixkv.model.loader import LoadedModel, load_model
from radixkv.model.simple import single_batch

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def _best_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Best-of-`repeats` time in ms: on a shared machine the minimum is the least disturbed."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * min(times)


def _batch(lens: list[int], extend: list[int], slots: torch.Tensor) -> ForwardBatch:
    offsets = [sum(lens[:i]) for i in range(len(lens))]
    ctx = [slots[o : o + s] for o, s in zip(offsets, lens, strict=True)]
    return ForwardBatch.from_contexts(torch.zeros(sum(extend), dtype=torch.int64), ctx, extend)


def _attention_case(
    attn: TorchAttention, batch: ForwardBatch, k_cache: torch.Tensor, repeats: int
) -> float:
    q = torch.randn(batch.num_tokens, HEADS, HEAD_DIM).to(k_cache.dtype)
    meta = attn.prepare(batch)
    return _best_ms(lambda: attn.attend(q, k_cache, k_cache, meta, None, HEAD_DIM**-0.5), repeats)


def attention_bench(prefill_len: int, decode_batch: int, decode_ctx: int, repeats: int) -> dict:
    """ms per layer call of each kernel: one causal prefill, and a batched one-query decode
    (`cpp`: the C++ extend and decode kernels, where they build)."""
    from radixkv.model.kernels import decode_attention, extend_attention

    results: dict[str, dict[str, float]] = {}
    kernels = {name: TorchAttention(name) for name in ("matmul", "sdpa")}
    if decode_attention() is not None and extend_attention() is not None:
        kernels["cpp"] = TorchAttention("sdpa", decode_attention(), extend_attention())
    for dtype in (torch.float32, torch.bfloat16):
        total = max(prefill_len, decode_batch * decode_ctx)
        k_cache = torch.randn(total, KV_HEADS, HEAD_DIM).to(dtype)
        slots = torch.randperm(total)
        cases = {
            "prefill": _batch([prefill_len], [prefill_len], slots[:prefill_len]),
            "decode": _batch([decode_ctx] * decode_batch, [1] * decode_batch, slots),
        }
        results[str(dtype).removeprefix("torch.")] = {
            f"{case}_{name}_ms": _attention_case(attn, batch, k_cache, repeats)
            for case, batch in cases.items()
            for name, attn in kernels.items()
        }
    return results


def _step_times_ms(steps: list[Callable[[], object]]) -> tuple[float, float]:
    """(best, median) wall time of the individual steps, in ms."""
    times = []
    for fn in steps:
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return min(times), statistics.median(times)


def _model_rates(
    lm: LoadedModel, prompt_len: int, decode_steps: int, decode_batch: int, repeats: int
) -> dict[str, float]:
    """Prefill of one prompt; decode steps of one request, and of `decode_batch` requests
    together (each decode step timed on its own; best and median reported)."""
    total = prompt_len + decode_steps
    pool = KVPool(lm.config.pool_config(total * decode_batch, dtype=lm.dtype))
    ids = torch.randint(3, lm.config.vocab_size, (total,)).tolist()
    per_req = [torch.arange(r * total, (r + 1) * total) for r in range(decode_batch)]
    prefill_ms = _best_ms(
        lambda: lm.model(single_batch(ids[:prompt_len], 0, per_req[0]), pool), repeats
    )
    for r in range(1, decode_batch):  # every request's context holds the prompt
        lm.model(single_batch(ids[:prompt_len], 0, per_req[r]), pool)

    def one(p: int) -> Callable[[], object]:
        return lambda: lm.model(single_batch([ids[p]], p, per_req[0]), pool)

    def batched(p: int) -> Callable[[], object]:
        ctx = torch.cat([s[: p + 1] for s in per_req])
        batch = _batch([p + 1] * decode_batch, [1] * decode_batch, ctx)
        return lambda: lm.model(batch, pool)

    one_best, one_median = _step_times_ms([one(p) for p in range(prompt_len, total)])
    many_best, many_median = _step_times_ms([batched(p) for p in range(prompt_len, total)])
    return {
        "prefill_tokens_per_s": prompt_len / (prefill_ms / 1000),
        "decode_tokens_per_s": 1000 / one_best,
        "decode_tokens_per_s_median": 1000 / one_median,
        f"decode_batch{decode_batch}_tokens_per_s": decode_batch * 1000 / many_best,
        f"decode_batch{decode_batch}_tokens_per_s_median": decode_batch * 1000 / many_median,
    }


def model_bench(prompt_len: int, decode_steps: int, decode_batch: int, repeats: int) -> dict:
    return {
        str(dtype).removeprefix("torch."): _model_rates(
            load_model(None, dtype=dtype), prompt_len, decode_steps, decode_batch, repeats
        )
        for dtype in (torch.float32, torch.bfloat16)
    }


def _variant(name: str, dtype: torch.dtype) -> LoadedModel:
    """The default model as `plain` (unpacked weights), `packed` or `compiled`."""
    if name not in ("plain", "packed", "compiled"):
        raise SystemExit(f"unknown variant {name!r} (plain | packed | compiled)")
    old = os.environ.get("RADIXKV_PACK_WEIGHTS")
    os.environ["RADIXKV_PACK_WEIGHTS"] = "0" if name == "plain" else "1"
    try:
        lm = load_model(None, dtype=dtype)
    finally:
        if old is None:
            del os.environ["RADIXKV_PACK_WEIGHTS"]
        else:
            os.environ["RADIXKV_PACK_WEIGHTS"] = old
    if name == "compiled":
        # Compile and warm up as the engine's ModelRunner.compile does: a two-token forward
        # (the dynamic-shape graph) and a one-token one (its own graph).
        model: Any = lm.model
        model.compile()
        pool = KVPool(lm.config.pool_config(2, dtype=lm.dtype))
        slots = torch.arange(2, dtype=torch.int64)
        with torch.inference_mode():
            lm.model(ForwardBatch.from_contexts([0, 0], [slots], [2]), pool)
            lm.model(ForwardBatch.from_contexts([0], [slots], [1]), pool)
    return lm


def steps_ab(
    variants: list[str], dtype: torch.dtype, batch: int, prompt: int, steps: int, prof: bool
) -> dict[str, dict[str, float]]:
    """Best/median ms of a B-request decode step per variant (steps interleaved), and the max
    logit difference of each variant from the first."""
    total = prompt + steps + 1
    ids = torch.randint(3, 49152, (batch, total))
    ctx = [torch.arange(r * total, (r + 1) * total) for r in range(batch)]
    runs = {}
    for name in variants:
        lm = _variant(name, dtype)
        pool = KVPool(lm.config.pool_config(total * batch, dtype=lm.dtype))
        prefill = ForwardBatch.from_contexts(
            ids[:, :prompt].reshape(-1), [c[:prompt] for c in ctx], [prompt] * batch
        )
        lm.model(prefill, pool)
        runs[name] = (lm, pool)
    times: dict[str, list[float]] = {n: [] for n in variants}
    logits: dict[str, list[torch.Tensor]] = {n: [] for n in variants}
    profiler = None
    for s in range(steps + 1):
        p = prompt + s
        b = ForwardBatch.from_contexts(ids[:, p], [c[: p + 1] for c in ctx], [1] * batch)
        if prof and s == 1:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        for name in variants:
            lm, pool = runs[name]
            if profiler is not None and name == variants[-1]:
                profiler.start()
            t0 = time.perf_counter()
            logits[name].append(lm.model(b, pool))
            if s:  # the first step may still compile or allocate
                times[name].append(1000 * (time.perf_counter() - t0))
            if profiler is not None and name == variants[-1]:
                profiler.stop()
    if profiler is not None:
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    out = {}
    for name in variants:
        diffs = zip(logits[name], logits[variants[0]], strict=True)
        out[name] = {
            "best_ms": min(times[name]),
            "median_ms": statistics.median(times[name]),
            "max_abs_logit_diff": max(float((a - b).abs().max()) for a, b in diffs),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--decode-ctx", type=int, default=1024)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--skip-model", action="store_true")
    parser.add_argument("--steps-ab", default=None, help="e.g. plain,packed,compiled (only this)")
    parser.add_argument("--dtype", default="float32", help="--steps-ab: float32 | bfloat16")
    parser.add_argument("--prompt-len", type=int, default=256, help="--steps-ab: prompt tokens")
    parser.add_argument("--profile", action="store_true", help="--steps-ab: profiler table")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.steps_ab:
        variants = [v.strip() for v in args.steps_ab.split(",") if v.strip()]
        res = steps_ab(
            variants,
            getattr(torch, args.dtype),
            args.decode_batch,
            args.prompt_len,
            args.decode_steps,
            args.profile,
        )
        print(json.dumps({"threads": torch.get_num_threads(), "dtype": args.dtype, **res}))
        return
    out = {
        "threads": torch.get_num_threads(),
        "attention": attention_bench(
            args.prefill_len, args.decode_batch, args.decode_ctx, args.repeats
        ),
    }
    if not args.skip_model:
        out["model"] = model_bench(
            args.prefill_len, args.decode_steps, args.decode_batch, max(3, args.repeats // 2)
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
