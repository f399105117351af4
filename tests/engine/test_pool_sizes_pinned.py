"""Pool sizes pinned, kind by kind (`engine.kv.kinds.pool_sizes`): the per-kind sizing gives
exactly the sizes the fixed (FULL, SWA, STATE) triple of `setup.hybrid_sizes` gave before it, for
Gemma 3-, LFM2-, Qwen3.5- and Mistral-like tiny models and Gemma 3 270M's shape, under budgets,
explicit sizes, small schedulers and both dtypes (the table was computed with the old function).
A kind the model lacks has no pool (None below), and the errors are the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from radixkv.config import EngineConfig
from radixkv.engine.kv.kinds import pool_sizes
from radixkv.memory.hybrid import FULL, STATE, SWA, KVGroupSpec, PoolSpec
from radixkv.model.registry import load_config

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "page16": dict(page_size=16),
    "slots": dict(num_slots=4096, page_size=16),
    "small_run": dict(
        num_slots=4096, page_size=16, max_running_requests=2, chunked_prefill_size=256
    ),
    "budget_small_run": dict(
        page_size=16, max_running_requests=4, chunked_prefill_size=512, kv_cache_bytes=64 << 20
    ),
    "explicit": dict(
        num_slots=4096, swa_num_slots=2000, state_num_slots=9, chunked_prefill_size=256
    ),
    "tiny_budget": dict(
        page_size=4, kv_cache_bytes=1 << 20, max_running_requests=3, chunked_prefill_size=64
    ),
    "swa_too_small": dict(swa_num_slots=100),
    "one_state": dict(state_num_slots=1),
    "budget_one_page": dict(page_size=64, kv_cache_bytes=40000),
}
Sizes = tuple[int, int | None, int | None] | str  # (FULL, SWA, STATE), or the error's start
# (model, config) -> (float32, bfloat16)
PINNED: dict[tuple[str, str], tuple[Sizes, Sizes]] = {
    ("gemma3", "default"): ((2089832, 2440, None), (4186984, 2440, None)),
    ("gemma3", "page16"): ((2085632, 3840, None), (4182784, 3840, None)),
    ("gemma3", "slots"): ((4096, 3840, None), (4096, 3840, None)),
    ("gemma3", "small_run"): ((4096, 480, None), (4096, 480, None)),
    ("gemma3", "budget_small_run"): ((259648, 832, None), (521792, 832, None)),
    ("gemma3", "explicit"): ((4096, 2000, None), (4096, 2000, None)),
    ("gemma3", "tiny_budget"): ((3616, 160, None), (7712, 160, None)),
    ("gemma3", "swa_too_small"): ("the SWA pool needs", "the SWA pool needs"),
    ("gemma3", "one_state"): ((2089832, 2440, None), (4186984, 2440, None)),
    ("gemma3", "budget_one_page"): ("the KV budget does not", (64, 2240, None)),
    ("lfm2", "default"): ((2097152, None, 96), (4194304, None, 96)),
    ("lfm2", "page16"): ((2097152, None, 96), (4194304, None, 96)),
    ("lfm2", "slots"): ((4096, None, 96), (4096, None, 96)),
    ("lfm2", "small_run"): ((4096, None, 36), (4096, None, 36)),
    ("lfm2", "budget_small_run"): ((262144, None, 40), (524288, None, 40)),
    ("lfm2", "explicit"): ((4096, None, 9), (4096, None, 9)),
    ("lfm2", "tiny_budget"): ((4096, None, 38), (8192, None, 38)),
    ("lfm2", "swa_too_small"): ((2097152, None, 96), (4194304, None, 96)),
    ("lfm2", "one_state"): ("the STATE pool needs", "the STATE pool needs"),
    ("lfm2", "budget_one_page"): ((128, None, 96), (256, None, 96)),
    ("qwen3_5", "default"): ((2097152, None, 96), (4194304, None, 96)),
    ("qwen3_5", "page16"): ((2097152, None, 96), (4194304, None, 96)),
    ("qwen3_5", "slots"): ((4096, None, 96), (4096, None, 96)),
    ("qwen3_5", "small_run"): ((4096, None, 36), (4096, None, 36)),
    ("qwen3_5", "budget_small_run"): ((262144, None, 40), (524288, None, 40)),
    ("qwen3_5", "explicit"): ((4096, None, 9), (4096, None, 9)),
    ("qwen3_5", "tiny_budget"): ((4096, None, 38), (8192, None, 38)),
    ("qwen3_5", "swa_too_small"): ((2097152, None, 96), (4194304, None, 96)),
    ("qwen3_5", "one_state"): ("the STATE pool needs", "the STATE pool needs"),
    ("qwen3_5", "budget_one_page"): ((128, None, 96), (256, None, 96)),
    ("mistral", "default"): ((8388608, 1048576, None), (16777216, 2097152, None)),
    ("mistral", "page16"): ((8388608, 1048576, None), (16777216, 2097152, None)),
    ("mistral", "slots"): ((4096, 4096, None), (4096, 4096, None)),
    ("mistral", "small_run"): ((4096, 4096, None), (4096, 4096, None)),
    ("mistral", "budget_small_run"): ((1048576, 131072, None), (2097152, 262144, None)),
    ("mistral", "explicit"): ((4096, 2000, None), (4096, 2000, None)),
    ("mistral", "tiny_budget"): ((16384, 2048, None), (32768, 4096, None)),
    ("mistral", "swa_too_small"): ("the SWA pool needs", "the SWA pool needs"),
    ("mistral", "one_state"): ((8388608, 1048576, None), (16777216, 2097152, None)),
    ("mistral", "budget_one_page"): ((576, 2240, None), (1216, 2240, None)),
    ("gemma3_270m", "default"): ((14563, 14563, None), (61762, 22600, None)),
    ("gemma3_270m", "page16"): ((14560, 14560, None), (56352, 23680, None)),
    ("gemma3_270m", "slots"): ((4096, 4096, None), (4096, 4096, None)),
    ("gemma3_270m", "small_run"): ((4096, 3456, None), (4096, 3456, None)),
    ("gemma3_270m", "budget_small_run"): ((1808, 1808, None), (3632, 3632, None)),
    ("gemma3_270m", "explicit"): ((4096, 2000, None), (4096, 2000, None)),
    ("gemma3_270m", "tiny_budget"): ((28, 584, None), (56, 584, None)),
    ("gemma3_270m", "swa_too_small"): ("the SWA pool needs", "the SWA pool needs"),
    ("gemma3_270m", "one_state"): ((14563, 14563, None), (61762, 22600, None)),
    ("gemma3_270m", "budget_one_page"): ("the KV budget does not", "the KV budget does not"),
}


@pytest.fixture(scope="module")
def specs(tiny_model_dir: Callable[..., Path]) -> dict[str, PoolSpec]:
    archs = ("gemma3", "lfm2", "qwen3_5", "mistral")
    out = {arch: load_config(tiny_model_dir(arch)).pool_spec() for arch in archs}
    # 3 global layers, 15 sliding (W 512), 1 KV head of 256
    out["gemma3_270m"] = PoolSpec({FULL: KVGroupSpec(3, 1, 256), SWA: KVGroupSpec(15, 1, 256, 512)})
    return out


@pytest.mark.parametrize("model,config", list(PINNED))
def test_sizes_are_the_old_triples(model: str, config: str, specs: dict[str, PoolSpec]) -> None:
    spec = specs[model]
    for dtype, want in zip((torch.float32, torch.bfloat16), PINNED[model, config], strict=True):
        cfg = EngineConfig(**CONFIGS[config])
        if isinstance(want, str):
            with pytest.raises(ValueError, match=want):
                pool_sizes(cfg, spec, dtype)
            continue
        got = pool_sizes(cfg, spec, dtype)
        expect = {k: n for k, n in zip((FULL, SWA, STATE), want, strict=True) if n is not None}
        assert got == expect, (dtype, got)
        assert list(got) == [FULL, *(k for k in spec.kinds if k != FULL)]


def test_pools_follow_the_sizes(specs: dict[str, PoolSpec]) -> None:
    """`PoolSpec.make_pools` takes the sizes by kind: one pool per kind of the model."""
    for spec in specs.values():
        sizes = pool_sizes(EngineConfig(num_slots=64, page_size=16), spec, torch.float32)
        pools = spec.make_pools(sizes)
        assert pools.kinds == spec.kinds
        for kind in spec.kinds:
            assert pools[kind].num_slots == sizes[kind]
