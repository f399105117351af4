"""HTTP plumbing around the routes: API-key auth (`Authorization: Bearer KEY`, or Anthropic's
`x-api-key: KEY`) and request counting (one pure ASGI middleware, safe with streaming responses),
and the handlers that turn every failure into an OpenAI-style error body {"error": {message,
type, param, code}} — or Anthropic's {"type": "error", "error": {type, message}} under
/v1/messages."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixkv.engine.types import RequestError
from radixkv.server.dashboard import page_key_ok
from radixkv.server.errors import anthropic_body, is_anthropic_path
from radixkv.server.openai.protocol import APIError, overloaded

if TYPE_CHECKING:
    from radixkv.server.app import ServerState

log = logging.getLogger("radixkv.server")
ASGIApp = Callable[..., Awaitable[None]]


def request_error(exc: RequestError) -> APIError:
    """Map the engine's RequestError (code = HTTP-ish status) to an OpenAI-style error."""
    if exc.code in (429, 503):
        return overloaded(str(exc))
    if exc.code == 413:  # longer than the context or the pool: OpenAI reports a 400
        return APIError(str(exc), 400, param=exc.param or "prompt", code="context_length_exceeded")
    if exc.code >= 500:
        return APIError(str(exc), exc.code, type="server_error", param=exc.param)
    return APIError(str(exc), exc.code, param=exc.param, code="invalid_value")


_KNOWN_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/completions/render",
        "/v1/chat/completions/render",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/loads",
        "/server_info",
        "/get_server_info",
        "/model_info",
        "/get_model_info",
        "/version",
        "/health",
        "/metrics",
        "/flush_cache",
        "/cache/stats",
        "/cache/tree",
        "/dashboard",
        "/dashboard/state",
    }
)


def _route_label(path: str) -> str:
    if path.startswith("/sessions/"):
        return "/sessions/{id}"
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    return path if path in _KNOWN_ROUTES else "other"


def _auth_and_count(state: ServerState, app: Any) -> ASGIApp:
    """Pure ASGI middleware (safe with streaming): API-key auth on all routes but /health, and
    a request counter by route and status."""

    async def middleware(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path = scope.get("path", "")
        status = {"code": 500}

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if (
                state.api_key
                and path != "/health"
                and not _authorized(scope, state.api_key)
                and not page_key_ok(scope, state.api_key)
            ):
                err = APIError(
                    "invalid or missing API key (send 'Authorization: Bearer <key>' or "
                    "'x-api-key: <key>')",
                    401,
                    code="invalid_api_key",
                )
                body = anthropic_body(err) if is_anthropic_path(path) else err.body()
                await JSONResponse(body, 401)(scope, receive, counting_send)
                return
            await app(scope, receive, counting_send)
        finally:
            state.metrics.http_requests.labels(_route_label(path), str(status["code"])).inc()

    return middleware


def _authorized(scope: Any, api_key: str) -> bool:
    """A Bearer token or an `x-api-key` header (what Anthropic's clients send) equal to the key."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), api_key):
                return True
        elif name == b"x-api-key" and hmac.compare_digest(value.decode("latin-1").strip(), api_key):
            return True
    return False


def auth_and_count_middleware(state: ServerState) -> Callable[[Any], ASGIApp]:
    def factory(app: Any) -> ASGIApp:
        return _auth_and_count(state, app)

    return factory


def _error_response(request: Request, err: APIError) -> JSONResponse:
    """The error body (in the shape of the API the route speaks); a 503 (overloaded, or no
    engine) also says when to come back, so clients back off and a router (SGLang's gateway
    retries 408/429/5xx) tries another worker."""
    headers = None
    if err.status in (429, 503):
        state = getattr(request.app.state, "radixkv", None)
        seconds = state.config.server.retry_after if state is not None else 1
        headers = {"Retry-After": str(seconds)}
    body = anthropic_body(err) if is_anthropic_path(request.url.path) else err.body()
    return JSONResponse(body, err.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestError)
    async def _engine_error(request: Request, exc: RequestError) -> JSONResponse:
        return _error_response(request, request_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        err = APIError(str(exc.detail), exc.status_code, code=code)
        return _error_response(request, err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(request, APIError(f"invalid request: {exc.errors()}"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        err = APIError(f"internal error: {type(exc).__name__}", 500, type="server_error")
        return _error_response(request, err)
