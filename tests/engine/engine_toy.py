"""A tiny deterministic transformer + character tokenizer for engine tests.

The model writes each new token's K/V into the pool and attends ONLY over K/V gathered from the pool
by `context_slots`, so a wrong or reused slot changes the logits and the tests catch KV corruption.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field

import torch

from radixkv.engine.batch import ForwardBatch
from radixkv.memory.pool import KVPool, KVPoolConfig

ALPHABET = string.ascii_lowercase + string.digits + " ."
EOS = len(ALPHABET)
VOCAB = EOS + 1


@dataclass(frozen=True)
class ToyConfig:
    num_layers: int = 2
    num_kv_heads: int = 2
    head_dim: int = 8
    vocab_size: int = VOCAB
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = (EOS,)

    def pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig:
        return KVPoolConfig(
            self.num_layers, self.num_kv_heads, self.head_dim, num_slots, dtype, device
        )


class ToyDecoder:
    def push(self, token_id: int) -> str:
        return ALPHABET[token_id] if token_id < len(ALPHABET) else ""

    def flush(self) -> str:
        return ""


class ToyTokenizer:
    eos_token_ids = (EOS,)
    vocab_size = VOCAB

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ALPHABET.index(c) for c in text.lower() if c in ALPHABET]

    def decode(self, ids: list[int]) -> str:
        return "".join(ALPHABET[i] for i in ids if i < len(ALPHABET))

    def make_decoder(self) -> ToyDecoder:
        return ToyDecoder()


def _sinusoid(pos: torch.Tensor, dim: int) -> torch.Tensor:
    freqs = torch.exp(-math.log(1000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = pos.float()[:, None] * freqs[None, :]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class ToyModel:
    """Attention-only transformer; logits depend on every context token's pooled K/V."""

    def __init__(self, cfg: ToyConfig, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        d = cfg.num_kv_heads * cfg.head_dim
        self.d = d
        self.emb = torch.randn(cfg.vocab_size, d, generator=g)
        self.layers = [
            [torch.randn(d, d, generator=g) * (2.0 / math.sqrt(d)) for _ in range(4)]
            for _ in range(cfg.num_layers)
        ]
        self.out = torch.randn(d, cfg.vocab_size, generator=g)
        self.calls = 0

    def __call__(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        self.calls += 1
        h, dh = self.cfg.num_kv_heads, self.cfg.head_dim
        x = self.emb[batch.input_ids] + _sinusoid(batch.positions, self.d)
        for layer, (wq, wk, wv, wo) in enumerate(self.layers):
            q = (x @ wq).view(-1, h, dh)
            pool.write(layer, batch.out_slots, (x @ wk).view(-1, h, dh), (x @ wv).view(-1, h, dh))
            outs = []
            off = 0
            for r, n in enumerate(batch.extend_lens):
                ctx = batch.context_slots[r]
                k, v = pool.k[layer][ctx], pool.v[layer][ctx]  # [S, H, D]
                qr = q[off : off + n]  # [n, H, D]
                scores = torch.einsum("nhd,shd->hns", qr, k) / math.sqrt(dh)
                qpos = batch.positions[off : off + n]
                kpos = torch.arange(ctx.shape[0])
                scores = scores.masked_fill(kpos[None, None, :] > qpos[None, :, None], -1e9)
                outs.append(torch.einsum("hns,shd->nhd", scores.softmax(-1), v).reshape(n, -1))
                off += n
            x = x + torch.tanh(torch.cat(outs) @ wo)
        logits = x @ self.out
        if batch.return_all_logits:
            return logits
        last = torch.tensor(batch.extend_lens).cumsum(0) - 1
        return logits[last]


@dataclass
class ToyLM:
    config: ToyConfig = field(default_factory=ToyConfig)
    seed: int = 0
    tokenizer: ToyTokenizer = field(default_factory=ToyTokenizer)

    def __post_init__(self) -> None:
        self.model = ToyModel(self.config, self.seed)
