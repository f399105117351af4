"""`--kv-events-config`: vLLM's keys and defaults, our two extensions, and clear errors."""

from __future__ import annotations

import pytest

from radixkv.config import CacheConfig
from radixkv.config.kv_events import KVEventsConfig, parse_kv_events_config
from radixkv.engine.events.kv_event_publisher import bind_or_connect


def test_defaults_are_vllms() -> None:
    off = parse_kv_events_config(None)
    assert not off.active and off == KVEventsConfig()
    cfg = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert cfg.active and cfg.publisher == "zmq"
    assert (cfg.endpoint, cfg.replay_endpoint, cfg.topic) == ("tcp://*:5557", None, "")
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size) == (10_000, 100_000, 100_000)
    assert (cfg.layout, cfg.bind) == ("map", None)
    assert (cfg.seq_start, cfg.replay_layout) == ("zero", "plain")
    null = parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}')
    assert not null.active


@pytest.mark.parametrize(
    ("page", "block", "want"),
    [
        (1, None, 16),
        (4, None, 16),
        (16, None, 16),
        (32, None, 32),
        (64, None, 64),
        (1, 8, 8),
        (16, 32, 32),
    ],
)
def test_block_size(page: int, block: int | None, want: int) -> None:
    text = '{"enable_kv_cache_events": true' + (f', "block_size": {block}}}' if block else "}")
    assert parse_kv_events_config(text, page).block_tokens(page) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"enable_kv_cache_events": true, "endpont": "x"}', "unknown key(s) ['endpont']"),
        ('{"enable_kv_cache_events": "yes"}', "'enable_kv_cache_events' must be bool"),
        ('{"buffer_steps": true}', "'buffer_steps' must be int"),
        ('{"publisher": "kafka"}', "'publisher' must be one of"),
        ('{"layout": "list"}', "'layout' must be one of"),
        ('{"seq_start": "now"}', "'seq_start' must be one of"),
        ('{"replay_layout": "vllm"}', "'replay_layout' must be one of"),
        ('{"hwm": -1}', "'hwm' must be >= 0"),
        ('{"block_size": 24}', "multiple of the page size (16)"),
        ('{"endpoint": "localhost:5557"}', "must be a zmq address"),
    ],
)
def test_bad_config_names_the_key(text: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_kv_events_config(text, 16)
    assert says in str(err.value)
    problems = CacheConfig(page_size=16, kv_events_config=text).problems()
    assert problems and problems[0][0] == "kv_events_config" and says in problems[0][1]


class _Sock:
    """Records what bind_or_connect did (a real socket's state cannot tell a connect from a
    bind reliably: LAST_ENDPOINT is set by both, and probing the port races)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def bind(self, endpoint: str) -> None:
        self.calls.append(("bind", endpoint))

    def connect(self, endpoint: str) -> None:
        self.calls.append(("connect", endpoint))


@pytest.mark.parametrize(
    ("endpoint", "bind", "want"),
    [
        ("tcp://127.0.0.1:5557", None, "connect"),  # vLLM's rule: a host is connected to
        ("tcp://*:5557", None, "bind"),  # a wildcard is bound
        ("ipc:///tmp/kv-events", None, "bind"),
        ("inproc://kv-events", None, "bind"),
        ("tcp://127.0.0.1:5557", True, "bind"),  # `bind` decides when set
        ("tcp://*:5557", False, "connect"),
    ],
)
def test_bind_or_connect(endpoint: str, bind: bool | None, want: str) -> None:
    sock = _Sock()
    bind_or_connect(sock, endpoint, bind)  # type: ignore[arg-type]
    assert sock.calls == [(want, endpoint)]
