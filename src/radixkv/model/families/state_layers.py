"""Per-request working states of STATE layers (recurrent / convolution) over the StatePool.

A forward groups its requests once (`StateMeta`): one-token requests that continue an existing
state run together (gather their slots, one batched update, scatter back); every other request
(a prompt or a multi-token chunk) is a run over its token rows. The convolutions of all runs go
through one batched conv (`conv_runs`, bit-identical to one run at a time); the gated DeltaNet's
C++ kernel takes every run and decode row in one call (`StateMeta.kernel_runs`). A request with
prefix 0 starts from zeros whatever its slot holds (the engine need not clear working slots).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixkv.memory.hybrid import STATE, ModelPools
from radixkv.memory.state_pool import StatePool
from radixkv.model.batch import ForwardBatch
from radixkv.model.families.skeleton import DecoderLM, Rope
from radixkv.model.nn.layers import rope_cos_sin, rope_inv_freq


@dataclass
class StateRun:
    """One request run on its own: token rows [start, end), its working slot, fresh = prefix 0."""

    start: int
    end: int
    slot: int
    fresh: bool


@dataclass
class StateMeta:
    runs: list[StateRun]
    decode_rows: torch.Tensor | None  # [Rd] token rows of the batched one-token continuations
    decode_slots: torch.Tensor | None  # [Rd] their working slots
    _packed: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)

    def kernel_runs(self) -> tuple[torch.Tensor, ...]:
        """(starts, lens, slots, fresh) [R] int64 of every run, then every decode row as a run
        of one token: the form the DeltaNet kernel takes (built once per forward)."""
        if self._packed is None:
            cols = [[r.start, r.end - r.start, r.slot, int(r.fresh)] for r in self.runs]
            packed = torch.tensor(cols, dtype=torch.int64).reshape(-1, 4).t()
            if self.decode_rows is not None and self.decode_slots is not None:
                rows, slots = self.decode_rows.cpu(), self.decode_slots.cpu()
                ones, zeros = torch.ones_like(rows), torch.zeros_like(rows)
                packed = torch.cat([packed, torch.stack([rows, ones, slots, zeros])], dim=1)
            self._packed = tuple(packed.contiguous())
        return self._packed

    @classmethod
    def build(cls, batch: ForwardBatch, pool: StatePool | None, device: torch.device) -> StateMeta:
        if pool is None:
            raise ValueError("this model has state layers: a STATE pool is required")
        state_slots = batch.states(STATE)
        if state_slots is None or len(state_slots) != batch.num_requests:
            raise ValueError("this model has state layers: the batch needs one state slot/request")
        if len(set(state_slots)) != len(state_slots):
            raise ValueError("two requests of one batch share a working state slot")
        runs: list[StateRun] = []
        rows, slots = [], []
        start = 0
        for e, p, slot in zip(batch.extend_lens, batch.prefix_lens, state_slots, strict=True):
            if not 0 <= slot < pool.num_slots:
                raise ValueError(f"state slot {slot} out of range")
            if e == 1 and p > 0:
                rows.append(start)
                slots.append(slot)
            elif e > 0:
                runs.append(StateRun(start, start + e, slot, p == 0))
            start += e
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        return cls(runs, as_t(rows) if rows else None, as_t(slots) if slots else None)


def read_state(t: torch.Tensor, run: StateRun) -> torch.Tensor:
    """The state a run starts from: the slot's content, or zeros for a fresh sequence."""
    return torch.zeros_like(t[run.slot]) if run.fresh else t[run.slot]


def conv_taps(full: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Depthwise conv without padding: full [..., C, K-1+t], weight [C, K] → [..., C, t] in
    full's dtype. Each output is one float32 chain over the K taps in order (then + bias, one
    rounding), element-wise, so a token's result is the same bits in a prompt, a chunk of any
    size or a decode step, whatever else is in the batch."""
    k = weight.shape[1]
    t = full.shape[-1] - k + 1
    wf = weight.float()
    acc = full[..., 0:t].float() * wf[:, 0:1]
    for j in range(1, k):
        acc = acc + full[..., j : j + t].float() * wf[:, j : j + 1]
    if bias is not None:
        acc = acc + bias.float()[:, None]
    return acc.to(full.dtype)


def conv_extend(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv over new inputs x [t, C] after the last K-1 inputs `state`
    [C, K-1] (zeros before the first token); returns (out [t, C], new state [C, K-1])."""
    full = torch.cat([state.to(x.dtype), x.t()], dim=-1)  # [C, K-1+t]
    return conv_taps(full, weight, bias).t(), full[:, full.shape[1] - state.shape[1] :]


def conv_decode(
    x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One new input per sequence: x [R, C], states [R, C, K-1] → (out [R, C], new [R, C, K-1])."""
    full = torch.cat([states.to(x.dtype), x[:, :, None]], dim=-1)  # [R, C, K]
    return conv_taps(full, weight, bias)[:, :, 0], full[:, :, 1:]


def conv_runs(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    runs: list[StateRun],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """`conv_extend` of several multi-token runs in one batched conv: each run's K-1 state
    inputs and new inputs, right-padded with zeros to the longest run, go through one
    `conv_taps` ([R, C, K-1+T]); outputs past a run's length are dropped. Every output is the
    same element-wise float32 chain as run alone, so the bits equal the one-run-at-a-time path."""
    k1 = conv_state.shape[-1]
    longest = max(r.end - r.start for r in runs)
    full = x.new_zeros((len(runs), x.shape[1], k1 + longest))
    for i, run in enumerate(runs):
        full[i, :, :k1] = read_state(conv_state, run).to(x.dtype)
        full[i, :, k1 : k1 + run.end - run.start] = x[run.start : run.end].t()
    y = conv_taps(full, weight, bias)  # [R, C, longest]
    for i, run in enumerate(runs):
        t = run.end - run.start
        out[run.start : run.end] = y[i, :, :t].t()
        conv_state[run.slot] = full[i, :, t : t + k1]


def causal_conv(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    meta: StateMeta,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Depthwise causal conv of every request's new rows of x [T, C], continuing (and updating in
    place) each request's conv state in `conv_state` ([slots, C, K-1], one state layer)."""
    out = torch.empty_like(x)
    if len(meta.runs) == 1:
        run = meta.runs[0]
        y, new = conv_extend(x[run.start : run.end], read_state(conv_state, run), weight, bias)
        out[run.start : run.end] = y
        conv_state[run.slot] = new
    elif meta.runs:
        conv_runs(x, conv_state, meta.runs, weight, bias, out)
    if meta.decode_rows is not None and meta.decode_slots is not None:
        y, new = conv_decode(
            x.index_select(0, meta.decode_rows),
            conv_state.index_select(0, meta.decode_slots),
            weight,
            bias,
        )
        out.index_copy_(0, meta.decode_rows, y)
        conv_state.index_copy_(0, meta.decode_slots, new.to(conv_state.dtype))
    return out


@dataclass(frozen=True)
class RopeState(Rope):
    """One RoPE table for every attention layer, and the state layers' per-request grouping
    (None for a model without state layers)."""

    state: StateMeta | None

    def meta(self) -> StateMeta:
        assert self.state is not None
        return self.state


class RopeStateLM(DecoderLM[RopeState]):
    """A model whose attention layers share one RoPE table and whose state layers read the
    per-request state metadata (Qwen3.5, Qwen3-Next, LFM2): both built once per forward."""

    def init_rope(self, rotary_dim: int, theta: float, device: str) -> None:
        self.inv_freq: torch.Tensor
        inv = rope_inv_freq(rotary_dim, theta, None).to(device)
        self.register_buffer("inv_freq", inv, persistent=False)

    def prepare(self, batch: ForwardBatch, pools: ModelPools | None) -> RopeState:
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, self.dtype)
        state = None
        if STATE in self.pool_spec:
            state = StateMeta.build(batch, None if pools is None else pools.state(), self.device)
        return RopeState(cos, sin, state)
