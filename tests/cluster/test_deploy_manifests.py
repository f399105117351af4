"""The example Kubernetes manifests under deploy/kubernetes/, checked offline:

- every resource validates against Kubernetes' own OpenAPI schemas, strictly (an unknown or
  misspelt field is an error), with `kubernetes-validate` (pinned, in a cached virtualenv; skipped
  only when pip cannot reach the package index);
- each container's arguments parse with the program it runs: `radixkv serve` with our parser and
  config checks, smg and vllm-router with their own `parse_router_args` (in their virtualenvs);
- the pieces name each other consistently: the gateway's selector and port find the replicas,
  the replicas' L3 URL names the Redis Service, vllm-router lists every replica's event sockets.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_harness import router_python_or_skip, venv_python_or_skip

from radixkv.cli import build_parser
from radixkv.config.kv_events import parse_kv_events_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
VALIDATOR = "kubernetes-validate==1.37.0"


def _resources() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            out[doc["kind"], doc["metadata"]["name"]] = doc
    return out


def _container(res: dict[str, Any]) -> dict[str, Any]:
    (container,) = res["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _expand(args: list[str]) -> list[str]:
    """Kubernetes' $(VAR) expansion, with placeholder values."""
    return [re.sub(r"\$\((\w+)\)", lambda m: f"x-{m.group(1).lower()}", a) for a in args]


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    assert {p.name for p in MANIFESTS} >= {"radixkv.yaml", "gateway.yaml", "redis.yaml"}
    python = venv_python_or_skip(VALIDATOR)
    cli = python.parent / "kubernetes-validate"
    done = subprocess.run(
        [str(cli), "--strict", *map(str, MANIFESTS)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("passed for resource") == sum(1 for _ in _resources().values())


def test_the_validator_rejects_a_misspelt_field(tmp_path: Path) -> None:
    python = venv_python_or_skip(VALIDATOR)
    bad = tmp_path / "bad.yaml"
    bad.write_text((DEPLOY / "redis.yaml").read_text().replace("containerPort:", "containerPrt:"))
    done = subprocess.run(
        [str(python.parent / "kubernetes-validate"), "--strict", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "did not validate" in done.stdout + done.stderr


def test_replica_arguments_parse_and_name_the_other_pieces() -> None:
    res = _resources()
    sts = res["StatefulSet", "radixkv"]
    c = _container(sts)
    args = build_parser().parse_args([*c["command"][1:], *_expand(c["args"])])
    assert args.command == "serve" and args.port == 8000 and args.host == "0.0.0.0"
    events = parse_kv_events_config(args.kv_events_config, args.page_size)
    assert events.enable_kv_cache_events
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert events.endpoint == f"tcp://*:{ports['kv-events']}"
    assert events.replay_endpoint == f"tcp://*:{ports['kv-replay']}"
    redis_svc = res["Service", "radixkv-redis"]
    port = redis_svc["spec"]["ports"][0]["port"]
    assert args.hicache_storage_url == f"redis://radixkv-redis:{port}/0"
    assert res["Service", "radixkv"]["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    secret = c["env"][0]["valueFrom"]["secretKeyRef"]
    assert ("Secret", secret["name"]) in res


def _router_args(router: str, argv: list[str]) -> dict[str, Any]:
    """`parse_router_args(argv)` of the router's own package, as a dict of its fields."""
    module = {"smg": "smg.launch_router", "vllm-router": "vllm_router.launch_router"}[router]
    code = (
        "import dataclasses, json, sys\n"
        f"from {module} import parse_router_args\n"
        "a = parse_router_args(json.loads(sys.argv[1]))\n"
        "print(json.dumps(dataclasses.asdict(a), default=str))\n"
    )
    python = router_python_or_skip(router)
    done = subprocess.run(
        [str(python), "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("router", ["smg", "vllm-router"])
def test_router_arguments_parse_with_the_router_itself(router: str) -> None:
    res = _resources()
    sts = res["StatefulSet", "radixkv"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    c = _container(sts)
    serve = build_parser().parse_args([*c["command"][1:], *_expand(c["args"])])
    if router == "smg":
        gw = _container(res["Deployment", "radixkv-gateway"])
        assert gw["command"][-2:] == ["smg", "launch"]
        parsed = _router_args(router, _expand(gw["args"]))
        assert parsed["service_discovery"] and parsed["policy"] == "cache_aware"
        assert parsed["selector"] == labels and parsed["service_discovery_port"] == serve.port
        return
    vr = _container(res["Deployment", "radixkv-vllm-router"])
    parsed = _router_args(router, _expand(vr["args"]))
    assert parsed["policy"] == "kv_aware"
    names = [f"radixkv-{i}.radixkv" for i in range(sts["spec"]["replicas"])]
    assert parsed["worker_urls"] == [f"http://{n}:{serve.port}" for n in names]
    flat = " ".join(_expand(vr["args"]))
    for n in names:  # every replica's stream and replay sockets, at the ports it binds
        assert f"http://{n}:{serve.port}=tcp://{n}:5557" in flat
        assert f"--kv-event-replay-source=http://{n}:{serve.port}=tcp://{n}:5558" in flat
    assert parsed["kv_event_model"] == serve.served_model_name
    assert parsed["kv_event_block_size"] == serve.page_size
