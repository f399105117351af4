"""Accelerator check: `python scripts/gpu_check.py --device cuda` (scripts/gpu_check.sh).

Meant for a machine with a GPU (minutes in all); `--device cpu` runs the same path on CPU as a dry
run. Each stage is printed as it finishes, and all results go to one JSON (--json), rewritten
after every stage; with --deadline-s a stage that would end past the deadline is skipped, saying
so. In order, most wanted first:

1. The Triton paged-attention kernels compiled on the device against a float64 softmax, their
   bit invariance and their speed (scripts/gpu_triton.py; skipped, saying why, on CPU or without
   Triton; --triton-only runs just this).
2. Decode as CUDA graphs per batch-size bucket on the 1B shape: graph == eager bit for bit, and
   the step time at batch 1, 8, 32 with and without graphs against the weight-read floor
   (scripts/gpu_graphs.py; --skip-graphs leaves it out; on CPU a dry run under the interpreter).
3. Exactness against transformers on the device: a ragged two-request prefill, then batched
   decode steps fed with the reference's own greedy tokens; our logits vs transformers' full
   forward. float32 (TF32 off) must agree to RTOL_F32 relative with identical argmax; bfloat16
   to RTOL_BF16 with at least MIN_ARGMAX_BF16 of argmaxes equal (bf16 rounding differs between
   any two kernel orders).
4. The time to first token with a cached 2,048-token prefix against none, on the 1B model and
   the default-size one (scripts/gpu_serving.py); the Engine with decode graphs and without.
5. `radixkv serve` on the device with `radixkv bench serve` against it, prefix and random
   workloads, on both models; `radixkv bench engine` (cache off vs radix).
6. With --compile, exactness again with the compiled model (last: its compile takes longest).

The models: --model (default: the embedded SmolLM2) and --big-model (default on CUDA: `1b`, the
Llama-3.2-1B shape with seeded random weights); a name of radixkv.bench.tiny_model.MODELS is built
on the machine, its tokenizer from --tokenizer-dir (a device machine has no default model
package: there `smollm2-shaped` is the default model's config with seeded random weights).
Every stage runs inside a guard: an exception prints FAIL with its traceback and the next stage
runs. Exit status 1 if an exactness check fails or a stage errors.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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
    out = _run(cmd + (["--model", model] if model else []), timeout=240)
    return {**out, "ok": out["rc"] == 0}


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


class Run:
    """The results so far, saved after every stage (a run cut short by its time limit keeps what
    it measured), and the deadline that stages past it are skipped at."""

    def __init__(self, json_path: str | None, deadline_s: float | None) -> None:
        self.json_path, self.deadline_s = json_path, deadline_s
        self.t0 = time.perf_counter()
        self.results: dict[str, Any] = {"exactness": [], "bench": [], "serving": []}

    def stage(self, key: str, name: str, fn: Callable[[], dict[str, Any]], est_s: float) -> dict:
        """Run `fn` as stage `name` unless fewer than `est_s` seconds (about what it took on an
        H200) are left; store it under `key` (a list there gets it appended)."""
        left = None if self.deadline_s is None else self.deadline_s - self.elapsed()
        if left is not None and left < est_s:
            why = f"deadline: {left:.0f} s left, the stage needs about {est_s:.0f} s"
            r = _stage(name, lambda: {"skipped": why, "ok": True})
        else:
            r = _stage(name, fn)
        if isinstance(self.results.get(key), list):
            self.results[key].append(r)
        else:
            self.results[key] = r
        self.save()
        return r

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def save(self) -> None:
        if self.json_path:
            with open(self.json_path, "w", encoding="utf-8") as f:
                json.dump(self.results, f, indent=2, default=str)

    def failed(self) -> list[str]:
        stages = [r for r in self.results.values() if isinstance(r, dict)]
        for v in self.results.values():
            stages += v if isinstance(v, list) else []
        return [r["stage"] for r in stages if not r.get("ok", False)]


def _models(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The default-size model and the 1B-size one, as paths (None: the default model); names of
    radixkv.bench.tiny_model.MODELS are built here, tokenizer from --tokenizer-dir."""
    from pathlib import Path

    from radixkv.bench.tiny_model import resolve_model

    tok = Path(args.tokenizer_dir) if args.tokenizer_dir else None
    small = resolve_model(args.model, tok)
    big = args.big_model or ("1b" if args.device.startswith("cuda") else args.model)
    return small, resolve_model(big, tok)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda[:N] (default), or cpu for a dry run")
    p.add_argument("--model", default=None, help="HF checkpoint dir or a name of bench.tiny_model "
                   "(smollm2-shaped, ...; default: the embedded SmolLM2)")  # fmt: skip
    p.add_argument("--big-model", default=None, help="the 1B-size model of the serving stages "
                   "(default: 1b on CUDA, else --model)")  # fmt: skip
    p.add_argument("--tokenizer-dir", default=None, help="tokenizer files for the named models "
                   "(default: the converted default model's)")  # fmt: skip
    p.add_argument("--compile", action="store_true", help="also check the compiled model")
    p.add_argument("--skip-bench", action="store_true", help="exactness only")
    p.add_argument("--skip-triton", action="store_true", help="no Triton kernel stage")
    p.add_argument("--skip-graphs", action="store_true", help="no decode-graph stage")
    p.add_argument("--triton-only", action="store_true", help="only the Triton kernel stage")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="skip a stage that would end past this many seconds")  # fmt: skip
    p.add_argument("--json", default=None, help="write all results here (after every stage)")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible; use --device cpu for a dry run", file=sys.stderr)
        return 2
    if args.device == "cpu":  # a dry run: Triton interpreted, whatever imports it first
        os.environ.setdefault("TRITON_INTERPRET", "1")
    run = Run(args.json, args.deadline_s)
    if not args.skip_triton:
        gt = _scripts_module("gpu_triton")
        run.stage("triton", "triton", lambda: gt.triton_check(args.device), 80)
    if args.triton_only:
        return _finish(run)
    paths = lambda: {**dict(zip(("small", "big"), _models(args), strict=True)), "ok": True}  # noqa: E731
    models = run.stage("models", "models", paths, 40)
    small, big = models.get("small", args.model), models.get("big", args.model)
    if not args.skip_graphs:
        gg = _scripts_module("gpu_graphs")
        bw = run.results.get("triton", {}).get("copy_GB/s")
        run.stage("graphs", "graphs", lambda: gg.graphs_check(args.device, bw), 10)
    for dtype in (torch.float32, torch.bfloat16):
        check = functools.partial(exactness, small, args.device, dtype, False)
        r = run.stage("exactness", f"exactness {dtype} compiled=False", check, 5)
        print("exactness", json.dumps({k: v for k, v in r.items() if k != "error"}))
    if not args.skip_bench:
        _benches(run, args, small, big)
    if args.compile:
        for dtype in (torch.float32, torch.bfloat16):
            check = functools.partial(exactness, small, args.device, dtype, True)
            r = run.stage("exactness", f"exactness {dtype} compiled=True", check, 45)
            print("exactness", json.dumps({k: v for k, v in r.items() if k != "error"}))
    return _finish(run)


def _benches(run: Run, args: argparse.Namespace, small: str | None, big: str | None) -> None:
    """The cached-prefix TTFT cut, the engine with and without graphs, the serving runs and
    `radixkv bench engine`, most wanted first."""
    gs = _scripts_module("gpu_serving")
    dev = args.device
    dt = "float32" if dev == "cpu" else "bfloat16"
    cpu = {"prefix": 64, "suffix": 8, "reps": 1} if dev == "cpu" else {}
    for label, model in (("big", big), ("small", small)):
        fn = functools.partial(gs.prefix_ttft, model, dev, dt, **cpu)
        run.stage(f"prefix_ttft_{label}", f"prefix_ttft {label}", fn, 10)
    if not args.skip_graphs:
        gg = _scripts_module("gpu_graphs")
        run.stage("engine_graphs", "engine_graphs", lambda: gg.engine_graphs(dev, small), 10)
    shape = None
    if dev == "cpu":
        shape = ["--num-groups", "1", "--prompts-per-group", "2", "--system-len", "32"]
        shape += ["--question-len", "8", "--output-len", "4", "--concurrency", "2"]
    for label, model in (("big", big), ("small", small)):
        for workload in ("prefix", "random"):
            fn = functools.partial(gs.serve_run, model, dev, dt, workload, False, shape)
            run.stage("serving", f"serve {label} {workload}", fn, 25)
    run.stage("bench", "engine_bench", lambda: engine_bench(small, dev, dt, False), 15)


def _finish(run: Run) -> int:
    run.save()
    failed = run.failed()
    print(f"FAILED: {', '.join(failed)}" if failed else "OK", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
