"""`--kv-events-config`: vLLM's keys and defaults, our two extensions, and clear errors."""

from __future__ import annotations

import pytest
import zmq
from kv_subscriber import free_port

from radixkv.config import CacheConfig
from radixkv.config.kv_events import KVEventsConfig, parse_kv_events_config
from radixkv.engine.kv_event_publisher import bind_or_connect


def test_defaults_are_vllms() -> None:
    off = parse_kv_events_config(None)
    assert not off.active and off == KVEventsConfig()
    cfg = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert cfg.active and cfg.publisher == "zmq"
    assert (cfg.endpoint, cfg.replay_endpoint, cfg.topic) == ("tcp://*:5557", None, "")
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size) == (10_000, 100_000, 100_000)
    assert (cfg.layout, cfg.bind) == ("map", None)
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


@pytest.mark.parametrize("bind", [None, True, False])
def test_bind_or_connect(bind: bool | None) -> None:
    """vLLM's rule (bind wildcard / ipc / inproc, connect to the rest) unless `bind` decides."""
    ctx = zmq.Context()
    port = free_port()
    try:
        pub = ctx.socket(zmq.PUB)
        bind_or_connect(pub, f"tcp://127.0.0.1:{port}", bind)
        probe = ctx.socket(zmq.PUB)
        if bind:  # the port is taken: binding it again fails
            with pytest.raises(zmq.ZMQError):
                probe.bind(f"tcp://127.0.0.1:{port}")
        else:  # connected: the port is still free
            probe.bind(f"tcp://127.0.0.1:{port}")
        bind_or_connect(ctx.socket(zmq.PUB), "inproc://kv-events-test")  # bound by the rule
        with pytest.raises(zmq.ZMQError):
            ctx.socket(zmq.PUB).bind("inproc://kv-events-test")
    finally:
        ctx.destroy(linger=0)
