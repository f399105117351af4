"""Where a GPU step's time goes (issue 35): `python scripts/gpu_profile.py --model DIR` on a device
machine (scripts/gpu_session.sh runs it with --profile). Each part prints as it finishes:

1. `ttft`: the Engine's time to first token, 2,048 cached prefix tokens + 32 new ones against
   none, eager and compiled; the cached request under cProfile (host functions by own time) and
   torch.profiler (ops by host time and kernels by device time, kernel and sync counts).
2. `step`: one 1B decode step at batch 32 (1,024-token contexts) and one 2,048-token prefill,
   eager, under torch.profiler: kernels by device time, and the step's host time against its
   device time.
3. `graphs_compiled`: decode CUDA graphs of the compiled model against the weight-read floor.
4. `attention`: the decode and extend kernels' device time (CUDA-graph replays, no launch cost) at
   a few launch settings; each setting is one for every call (decode and extend alike), so any
   of them keeps the one-answer property.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

try:
    from scripts import gpu_graphs, gpu_triton
except ImportError:  # run as `python scripts/gpu_profile.py`
    import gpu_graphs  # type: ignore[no-redef]
    import gpu_triton  # type: ignore[no-redef]


def _table(prof: Any, key: str, rows: int = 14) -> str:
    try:
        return str(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))
    except Exception as e:  # a sort key this torch does not know
        return f"({key}: {e})"


def _device_us(prof: Any) -> tuple[float, int]:
    """Total device time (µs) and the number of kernels in a profile."""
    total, count = 0.0, 0
    for e in prof.events():
        if str(e.device_type).endswith("CUDA"):
            total += e.device_time
            count += 1
    return total, count


def profiled(label: str, fn: Callable[[], Any], reps: int = 3) -> dict[str, Any]:
    """fn under torch.profiler (after two warm-ups): host wall ms per call, device µs per call,
    kernels per call, and the two tables."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / reps
    dev_us, kernels = _device_us(prof)
    syncs = sum(1 for e in prof.events() if "Synchronize" in e.name or e.name == "aten::item")
    out = {"label": label, "wall_ms": wall, "device_ms": dev_us / reps / 1e3,
           "kernels": kernels / reps, "syncs": syncs / reps}  # fmt: skip
    print(f"== {label}: host wall {wall:.2f} ms, device {out['device_ms']:.2f} ms, "
          f"{out['kernels']:.0f} kernels, {out['syncs']:.0f} syncs per call",
          flush=True)  # fmt: skip
    print(_table(prof, "self_cuda_time_total"), flush=True)
    print(_table(prof, "self_cpu_time_total", 12), flush=True)
    return out


def ttft(model: str, compile_model: bool) -> dict[str, Any]:
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

    t0 = time.perf_counter()
    engine = Engine(model, device="cuda", dtype="bfloat16", compile=compile_model)
    start_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(3)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def toks(n: int) -> list[int]:
        return torch.randint(3, engine.vocab_size, (n,), generator=gen).tolist()

    def timed(p: list[int]) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.generate([p], one)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    timed(toks(2080))
    cold, warm = [], []
    for _ in range(3):
        head = toks(2048)
        cold.append(timed(head + toks(32)))
        warm.append(timed(head + toks(32)))
    head = toks(2048)
    timed(head + toks(32))
    pr = cProfile.Profile()
    pr.enable()
    timed(head + toks(32))
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    label = f"ttft {'compiled' if compile_model else 'eager'}"
    print(f"== {label}: start {start_s:.1f} s, cold {statistics.median(cold):.1f} ms, cached "
          f"{statistics.median(warm):.1f} ms ({cold} / {warm})", flush=True)  # fmt: skip
    print(s.getvalue()[-6000:], flush=True)
    heads = [toks(2048) for _ in range(5)]
    for h in heads:
        timed(h + toks(32))
    it = iter(heads)
    prof = profiled(f"{label} cached request", lambda: timed(next(it) + toks(32)))
    return {"cold_ms": cold, "warm_ms": warm, "start_s": start_s, "profile": prof}


def steps() -> list[dict[str, Any]]:
    from radixkv.model.batch import ForwardBatch

    model, pool, _ = gpu_graphs._setup("cuda", gpu_graphs.ONE_B, 32, 2100, None)
    step = gpu_graphs._decode_step(model, 32, 1024, seed=1)
    out = [profiled("1b eager decode step, batch 32", lambda: model(step, pool))]
    one = gpu_graphs._decode_step(model, 1, 1024, seed=2)
    out.append(profiled("1b eager decode step, batch 1", lambda: model(one, pool)))
    slots = torch.arange(2048, device="cuda")
    ids = list(range(3, 2051))
    pre = ForwardBatch.from_contexts(ids, [slots], [2048], device="cuda")
    out.append(profiled("1b eager prefill, 2048 tokens", lambda: model(pre, pool)))
    return out


def graphs_compiled() -> dict[str, Any]:
    from radixkv.model.batch import ForwardBatch

    model, pool, graphs = gpu_graphs._setup("cuda", gpu_graphs.ONE_B, 32, 1024, None)
    t0 = time.perf_counter()
    model.compile()
    slots = torch.arange(2, device="cuda")
    with torch.inference_mode():
        model(ForwardBatch.from_contexts([5, 6], [slots], [2], device="cuda"), pool)
        model(ForwardBatch.from_contexts([5], [slots], [1], device="cuda"), pool)
    compile_s = time.perf_counter() - t0
    graphs.capture_all()
    timer = gpu_graphs._timer("cuda")
    bw = gpu_triton.copy_bandwidth("cuda", timer)
    rows = gpu_graphs.timings(model, pool, graphs, 1024, (1, 8, 32), timer, bw)
    for r in rows:
        print("compiled graphs step", {k: round(v, 4) if isinstance(v, float) else v
                                       for k, v in r.items()}, flush=True)  # fmt: skip
    step = gpu_graphs._decode_step(model, 32, 1024, seed=1)
    prof = profiled("1b compiled+graph decode step, batch 32", lambda: graphs.run(step))
    return {"compile_s": compile_s, "timings": rows, "profile": prof}


SETTINGS: list[dict[str, Any]] = [  # the first is the shipped one
    {},
    {"num_warps": 8},
    {"num_stages": 1},
    {"num_stages": 3},
    {"BLOCK_N": 32},
    {"BLOCK_N": 128},
    {"KV_SPLIT": 256},
]


def attention() -> list[dict[str, Any]]:
    import triton.testing

    from radixkv.model.triton import paged_attention as pa

    base = pa.launch_config
    rows = []
    for setting in SETTINGS:
        consts = {k: setting[k] for k in ("BLOCK_N", "KV_SPLIT") if k in setting}
        opts = {k: v for k, v in setting.items() if k not in consts}
        saved = {k: getattr(pa, k) for k in consts}
        for k, v in consts.items():
            setattr(pa, k, v)
        pa.launch_config = lambda d, o=opts: {**base(d), **o}  # type: ignore[misc]
        try:
            row: dict[str, Any] = {"setting": setting}
            for reqs, ctx in ((32, 1024), (32, 4096), (1, 1024)):
                kc, vc, table = gpu_triton._paged_pool(reqs, ctx, 8, 64, "cuda")
                q = torch.randn(reqs, 32, 64, device="cuda", dtype=torch.bfloat16)
                lens = torch.full((reqs,), ctx, device="cuda")

                def call(q=q, k=kc, v=vc, t=table, n=lens, c=ctx) -> Any:
                    return pa.decode_attention(q, k, v, t, n, scale=0.125, max_seq_len=c)

                row[f"decode_{reqs}x{ctx}_us"] = 1e3 * triton.testing.do_bench_cudagraph(call)
            kc, vc, table = gpu_triton._paged_pool(1, 2048, 8, 64, "cuda")
            q = torch.randn(2048, 32, 64, device="cuda", dtype=torch.bfloat16)
            lens = torch.tensor([2048], device="cuda")
            starts = torch.tensor([0, 2048], device="cuda")

            def ext(q=q, k=kc, v=vc, t=table, n=lens, st=starts) -> Any:
                return pa.extend_attention(q, k, v, t, n, st, scale=0.125)

            row["extend_2048_us"] = 1e3 * triton.testing.do_bench_cudagraph(ext)
        except Exception as e:
            row["error"] = repr(e)[:300]
        finally:
            for k2, v2 in saved.items():
                setattr(pa, k2, v2)
            pa.launch_config = base
        print("attention", {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()},
              flush=True)  # fmt: skip
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the 1B-shape checkpoint (for the Engine)")
    p.add_argument("--parts", default="attention,step,ttft,graphs_compiled")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    parts: dict[str, Callable[[], Any]] = {
        "attention": attention,
        "step": steps,
        "ttft": lambda: [ttft(args.model, False), ttft(args.model, True)],
        "graphs_compiled": graphs_compiled,
    }
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            parts[name]()
        except Exception:
            import traceback

            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        print(f"-- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
