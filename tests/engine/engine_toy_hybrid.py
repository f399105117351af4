"""A tiny deterministic hybrid model (FULL + SWA + STATE layers) for engine tests.

Every layer reads only what the engine hands it, so a wrong slot, a freed SWA slot inside a
window, or a wrong / stale state changes the logits (or raises):
- FULL layers attend over `context_slots` in the FULL pool;
- SWA layers (window W) attend over the last W positions of `window_context_slots(SWA)` in the
  SWA pool and raise if any slot they must read is -1 (freed);
- STATE layers run h <- 0.8 h + tanh(x Wa) token by token from the state in slot
  `states(STATE)[r]` (zeros when the request starts at 0) and write it back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from engine_toy import EOS, VOCAB, ToyTokenizer, _sinusoid

from radixkv.engine.batch import ForwardBatch
from radixkv.memory.hybrid import (
    FULL,
    STATE,
    SWA,
    KVGroupSpec,
    LayerGroupSpec,
    ModelPools,
    PoolSpec,
    StateGroupSpec,
)
from radixkv.memory.state_pool import StateLayerSpec, StateTensorSpec


@dataclass(frozen=True)
class ToyHybridConfig:
    kinds: tuple[str, ...] = ("full", "swa", "state", "swa")
    window: int = 8
    num_kv_heads: int = 2
    head_dim: int = 8
    vocab_size: int = VOCAB
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = (EOS,)

    @property
    def d(self) -> int:
        return self.num_kv_heads * self.head_dim

    def pool_spec(self) -> PoolSpec:
        state = StateLayerSpec((StateTensorSpec("h", (self.d,)),))
        groups: dict[str, LayerGroupSpec] = {}
        for kind, window in ((FULL, None), (SWA, self.window)):
            if n := self.kinds.count(kind):
                groups[kind] = KVGroupSpec(n, self.num_kv_heads, self.head_dim, window)
        if n := self.kinds.count(STATE):
            groups[STATE] = StateGroupSpec((state,) * n)
        return PoolSpec(groups)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("nhd,shd->hns", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask[None], -1e9)
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


class ToyHybridModel:
    def __init__(self, cfg: ToyHybridConfig, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        d = cfg.d
        self.cfg = cfg
        self.emb = torch.randn(cfg.vocab_size, d, generator=g)
        self.w = [
            [torch.randn(d, d, generator=g) * (2.0 / math.sqrt(d)) for _ in range(4)]
            for _ in cfg.kinds
        ]
        self.out = torch.randn(d, cfg.vocab_size, generator=g)
        self.calls = 0

    def __call__(self, batch: ForwardBatch, pools: ModelPools) -> torch.Tensor:
        self.calls += 1
        x = self.emb[batch.input_ids] + _sinusoid(batch.positions, self.cfg.d)
        idx = {"full": 0, "swa": 0, "state": 0}
        for layer, kind in enumerate(self.cfg.kinds):
            j = idx[kind]
            idx[kind] += 1
            if kind == "state":
                x = self._state(x, batch, pools, j, self.w[layer])
            else:
                x = x + torch.tanh(self._attn(x, batch, pools, kind, j, self.w[layer]))
        logits = x @ self.out
        if batch.return_all_logits:
            return logits
        return logits[torch.tensor(batch.extend_lens).cumsum(0) - 1]

    def _attn(
        self, x: torch.Tensor, b: ForwardBatch, pools: ModelPools, kind: str, j: int, w: list
    ) -> torch.Tensor:
        h, dh, win = self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.window
        wq, wk, wv, wo = w
        pool = pools.kv(kind)
        own = b.window(kind)
        ctxs = b.context_slots if kind == "full" else b.window_context_slots(kind)
        out_slots = b.out_slots if kind == "full" else None if own is None else own.out_slots
        if pool is None or ctxs is None or out_slots is None:
            raise ValueError(f"{kind} layer without its pool or slots")
        q = (x @ wq).view(-1, h, dh)
        pool.write(j, out_slots, (x @ wk).view(-1, h, dh), (x @ wv).view(-1, h, dh))
        outs, off = [], 0
        for r, n in enumerate(b.extend_lens):
            ctx = ctxs[r]
            qpos = b.positions[off : off + n]
            lo = 0 if kind == "full" else max(0, int(qpos[0]) - win + 1)
            slots = ctx[lo:]
            if bool((slots < 0).any()):
                raise RuntimeError(f"{kind} layer would read a freed slot (positions >= {lo})")
            kpos = torch.arange(lo, ctx.shape[0])
            mask = kpos[None, :] > qpos[:, None]
            if kind == "swa":
                mask |= kpos[None, :] <= qpos[:, None] - win
            outs.append(_attend(q[off : off + n], pool.k[j][slots], pool.v[j][slots], mask))
            off += n
        return torch.cat(outs) @ wo

    def _state(
        self, x: torch.Tensor, b: ForwardBatch, pools: ModelPools, j: int, w: list
    ) -> torch.Tensor:
        state = pools.state()
        state_slots = b.states(STATE)
        if state is None or state_slots is None:
            raise ValueError("state layer without its pool or slots")
        wa, wo = w[0], w[1]
        store = state.tensors[j]["h"]
        rows, off = [], 0
        for r, n in enumerate(b.extend_lens):
            slot = state_slots[r]
            prefix = b.seq_lens[r] - n
            h = torch.zeros(self.cfg.d) if prefix == 0 else store[slot].clone()
            for i in range(off, off + n):
                h = 0.8 * h + torch.tanh(x[i] @ wa)
                rows.append(x[i] + torch.tanh(h @ wo))
            store[slot] = h
            off += n
        return torch.stack(rows)


@dataclass
class ToyHybridLM:
    config: ToyHybridConfig = field(default_factory=ToyHybridConfig)
    seed: int = 0
    tokenizer: ToyTokenizer = field(default_factory=ToyTokenizer)

    def __post_init__(self) -> None:
        self.model = ToyHybridModel(self.config, self.seed)


def reference_greedy_hybrid(lm: ToyHybridLM, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding by full recomputation on fresh pools each token (no cache, no reuse)."""
    tokens = list(prompt)
    out: list[int] = []
    spec = lm.config.pool_spec()
    for _ in range(max_tokens):
        n = len(tokens)
        pools = spec.make_pools({FULL: n, SWA: n, STATE: 1})
        slots = torch.arange(n, dtype=torch.int64)
        batch = ForwardBatch.from_contexts(
            tokens,
            [slots],
            [n],
            kind_slots={
                **({SWA: [slots]} if SWA in spec else {}),
                **({STATE: [0]} if STATE in spec else {}),
            },
        )
        with torch.inference_mode():
            tok = int(lm.model(batch, pools)[0].argmax())
        out.append(tok)
        tokens.append(tok)
    return out
