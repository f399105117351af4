"""The decode-graph part of the device check (scripts/gpu_check.py; issue 35, item 3).

On a CUDA device, over the 1B shape (Llama-3.2-1B's: 16 layers, hidden 2,048, 32 / 8 heads of 64,
MLP 8,192, the default 49,152-token vocabulary) with random bf16 weights made on the device (no
checkpoint to build or read) and random K/V in a pool of scattered slots, through the Triton
backend:

1. capture: one CUDA graph per bucket (1, 2, 4, 8, 16, 24, 32), timed;
2. exactness: for batches of 1, 8 and 32 requests (each fills its bucket) the logits through the
   graph must equal the eager forward's bit for bit, and so must the K/V the step wrote; for 3
   and 20 requests (padded to 4 and 24) the graph must equal the eager forward of the padded
   batch, and whether it equals the unpadded eager forward is printed (that is cuBLAS's batch
   invariance between M = 3 and M = 4, not the graph's doing);
3. speed: one decode step at batch 1, 8 and 32 with a 1,024-token context per request, eager and
   through the graph (copy-in, replay, slice-out included), against the weight-read floor (bf16
   weights read once per step at the measured copy bandwidth) and that floor plus the step's K/V.

`engine_graphs` runs the default model through the Engine on the device twice, with decode
graphs (the default) and with --cuda-graph-max-bs 0, and prints whether the greedy tokens agree
and how many steps replayed a graph.

On the CPU (`--device cpu`, and the unit tests) the same code runs a small shape through the
Triton kernels under the interpreter with the recording capturer: a dry run of the script, not a
measurement.
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch

from radixkv.bench.tiny_model import LLAMA_1B

# The 1B shape of `radixkv bench` (its config, less the initializer, with the default vocabulary).
ONE_B: dict[str, Any] = {
    **{k: v for k, v in LLAMA_1B.config.items() if k != "initializer_range"},
    "vocab_size": 49152,
}
DRY: dict[str, Any] = {  # the CPU dry run's shape
    **ONE_B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
}
BATCHES = (1, 8, 32)  # bucket sizes: timed, and must equal eager bit for bit
PADDED = (3, 20)  # padded to 4 and 24
CONTEXT = 1024


def random_llama(shape: dict[str, Any], device: str, dtype: torch.dtype, backend: Any) -> Any:
    """A Llama-family CausalLM of `shape` with seeded random weights made on `device`."""
    from radixkv.model.config import LlamaConfig
    from radixkv.model.families.llama import CausalLM

    cfg = LlamaConfig.from_dict({"architectures": ["LlamaForCausalLM"], "eos_token_id": 2, **shape})
    h, dim = cfg.hidden_size, cfg.head_dim
    shapes = {
        "q_proj": (cfg.num_heads * dim, h),
        "k_proj": (cfg.num_kv_heads * dim, h),
        "v_proj": (cfg.num_kv_heads * dim, h),
        "o_proj": (h, cfg.num_heads * dim),
        "gate_proj": (cfg.intermediate_size, h),
        "up_proj": (cfg.intermediate_size, h),
        "down_proj": (h, cfg.intermediate_size),
        "embed_tokens": (cfg.vocab_size, h),
    }

    def get(name: str) -> torch.Tensor | None:
        if name.endswith(".bias") or name == "lm_head.weight":
            return None
        if "norm" in name:
            return torch.ones(h, device=device, dtype=dtype)
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
        out = torch.randn(shapes[name.split(".")[-2]], generator=gen, device=device)
        return out.mul_(0.02).to(dtype)

    return CausalLM(cfg, get, device=device, attention=backend).eval()


def _decode_step(model: Any, reqs: int, context: int, seed: int) -> Any:
    """One decode step of `reqs` requests, request r's context in scattered slots of its own
    stretch of the pool: [r * (context + 1), (r + 1) * (context + 1))."""
    from radixkv.model.batch import ForwardBatch

    gen = torch.Generator().manual_seed(seed)
    span = context + 1
    table = torch.stack([r * span + torch.randperm(span, generator=gen) for r in range(reqs)])
    ids = torch.randint(3, model.config.vocab_size, (reqs,), generator=gen)
    return ForwardBatch.from_table(ids, table, [1] * reqs, [span] * reqs, device=model.device)


def weight_bytes(model: Any) -> int:
    """Bytes one decode step reads at least once: every layer's projections and the head."""
    c = model.config
    h, dim, el = c.hidden_size, c.head_dim, model.dtype.itemsize
    attn = h * (c.num_heads + 2 * c.num_kv_heads) * dim + c.num_heads * dim * h
    return (c.num_layers * (attn + 3 * h * c.intermediate_size) + c.vocab_size * h) * el


def _setup(device: str, shape: dict[str, Any], max_bs: int, context: int, capturer: Any) -> Any:
    from radixkv.engine.graph_capture import CudaGraphCapturer
    from radixkv.engine.graph_runner import GraphRunner
    from radixkv.memory.allocator import PageAllocator
    from radixkv.memory.pool import KVPool
    from radixkv.model.triton.backend import TritonAttention

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = random_llama(shape, device, dtype, TritonAttention())
    slots = max_bs * (context + 1) + 1  # every request's stretch, then the scratch page
    pool = KVPool(model.config.pool_config(slots, dtype, device))
    gen = torch.Generator(device=device).manual_seed(7)
    for t in (*pool.k, *pool.v):
        t.copy_(torch.randn(t.shape, generator=gen, device=device).to(dtype))
    scratch = PageAllocator(slots, 1).reserve_tail()
    capturer = capturer or CudaGraphCapturer(device)
    graphs = GraphRunner(model, pool, max_bs, context + 1, scratch, capturer)
    return model, pool, graphs


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def exactness(model: Any, pool: Any, graphs: Any, context: int, sizes: tuple[int, ...]) -> list:
    """Graph vs eager logits (and written K/V) per batch size; see the module docstring."""
    from radixkv.engine.graph_runner import pad_decode

    rows = []
    for reqs in sizes:
        step = _decode_step(model, reqs, context, seed=reqs)
        eager = model(step, pool)
        kv_eager = [pool.k[0][step.out_slots].clone(), pool.v[-1][step.out_slots].clone()]
        graph = graphs.run(step)
        kv_graph = [pool.k[0][step.out_slots], pool.v[-1][step.out_slots]]
        bucket = graphs.bucket_for(reqs)
        row: dict[str, Any] = {"requests": reqs, "bucket": bucket, "replayed": graph is not None}
        if graph is None:
            row["ok"] = False
            rows.append(row)
            continue
        row["equal_eager"] = torch.equal(graph, eager)
        row["max_diff_eager"] = float((graph - eager).abs().max())
        row["kv_equal"] = all(torch.equal(a, b) for a, b in zip(kv_eager, kv_graph, strict=True))
        if bucket == reqs:
            row["ok"] = row["equal_eager"] and row["kv_equal"]
        else:  # the graph computes the padded batch: it must equal that batch's eager forward
            padded = model(pad_decode(step, bucket, graphs.scratch), pool)[:reqs]
            row["equal_eager_padded"] = torch.equal(graph, padded)
            row["ok"] = row["equal_eager_padded"]
        rows.append(row)
    return rows


def timings(
    model: Any,
    pool: Any,
    graphs: Any,
    context: int,
    sizes: tuple[int, ...],
    bench: Callable[[Callable[[], Any]], float],
    bw_gbps: float | None,
) -> list:
    """ms per decode step, eager and through the graph, against the weight-read floor."""
    c = model.config
    floor_ms = weight_bytes(model) / bw_gbps / 1e6 if bw_gbps else None
    rows = []
    for reqs in sizes:
        step = _decode_step(model, reqs, context, seed=100 + reqs)
        eager_ms = bench(lambda: model(step, pool))  # noqa: B023
        graph_ms = bench(lambda: graphs.run(step))  # noqa: B023
        kv = reqs * (context + 1) * c.num_layers * c.num_kv_heads * c.head_dim * 2
        kv_ms = kv * model.dtype.itemsize / bw_gbps / 1e6 if bw_gbps else None
        rows.append({
            "requests": reqs, "context": context, "eager_ms": eager_ms, "graph_ms": graph_ms,
            "speedup": eager_ms / graph_ms, "weight_floor_ms": floor_ms,
            "graph_of_floor": graph_ms / floor_ms if floor_ms else None,
            "floor_with_kv_ms": floor_ms + kv_ms if floor_ms and kv_ms else None,
        })  # fmt: skip
    return rows


def _timer(device: str) -> Callable[[Callable[[], Any]], float]:
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=25, rep=200, return_mode="median"))

    def once(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return once


def skip_reason(device: str) -> str | None:
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return "no CUDA device visible"
        if os.environ.get("TRITON_INTERPRET", "0") == "1":
            return "TRITON_INTERPRET=1: the kernels would be interpreted, not compiled"
    elif device != "cpu":
        return f"{device}: graphs are captured on CUDA (dry run: --device cpu)"
    elif "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "triton imported without TRITON_INTERPRET=1: no CPU dry run"
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not importable: {e}"
    return None


def graphs_check(device: str, bw_gbps: float | None = None, capturer: Any = None) -> dict:
    """The stage: {"skipped": reason} or capture, exactness and timings with "ok"."""
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's import: a dry run
    reason = skip_reason(device)
    if reason is not None:
        return {"skipped": reason, "ok": True}
    dry = not device.startswith("cuda")
    shape, context = (DRY, 24) if dry else (ONE_B, CONTEXT)
    if dry and capturer is None:
        from radixkv.engine.graph_capture import RecordingCapturer

        capturer = RecordingCapturer()
    sizes, padded = ((1, 2, 4), (3,)) if dry else (BATCHES, PADDED)
    model, pool, graphs = _setup(device, shape, max(sizes), context, capturer)
    t0 = time.perf_counter()
    captured = graphs.capture_all()
    _sync(device)
    out: dict[str, Any] = {"capture_s": time.perf_counter() - t0, "buckets": list(graphs.sizes)}
    print(f"graphs: captured {captured} in {out['capture_s']:.1f} s, buckets {graphs.sizes}",
          graphs.failed or "", flush=True)  # fmt: skip
    if not captured:
        return {**out, "failed": graphs.failed, "ok": False}
    if bw_gbps is None and not dry:
        try:
            from scripts.gpu_triton import copy_bandwidth
        except ImportError:  # run as `python scripts/gpu_check.py`: scripts/ is on the path
            from gpu_triton import copy_bandwidth  # type: ignore[no-redef]

        bw_gbps = copy_bandwidth(device, _timer(device))
    out["copy_GB/s"] = bw_gbps
    out["exactness"] = exactness(model, pool, graphs, context, tuple(sorted(sizes + padded)))
    for row in out["exactness"]:
        print("graphs exact", row, flush=True)
    out["timings"] = timings(model, pool, graphs, context, sizes, _timer(device), bw_gbps)
    for row in out["timings"]:
        print("graphs step", {k: round(v, 4) if isinstance(v, float) else v
                              for k, v in row.items()}, flush=True)  # fmt: skip
    out["fallbacks"] = dict(graphs.fallbacks)
    out["ok"] = all(r["ok"] for r in out["exactness"]) and not graphs.fallbacks
    return out


def engine_graphs(device: str, model_path: str | None = None) -> dict:
    """The default model through the Engine with decode graphs and without: the greedy tokens
    of four prompts (a bucket of 4) and three (padded to 4), and the replay count."""
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {"skipped": "the engine captures graphs on CUDA only", "ok": True}
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5] * (i + 1) + [100 + i] for i in range(4)]
    out: dict[str, Any] = {}
    tokens = {}
    for label, max_bs in (("graphs", None), ("eager", 0)):
        engine = Engine(model_path, device=device, cuda_graph_max_bs=max_bs, num_slots=8192)
        for name, group in (("four", prompts), ("three", prompts[:3])):
            t0 = time.perf_counter()
            res = engine.generate(group, params)
            out[f"{label}_{name}_s"] = time.perf_counter() - t0
            tokens[(label, name)] = [r.output_token_ids for r in res]
        graphs = engine.runner.graphs
        out[f"{label}_replays"] = 0 if graphs is None else graphs.replays
        out[f"{label}_fallbacks"] = {} if graphs is None else dict(graphs.fallbacks)
        if graphs is not None and graphs.failed:
            out["capture_failed"] = graphs.failed
        engine.check_memory()
        del engine
    for name in ("four", "three"):
        out[f"tokens_equal_{name}"] = tokens[("graphs", name)] == tokens[("eager", name)]
    out["ok"] = out["graphs_replays"] > 0 and "capture_failed" not in out
    return out
