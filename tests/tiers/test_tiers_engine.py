"""Engine with host (L2) and file storage (L3) tiers: outputs equal cache-off outputs, every
step's census balances on the device and host pools, restarts keep the cache, and corrupt,
truncated or foreign storage values are misses."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import make_engine
from engine_toy import ToyLM
from tier_helpers import LM, prompts, reference, run, run_one_by_one, tier_engine

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_l2_hits_do_not_change_outputs(policy: str, page_size: int) -> None:
    e = tier_engine(hicache_write_policy=policy, page_size=page_size)
    want = reference()
    # Later rounds find what L1 evicted in L2. Selective copies a page on its second use, so
    # every prompt runs twice in a row there.
    repeat = 2 if policy == "write_through_selective" else 1
    for _ in range(3):
        assert run_one_by_one(e, repeat=repeat) == want
    by_tier = e.metrics().cached_tokens_by_tier
    assert by_tier["host"] > 0, by_tier
    stats = e.metrics().tier_stats
    assert (
        stats["host_free_pages"] + stats["host_cached_pages"] + stats["host_held_pages"]
        == (stats["host_pool_pages"])
    )


def test_small_l2_under_pressure_keeps_census() -> None:
    e = tier_engine(hicache_size=0.02, hicache_write_policy="write_back")  # a few pages only
    want = reference(seed=1, n=8)
    for _ in range(2):
        assert run(e, seed=1, n=8) == want


def _storage(tmp: Path, policy: str = "wait_complete") -> dict[str, object]:
    return {
        "hicache_storage_backend": "file",
        "hicache_storage_url": str(tmp / "l3"),
        "hicache_storage_prefetch_policy": policy,
    }


@pytest.mark.parametrize("policy", ["cost_aware", "wait_complete", "timeout", "best_effort"])
def test_restart_finds_the_cache_in_storage(tmp_path: Path, policy: str) -> None:
    want = reference()
    a = tier_engine(**_storage(tmp_path, policy))
    assert run_one_by_one(a) == want
    assert a.close()  # clean shutdown flushes every pending write
    b = tier_engine(**_storage(tmp_path, policy))  # a new process: empty tree, empty L2
    assert run_one_by_one(b) == want
    stats = b.metrics().tier_stats
    if policy != "best_effort":  # best_effort may admit before the pages arrive
        assert b.metrics().cached_tokens_by_tier["storage"] > 0
        assert stats["storage_reads_hit"] > 0
    b.close()


def test_l3_without_l2_flag(tmp_path: Path) -> None:
    want = reference()
    a = tier_engine(enable_hierarchical_cache=False, **_storage(tmp_path))
    assert run_one_by_one(a) == want and a.close()
    b = tier_engine(enable_hierarchical_cache=False, **_storage(tmp_path))
    assert run_one_by_one(b) == want
    assert b.metrics().cached_tokens_by_tier["storage"] > 0
    b.close()


def _values(tmp: Path) -> list[Path]:
    return sorted(p for p in (tmp / "l3").rglob("*") if p.is_file())


def test_corrupt_and_truncated_files_are_misses(tmp_path: Path) -> None:
    want = reference()
    a = tier_engine(**_storage(tmp_path))
    assert run_one_by_one(a) == want and a.close()
    files = _values(tmp_path)
    assert files
    for i, f in enumerate(files):
        data = bytearray(f.read_bytes())
        if i % 2:
            f.write_bytes(bytes(data[: len(data) // 2]))  # truncated
        else:
            data[len(data) // 2] ^= 0xFF  # one flipped byte
            f.write_bytes(bytes(data))
    b = tier_engine(**_storage(tmp_path))
    assert run_one_by_one(b) == want
    stats = b.metrics().tier_stats
    assert stats["storage_corrupt"] > 0
    assert b.metrics().cached_tokens_by_tier["storage"] == 0
    b.close()


def test_another_models_pages_are_never_used(tmp_path: Path) -> None:
    other = ToyLM(seed=1)  # same shapes, other weights: another fingerprint
    want_other = reference(lm=other)
    a = tier_engine(**_storage(tmp_path))
    assert run_one_by_one(a) == reference() and a.close()
    ours = set(_values(tmp_path))
    b = tier_engine(other, **_storage(tmp_path))
    assert run_one_by_one(b) == want_other  # other keys: the first model's pages never match
    assert b.metrics().cached_tokens_by_tier["storage"] == 0 and b.close()
    theirs = [f for f in _values(tmp_path) if f not in ours]
    donors = sorted(ours)
    for i, f in enumerate(theirs):  # present model A's (valid) pages under model B's keys
        f.write_bytes(donors[i % len(donors)].read_bytes())
    c = tier_engine(other, **_storage(tmp_path))
    assert run_one_by_one(c) == want_other
    assert c.metrics().tier_stats["storage_corrupt"] > 0
    assert c.metrics().cached_tokens_by_tier["storage"] == 0
    c.close()


def test_unwritable_storage_only_costs_hits(tmp_path: Path) -> None:
    (tmp_path / "l3").write_text("not a directory")
    with pytest.raises(Exception, match="storage directory"):
        tier_engine(**_storage(tmp_path))


@pytest.mark.parametrize("policy", ["write_back", "write_through_selective"])
def test_clean_shutdown_saves_pages_only_l1_held(tmp_path: Path, policy: str) -> None:
    want = reference()
    a = tier_engine(num_slots=1024, hicache_write_policy=policy, **_storage(tmp_path))
    assert run_one_by_one(a) == want  # everything fits L1: nothing was evicted or hit twice
    assert a.close()
    b = tier_engine(**_storage(tmp_path))
    assert run_one_by_one(b) == want
    assert b.metrics().cached_tokens_by_tier["storage"] > 0
    b.close()


def test_n_choices_through_the_tiers(tmp_path: Path) -> None:
    """n > 1 choices share a request id but not their outputs: each choice's pages get their
    own keys, so sampled outputs with tiers (and after a restart) equal cache-off outputs."""
    sp = SamplingParams(max_tokens=12, temperature=1.0, seed=5, n=3, ignore_eos=True)
    ps = prompts(seed=3, n=4)

    def outputs(engine: Engine) -> list[list[int]]:
        res = engine.generate(ps, sp)  # one output per choice
        engine.check_memory()
        return [r.output_token_ids for r in res]

    off = make_engine(LM, disable_radix_cache=True)
    want = outputs(off)
    # Follow-ups continue each choice's own output: they hit pages generated by that choice.
    follow = [ps[i // sp.n] + want[i] for i in range(len(want))]
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    want_follow = [r.output_token_ids for r in off.generate(follow, greedy)]
    for _ in range(2):  # a restart on the same storage
        e = tier_engine(hicache_write_policy="write_through", **_storage(tmp_path))
        for _ in range(2):
            assert outputs(e) == want
            assert [r.output_token_ids for r in e.generate(follow, greedy)] == want_follow
            e.check_memory()
        assert e.close()
    assert e.metrics().cached_tokens_by_tier["storage"] > 0
