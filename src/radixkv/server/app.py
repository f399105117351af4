"""The OpenAI-compatible FastAPI app over an EngineClient.

`create_app(engine, ...)` takes either an EngineClient — a ProcessEngine (the engine in its own
process, what `radixkv serve` uses) — or an already-built Engine object, which it drives in-process
through an AsyncEngine loop thread (tests, fake engines). The app's lifespan starts and stops it.
Every server → engine call is `await state.engine.call(operator.methodcaller("name", *args))`
(or a module-level function of the engine): it must cross a process boundary.

Request bodies are parsed by hand (protocol.parse_body) so every bad input is
an OpenAI-style 4xx body, never FastAPI's 422.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import operator
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixkv.config import EngineConfig
from radixkv.server.apis import install_api_routes
from radixkv.server.config_view import install_config_route
from radixkv.server.dashboard import RecentRequests, install_dashboard
from radixkv.server.engine_link.async_engine import AsyncEngine, EngineLike
from radixkv.server.engine_link.engine_client import EngineClient
from radixkv.server.gateway import install_gateway_routes
from radixkv.server.metrics import CONTENT_TYPE, ServerMetrics
from radixkv.server.middleware import auth_and_count_middleware, install_error_handlers
from radixkv.server.openai.generate import respond, sampling_for
from radixkv.server.openai.prompts import load_chat_template, parse_chat, parse_completion
from radixkv.server.openai.protocol import APIError
from radixkv.server.openai.serving import Kind
from radixkv.server.sessions import SessionTracker
from radixkv.server.tool_calling.tool_parsers import parser_for_template
from radixkv.server.tool_calling.tools import ToolPlan

log = logging.getLogger("radixkv.server")


class ServerState:
    """Everything the handlers share; one per app."""

    def __init__(
        self, engine: EngineLike | EngineClient, model_name: str, api_key: str | None
    ) -> None:
        client = engine if isinstance(engine, EngineClient) else AsyncEngine(engine)
        self.engine: EngineClient = client.launch()
        self.tokenizer = self.engine.tokenizer
        self.vocab_size = int(self.tokenizer.vocab_size)
        # The resolved context length (the engine's, else the configured one; None = unknown).
        self.max_model_len: int | None = self.engine.max_model_len
        self.model_name = model_name
        self.api_key = api_key
        # The engine's configuration; create_app may set the full chain (server section) instead.
        self.config: EngineConfig = self.engine.config
        # A token's own text, for logprobs (special tokens included).
        self.token_text = functools.lru_cache(maxsize=65536)(
            lambda tid: str(self.tokenizer.decode([tid], skip_special_tokens=False))
        )
        self.sessions = SessionTracker()
        # Per-process secret for the dashboard's short hashes of ids and salts (never shown).
        self.label_key = secrets.token_bytes(16)
        self.recent = RecentRequests(self.label_key)
        self.metrics = ServerMetrics(self.engine.metrics)
        self.started = int(time.time())
        self.tool_call_parser: str | None = None
        self.configure(self.config)

    def configure(self, config: EngineConfig) -> None:
        """Apply the server section: --chat-template replaces the tokenizer's template (the API
        side renders every prompt); --tool-call-parser, else the format the chat template's tool
        instructions point to."""
        self.config = config
        if config.server.chat_template is not None:
            self.tokenizer.chat_template = load_chat_template(config.server.chat_template)
        self.tool_call_parser = config.server.tool_call_parser or parser_for_template(
            getattr(self.tokenizer, "chat_template", None)
        )

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                f"model '{model}' not found; this server serves '{self.model_name}'",
                404,
                param="model",
                code="model_not_found",
            )


def create_app(
    engine: EngineLike | EngineClient,
    model_name: str,
    api_key: str | None = None,
    config: EngineConfig | None = None,
) -> FastAPI:
    """The app over `engine`; `config` is the full configuration chain when the caller has it
    (`radixkv serve`: its server section is what /config shows), else the engine's."""
    state = ServerState(engine, model_name, api_key)
    if config is not None:
        state.configure(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            await state.engine.stop()

    app = FastAPI(title="RadixKV", lifespan=lifespan)
    app.state.radixkv = state
    install_error_handlers(app)
    _install_routes(app, state)
    install_api_routes(app, state)
    install_dashboard(app, state)
    install_config_route(app, state)
    install_gateway_routes(app, state)
    app.add_middleware(auth_and_count_middleware(state))
    return app


def _rendered(
    state: ServerState,
    kind: Kind,
    req: Any,
    prompt_ids: list[int],
    tool_plan: ToolPlan | None = None,
) -> dict[str, Any]:
    """A request as the engine would get it, in vLLM's `GenerateRequest` shape (what its
    `/render` routes answer): the prompt's token ids and the resolved sampling parameters."""
    sampling = sampling_for(state, kind, req, prompt_ids, tool_plan)
    params = dataclasses.asdict(sampling)
    params["stop"] = list(sampling.stop)
    params["stop_token_ids"] = list(sampling.stop_token_ids)
    params["logit_bias"] = {str(t): b for t, b in sampling.logit_bias} or None
    schema = params.pop("json_schema")
    params["structured_outputs"] = {"json": json.loads(schema)} if schema else None
    grammar = params.pop("grammar")
    if grammar is not None:
        params["structured_outputs"] = {"grammar": grammar}
    options = req.options()
    return {
        "request_id": f"render-{uuid.uuid4().hex}",
        "token_ids": prompt_ids,
        "features": None,
        "sampling_params": params,
        "model": state.model_name,
        "stream": req.stream,
        "stream_options": req.stream_options.model_dump() if req.stream_options else None,
        "cache_salt": options.cache_salt,
        "priority": options.priority,
        "kv_transfer_params": None,
    }


def _install_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req, ids = await parse_completion(state, request)
        return await respond(state, request, "completion", req, ids)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req, ids, plan = await parse_chat(state, request)
        return await respond(state, request, "chat", req, ids, plan)

    # The prompt token ids a request would run with, without running it (vLLM's render routes,
    # which vllm-router's kv_aware policy calls to hash a prompt the way the engine will see it).
    @app.post("/v1/completions/render")
    async def render_completion(request: Request) -> list[dict[str, Any]]:
        req, ids = await parse_completion(state, request)
        return [_rendered(state, "completion", req, ids)]  # one per prompt, as vLLM answers

    @app.post("/v1/chat/completions/render")
    async def render_chat(request: Request) -> dict[str, Any]:
        req, ids, plan = await parse_chat(state, request)
        return _rendered(state, "chat", req, ids, plan)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        state.check_model(model)
        return _model_card(state)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.engine.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "error", "error": state.engine.fatal_error}, 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/flush_cache")
    async def flush_cache() -> dict[str, Any]:
        flushed = bool(await state.engine.call(operator.methodcaller("flush_cache")))
        return {"flushed": flushed, **_stats(state, state.engine.metrics())}

    @app.get("/cache/stats")
    async def cache_stats() -> dict[str, Any]:
        m, memory = await state.engine.call(_metrics_and_census)
        out = {**_stats(state, m), "memory_check": memory}
        if state.engine.supports("regret_stats"):
            out["regret"] = await state.engine.call(operator.methodcaller("regret_stats"))
        return out

    @app.get("/sessions/{session_id}")
    async def session(session_id: str) -> dict[str, Any]:
        return _session_or_404(state, session_id, close=False)

    @app.post("/sessions/{session_id}/close")
    async def close_session(session_id: str) -> dict[str, Any]:
        out = _session_or_404(state, session_id, close=True)
        if state.engine.supports("close_session"):  # session-aware eviction
            released = await state.engine.call(operator.methodcaller("close_session", session_id))
            out["cache_reference_released"] = bool(released)
        return out


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.started,
        "owned_by": "radixkv",
        "max_model_len": state.max_model_len,
    }


def _metrics_and_census(engine: Any) -> tuple[Any, str]:
    """(metrics, census verdict), taken together between two steps (runs on the engine side)."""
    try:
        engine.check_memory()
        memory = "ok"
    except Exception as exc:
        memory = f"FAILED: {exc}"
    return engine.metrics(), memory


def _stats(state: ServerState, m: Any) -> dict[str, Any]:
    cfg = state.engine.config
    return {
        **dataclasses.asdict(m),
        "token_hit_rate": m.token_hit_rate,
        "pool_usage": m.pool_usage,
        "inflight_requests": state.engine.inflight,
        # Where the engine runs and how long its steps took (the server's overhead is the rest).
        "engine": {
            "pid": state.engine.pid,
            "steps": state.engine.steps,
            "step_seconds": round(state.engine.step_seconds, 6),
        },
        "config": {
            "cache": cfg.cache.kind,
            "prefix_cache_enabled": cfg.prefix_cache_enabled,
            "page_size": cfg.cache.page_size,
            "eviction_policy": cfg.cache.eviction_policy,
            "schedule_policy": cfg.scheduler.schedule_policy,
        },
    }


def _session_or_404(state: ServerState, session_id: str, close: bool) -> dict[str, Any]:
    stats = state.sessions.close(session_id) if close else state.sessions.get(session_id)
    if stats is None:
        raise APIError(
            f"session '{session_id}' not found", 404, param="session_id", code="not_found"
        )
    return stats.to_json()
