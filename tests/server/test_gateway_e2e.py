"""Two real `radixkv serve` replicas behind a real SGLang Model Gateway (`smg`, pinned below),
driven by the official `openai` client with concurrent requests.

smg is a Rust binary in a Python wheel with dependencies of its own, so it lives in a virtualenv
of its own, made once by `smg_python` under `.cache/` (gitignored) and reused by later runs. The
test is skipped, saying so, only when pip cannot reach the package registry.

What it checks: both replicas register (smg's probes, `/v1/loads` polls and requests all carry
the router's API key, which the replicas require); every request is answered, although one
replica is sized to refuse most of a burst (503 + Retry-After: smg retries elsewhere); the
`/render` route gives the token ids the chat request ran with; `POST /flush_cache` on the router
reaches both replicas.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_cli import _free_port

from radixkv.model.tokenizer import Tokenizer

SMG_VERSION = "1.13.0"
CACHE = Path(__file__).resolve().parents[2] / ".cache"
KEY = "gw-test-key"
MODEL = "tiny-llama"
AUTH = {"Authorization": f"Bearer {KEY}"}
# pip's words when it cannot reach an index (a skip); anything else is a failure.
OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ProxyError",
    "No matching distribution found",
    "Could not find a version that satisfies",
)


@pytest.fixture(scope="session")
def smg_python() -> Path:
    """The interpreter of a virtualenv holding smg==SMG_VERSION (made once, then reused)."""
    venv = CACHE / f"smg-{SMG_VERSION}"
    python = venv / "bin" / "python"
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / f"smg-{SMG_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs never build it at once
        if (venv / ".complete").exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run(
            [*pip, f"smg=={SMG_VERSION}"], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            out = done.stdout + done.stderr
            shutil.rmtree(venv, ignore_errors=True)
            why = [ln.strip() for ln in out.splitlines() if any(w in ln for w in OFFLINE)]
            if why:
                reason = " / ".join(dict.fromkeys([why[0], why[-1]]))
                pytest.skip(
                    f"pip cannot reach the package registry for smg=={SMG_VERSION}: {reason}"
                )
            pytest.fail(f"pip install smg=={SMG_VERSION} failed:\n{out[-3000:]}")
        (venv / ".complete").write_text(SMG_VERSION + "\n")
    return python


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, f"{what} exited:\n{log.read_text()[-3000:]}"
        try:
            if ready():
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{what} not ready:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _requests_by_route(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "radixkv_http_requests":
            continue
        for s in family.samples:
            if s.name.endswith("_total"):
                out[s.labels["route"], s.labels["status"]] = s.value
    return out


@pytest.fixture(scope="module")
def cluster(
    smg_python: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("gateway")
    ports = [_free_port() for _ in range(2)]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    serve = [sys.executable, "-m", "radixkv", "serve", "--model", str(model_dir)]
    serve += ["--served-model-name", MODEL, "--num-slots", "4096", "--max-model-len", "512"]
    serve += ["--api-key", KEY, "--no-compile", "--threads", "1", "--log-level", "warning"]
    # Replica 0 takes 1 running + 1 waiting request: a burst overloads it (503 + Retry-After).
    small = ["--max-running-requests", "1", "--max-queued-requests", "1"]
    procs = [
        _start([*serve, "--port", str(ports[0]), *small], logs / "worker0.log"),
        _start([*serve, "--port", str(ports[1])], logs / "worker1.log"),
    ]
    try:
        for i, (proc, url) in enumerate(zip(procs, workers, strict=True)):
            log = logs / f"worker{i}.log"

            def up(url: str = url) -> bool:
                return httpx.get(url + "/health", timeout=2).status_code == 200

            _wait(proc, log, up, f"worker {i}")
        router = f"http://127.0.0.1:{_free_port()}"
        smg = [str(smg_python), "-m", "smg", "launch", "--host", "127.0.0.1"]
        smg += ["--port", router.rsplit(":", 1)[1], "--worker-urls", *workers]
        smg += ["--policy", "cache_aware", "--disable-tokenizer-autoload", "--api-key", KEY]
        # Its Prometheus listener defaults to 0.0.0.0:29000: keep it on loopback, on a free port.
        smg += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
        smg += ["--load-monitor-interval", "1", "--log-level", "warn"]
        procs.append(_start(smg, logs / "smg.log"))

        def ready() -> bool:
            body = httpx.get(router + "/readiness", timeout=2).json()
            return bool(body.get("healthy_workers") == 2)

        _wait(procs[-1], logs / "smg.log", ready, "smg")
        yield {"router": router, "workers": workers, "logs": logs}
    finally:
        if len(procs) == 3:
            procs.pop().kill()  # smg holds its listener 5 s on SIGTERM (its drain window)
        _stop(procs)


@pytest.mark.slow
def test_replicas_behind_smg(cluster: dict[str, Any], model_dir: Path) -> None:
    router, workers = cluster["router"], cluster["workers"]
    registered = httpx.get(router + "/workers", headers=AUTH, timeout=10).json()["workers"]
    assert sorted(w["url"] for w in registered) == sorted(workers)
    assert all(w["model_id"] == MODEL and w["is_healthy"] for w in registered), registered
    anonymous = httpx.post(router + "/v1/chat/completions", json={"model": MODEL}, timeout=10)
    assert anonymous.status_code == 401  # the router wants its key too

    client = openai.OpenAI(base_url=router + "/v1", api_key=KEY, max_retries=0, timeout=120)
    tenants = [f"You are assistant number {t}. " + f"Tenant {t} rules apply. " * 12 for t in "ABCD"]
    jobs = [(system, f"Question {q} about the radix cache?") for system in tenants for q in "1234"]

    def ask(job: tuple[str, str]) -> Any:
        system, question = job
        messages: Any = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
        kw: Any = {"max_tokens": 8, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
        r = client.chat.completions.create(model=MODEL, messages=messages, **kw)
        return messages, r

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, jobs))
    for _, r in answers:  # every request answered, in full
        assert r.choices[0].finish_reason == "length"
        assert r.usage is not None and r.usage.completion_tokens == 8

    # The replicas saw each request once as a success; replica 0's refusals were retried.
    by_worker = [_requests_by_route(url) for url in workers]
    served = [c.get(("/v1/chat/completions", "200"), 0.0) for c in by_worker]
    assert sum(served) == len(jobs), by_worker
    refused = by_worker[0].get(("/v1/chat/completions", "503"), 0.0)
    print(f"served per replica {served}; replica 0 refused {refused} (retried by smg)")
    # 8 concurrent requests, 4 per system prompt, which cache_aware keeps together: replica 0
    # (2 in flight at most) gets more than it holds at least once, and no client saw it.
    assert refused >= 1, by_worker
    # smg's registration probes and load polls reached both replicas with the key.
    deadline = time.monotonic() + 15
    while not all(c.get(("/v1/loads", "200"), 0) >= 1 for c in by_worker):
        assert time.monotonic() < deadline, by_worker
        time.sleep(0.5)
        by_worker = [_requests_by_route(url) for url in workers]
    for counts in by_worker:
        assert not [k for k in counts if k[1] == "401"], counts
        assert counts.get(("/v1/models", "200"), 0) >= 1
    # ... and smg parsed them: its view of each replica's load is ours.
    for w in httpx.get(router + "/workers", headers=AUTH, timeout=10).json()["workers"]:
        (load,) = w["engine_load"]["loads"]
        assert load["max_total_num_tokens"] == 4096 and load["max_running_requests"] in (1, 32)

    # /render gives the token ids the request ran with (the model's own chat template).
    messages, r = answers[0]
    rendered = httpx.post(
        workers[1] + "/v1/chat/completions/render",
        json={"model": MODEL, "messages": messages, "max_tokens": 8},
        headers=AUTH,
        timeout=30,
    ).json()
    tok = Tokenizer.from_pretrained(model_dir)
    assert rendered["token_ids"] == list(tok.apply_chat_template(messages, True))
    assert r.usage is not None and len(rendered["token_ids"]) == r.usage.prompt_tokens

    # POST /flush_cache on the router reaches both replicas.
    before = [
        httpx.get(u + "/cache/stats", headers=AUTH).json()["cached_tokens_in_tree"] for u in workers
    ]
    assert sum(before) > 0
    flushed = httpx.post(router + "/flush_cache", headers=AUTH, timeout=30)
    assert flushed.status_code == 200, flushed.text
    assert flushed.json()["workers_flushed"] == 2
    for url in workers:
        stats = httpx.get(url + "/cache/stats", headers=AUTH).json()
        assert stats["cached_tokens_in_tree"] == 0
        assert _requests_by_route(url)[("/flush_cache", "200")] == 1
