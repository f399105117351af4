"""The one table of supported architectures: a checkpoint's `architectures[0]` → its family's
config class and model class.

To add a family: write its module (anywhere importable: ours live in radixkv.model.families) with
its config (a radixkv.model.config.ModelConfig subclass with `from_dict(raw, gen)`, or new flags
on an existing family's config), its layer classes (built from the blocks of
radixkv.model.nn.blocks, or the skeleton's standard `DecoderLayer`) and its model (a
radixkv.model.families.skeleton.DecoderLM subclass naming them, constructed as
`Model(config, get, device=, attention=)`), then add one line here, `"Arch": Family(module,
config class name, model class name)`. Nothing else changes: the loader, the engine, the native
and compiled layer stacks and the pools all follow from the config and the layers.
Family modules are imported on first use, so reading a config does not import every family.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from radixkv.model.config import ModelConfig

# The architectures LlamaConfig parses (one family, radixkv.model.families.llama).
LLAMA_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
)


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture (or a feature of it, e.g. RoPE scaling) is not supported."""


AnyConfig: TypeAlias = "ModelConfig"
OURS = "radixkv.model.families."  # where the built-in families live


@dataclass(frozen=True)
class Family:
    """Where a family lives: its module (a full dotted path) and the two class names there."""

    module: str
    config: str
    model: str

    def config_class(self) -> Any:
        return getattr(import_module(self.module), self.config)

    def model_class(self) -> Any:
        return getattr(import_module(self.module), self.model)


_LLAMA = Family(OURS + "llama", "LlamaConfig", "CausalLM")
ARCHITECTURES: dict[str, Family] = {
    **dict.fromkeys(LLAMA_ARCHITECTURES, _LLAMA),
    "Gemma3ForCausalLM": Family(OURS + "gemma3", "Gemma3Config", "Gemma3LM"),
    "Qwen3_5ForCausalLM": Family(OURS + "qwen3_5", "Qwen35Config", "Qwen35LM"),
    "Lfm2ForCausalLM": Family(OURS + "lfm2", "Lfm2Config", "Lfm2LM"),
    "Qwen3NextForCausalLM": Family(OURS + "qwen3_next", "Qwen3NextConfig", "Qwen3NextLM"),
}


def architecture(raw: dict[str, Any]) -> str:
    """The architecture a config dict declares (its model_type if it lists none)."""
    archs = raw.get("architectures") or []
    return archs[0] if archs else str(raw.get("model_type", "<missing>"))


def family(arch: str) -> Family:
    """The family of `arch`; UnsupportedArchitectureError naming the supported ones otherwise."""
    found = ARCHITECTURES.get(arch)
    if found is None:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}"
        )
    return found


def parse_config(raw: dict[str, Any], gen: dict[str, Any] | None = None) -> AnyConfig:
    """The family config of an HF config dict (and its generation config)."""
    config: AnyConfig = family(architecture(raw)).config_class().from_dict(raw, gen or {})
    return config


def load_config(path: str | os.PathLike[str]) -> AnyConfig:
    """The config of any supported checkpoint directory (UnsupportedArchitectureError
    otherwise)."""
    root = Path(path)
    raw = json.loads((root / "config.json").read_text())
    gen_path = root / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    return parse_config(raw, gen)
