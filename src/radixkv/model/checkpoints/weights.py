"""Lazy access to the tensors of a (possibly sharded) safetensors checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

# Tensors a checkpoint may carry that the model does not need.
IGNORED_SUFFIXES: tuple[str, ...] = ("rotary_emb.inv_freq",)


class SafetensorsWeights:
    """Maps tensor name → file; `get` reads one tensor, converts it, and records it as used."""

    def __init__(self, root: str | os.PathLike[str], dtype: torch.dtype, device: str) -> None:
        self.root = Path(root)
        self.dtype = dtype
        self.device = device
        self.used: set[str] = set()
        self._handles: dict[Path, Any] = {}
        index = self.root / "model.safetensors.index.json"
        if index.exists():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            self.files = {name: self.root / fname for name, fname in weight_map.items()}
        else:
            self.files = {}
            shards = sorted(self.root.glob("*.safetensors"))
            if not shards:
                raise FileNotFoundError(f"no *.safetensors files in {self.root}")
            for shard in shards:
                with safe_open(str(shard), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        self.files[name] = shard

    def names(self) -> set[str]:
        return set(self.files)

    def get(self, name: str) -> torch.Tensor | None:
        path = self.files.get(name)
        if path is None:
            return None
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = safe_open(str(path), framework="pt")
        tensor = handle.get_tensor(name)
        self.used.add(name)
        # Everything, norms included, is cast to the model dtype (as HF `from_pretrained(dtype=)`).
        return tensor.to(device=self.device, dtype=self.dtype)

    def unused(self, allowed: set[str] | None = None) -> list[str]:
        """Checkpoint tensors never read (except ignorable ones and `allowed`)."""
        skip = allowed or set()
        return sorted(
            n
            for n in self.files
            if n not in self.used and n not in skip and not n.endswith(IGNORED_SUFFIXES)
        )

    def close(self) -> None:
        self._handles.clear()
