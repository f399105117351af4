"""`python -m scripts.peers` (the head-to-head, outside the package): the peer server's start/stop
and recorded environment, vLLM's client contract (against a stand-in `vllm` package), and the
side-by-side table."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# The bench tests' fake OpenAI server and tiny checkpoints.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from fake_openai_server import KERNEL_PATHS, FakeServer
from test_tiny_model import SMALL

from radixkv.bench import tiny_model
from radixkv.bench.serving.peer_server import PeerServer, vllm_env
from scripts.peers.run import (
    WORKLOADS,
    peers_model,
    register,
    run_sglang_client,
    run_vllm_client,
)
from scripts.peers.table import peers_table

HEALTH_SERVER = textwrap.dedent(
    """
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def test_vllm_env_binds_every_core_and_reserves_none() -> None:
    env = vllm_env(2)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert vllm_env(1)["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_peer_server_starts_reports_and_stops(tmp_path: Path) -> None:
    srv = PeerServer([sys.executable, "-c", HEALTH_SERVER], {"X_PEER": "1"}, tmp_path / "l", 30)
    with srv:
        assert srv.proc is not None
        pid = srv.proc.pid
        desc = srv.describe()
        assert desc["command"].startswith("X_PEER=1 ")
        assert f"--port {srv.port}" in desc["command"]
        assert desc["startup_s"] is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the whole process group is gone


def test_peer_server_that_dies_is_an_error_with_its_log(tmp_path: Path) -> None:
    code = "import sys; print('bad flag'); sys.exit(3)"
    with pytest.raises(RuntimeError, match="bad flag"):
        PeerServer([sys.executable, "-c", code], {}, tmp_path / "l", 30).start()


FAKE_VLLM = textwrap.dedent(
    """
    import json, os
    def add_cli_args(p):
        for f in ("--backend", "--base-url", "--model", "--tokenizer", "--seed",
                  "--result-dir", "--result-filename", "--num-warmups", "--dataset-name",
                  "--num-prompts", "--max-concurrency", "--random-input-len",
                  "--random-output-len"):
            p.add_argument(f)
        for f in ("--ignore-eos", "--save-result", "--disable-tqdm"):
            p.add_argument(f, action="store_true")
    def main(a):
        assert a.ignore_eos and a.save_result and a.backend == "openai"
        res = {"duration": 2.5, "mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0,
               "output_throughput": 64.0, "args": vars(a)}
        with open(os.path.join(a.result_dir, a.result_filename), "w") as f:
            json.dump(res, f)
    """
)


def _fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `vllm.benchmarks.serve` on the PYTHONPATH of the clients' subprocesses."""
    pkg = tmp_path / "site" / "vllm" / "benchmarks"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "serve.py").write_text(FAKE_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))


def test_vllm_client_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm(tmp_path, monkeypatch)
    res = run_vllm_client(sys.executable, "http://x", "m", "tok", "random", tmp_path, 7)
    assert res["duration"] == 2.5
    assert res["args"]["dataset_name"] == "random"
    assert res["args"]["random_input_len"] == "256"
    assert res["args"]["seed"] == "7"
    assert "<vllm.benchmarks.serve>" in res["command"]


def _our(wall: float, ttft: float, tpot: float) -> dict[str, object]:
    summary = {
        "wall_s": wall,
        "ttft_s": {"mean": ttft},
        "tpot_s": {"mean": tpot},
        "output_tok_per_s": 1.0,
        "token_hit_rate": 0.5,
    }
    return {"summary": summary}


def test_peers_table_ratios_and_start_lines() -> None:
    def run(engine: str, dur: float) -> dict[str, object]:
        v = {"duration": dur, "mean_ttft_ms": 1.0, "mean_tpot_ms": 1.0, "output_throughput": 1.0}
        return {
            "engine": engine,
            "dtype": "float32",
            "server": {"command": f"start {engine}"},
            "random": {"vllm_client": v, "radixkv_client": _our(dur, 0.1, 0.01)},
        }

    result = {"workloads": dict.fromkeys(WORKLOADS), "runs": [run("radixkv", 9), run("vllm", 10)]}
    md = peers_table(result)
    assert "| random | vllm | float32 | duration (s) | 9.0 | 10.0 | 0.90x |" in md
    assert "| random | radixkv | float32 | token hit rate | 50.0% | 50.0% | - |" in md
    assert "- vllm float32: `start vllm`" in md
    assert "prefix" not in md.split("How")[0]
    json.dumps(result)


def test_peers_table_mean_e2e_from_each_client() -> None:
    """Mean end-to-end latency: vLLM's client's per-request latencies (s), SGLang's reported
    mean, ours from the summary; the trade of TTFT against TPOT shows in it."""

    def run(engine: str, lat: list[float], sg: float, ours: float) -> dict[str, object]:
        v = {"duration": 1.0, "latencies": lat}
        o = _our(1.0, 0.1, 0.01)
        o["summary"]["e2e_s"] = {"mean": ours}  # type: ignore[index]
        return {
            "engine": engine,
            "dtype": "float32",
            "server": {"command": f"start {engine}"},
            "random": {"vllm_client": v, "radixkv_client": o},
            "gsp": {"sglang_client": {"duration": 1.0, "mean_e2e_latency_ms": sg}},
        }

    workloads = {"random": ["vllm_client", "radixkv_client"], "gsp": ["sglang_client"]}
    runs = [run("radixkv", [1.0, 2.0], 300.0, 1.2), run("vllm", [2.0, 4.0], 400.0, 2.4)]
    md = peers_table({"workloads": workloads, "runs": runs})
    e2e = "float32 | mean E2E latency (ms)"
    assert f"| random | vllm | {e2e} | 1,500.0 | 3,000.0 | 0.50x |" in md
    assert f"| random | radixkv | {e2e} | 1,200.0 | 2,400.0 | 0.50x |" in md
    assert f"| gsp | sglang | {e2e} | 300.0 | 400.0 | 0.75x |" in md


def test_peers_table_takes_the_median_of_rounds() -> None:
    def run(engine: str, dur: float, rnd: int) -> dict[str, object]:
        v = {"duration": dur, "mean_ttft_ms": 1.0, "mean_tpot_ms": 1.0, "output_throughput": 1.0}
        return {
            "engine": engine,
            "dtype": "float32",
            "round": rnd,
            "server": {"command": f"start {engine}"},
            "random": {"vllm_client": v, "radixkv_client": _our(dur, 0.1, 0.01)},
        }

    runs = [run("radixkv", d, i) for i, d in enumerate((8, 30, 9))]
    runs += [run("vllm", d, i) for i, d in enumerate((10, 10, 12))]
    md = peers_table({"workloads": dict.fromkeys(WORKLOADS), "runs": runs})
    assert "| random | vllm | float32 | duration (s) | 9.0 | 10.0 | 0.90x |" in md
    assert "median of 3 rounds" in md
    assert md.count("- vllm float32:") == 1


def test_reports_carry_no_machine_paths() -> None:
    from radixkv.bench.serving.peer_server import scrub

    home = str(Path.home())
    text = f"/opt/venv/bin/python -m x --tokenizer {home}/.cache/m"
    assert scrub(text, "/opt/venv/bin/python") == "$VLLM_PYTHON -m x --tokenizer ~/.cache/m"
    text = "/tmp/out/r1/vllm.json /srv/ckpt/tiny /srv/ckpt/tiny-2 /opt/sgl/bin/python"
    got = scrub(text, "/opt/venv/bin/python", "/opt/sgl/bin/python", "/tmp/out", "/srv/ckpt/tiny")
    assert got == "$OUT/r1/vllm.json $MODEL_DIR $MODEL_DIR-2 $SGLANG_PYTHON"


FAKE_SGLANG = textwrap.dedent(
    """
    import argparse, json
    p = argparse.ArgumentParser()
    for f in ("--backend", "--base-url", "--model", "--tokenizer", "--seed", "--output-file",
              "--dataset-name", "--gsp-num-groups", "--gsp-prompts-per-group",
              "--gsp-system-prompt-len", "--gsp-question-len", "--gsp-output-len",
              "--max-concurrency"):
        p.add_argument(f)
    p.add_argument("--disable-tqdm", action="store_true")
    a = p.parse_args()
    assert a.backend == "vllm" and a.dataset_name == "generated-shared-prefix"
    res = {"duration": 4.0, "mean_ttft_ms": 50.0, "p99_ttft_ms": 90.0, "mean_tpot_ms": 5.0,
           "output_throughput": 8.0, "args": vars(a)}
    with open(a.output_file, "a") as f:
        f.write(json.dumps({"duration": 99.0}) + "\\n" + json.dumps(res) + "\\n")
    """
)


def test_sglang_client_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bench_serving.py").write_text(FAKE_SGLANG)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    res = run_sglang_client(sys.executable, "http://x", "m", "tok", "gsp", tmp_path, 3)
    assert res["duration"] == 4.0  # the last line of the JSONL file is this run's
    assert res["args"]["gsp_system_prompt_len"] == "1024"
    assert res["args"]["seed"] == "3"
    assert "sglang.bench_serving" in res["command"]


def test_peers_table_names_each_workloads_peer_client() -> None:
    def run(engine: str, dur: float) -> dict[str, object]:
        s = {"duration": dur, "mean_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "mean_tpot_ms": 1.0}
        return {
            "engine": engine,
            "dtype": "bfloat16",
            "server": {"command": f"start {engine}"},
            "gsp": {"sglang_client": s, "radixkv_client": _our(dur, 0.1, 0.01)},
        }

    workloads = {"gsp": {"sglang_client": [], "radixkv_client": []}}
    md = peers_table({"workloads": workloads, "runs": [run("radixkv", 8), run("vllm", 10)]})
    assert "| gsp | sglang | bfloat16 | duration (s) | 8.0 | 10.0 | 0.80x |" in md
    assert "| gsp | sglang | bfloat16 | p99 TTFT (ms) | 2.0 | 2.0 | 1.00x |" in md
    assert "| gsp | vllm |" not in md


def test_peers_table_puts_each_of_our_engines_against_vllm() -> None:
    """Invariance on and off side by side, each as a ratio to vLLM, whichever engine ran
    first (the rounds rotate the order); the off server is started without our kernels."""
    from scripts.peers.run import OURS

    def run(engine: str, dur: float) -> dict[str, object]:
        v = {"duration": dur, "mean_ttft_ms": 1.0, "mean_tpot_ms": 1.0, "output_throughput": 1.0}
        return {
            "engine": engine,
            "dtype": "bfloat16",
            "server": {"command": f"start {engine}"},
            "random": {"vllm_client": v, "radixkv_client": _our(dur, 0.1, 0.01)},
        }

    runs = [run("vllm", 10), run("radixkv", 7), run("radixkv-off", 8)]
    md = peers_table({"workloads": dict.fromkeys(WORKLOADS), "runs": runs})
    head = "| workload | client | dtype | metric | vllm | radixkv | radixkv-off "
    assert head + "| radixkv / vllm | radixkv-off / vllm |" in md
    assert "| random | vllm | bfloat16 | duration (s) | 10.0 | 7.0 | 8.0 | 0.70x | 0.80x |" in md
    assert OURS["radixkv-off"] == {"RADIXKV_CPU_KERNELS": "0"} and OURS["radixkv"] == {}


def _peers_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["peers", "--vllm-python", sys.executable, *argv])


def test_model_flag_names_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_dir: Path
) -> None:
    """`--model` takes `default`, `1b` or a directory; `--model-dir` is the same flag."""
    assert _peers_args().model == "default"
    assert _peers_args("--model", "1b").model == "1b"
    assert _peers_args("--model-dir", "/ckpt").model == "/ckpt"
    assert peers_model("default") == str(default_model_dir)
    assert peers_model("/ckpt") == "/ckpt"
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
    small = tiny_model.SeededLlama("small-1b", {**tiny_model.LLAMA_1B.config, **SMALL})
    monkeypatch.setitem(tiny_model.MODELS, "1b", small)
    assert peers_model("1b") == str(tmp_path / "small-1b")
    assert (tmp_path / "small-1b" / "tokenizer.json").exists()


class _FakeEngineServer:
    """`_server`'s contract (a context manager with `url` and `describe()`) on a FakeServer."""

    def __init__(self, engine: str) -> None:
        self.fake, self.engine, self.url = FakeServer(first_delay=0.0), engine, ""

    def __enter__(self) -> _FakeEngineServer:
        self.url = self.fake.__enter__().url
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.__exit__(*exc)

    def describe(self) -> dict[str, Any]:
        return {"command": f"start {self.engine}", "startup_s": 0.0}


def test_peers_json_and_table_carry_the_kernel_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole `python -m scripts.peers` run on fake servers: our engines' kernel paths, fetched
    from their servers' /config, land in the JSON beside the machine and in the table's header."""
    from scripts.peers import run as peers

    _fake_vllm(tmp_path, monkeypatch)
    monkeypatch.setattr(peers, "_server", lambda engine, *_: _FakeEngineServer(engine))
    monkeypatch.setattr(peers, "run_our_client", lambda *_: _our(1.0, 0.1, 0.01))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    args = _peers_args("--model", str(ckpt), "--dtypes", "float32", "--out", str(out))
    args.workloads = "random"
    assert peers._cmd_peers(args) == 0
    result = json.loads((out / "peers.json").read_text())
    assert result["kernel_paths"] == {"radixkv": KERNEL_PATHS}
    assert result["machine"]["cpu"] and result["machine"]["cores"]
    runs = {r["engine"]: r for r in result["runs"]}
    assert runs["radixkv"]["kernel_paths"] == KERNEL_PATHS
    assert "kernel_paths" not in runs["vllm"]  # a peer's server is not asked
    assert runs["vllm"]["random"]["vllm_client"]["args"]["tokenizer"] == "$MODEL_DIR"
    md = (out / "peers.md").read_text()
    assert md.startswith(f"Machine: {result['machine']['cpu']}, ")
    assert "radixkv kernel paths: kernels fake, float32_gemm fma." in md.splitlines()[0]


def test_the_tool_runs_from_a_checkout_and_left_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m scripts.peers` is the head-to-head's command; `radixkv bench` no longer has it."""
    from radixkv.cli import build_parser
    from scripts.peers.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert "--vllm-python" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["bench", "peers", "--vllm-python", sys.executable])
    assert refused.value.code == 2
    assert "invalid choice: 'peers'" in capsys.readouterr().err
