"""The benchmark checkpoint builder: ~100M-parameter shapes, and a shrunken build that loads and
serves (tokenizer included) with the expected components."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixkv.memory.hybrid import FULL, SWA
from radixkv.model import load_model
from radixkv.model.hybrid_simple import greedy_generate_hybrid
from scripts.hybrid_ckpt import build, count_parameters, main


@pytest.mark.parametrize("family", ["gemma3", "qwen3_5"])
def test_shapes_are_about_100m(family: str) -> None:
    assert 90e6 < count_parameters(family) < 115e6


def test_build_loads(tmp_path: Path, default_model_dir: Path) -> None:
    small = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
    info = build(
        "gemma3",
        tmp_path / "g",
        layers=6,
        tokenizer_dir=default_model_dir,
        sliding_window=16,
        **small,
    )
    assert info["layer_types"].count("full_attention") == 1
    lm = load_model(info["path"])
    spec = lm.config.pool_spec()
    assert (spec[FULL].num_layers, spec[SWA].num_layers, spec.window(SWA)) == (1, 5, 16)
    assert lm.tokenizer.encode("hello") and len(greedy_generate_hybrid(lm, [5, 6, 7], 3)) >= 1
    with pytest.raises(SystemExit):
        main(["--family", "nope", "--out", str(tmp_path / "x")])
