"""Random-weight hybrid checkpoints for benchmarks: Gemma 3- and Qwen3.5-shaped, ~100M parameters.

    python scripts/hybrid_ckpt.py --family gemma3 --out ckpt/gemma3-100m
    python scripts/hybrid_ckpt.py --family qwen3_5 --out ckpt/qwen35-100m [--layers 12]

The shapes follow the small members of each family scaled to ~100M parameters with the default
model's vocabulary (49152 tokens; its tokenizer files are copied in, so the server can serve the
checkpoint): Gemma 3 with 5 sliding layers (window 512) per full layer, Qwen3.5 with 3 gated
DeltaNet layers per full-attention layer. Weights are seeded random: outputs are gibberish, but
the cost and memory profile (KV per token in each component, state per request) is the family's.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import torch

VOCAB = 49152
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# Per family: the transformers config class name and its arguments.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3": (
        "Gemma3TextConfig",
        {
            "hidden_size": 640,
            "intermediate_size": 2048,
            "num_hidden_layers": 12,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3_5": (
        "Qwen3_5TextConfig",
        {
            "hidden_size": 640,
            "intermediate_size": 2048,
            "num_hidden_layers": 12,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 128,
            "full_attention_interval": 4,
            "linear_num_key_heads": 8,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
}


def make_config(family: str, layers: int | None = None, **overrides: Any) -> Any:
    """The transformers config of a family's benchmark shape (`overrides` for smaller tests)."""
    import transformers

    if family not in SHAPES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(SHAPES)}")
    cls_name, kwargs = SHAPES[family]
    kwargs = {**kwargs, "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2}
    kwargs["pad_token_id"] = 2
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
    kwargs.update(overrides)
    return getattr(transformers, cls_name)(**kwargs)


def count_parameters(family: str, layers: int | None = None) -> int:
    """Parameters of the shape, counted on the meta device (nothing allocated)."""
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(make_config(family, layers))
    return sum(p.numel() for p in model.parameters())


def build(
    family: str,
    out: str | Path,
    *,
    layers: int | None = None,
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> dict[str, Any]:
    """Write the checkpoint to `out`; returns {"path", "parameters", "layer_types"}.

    `tokenizer_dir` None → the embedded default model's tokenizer (converted once)."""
    import transformers

    config = make_config(family, layers, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = 2
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root, safe_serialization=True)
    if tokenizer_dir is None:
        from radixkv.model import default_model_path

        tokenizer_dir = default_model_path()
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.exists():
            shutil.copy(src, root / name)
    params = sum(p.numel() for p in model.parameters())
    return {"path": str(root), "parameters": params, "layer_types": list(config.layer_types)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", choices=sorted(SHAPES), required=True)
    p.add_argument("--out", required=True, help="directory to write the checkpoint to")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args(argv)
    info = build(
        args.family,
        args.out,
        layers=args.layers,
        seed=args.seed,
        dtype=getattr(torch, args.dtype),
    )
    kinds = ", ".join(
        f"{t}x{info['layer_types'].count(t)}" for t in sorted(set(info["layer_types"]))
    )
    print(f"{info['path']}: {info['parameters'] / 1e6:.1f}M parameters ({kinds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
