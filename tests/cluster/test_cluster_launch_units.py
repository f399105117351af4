"""The launcher's pure parts (no process started): argument lookup, the announced block size,
spec checks, and the routers' command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixkv.cluster.launch import ClusterSpec, _flag, event_block_size
from radixkv.cluster.routers import RouterPlan


def test_flag_reads_both_spellings_and_the_last_wins() -> None:
    args = ("--page-size", "4", "--served-model-name=a", "--page-size=8")
    assert _flag(args, "--page-size") == "8" and _flag(args, "--served-model-name") == "a"
    assert _flag(args, "--port") is None and _flag(("--port",), "--port") is None


@pytest.mark.parametrize(("page", "block"), [(None, 16), (1, 16), (4, 16), (16, 16), (32, 32)])
def test_event_block_size_is_the_replicas_default(page: int | None, block: int) -> None:
    args = () if page is None else ("--page-size", str(page))
    assert event_block_size(args) == block


def test_spec_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="replicas"):
        ClusterSpec(0, None, ())
    with pytest.raises(ValueError, match="router"):
        ClusterSpec(1, None, (), router="nginx")
    with pytest.raises(ValueError, match="replica_args"):
        ClusterSpec(1, None, (), replica_args=((), ()))


def test_router_command_lines() -> None:
    py = Path("venv/bin/python")
    workers = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    smg = RouterPlan("smg", py, 9, "cache_aware", workers, api_key="k").command()
    assert smg[:3] == [str(py), "-m", "smg"] and "--service-discovery" not in smg
    assert smg[smg.index("--worker-urls") + 1 : smg.index("--worker-urls") + 3] == list(workers)
    assert smg[smg.index("--api-key") + 1] == "k" and smg[smg.index("--host") + 1] == "127.0.0.1"
    # A replica down when the router (re)started is retried every second, not every 30 s.
    assert smg[smg.index("--worker-startup-check-interval") + 1] == "1"
    # A dead replica is found within seconds; a returned one's open breaker retries after 5 s.
    assert smg[smg.index("--health-check-interval-secs") + 1] == "2"
    assert smg[smg.index("--cb-timeout-duration-secs") + 1] == "5"
    sources = tuple((w, f"tcp://127.0.0.1:{n}", None) for n, w in enumerate(workers))
    vr = RouterPlan("vllm-router", py, 9, "kv_aware", workers, None, sources, 32, "m").command()
    assert vr[0] == "venv/bin/vllm-router" and "--api-key" not in vr
    assert [vr[i + 1] for i, a in enumerate(vr) if a == "--kv-event-source"] == [
        "http://127.0.0.1:1=tcp://127.0.0.1:0",
        "http://127.0.0.1:2=tcp://127.0.0.1:1",
    ]
    assert "--kv-event-replay-source" not in vr
    assert vr[vr.index("--worker-startup-check-interval") + 1] == "1"
    assert vr[vr.index("--health-check-interval-secs") + 1] == "2"
    assert vr[vr.index("--kv-event-block-size") + 1] == "32" and vr[-1] == "m"
