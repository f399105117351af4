"""The OpenAI-style error type of the HTTP layer."""

from __future__ import annotations

from typing import Any


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


# Anthropic's error types, by HTTP status (its Messages API answers errors in its own shape).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_body(err: APIError) -> dict[str, Any]:
    """The error as Anthropic's Messages API shapes it: {"type": "error", "error": {type,
    message}} (a 4xx it does not name is invalid_request_error, a 5xx api_error). The shape has
    no `param`, so the message starts with the field it is about, as Anthropic's do."""
    default = "api_error" if err.status >= 500 else "invalid_request_error"
    kind = _ANTHROPIC_TYPES.get(err.status, default)
    message = err.message
    if err.param and not message.startswith(err.param):
        message = f"{err.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic_path(path: str) -> bool:
    """True for the routes that answer in Anthropic's shapes (/v1/messages and below)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")
