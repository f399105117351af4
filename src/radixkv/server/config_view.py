"""`GET /config`: the configuration chain the server runs with, as plain data.

Sections and fields as EngineConfig.describe() gives them (the API key masked, never shown),
which fields differ from their defaults, and what the engine resolved from the `auto`/`None`
values it was given; among those the CPU model and the kernel path each dtype takes
(`resolved.kernel_paths`, as `radixkv.model.kernels.kernel_paths()` reports them in the engine's
process), which benchmark reports record. Behind --api-key like every route but /health.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from radixkv.config import EngineConfig


def config_view(config: EngineConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """The /config body for `config`; `resolved` holds values the engine derived at start-up."""
    changed = [
        f"{name}.{field}"
        for name, section in config.describe().items()
        for field in sorted(getattr(config, name).changed())
    ]
    return {"config": config.describe(), "changed": changed, "resolved": resolved}


def install_config_route(app: FastAPI, state: Any) -> None:
    """Add GET /config; `state.config` is the full chain (server section included)."""

    @app.get("/config")
    async def config() -> dict[str, Any]:
        resolved = {
            "max_model_len": state.max_model_len,
            "model_name": state.model_name,
            # Computed where the model runs (the engine's process in process mode).
            "kernel_paths": getattr(state.engine, "kernel_paths", {}),
        }
        return config_view(state.config, resolved)
