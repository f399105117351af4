"""Our tokenizer (tokenizers + jinja) vs transformers' on the converted default tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixkv.model import Tokenizer

TEXTS = [
    "Hello world!",
    "  leading spaces, digits 12345 and 3.14159",
    "ünïcödé — naïve café 你好，世界 🙂👍🏽 ok",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "tabs\tand\nnewlines\n\n  end",
]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! 🙂"},
        {"role": "user", "content": "Bye"},
    ],
]


@pytest.fixture(scope="module")
def ours(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def theirs(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(ours: Tokenizer, theirs: Any, text: str) -> None:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_chat_template_matches_transformers(
    ours: Tokenizer, theirs: Any, chat: int, gen: bool
) -> None:
    messages = CHATS[chat]
    expected = theirs.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
    assert ours.render_chat(messages, add_generation_prompt=gen) == expected
    ids = ours.apply_chat_template(messages, add_generation_prompt=gen)
    assert ids == theirs.encode(expected, add_special_tokens=False)


def test_special_ids(ours: Tokenizer) -> None:
    assert ours.eos_token_ids == (2,)  # <|im_end|>
    assert ours.vocab_size == 49152
    assert ours.decode([1, 2]) == ""


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decoder_streams_exactly(ours: Tokenizer, text: str) -> None:
    ids = ours.encode(text)
    dec = ours.make_decoder()
    pieces = [dec.push(t) for t in ids]
    pieces.append(dec.flush())
    assert "".join(pieces) == ours.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_incremental_decoder_holds_split_multibyte_chars(ours: Tokenizer) -> None:
    ids = ours.encode("🙂")
    assert len(ids) > 1  # the emoji's UTF-8 bytes span several byte-level tokens
    dec = ours.make_decoder()
    assert [dec.push(t) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.push(ids[-1]) == "🙂"
    # A truncated character is only released by flush().
    dec2 = ours.make_decoder()
    assert dec2.push(ids[0]) == ""
    assert dec2.flush() == ours.decode(ids[:1])
