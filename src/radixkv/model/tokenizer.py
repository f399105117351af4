"""Tokenizer from an HF checkpoint directory: `tokenizer.json` + the chat template.

Encoding/decoding uses the `tokenizers` library directly (no `transformers` import at serve time).
The chat template is rendered with Jinja2 in a sandbox configured like `transformers` does
(trim_blocks, lstrip_blocks, loop controls, `raise_exception`, `strftime_now`), then encoded
without adding special tokens, so `apply_chat_template` returns the same ids as `transformers`.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as plain strings or AddedToken dicts."""
    if isinstance(value, dict):
        return str(value.get("content"))
    return None if value is None else str(value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _read_template(root: Path, tok_config: dict[str, Any]) -> str | None:
    jinja_file = root / "chat_template.jinja"
    if jinja_file.exists():
        return jinja_file.read_text()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: use "default"
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


class Tokenizer:
    """Text ↔ token ids, chat templating, and incremental detokenization."""

    def __init__(
        self,
        backend: HFTokenizer,
        special_tokens: dict[str, str | None],
        chat_template: str | None,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.backend = backend
        self.special_tokens = special_tokens
        self.chat_template = chat_template  # compiled by the setter
        self.eos_token_ids = eos_token_ids
        bos = special_tokens.get("bos_token")
        self.bos_token_id = None if bos is None else backend.token_to_id(bos)

    def __getstate__(self) -> dict[str, Any]:
        # The compiled template is not picklable; it is rebuilt from its source on unpickling
        # (the engine process sends its tokenizer to the API process this way).
        return {k: v for k, v in self.__dict__.items() if k != "_template"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.chat_template = self._source

    @property
    def chat_template(self) -> str | None:
        """The chat template's source; setting it compiles it (a server's --chat-template)."""
        return self._source

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        self._template = None if source is None else _compile_template(source)
        self._source = source

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], extra_eos_ids: tuple[int, ...] = ()
    ) -> Tokenizer:
        root = Path(path)
        backend = HFTokenizer.from_file(str(root / "tokenizer.json"))
        cfg_path = root / "tokenizer_config.json"
        tok_config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        special = {k: _token_text(tok_config.get(k)) for k in SPECIAL_TOKEN_KEYS}
        eos: list[int] = []
        eos_text = special.get("eos_token")
        eos_id = None if eos_text is None else backend.token_to_id(eos_text)
        for tid in ([eos_id] if eos_id is not None else []) + list(extra_eos_ids):
            if tid not in eos:
                eos.append(tid)
        return cls(backend, special, _read_template(root, tok_config), tuple(eos))

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int] | tuple[int, ...], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat template applied to `messages` (and `tools`, OpenAI's function specs, as
        transformers' `apply_chat_template(tools=...)` passes them), as text."""
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        tokens = {k: v for k, v in self.special_tokens.items() if v is not None}
        return str(
            self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **tokens,
            )
        )

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def make_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special_tokens)


class IncrementalDecoder:
    """Streams text token by token without splitting multi-byte characters.

    Keeps a small window [prefix_offset, read_offset) of already-emitted tokens as decoding
    context; text is emitted only when the window plus new tokens decodes to more characters than
    the window alone and does not end in U+FFFD (an incomplete UTF-8 sequence). Invariant: the
    concatenation of all `push` results and `flush()` equals `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _pending(self) -> str:
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        prefix_text = decode(self.ids[self.prefix_offset : self.read_offset], skip)
        new_text = decode(self.ids[self.prefix_offset :], skip)
        if len(new_text) <= len(prefix_text):
            return ""
        return new_text[len(prefix_text) :]

    def push(self, token_id: int) -> str:
        """Add one token; return the newly stable text (possibly empty)."""
        self.ids.append(int(token_id))
        text = self._pending()
        if not text or text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text

    def flush(self) -> str:
        """Whatever is still held back (e.g. a truncated multi-byte character) at the end."""
        text = self._pending()
        self.prefix_offset = self.read_offset = len(self.ids)
        return text
