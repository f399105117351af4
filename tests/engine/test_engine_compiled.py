"""`--compile` serves every model whose layers are the skeleton's standard ones, whatever its KV
kinds: Mistral (every layer on the SWA pool) and the test-only toy family with sliding and full
layers (FULL + SWA) compile through the engine, every forward runs the compiled stack, and a
request's tokens AND log-probabilities are the same bits alone on a cold engine, in any batch
mix, under any prefill chunk and page size, after a cached prefix or a full hit, and equal to the
eager engine's. A model with state layers (LFM2) keeps its eager layers and says why.

Exactness against transformers of the same compiled models: tests/model/test_model_compiled.py.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_engine_invariance import _drive, _engine

from radixkv.engine.types import SamplingParams
from radixkv.model import LoadedModel, load_model
from radixkv.model.nn.compiled import CompiledStack
from radixkv.model.nn.native_stack import NativeStack
from radixkv.model.registry import ARCHITECTURES, Family

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from test_toy_family import VOCAB, build

SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def toy_registered() -> Iterator[None]:
    """The toy family's one registry line, for this module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(
            ARCHITECTURES, "ToyForCausalLM", Family("model_toy_family", "ToyConfig", "ToyLM")
        )
        yield


@pytest.fixture(scope="module", params=["mistral", "toy-sliding"])
def make(
    request: pytest.FixtureRequest, tiny_model_dir: Callable[..., Path], toy_registered: None
) -> Callable[[], LoadedModel]:
    """A fresh float32 model of the kind named by the parameter, per call."""
    path = str(tiny_model_dir("mistral"))

    def mistral() -> LoadedModel:
        return load_model(path, "cpu", torch.float32)

    def toy() -> LoadedModel:
        lm = build("ToyForCausalLM", layer_types=SLIDING, sliding_window=6)
        return LoadedModel(lm.model, lm.config, mistral().tokenizer, Path(path))

    return mistral if request.param == "mistral" else toy


def _prompts(vocab: int, seed: int) -> list[list[int]]:
    """Shared prefixes far past the windows (8 and 6), branches, a duplicate, a one-token one."""
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    system = rand(40)
    ps = [system + rand(rng.randrange(1, 25)) for _ in range(4)]
    ps += [rand(13), rand(1), list(ps[1]), ps[2][:30]]
    return ps


def _counted(monkeypatch: pytest.MonkeyPatch, cls: Any) -> list[int]:
    calls: list[int] = []
    real = cls.__call__

    def counted(self: Any, *args: Any) -> torch.Tensor:
        calls.append(1)
        return real(self, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(cls, "__call__", counted)
    return calls


@pytest.mark.slow
def test_compiled_answers_do_not_depend_on_batch_chunks_or_cache(
    make: Callable[[], LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = make()
    prompts = _prompts(min(VOCAB, int(lm.config.vocab_size)), seed=5)
    compiled = _counted(monkeypatch, CompiledStack)
    native = _counted(monkeypatch, NativeStack)
    alone: dict[int, Any] = {}
    for i in range(len(prompts)):  # each prompt alone, cache off, one prefill chunk
        eng = _engine(lm, compile=True, disable_radix_cache=True)
        alone |= _drive(eng, prompts, False, [i])
    assert lm.model.compiled is not None
    assert len(compiled) > 2 * len(prompts) and not native  # the warm-ups and every step
    rng = random.Random(3)
    for chunk, page in [(7, 1), (16, 16), (2048, 4)]:
        order = list(range(len(prompts)))
        rng.shuffle(order)
        eng = _engine(lm, compile=True, chunked_prefill_size=chunk, page_size=page)
        assert _drive(eng, prompts, False, order, rng) == alone, (chunk, page)
        assert _drive(eng, prompts, False, order[::-1]) == alone, (chunk, page, "warm")
        assert eng.metrics().cached_prompt_tokens_total > 0
    assert not native
    eager = make()
    steps = len(compiled)
    got = _drive(_engine(eager, compile=False), prompts, False, list(range(len(prompts))))
    assert got == alone  # the eager layers (the native stack where it serves) agree
    assert len(compiled) == steps and eager.model.compiled is None


def test_state_layer_models_stay_eager_and_say_why(
    tiny_model_dir: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    lm = load_model(str(tiny_model_dir("lfm2")), "cpu", torch.float32)
    with caplog.at_level(logging.WARNING, logger="radixkv.engine.runner"):
        eng = _engine(lm, compile=True)
    assert lm.model.compiled is None
    reason = eng.runner.compile(eng.kv)
    assert reason is not None and "2 of 3 are state layers" in reason and "Lfm2Layer" in reason
    assert reason in caplog.text
    out = eng.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0].output_token_ids) == 3  # it serves, eagerly
    eng.check_memory()
