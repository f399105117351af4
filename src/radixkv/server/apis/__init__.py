"""The other APIs agent clients speak, on the same engine, chat template and tool-call path as
`/v1/chat/completions`: OpenAI's Responses API (responses.py) and Anthropic's Messages API
(messages.py). Each translates its request into a chat completion request and its answer back
(bridge.py), so an agent loop on either keeps its prefix in the radix cache turn after turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from radixkv.server.apis.messages import install_messages_routes
from radixkv.server.apis.responses import install_responses_routes

if TYPE_CHECKING:
    from radixkv.server.app import ServerState


def install_api_routes(app: FastAPI, state: ServerState) -> None:
    """POST /v1/responses, GET / DELETE /v1/responses/{id}, POST /v1/messages and
    POST /v1/messages/count_tokens."""
    install_responses_routes(app, state)
    install_messages_routes(app, state)
