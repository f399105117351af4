"""The gated DeltaNet's C++ kernel ("kernel", one fixed order per token) against the torch forms it
replaced ("torch": chunked matmuls for prompts, the einsum recurrence for decode steps) on a
Qwen3.5-shaped model with seeded random weights: 16 key and 16 value heads of dk = dv = 128,
hidden 1,024, layers linear x3 + full attention, MLP 3,072.

`python scripts/deltanet_bench.py [--dtype bfloat16|float32] [--prompt 1024] [--reps 3]`
Per rep, kernel and torch alternate (which goes first alternates too): a prefill of the whole
prompt in one forward, then `--decodes` single-token decode steps. Prints the median wall ms of
the prefill and of a decode step, and the share of it spent in the DeltaNet rule (`_rule`)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from radixkv.model import default_model_path, load_model
from radixkv.model.families.qwen3_5 import GatedDeltaNet
from radixkv.model.hybrid_simple import Session

CONFIG: dict[str, Any] = dict(
    vocab_size=49152,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=8192,
    initializer_range=0.02,
    tie_word_embeddings=False,
)


def checkpoint(out: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3_5TextConfig(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = Path(default_model_path())  # the default model's tokenizer (vocab 49,152)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out / name)
    return out


class RuleClock:
    """Wall seconds spent in GatedDeltaNet._rule while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        real: Callable[..., torch.Tensor] = GatedDeltaNet._rule

        def timed(mod: GatedDeltaNet, *args: Any) -> torch.Tensor:
            t0 = time.perf_counter()
            try:
                return real(mod, *args)
            finally:
                self.seconds += time.perf_counter() - t0

        GatedDeltaNet._rule = timed  # type: ignore[method-assign,assignment]


def one(lm: Any, prompt: list[int], decodes: int, clock: RuleClock) -> tuple[float, ...]:
    """(prefill s, its rule s, decode step s, its rule s), decode figures per step."""
    sess = Session(lm, num_slots=len(prompt) + decodes + 8, num_states=2)
    seq = sess.new(prompt + [5] * decodes)
    clock.seconds = 0.0
    t0 = time.perf_counter()
    sess.step([(seq, len(prompt))], all_logits=False)
    pre, pre_rule = time.perf_counter() - t0, clock.seconds
    clock.seconds = 0.0
    t0 = time.perf_counter()
    for _ in range(decodes):
        sess.step([(seq, 1)], all_logits=False)
    dec = (time.perf_counter() - t0) / decodes
    return pre, pre_rule, dec, clock.seconds / decodes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decodes", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lm = load_model(checkpoint(Path(tmp)), "cpu", getattr(torch, args.dtype))
    prompt = torch.randint(3, 49152, (args.prompt,), generator=torch.Generator().manual_seed(1))
    toks = prompt.tolist()
    clock = RuleClock()
    res: dict[str, list[tuple[float, ...]]] = {"kernel": [], "torch": []}
    with torch.inference_mode():
        for rep in range(args.reps + 1):  # the first round warms up
            for mode in ("kernel", "torch") if rep % 2 else ("torch", "kernel"):
                os.environ["RADIXKV_DELTANET_KERNEL"] = "1" if mode == "kernel" else "0"
                r = one(lm, toks, args.decodes, clock)
                if rep:
                    res[mode].append(r)
    threads = torch.get_num_threads()
    print(f"{args.dtype}, prompt {args.prompt}, threads {threads}, reps {args.reps}")
    for mode, rows in res.items():
        pre, pre_rule, dec, dec_rule = (statistics.median(c) for c in zip(*rows, strict=True))
        print(
            f"{mode:6s} prefill {pre * 1e3:8.1f} ms (rule {pre_rule * 1e3:7.1f} ms, "
            f"{pre_rule / pre:4.0%})  decode step {dec * 1e3:6.2f} ms (rule {dec_rule * 1e3:5.2f}"
            f" ms, {dec_rule / dec:4.0%})"
        )


if __name__ == "__main__":
    main()
