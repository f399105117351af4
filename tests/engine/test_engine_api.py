"""Engine API behaviour: input errors, sampling/seeds, stop tokens and strings, streaming."""

from __future__ import annotations

import pytest
from engine_helpers import GREEDY, make_engine, reference_greedy
from engine_toy import ALPHABET, EOS, ToyLM

from radixkv.engine.types import RequestError, SamplingParams


def test_bad_requests_raise_request_error() -> None:
    eng = make_engine(num_slots=256, max_model_len=100, max_queued_requests=2)
    with pytest.raises(RequestError) as e:
        eng.add_request([1] * 95, SamplingParams(max_tokens=10))
    assert e.value.code == 400 and "max_model_len" in str(e.value)
    with pytest.raises(RequestError, match="vocabulary") as e:
        eng.add_request([1, 2, 999], GREEDY)
    assert e.value.code == 400
    with pytest.raises(RequestError, match="vocabulary"):
        eng.add_request([-1], GREEDY)
    with pytest.raises(RequestError, match="empty"):
        eng.add_request([], GREEDY)
    with pytest.raises(RequestError, match="temperature"):
        eng.add_request([1], SamplingParams(temperature=-1))
    eng.add_request([1, 2], GREEDY, request_id="x")
    with pytest.raises(RequestError, match="already in use"):
        eng.add_request([1, 2], GREEDY, request_id="x")
    eng.add_request([1, 2], GREEDY)
    with pytest.raises(RequestError) as e:
        eng.add_request([1, 2], GREEDY)
    assert e.value.code == 503
    eng.check_memory()


def test_request_larger_than_pool_is_refused() -> None:
    eng = make_engine(num_slots=64, page_size=16)
    with pytest.raises(RequestError, match="never fit") as e:
        eng.add_request([1] * 60, SamplingParams(max_tokens=5))
    assert e.value.code == 400
    out = eng.generate([[1] * 50], SamplingParams(max_tokens=14, temperature=0))[0]
    assert len(out.output_token_ids) <= 14


def test_string_prompts_and_text() -> None:
    eng = make_engine()
    outs = eng.generate(["hello world", "hello there"], GREEDY)
    assert [o.prompt_token_ids for o in outs] == [
        eng.tokenizer.encode("hello world"),
        eng.tokenizer.encode("hello there"),
    ]
    for o in outs:
        assert o.text == "".join(ALPHABET[t] for t in o.output_token_ids)
        assert o.finish_reason == "length" and o.ttft_s is not None and o.latency_s is not None


def _first_n(n: int) -> tuple[list[int], list[int]]:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    return prompt, reference_greedy(ToyLM(), prompt, n)


def test_stop_token_ids_and_eos() -> None:
    prompt, ref = _first_n(10)
    eng = make_engine()
    stop_tok = ref[4]
    cut = ref.index(stop_tok) + 1
    out = eng.generate(
        [prompt], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop_tok,))
    )[0]
    assert out.output_token_ids == ref[:cut] and out.finish_reason == "stop"
    assert out.text == "".join(ALPHABET[t] for t in ref[: cut - 1])  # stop token's text dropped
    eng.eos_token_ids = frozenset({stop_tok})
    out = eng.generate([prompt], SamplingParams(max_tokens=10, temperature=0))[0]
    assert out.finish_reason == "stop" and len(out.output_token_ids) == cut
    out = eng.generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    assert out.output_token_ids == ref and out.finish_reason == "length"
    assert EOS in eng.tokenizer.eos_token_ids


def test_stop_strings_truncate_and_hold_back_while_streaming() -> None:
    prompt, ref = _first_n(12)
    text = "".join(ALPHABET[t] for t in ref)
    stop = text[5:8]  # a 3-char stop string in the middle of the greedy output
    first = text.find(stop)
    eng = make_engine()
    sp = SamplingParams(max_tokens=12, temperature=0, stop=(stop, "never"))
    deltas = list(eng.stream(prompt, sp))
    assert deltas[-1].finished and deltas[-1].finish_reason == "stop"
    streamed = "".join(d.new_text for d in deltas)
    assert streamed == text[:first]
    # No delta ever showed a prefix of the stop string that was later taken back.
    shown = ""
    for d in deltas:
        shown += d.new_text
        assert text.startswith(shown) and stop not in shown
    assert sum(len(d.new_token_ids) for d in deltas) == first + len(stop)
    out = eng.generate([prompt], sp)[0]
    assert out.text == text[:first] and out.finish_reason == "stop"


def test_seeded_sampling_is_reproducible_across_batches() -> None:
    prompt = [7, 7, 1, 2, 3]
    sp = SamplingParams(
        max_tokens=12, temperature=1.3, top_p=0.9, top_k=20, seed=1234, ignore_eos=True
    )
    alone = make_engine().generate([prompt], sp)[0].output_token_ids
    noisy = [SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)] * 3
    eng = make_engine()
    outs = eng.generate([[1, 2], prompt, [9] * 20, [4, 4, 4, 4]], [noisy[0], sp, *noisy[1:]])
    assert outs[1].output_token_ids == alone
    other_seed = SamplingParams(max_tokens=12, temperature=1.3, seed=99, ignore_eos=True)
    assert make_engine().generate([prompt], other_seed)[0].output_token_ids != alone


def test_stream_yields_tokens_incrementally_and_abort_on_close() -> None:
    eng = make_engine()
    prompt, ref = _first_n(8)
    got: list[int] = []
    for d in eng.stream(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)):
        got += d.new_token_ids
        assert d.completion_tokens == len(got)
    assert got == ref
    it = eng.stream(prompt, SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    next(it)
    it.close()  # the consumer went away: the request is aborted and its memory returned
    assert not eng.scheduler.running and not eng.scheduler.waiting
    eng.check_memory()


def test_generate_with_one_bad_prompt_adds_nothing() -> None:
    eng = make_engine()
    with pytest.raises(RequestError):
        eng.generate([[1, 2, 3], [1, 999]], GREEDY)
    assert not eng.has_unfinished() and eng.step() == []
    eng.check_memory()
    assert eng.allocator.free_slots == eng.allocator.num_slots


def test_hit_rate_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    eng = make_engine()
    eng.log_interval_s = 0.0
    with caplog.at_level("INFO", logger="radixkv.engine.engine"):
        eng.generate([[1, 2, 3, 4, 5]] * 2, GREEDY)
    assert any("token hit rate" in r.getMessage() for r in caplog.records)
