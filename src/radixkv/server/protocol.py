"""OpenAI-compatible request bodies and the OpenAI-style error type.

Bodies are parsed from raw bytes in strict JSON mode, so a string where a number belongs is a 400
(never FastAPI's 422), and malformed JSON is a 400 too. Unknown fields are ignored (clients send
many optional ones); fields we cannot honour (n > 1, logprobs, echo, penalties) are rejected with
a 400 that names the parameter instead of being silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixkv.engine.types import RequestOptions, SamplingParams

_M = TypeVar("_M", bound=BaseModel)


class APIError(Exception):
    """An error that becomes an OpenAI-style body: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def overloaded(message: str) -> APIError:
    return APIError(message, 503, type="server_error", code="overloaded")


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
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # Extensions (sent by OpenAI clients through `extra_body`).
    cache_salt: str | None = Field(default=None, max_length=256)
    priority: int = 0
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    def check_common(self, vocab_size: int) -> None:
        if self.n != 1:
            raise APIError("only n=1 is supported", param="n", code="unsupported_parameter")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise APIError("max_tokens must be >= 1", param="max_tokens", code="invalid_value")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                raise APIError(f"{name} is not supported", param=name, code="unsupported_parameter")
        if self.logit_bias:
            raise APIError("logit_bias is not supported", param="logit_bias", code="unsupported")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise APIError(
                "only response_format type 'text' is supported",
                param="response_format",
                code="unsupported",
            )
        for tid in self.stop_token_ids or ():
            if not 0 <= tid < vocab_size:
                raise APIError(
                    f"stop_token_ids: {tid} is outside the vocabulary [0, {vocab_size})",
                    param="stop_token_ids",
                    code="invalid_value",
                )

    def sampling(self, default_max_tokens: int) -> SamplingParams:
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

    def check(self, vocab_size: int) -> None:
        self.check_common(vocab_size)
        if self.logprobs is not None:
            raise APIError("logprobs are not supported", param="logprobs", code="unsupported")
        if self.echo:
            raise APIError("echo is not supported", param="echo", code="unsupported_parameter")
        if self.suffix:
            raise APIError("suffix is not supported", param="suffix", code="unsupported_parameter")
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and len(prompt) != 1:
            raise APIError(
                "batched prompts are not supported; send one prompt per request",
                param="prompt",
                code="unsupported_parameter",
            )

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
    tools: list[Any] | None = None

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
        if self.logprobs or self.top_logprobs:
            raise APIError("logprobs are not supported", param="logprobs", code="unsupported")
        if self.tools:
            raise APIError("tools are not supported", param="tools", code="unsupported")

    def template_messages(self) -> list[dict[str, str]]:
        # "developer" is OpenAI's newer name for the system role; templates know "system".
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


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
