"""Shared GGUF → Hugging Face checkpoint machinery for the embedded models (`default.py`,
`gemma3_gguf.py`): where converted checkpoints live, dequantization, the tokenizer, and the
atomic write.

Every converter dequantizes each tensor to float32 with `gguf.quants.dequantize` (any type the
`gguf` package knows: F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q6_K, ...), so the checkpoint holds exactly
the values the GGUF encodes. A checkpoint is written into a temporary sibling directory and renamed
into place only when complete, with a marker file that carries the converter's version: a crashed
or concurrent conversion never leaves a half-written checkpoint behind, and a newer converter
redoes an older conversion.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

MARKER = "radixkv_conversion.json"


def cache_root() -> Path:
    """Where converted checkpoints live: `$RADIXKV_CACHE_DIR`, else ~/.cache/radixkv/models."""
    env = os.environ.get("RADIXKV_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "radixkv" / "models"


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A GGUF metadata value (`default` when the key is absent and a default is given)."""
    if key not in reader.fields:
        if default is not None:
            return default
        raise KeyError(f"GGUF metadata has no {key!r}")
    return reader.fields[key].contents()


def tensor_name(
    name: str, top: dict[str, str], layer: dict[str, str], suffixes: str = "weight"
) -> str:
    """The HF name of a GGUF tensor: `top` maps whole names, `layer` maps the part between
    `blk.N.` and the suffix (`suffixes`: a regex alternation such as "weight|bias")."""
    if name in top:
        return top[name]
    m = re.fullmatch(rf"blk\.(\d+)\.(\w+)\.({suffixes})", name)
    if m is None or m.group(2) not in layer:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{layer[m.group(2)]}.{m.group(3)}"


def dequantize(tensor: Any) -> np.ndarray:
    """One GGUF tensor as a float32 array in row-major (PyTorch) shape."""
    from gguf.quants import dequantize as gguf_dequantize

    # GGUF shapes are innermost-first; dequantize returns the row-major numpy shape.
    w = np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    return w.reshape([int(d) for d in reversed(tensor.shape)])


def to_torch(w: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(w, dtype=np.float32, order="C"))


def is_complete(target: Path, version: int) -> bool:
    """Whether `target` holds a finished conversion by this converter version."""
    marker = target / MARKER
    if not marker.exists():
        return False
    return bool(json.loads(marker.read_text()).get("version") == version)


def write_tokenizer(gguf_file: Path, out: Path, chat_template: str | None) -> None:
    """Tokenizer via transformers' GGUF conversion, plus the chat template in tokenizer_config."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    tok.save_pretrained(str(out))
    if chat_template is not None:
        cfg_path = out / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        tok_cfg["chat_template"] = chat_template
        cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")


def write_checkpoint(
    target: Path,
    gguf_file: Path,
    version: int,
    config: dict[str, Any],
    generation: dict[str, Any],
    tensors: Callable[[], dict[str, torch.Tensor]],
    chat_template: str | None,
) -> None:
    """Write config.json, model.safetensors (from `tensors()`), generation_config.json, the
    tokenizer files and the marker into `target`, atomically (see the module docstring)."""
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        save_file(tensors(), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        write_tokenizer(gguf_file, tmp, chat_template)
        marker = {"version": version, "source": gguf_file.name}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        if target.exists():
            # A stale or partial earlier conversion: move it aside first (rename is atomic).
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_complete(target, version):  # lost a race to a concurrent converter
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
