"""OpenAI-compatible request bodies (the error type lives in server/errors.py).

Bodies are parsed from raw bytes in strict JSON mode, so a string where a number belongs is a 400
(never FastAPI's 422), and malformed JSON is a 400 too. Unknown fields are ignored (clients send
many optional ones); fields we cannot honour (suffix, echo together with logprobs) are
rejected with a 400 that names the parameter instead of being silently dropped. Tools and
`tool_choice` are checked here too (radixkv.server.tool_calling.tools); a forced choice becomes the
request's grammar.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixkv.engine.types import RequestOptions, SamplingParams
from radixkv.server.errors import APIError as APIError  # re-exported for the handlers
from radixkv.server.errors import overloaded as overloaded
from radixkv.server.openai.sampling_args import logit_bias_pairs, response_format_schema
from radixkv.server.tool_calling.tools import (
    Mode,
    ToolCallIn,
    ToolSpec,
    check_tools,
    constraint_schema,
    tool_mode,
)

_M = TypeVar("_M", bound=BaseModel)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by completions and chat completions (sampling, cache controls)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # extension (vLLM / HF semantics)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # Extensions (sent by OpenAI clients through `extra_body`).
    cache_salt: str | None = Field(default=None, max_length=256)
    priority: int = 0
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    def check_common(self, vocab_size: int) -> None:
        if self.n < 1:
            raise APIError("n must be >= 1", param="n", code="invalid_value")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise APIError("max_tokens must be >= 1", param="max_tokens", code="invalid_value")
        for tid in self.stop_token_ids or ():
            if not 0 <= tid < vocab_size:
                raise APIError(
                    f"stop_token_ids: {tid} is outside the vocabulary [0, {vocab_size})",
                    param="stop_token_ids",
                    code="invalid_value",
                )

    def logprobs_k(self) -> int | None:
        """Top alternatives per token (None: no logprobs); set by each endpoint."""
        return None

    def sampling(self, default_max_tokens: int, vocab_size: int = 2**31) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        params = SamplingParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            seed=self.seed,
            stop=tuple(s for s in stop if s),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            n=self.n,
            logprobs=self.logprobs_k(),
            logit_bias=logit_bias_pairs(self.logit_bias, vocab_size),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            json_schema=response_format_schema(self.response_format),
        )
        params.validate()  # RequestError → 400 naming the parameter
        return params

    def options(self) -> RequestOptions:
        return RequestOptions(
            cache_salt=self.cache_salt or None, priority=self.priority, session_id=self.session_id
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    # As in vLLM: a text prompt gets the tokenizer's special tokens (Gemma's <bos>; SmolLM2
    # adds none); token-id prompts are taken as they are.
    add_special_tokens: bool = True

    def check(self, vocab_size: int) -> None:
        self.check_common(vocab_size)
        if self.echo and self.logprobs is not None:
            raise APIError(
                "echo together with logprobs is not supported (prompt logprobs are not computed)",
                param="echo",
                code="unsupported_parameter",
            )
        if self.suffix:
            raise APIError("suffix is not supported", param="suffix", code="unsupported_parameter")
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and len(prompt) != 1:
            raise APIError(
                "batched prompts are not supported; send one prompt per request",
                param="prompt",
                code="unsupported_parameter",
            )

    def logprobs_k(self) -> int | None:
        return self.logprobs

    def prompt_text_or_ids(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return str(self.prompt[0])
        return self.prompt  # type: ignore[return-value]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it ("developer" is OpenAI's newer "system")."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        if self.tool_calls:
            out["tool_calls"] = [c.for_template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True

    def check(self, vocab_size: int) -> None:
        if self.max_completion_tokens is not None:  # the newer name wins over max_tokens
            if self.max_completion_tokens < 1:
                raise APIError(
                    "max_completion_tokens must be >= 1",
                    param="max_completion_tokens",
                    code="invalid_value",
                )
            self.max_tokens = self.max_completion_tokens
        self.check_common(vocab_size)
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                "top_logprobs requires logprobs=true", param="top_logprobs", code="invalid_value"
            )
        mode, _ = self.tool_mode()
        if self.tools:
            check_tools(self.tools)
        if mode in ("required", "named") and self.response_format not in (
            None,
            {"type": "text"},
        ):
            raise APIError(
                f"response_format cannot be combined with tool_choice {mode!r}",
                param="response_format",
                code="invalid_value",
            )

    def tool_mode(self) -> tuple[Mode, str | None]:
        """(none / auto / required / named, the named function); 400 if tool_choice is wrong."""
        return tool_mode(self.tools, self.tool_choice)

    def sampling(self, default_max_tokens: int, vocab_size: int = 2**31) -> SamplingParams:
        params = super().sampling(default_max_tokens, vocab_size)
        mode, name = self.tool_mode()
        schema = constraint_schema(self.tools or [], mode, name, self.parallel_tool_calls)
        return params if schema is None else dataclasses.replace(params, json_schema=schema)

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]

    @property
    def uses_tools(self) -> bool:
        """True when tools or tool turns must go through the tool-aware rendering."""
        return bool(self.tools) or any(m.tool_calls or m.role == "tool" for m in self.messages)


def parse_body(model: type[_M], raw: bytes) -> _M:
    """Parse a JSON body strictly; any failure becomes an APIError(400) naming the field."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0] if errors else {"type": "", "loc": (), "msg": str(exc)}
        if first["type"] == "json_invalid":
            raise APIError(f"malformed JSON body: {first['msg']}", code="invalid_json") from None
        # Drop list indices and union-member tags ("str", "list[int]", "TextPart") from the path.
        loc = [str(p) for p in first["loc"] if isinstance(p, str) and _is_field_name(p)]
        param = ".".join(loc) or None
        raise APIError(
            f"invalid request body: {param or 'body'}: {first['msg']}",
            param=param,
            code="invalid_type" if "type" in str(first["type"]) else "invalid_value",
        ) from None


def _is_field_name(part: str) -> bool:
    return part not in {"str", "int", "float", "bool"} and "[" not in part and part[:1].islower()
