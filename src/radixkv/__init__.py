"""RadixKV: an LLM serving engine whose heart is a radix-tree KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

__all__ = ["Engine", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import radixkv` (and the cache package) must not import torch.
    if name == "Engine":
        from radixkv.engine.engine import Engine

        return Engine
    if name == "SamplingParams":
        from radixkv.engine.types import SamplingParams

        return SamplingParams
    raise AttributeError(name)
