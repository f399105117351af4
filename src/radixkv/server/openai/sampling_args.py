"""OpenAI request fields that become plain-data SamplingParams: `logit_bias` and
`response_format` (json_object / json_schema). Schemas are validated and compiled in the engine
(radixkv.engine.sampling.grammar); here only the shape of the field is checked."""

from __future__ import annotations

import json
from typing import Any

from radixkv.server.errors import APIError

JSON_OBJECT_SCHEMA = '{"type": "object"}'  # json_object: any JSON object


def logit_bias_pairs(
    bias: dict[str, float] | None, vocab_size: int
) -> tuple[tuple[int, float], ...]:
    """{"token id": bias} → ((id, bias), ...); keys must be token ids in the vocabulary."""
    out: list[tuple[int, float]] = []
    for key, value in (bias or {}).items():
        try:
            tid = int(key)
        except ValueError:
            raise APIError(
                f"logit_bias keys are token ids; got {key!r}",
                param="logit_bias",
                code="invalid_value",
            ) from None
        if not 0 <= tid < vocab_size:
            raise APIError(
                f"logit_bias: token id {tid} is outside the vocabulary [0, {vocab_size})",
                param="logit_bias",
                code="invalid_value",
            )
        out.append((tid, float(value)))
    return tuple(out)


def response_format_schema(fmt: dict[str, Any] | None) -> str | None:
    """The JSON Schema text a response_format asks for (None: free text)."""
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        spec = (fmt or {}).get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                "response_format json_schema needs json_schema.schema (an object)",
                param="response_format",
                code="invalid_value",
            )
        # `strict` is accepted either way: the schema is always enforced by the grammar.
        return json.dumps(schema)  # key order kept: properties are generated in this order
    raise APIError(
        f"unknown response_format type {kind!r} (text, json_object, json_schema)",
        param="response_format",
        code="invalid_value",
    )
