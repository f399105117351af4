"""Default pool sizes of hybrid models (`engine.kv.kinds.pool_sizes`): the SWA pool follows the
window and the running / cached demand, never exceeds the FULL pool, and a byte budget gives FULL
what SWA does not take; explicit sizes win."""

from __future__ import annotations

import pytest
import torch

from radixkv.config import EngineConfig
from radixkv.engine.kv.kinds import pool_sizes
from radixkv.engine.kv.swa_kv import swa_demand
from radixkv.memory.hybrid import (
    FULL,
    STATE,
    SWA,
    KVGroupSpec,
    PoolSpec,
    StateGroupSpec,
)
from radixkv.memory.state_pool import StateLayerSpec, StateTensorSpec

# Gemma 3 270M's shape: 3 global layers, 15 sliding ones (window 512), 1 KV head of 256.
GEMMA = PoolSpec({FULL: KVGroupSpec(3, 1, 256), SWA: KVGroupSpec(15, 1, 256, window=512)})


def hybrid_sizes(cfg: EngineConfig, spec: PoolSpec, dtype: torch.dtype) -> tuple[int, int, int]:
    """(FULL, SWA, STATE) slots, 0 for a kind the model lacks."""
    sizes = pool_sizes(cfg, spec, dtype)
    return sizes[FULL], sizes.get(SWA, 0), sizes.get(STATE, 0)


def naive_demand(window: int, ps: int, running: int, chunk: int) -> int:
    """The rule as the docs state it, position by position."""
    pages = lambda n: -(-n // ps) * ps  # noqa: E731
    per_running = pages(window) + 2 * ps
    cached_windows = max(4, running // 4)
    return running * per_running + pages(chunk) + cached_windows * (pages(window) + ps)


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("running,chunk", [(32, 2048), (2, 256), (8, 512)])
def test_swa_demand_is_the_stated_rule(ps: int, running: int, chunk: int) -> None:
    assert swa_demand(512, ps, running, chunk) == naive_demand(512, ps, running, chunk)


def test_budget_gives_full_what_swa_does_not_take() -> None:
    cfg = EngineConfig(page_size=16)
    full, swa, _ = hybrid_sizes(cfg, GEMMA, torch.bfloat16)
    full_b, swa_b = GEMMA.slot_bytes(FULL, torch.bfloat16), GEMMA.slot_bytes(SWA, torch.bfloat16)
    budget = cfg.cache.kv_cache_bytes
    even = budget // (full_b + swa_b) // 16 * 16
    assert swa == swa_demand(512, 16, 32, 2048) < even < full
    assert full * full_b + swa * swa_b <= budget < (full + 16) * full_b + swa * swa_b
    assert full > 1.9 * even  # the same 512 MiB hold twice the cacheable tokens


def test_demand_beyond_the_even_split_keeps_it() -> None:
    # float32 doubles every token: 32 running windows no longer fit half the budget.
    full, swa, _ = hybrid_sizes(EngineConfig(), GEMMA, torch.float32)
    assert full == swa


def test_explicit_sizes_win_and_the_pool_stays_within_bounds() -> None:
    full, swa, _ = hybrid_sizes(EngineConfig(num_slots=4096, page_size=16), GEMMA, torch.float32)
    assert (full, swa) == (4096, 4096)  # demand 32 x 544 + ... is above the FULL pool
    cfg = EngineConfig(
        num_slots=4096, page_size=16, max_running_requests=2, chunked_prefill_size=256
    )
    full, swa, _ = hybrid_sizes(cfg, GEMMA, torch.float32)
    assert (full, swa) == (4096, swa_demand(512, 16, 2, 256)) and swa < full
    small = EngineConfig(num_slots=256, page_size=16, chunked_prefill_size=256)
    assert hybrid_sizes(small, GEMMA, torch.float32)[1] == 512 + 256 + 32  # one request's least
    explicit = EngineConfig(num_slots=4096, swa_num_slots=2000, chunked_prefill_size=256)
    assert hybrid_sizes(explicit, GEMMA, torch.float32)[:2] == (4096, 2000)
    with pytest.raises(ValueError, match="SWA pool"):
        hybrid_sizes(EngineConfig(swa_num_slots=100), GEMMA, torch.float32)


def test_models_without_full_or_swa_keep_their_old_sizes() -> None:
    all_sliding = PoolSpec({SWA: KVGroupSpec(4, 2, 16, window=64)})
    cfg = EngineConfig(num_slots=1024, chunked_prefill_size=256)
    assert hybrid_sizes(cfg, all_sliding, torch.float32)[1] == 1024  # all the KV there is
    state = StateLayerSpec((StateTensorSpec("h", (8,)),))
    full_state = PoolSpec({FULL: KVGroupSpec(2, 2, 16), STATE: StateGroupSpec((state,))})
    assert pool_sizes(EngineConfig(num_slots=1024), full_state, torch.float32) == {
        FULL: 1024,
        STATE: 96,
    }
