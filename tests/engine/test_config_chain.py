"""The configuration chain (radixkv.config): flat keywords land in their sections, the CLI builds
the same config the API does, one validate() reports every problem by flag, the printout masks
secrets, and the Engine takes it whole or as keyword overrides."""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import subprocess
import sys

import pytest
from engine_helpers import make_engine

from radixkv.cli import main
from radixkv.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from radixkv.config.fields import MASK, flag_of
from radixkv.config.sections import DTYPE_NAMES, eviction_policy_names
from radixkv.engine import setup

# Every keyword of the flat EngineConfig before the chain, with its default: they must all still
# build the same configuration (callers and other branches use them).
FLAT_DEFAULTS = {
    "model": None,
    "device": "auto",
    "dtype": "auto",
    "page_size": 1,
    "eviction_policy": "lru",
    "schedule_policy": "lpm",
    "cache": "radix",
    "disable_radix_cache": False,
    "chunked_prefill_size": 2048,
    "max_running_requests": 32,
    "max_queued_requests": 256,
    "num_slots": None,
    "kv_cache_bytes": 512 * 2**20,
    "max_model_len": None,
    "seed": 0,
    "swa_num_slots": None,
    "state_num_slots": None,
    "state_checkpoint_interval": 256,
    "compile": False,
    "regret_window": 2048,
    "max_n": 16,
    "enable_hierarchical_cache": False,
    "hicache_size": None,
    "hicache_write_policy": "write_through",
    "hicache_storage_backend": None,
    "hicache_storage_url": None,
    "hicache_storage_prefetch_policy": "cost_aware",  # the default since the cost model
    "hicache_prefetch_timeout_s": 2.0,
    "hicache_storage_timeout_s": 1.0,
    "hicache_flush_timeout_s": 10.0,
}


def _get(cfg: EngineConfig, flat: str) -> object:
    from radixkv.config.chain import _FLAT

    section, field = _FLAT[flat]
    return getattr(getattr(cfg, section), field)


def test_flat_names_keep_their_defaults_and_land_in_sections() -> None:
    cfg = EngineConfig()
    assert set(FLAT_DEFAULTS) <= set(EngineConfig.flat_names())
    for name, default in FLAT_DEFAULTS.items():
        assert _get(cfg, name) == default, name
    cfg = EngineConfig(page_size=16, cache="blockhash", model="some/dir", max_n=3, port=9)
    assert cfg.cache == CacheConfig(kind="blockhash", page_size=16)
    assert cfg.model == ModelConfig(path="some/dir")
    assert cfg.scheduler == SchedulerConfig(max_n=3) and cfg.server == ServerConfig(port=9)
    with pytest.raises(TypeError, match="nope"):
        EngineConfig(nope=1)


def test_override_copies_and_replace_is_guarded() -> None:
    base = EngineConfig(page_size=4, num_slots=64)
    cfg = base.override(eviction_policy="s3fifo", scheduler=SchedulerConfig(seed=5))
    assert base.cache.eviction_policy == "lru" and cfg.cache.eviction_policy == "s3fifo"
    assert cfg.cache.page_size == 4 and cfg.scheduler.seed == 5
    assert base.override(cache="blockhash").cache == CacheConfig(
        kind="blockhash", page_size=4, num_slots=64
    )
    assert base.override(model="m").override(model=None).model.path is None
    # dataclasses.replace with a field name works; with a flat "cache"/"model" string it would
    # silently reset that section, so it is refused.
    assert dataclasses.replace(base, page_size=8).cache.num_slots == 64
    with pytest.raises(TypeError, match="override"):
        dataclasses.replace(base, cache="blockhash")
    assert hash(cfg) == hash(base.override(eviction_policy="s3fifo", seed=5))
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # crosses to the engine process unchanged


def test_validate_reports_every_problem_by_flag() -> None:
    assert EngineConfig().validate() == EngineConfig()
    bad = EngineConfig(
        page_size=0,
        dtype="float8",
        device="gpu",
        eviction_policy="nope",
        chunked_prefill_size=0,
        max_queued_requests=-1,
        hicache_storage_backend="file",
        port=70000,
        hicache_size=-1.0,
    )
    with pytest.raises(ConfigError) as exc:
        bad.validate()
    errors = exc.value.errors
    for flag in (
        "--page-size",
        "--dtype",
        "--device",
        "--eviction-policy",
        "--chunked-prefill-size",
        "--max-queued-requests",
        "--hicache-storage-url",
        "--port",
        "--hicache-size",
    ):
        assert sum(e.startswith(flag + " ") for e in errors) == 1, (flag, errors)
    assert isinstance(exc.value, ValueError) and len(errors) == 9
    # Cross-field rules of the cache section.
    errs = EngineConfig(enable_hierarchical_cache=True, disable_radix_cache=True).problems()
    assert any("--disable-radix-cache" in e and "prefix cache" in e for e in errs)
    assert EngineConfig(enable_hierarchical_cache=True, cache="blockhash").problems()
    assert EngineConfig(num_slots=3, page_size=4).problems()
    assert not EngineConfig(eviction_policy="session-lfu").problems()


def _parser(server: bool = True) -> argparse.ArgumentParser:
    return EngineConfig.add_args(argparse.ArgumentParser(), server=server)


def test_flags_build_the_same_config_as_the_api() -> None:
    assert EngineConfig.from_args(_parser().parse_args([])) == EngineConfig()
    argv = "--model d --page-size 16 --cache blockhash --kv-cache-mb 64 --max-n 3 --port 9 "
    argv += "--api-key k --enable-hierarchical-cache --hicache-prefetch-timeout 0.5"
    got = EngineConfig.from_args(_parser().parse_args(argv.split()))
    want = EngineConfig(
        model="d",
        page_size=16,
        cache="blockhash",
        kv_cache_bytes=64 * 2**20,
        max_n=3,
        port=9,
        api_key="k",
        enable_hierarchical_cache=True,
        hicache_prefetch_timeout_s=0.5,
    )
    assert got == want
    # Flag defaults can be changed per command, by flat name.
    p = EngineConfig.add_args(argparse.ArgumentParser(), compile=True, model="m", max_n=2)
    want = EngineConfig(compile=True, model="m", max_n=2)
    assert EngineConfig.from_args(p.parse_args([])) == want
    assert not EngineConfig.from_args(p.parse_args(["--no-compile"])).model.compile
    # A parser without the server flags leaves that section at its defaults.
    assert EngineConfig.from_args(_parser(server=False).parse_args([])).server == ServerConfig()
    # Every flag a section declares is registered exactly once.
    flags = [a for act in _parser()._actions for a in act.option_strings]
    sections = (ModelConfig, CacheConfig, SchedulerConfig, ServerConfig)
    declared = [flag_of(f) for section in sections for f in section.fields()]
    negations = {"--no-" + f.removeprefix("--") for f in declared if f}
    registered = [f for f in flags if f not in ("-h", "--help", *negations)]
    assert sorted(f for f in declared if f) == sorted(registered)


def test_describe_and_format_mask_the_api_key() -> None:
    cfg = EngineConfig(api_key="sekrit-key", page_size=16)
    assert cfg.describe()["server"]["api_key"] == MASK
    assert cfg.describe()["cache"]["page_size"] == 16
    text = cfg.format()
    assert "sekrit" not in text + repr(cfg.describe()) + repr(cfg)
    lines = text.splitlines()
    assert any(line.split()[:3] == ["*", "page_size", "16"] for line in lines)
    assert any(line.split()[:2] == ["max_n", "16"] for line in lines)  # default: no mark
    assert EngineConfig().describe()["server"]["api_key"] is None


def test_dtype_names_are_the_ones_setup_resolves() -> None:
    assert set(DTYPE_NAMES) == {"auto", *setup._DTYPES}


def test_engine_takes_overrides_and_validates_first() -> None:
    eng = make_engine(page_size=4, max_n=2, eviction_policy="lfu")
    assert eng.config.cache.page_size == 4 and eng.config.scheduler.max_n == 2
    assert eng.allocator.page_size == 4
    eng = make_engine(config=EngineConfig(page_size=2), num_slots=512)
    assert (eng.config.cache.page_size, eng.allocator.num_slots) == (2, 512)
    with pytest.raises(ConfigError) as exc:  # before any model is loaded: the path is bogus
        from radixkv.engine.engine import Engine

        Engine("/nonexistent/model", page_size=0, max_running_requests=0)
    assert len(exc.value.errors) == 2


def test_cli_refuses_a_bad_config_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "hi", "--model", "/nonexistent", "--page-size", "0", "--max-n", "0"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--page-size (cache.page_size)" in err and "--max-n (scheduler.max_n)" in err


def test_config_imports_no_torch() -> None:
    code = "import sys, radixkv.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_eviction_policy_choice_builds_a_cache() -> None:
    """`--eviction-policy` offers only names a cache accepts: no session-aware form of a policy
    that owns its queue (s3fifo, predict, density), which the cache would refuse."""
    from radixkv.cache import RadixCache

    names = eviction_policy_names()
    assert {"density", "session-lru"} <= set(names)
    assert not {"session-s3fifo", "session-predict", "session-density"} & set(names)
    for name in names:
        RadixCache(page_size=4, policy=name)
