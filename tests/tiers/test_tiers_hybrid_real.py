"""Hybrid checkpoints (Gemma 3: sliding window + full attention; Qwen3.5: gated DeltaNet + full;
LFM2: short conv + full) with L2 + file L3, page 16, float32: a restarted engine gets >= 90% of
a 1,500-token prompt back from L3, a prompt diverging at token 1,000 reuses >= 500 tokens, a
corrupt component value (flipped bytes in the file backend) is a miss that is recomputed, and
every output equals a cache-off engine's, with the census of every pool (device and host, per
component) checked after every step. Skipped where the hybrid families are not installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import run_checked

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams

pytest.importorskip("radixkv.model.families.qwen3_5")

# The component each family keeps beside its FULL pages (the suffix of its storage keys).
FAMILIES = {"gemma3": "-swa", "qwen3_5": "-state", "lfm2": "-state"}
SP = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n,), generator=g).tolist()


def _engine(path: Path, **kw: Any) -> Engine:
    return Engine(
        str(path),
        device="cpu",
        dtype="float32",
        page_size=16,
        num_slots=4096,
        max_running_requests=2,
        **kw,
    )


def _run(e: Engine, prompt: list[int]) -> tuple[list[int], int]:
    before = e.metrics().cached_prompt_tokens_total
    (out,) = run_checked(e, [prompt], SP)
    return out.output_token_ids, e.metrics().cached_prompt_tokens_total - before


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_restarted_hybrid_engine_restores_from_storage(
    arch: str, tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = tiny_model_dir(arch, max_position_embeddings=2048)
    base = _tokens(1500, seed=1)
    diverging = base[:1000] + _tokens(500, seed=2)
    off = _engine(path, disable_radix_cache=True)
    want = [_run(off, p)[0] for p in (base, diverging)]
    tiers = {
        "enable_hierarchical_cache": True,
        "hicache_storage_backend": "file",
        "hicache_storage_url": str(tmp_path / "l3"),
    }  # the default prefetch policy
    a = _engine(path, **tiers)
    assert _run(a, base) == (want[0], 0)
    assert a.close()
    b = _engine(path, **tiers)  # a restart: empty tree, empty L2
    got, cached = _run(b, base)
    assert got == want[0] and cached >= 0.9 * len(base), cached
    assert b.metrics().cached_tokens_by_tier["storage"] == cached
    assert b.close()
    c = _engine(path, **tiers)
    got, cached = _run(c, diverging)
    assert got == want[1] and cached >= 500, cached
    assert c.close()
    files = [p for p in (tmp_path / "l3").rglob(f"*{FAMILIES[arch]}") if p.is_file()]
    assert files
    for f in files:  # every SWA page / checkpoint: one flipped byte
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    d = _engine(path, **tiers)
    got, cached = _run(d, base)
    assert got == want[0] and cached == 0  # FULL pages alone resume nowhere: recomputed
    assert d.metrics().tier_stats["storage_corrupt"] > 0
    d.close()
