"""Accelerator check: `python scripts/gpu_check.py --device cuda` (scripts/gpu_check.sh).

Meant for a machine with a GPU (a few minutes in all); `--device cpu` runs the same path on CPU as
a dry run. Three parts, each printed as it finishes, all results in one JSON (--json):

1. Exactness against transformers on the device: a ragged two-request prefill, then batched
   decode steps fed with the reference's own greedy tokens; our logits vs transformers' full
   forward. float32 (TF32 off) must agree to RTOL_F32 relative with identical argmax; bfloat16
   to RTOL_BF16 with at least MIN_ARGMAX_BF16 of argmaxes equal (bf16 rounding differs between
   any two kernel orders). Eager always, compiled too with --compile.
2. `radixkv bench engine` on a small shared-prefix workload (cache off vs radix).
3. A short serving run: `radixkv serve` on the device, `radixkv bench serve` against it.
Before them (first, so a short session gets it): the Triton paged-attention kernels compiled on
the device against a float64 softmax, their bit invariance, and their speed (scripts/
gpu_triton.py; skipped, saying why, on CPU or without Triton; --triton-only runs just this);
then decode as CUDA graphs per batch-size bucket on the 1B shape: graph == eager bit for bit,
and the step time at batch 1, 8, 32 with and without graphs against the weight-read floor, and
the Engine with and without graphs (scripts/gpu_graphs.py; --skip-graphs leaves it out; on CPU a
dry run under Triton's interpreter).
Every stage runs inside a guard: an exception prints FAIL with its traceback and the next stage
runs. Exit status 1 if an exactness check fails or a stage errors.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

RTOL_F32 = 1e-3
RTOL_BF16 = 0.1
MIN_ARGMAX_BF16 = 0.9


def _reference_logits(hf: Any, ids: list[int], device: str) -> torch.Tensor:
    with torch.no_grad():
        out = hf(torch.tensor([ids], device=device)).logits[0].float()
    return out.cpu()


def exactness(
    model_path: str | None, device: str, dtype: torch.dtype, compile_model: bool = False
) -> dict[str, Any]:
    """Our logits vs transformers' (see the module docstring); returns the measured errors."""
    from transformers import AutoModelForCausalLM

    from radixkv.engine.batch import ForwardBatch
    from radixkv.memory.pool import KVPool
    from radixkv.model import load_model

    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    lm = load_model(model_path, device, dtype)
    if compile_model:
        lm.model.compile()
    # The reference is always float32: bf16 is judged against the exact answer.
    hf: Any = AutoModelForCausalLM.from_pretrained(lm.path, dtype=torch.float32)
    hf = hf.to(device).eval()
    g = torch.Generator().manual_seed(0)
    vocab = lm.config.vocab_size
    seqs = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (37, 64)]
    steps = 6
    pool = KVPool(lm.config.pool_config(256, dtype=dtype, device=device))
    perm = torch.randperm(256, generator=g)  # scattered, disjoint slots per request
    slots = [perm[:120], perm[120:240]]
    errs: list[float] = []
    agree = total = 0
    ext = [len(s) for s in seqs]
    for step in range(steps + 1):
        ctx = [sl[: len(s)].to(device) for sl, s in zip(slots, seqs, strict=True)]
        new = [s[len(s) - e :] for s, e in zip(seqs, ext, strict=True)]
        batch = ForwardBatch.from_contexts(
            [t for n in new for t in n], ctx, ext, device=device, return_all_logits=step == 0
        )
        ours = lm.model(batch, pool).float().cpu()
        refs = [_reference_logits(hf, s, device) for s in seqs]
        ref = torch.cat(refs) if step == 0 else torch.stack([r[-1] for r in refs])
        errs.append(float((ours - ref).abs().max() / ref.abs().max()))
        agree += int((ours.argmax(-1) == ref.argmax(-1)).sum())
        total += ref.shape[0]
        # Teacher forcing: both models continue with the reference's greedy token.
        seqs = [[*s, int(r[-1].argmax())] for s, r in zip(seqs, refs, strict=True)]
        ext = [1, 1]
    rate = agree / total
    f32 = dtype == torch.float32
    ok = max(errs) < (RTOL_F32 if f32 else RTOL_BF16) and (rate == 1.0 or not f32)
    ok = ok and (f32 or rate >= MIN_ARGMAX_BF16)
    return {
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "compiled": compile_model,
        "max_rel_err": max(errs),
        "argmax_agreement": rate,
        "ok": ok,
    }


def _run(cmd: list[str], timeout: float) -> dict[str, Any]:
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    print(proc.stdout[-3000:], proc.stderr[-2000:] if proc.returncode else "", flush=True)
    return {"cmd": cmd, "rc": proc.returncode, "wall_s": time.perf_counter() - t0}


def engine_bench(model: str | None, device: str, dtype: str, compile_model: bool) -> dict:
    cmd = [sys.executable, "-m", "radixkv", "bench", "engine", "--device", device]
    cmd += ["--dtype", dtype, "--workloads", "shared-prefix", "--modes", "off,radix"]
    cmd += ["--skip-target", "--groups", "2", "--prompts-per-group", "4", "--output-len", "16"]
    cmd += ["--compile" if compile_model else "--no-compile"]
    return _run(cmd + (["--model", model] if model else []), timeout=240)


def serve_bench(model: str | None, device: str, dtype: str, compile_model: bool) -> dict:
    from radixkv.bench.serving.server_proc import LocalServer

    flags = ["--device", device, "--dtype", dtype]
    flags.append("--compile" if compile_model else "--no-compile")
    with LocalServer(model, flags, startup_timeout=300) as server:
        cmd = [sys.executable, "-m", "radixkv", "bench", "serve", "--base-url", server.url]
        cmd += ["--workload", "shared-prefix", "--num-groups", "2", "--prompts-per-group", "4"]
        cmd += ["--system-len", "512", "--question-len", "32", "--output-len", "32"]
        cmd += ["--concurrency", "4", "--no-progress"]
        out = _run(cmd, timeout=180)
        out["startup_s"] = server.startup_s
        return out


def _stage(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one stage; an exception is printed as FAIL with its traceback and the run goes on
    (a device session is too short to lose the stages after a broken one)."""
    t0 = time.perf_counter()
    try:
        r = fn()
    except Exception:
        tb = traceback.format_exc()
        print(f"FAIL {name}\n{tb}", flush=True)
        return {"stage": name, "ok": False, "error": tb, "wall_s": time.perf_counter() - t0}
    r = {"stage": name, **r}
    r.setdefault("wall_s", time.perf_counter() - t0)
    if "ok" in r:
        status = "skipped: " + r["skipped"] if "skipped" in r else "ok" if r["ok"] else "FAIL"
        print(f"{name}: {status} ({r['wall_s']:.1f} s)", flush=True)
    return r


def _scripts_module(name: str) -> Any:
    """scripts/<name>.py, as a package module (tests) or from scripts/ on the path (a run)."""
    import importlib

    try:
        return importlib.import_module(f"scripts.{name}")
    except ImportError:
        return importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda[:N] (default), or cpu for a dry run")
    p.add_argument("--model", default=None, help="HF checkpoint dir (default: embedded SmolLM2)")
    p.add_argument("--compile", action="store_true", help="also check the compiled model")
    p.add_argument("--skip-bench", action="store_true", help="exactness only")
    p.add_argument("--skip-triton", action="store_true", help="no Triton kernel stage")
    p.add_argument("--skip-graphs", action="store_true", help="no decode-graph stage")
    p.add_argument("--triton-only", action="store_true", help="only the Triton kernel stage")
    p.add_argument("--json", default=None, help="write all results here")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible; use --device cpu for a dry run", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"exactness": [], "bench": []}
    if not args.skip_triton:
        gt = _scripts_module("gpu_triton")
        results["triton"] = _stage("triton", lambda: gt.triton_check(args.device))
    if not args.skip_graphs and not args.triton_only:
        gg = _scripts_module("gpu_graphs")
        bw = results.get("triton", {}).get("copy_GB/s")
        results["graphs"] = _stage("graphs", lambda: gg.graphs_check(args.device, bw))
        results["engine_graphs"] = _stage(
            "engine_graphs", lambda: gg.engine_graphs(args.device, args.model)
        )
    for dtype in () if args.triton_only else (torch.float32, torch.bfloat16):
        for comp in (False, True) if args.compile else (False,):
            check = functools.partial(exactness, args.model, args.device, dtype, comp)
            r = _stage(f"exactness {dtype} compiled={comp}", check)
            print("exactness", json.dumps({k: v for k, v in r.items() if k != "error"}))
            results["exactness"].append(r)
    if not args.skip_bench and not args.triton_only:
        dt = "float32" if args.device == "cpu" else "bfloat16"
        for stage in (engine_bench, serve_bench):
            r = _stage(
                stage.__name__, functools.partial(stage, args.model, args.device, dt, args.compile)
            )
            r.setdefault("ok", r.get("rc") == 0)
            results["bench"].append(r)
    stages = [r for k, r in results.items() if isinstance(r, dict)]
    stages += results["exactness"] + results["bench"]
    failed = [r["stage"] for r in stages if not r.get("ok", False)]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2, default=str)
    print(f"FAILED: {', '.join(failed)}" if failed else "OK", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
