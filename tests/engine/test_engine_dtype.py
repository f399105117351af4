"""`--dtype auto` on CPU: bfloat16 only where the CPU has native bf16; the flag plumbing of
--compile/--no-compile."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch

from radixkv.engine import setup
from radixkv.engine.args import add_engine_args, engine_config_from_args


@pytest.mark.parametrize(
    ("native", "env", "want"),
    [(True, "1", torch.bfloat16), (False, "1", torch.float32), (True, "0", torch.float32)],
)
def test_auto_dtype_on_cpu(
    monkeypatch: pytest.MonkeyPatch, native: bool, env: str, want: torch.dtype
) -> None:
    monkeypatch.setattr(setup, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setenv("RADIXKV_AUTO_BF16", env)
    assert setup.resolve_dtype("auto", "cpu") == want
    assert setup.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert setup.resolve_dtype("float32", "cpu") == torch.float32


def test_cpu_flag_probe_returns_a_bool() -> None:
    assert isinstance(setup.cpu_has_native_bf16(), bool)


def test_compile_flag_defaults() -> None:
    def parse(argv: list[str], default: bool) -> bool:
        p = argparse.ArgumentParser()
        add_engine_args(p, compile_default=default)
        return engine_config_from_args(p.parse_args(argv)).model.compile

    assert parse([], False) is False and parse([], True) is True
    assert parse(["--compile"], False) is True and parse(["--no-compile"], True) is False


def test_runner_compiles_only_models_with_a_compiled_path() -> None:
    from torch import nn

    from radixkv.engine.runner import ModelRunner
    from radixkv.memory.pool import KVPool, KVPoolConfig
    from radixkv.memory.req_table import ReqToTokenTable

    class Plain(nn.Module):  # nn.Module.compile exists, but this model has no compiled path
        def compile(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("must not be compiled")

    pool = KVPool(KVPoolConfig(num_layers=1, num_kv_heads=1, head_dim=2, num_slots=4))
    runner = ModelRunner(Plain(), pool, ReqToTokenTable(1, 4))
    kv: Any = None  # never reached: a model without a compiled path is not warmed up
    assert runner.compile(kv) == "it has no compiled layer stack"  # a no-op that says why
