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
