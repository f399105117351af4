"""The `trace` workload: replay a public trace (via `radixkv.bench.inputs.traces`) against a server.

Scaling for small machines: with `length_scale = k`, a trace block of `block_size` tokens becomes
`max(1, block_size // k)` tokens and every input length becomes `ceil(input_length / k)` (at
least 1), so the prefix structure (which requests share how many blocks) is kept exactly while the
token counts shrink about k-fold. Outputs shrink the same way unless `output_len` fixes them.
Arrival offsets are the trace's, relative to its first request, multiplied by `time_scale`.
`max_prompt_len` truncates longer prompts (after scaling) to fit a model's context.

`tools_len = n` puts one shared tool list of n tokens in front of every request, as an agent
client sends its tools before the conversation (the Claude Code traces hash what follows the
client's prefix; this restores a prefix every session shares): the tokens of generated function
tools (`radixkv.bench.agent.agent_tools`) when the token source has a tokenizer, else seeded ids.

Each block id maps to a deterministic run of tokens drawn from the token source's pool with a
seeded 64-bit mix of (block id, position in block), so equal block ids give equal tokens and
distinct ids collide only by chance.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from radixkv.bench.inputs.tokens import TokenSource
from radixkv.bench.inputs.workloads import BenchRequest, Workload

_M64 = (1 << 64) - 1


def _mix(values: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64-style finaliser over uint64 (wrapping arithmetic is intended)."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64((0x9E3779B97F4A7C15 * (seed + 1)) & _M64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def block_tokens(
    block_ids: np.ndarray, block_len: int, length: int, tokens: TokenSource, seed: int
) -> list[int]:
    """`length` tokens for consecutive blocks `block_ids` of `block_len` tokens each."""
    pos = block_ids.astype(np.int64)[:, None] * block_len + np.arange(block_len, dtype=np.int64)
    flat = pos.ravel()[:length]
    idx = (_mix(flat, seed) % np.uint64(len(tokens.pool))).astype(np.int64)
    return [int(x) for x in tokens.pool[idx]]


def trace_workload(
    tokens: TokenSource,
    *,
    trace: str | None = None,
    time_scale: float = 1.0,
    length_scale: int = 1,
    max_requests: int | None = None,
    max_sessions: int | None = None,
    max_prompt_len: int | None = None,
    output_len: int | None = None,
    tools_len: int | None = None,
    seed: int = 0,
) -> Workload:
    """Requests of `trace` in arrival order (see the module doc for scaling)."""
    from radixkv.bench.inputs.trace_files import DEFAULT_WORKLOAD_TRACE, display_path, resolve_trace
    from radixkv.bench.inputs.traces import load_trace

    path = resolve_trace(trace or DEFAULT_WORKLOAD_TRACE)  # FileNotFoundError names the options
    if length_scale < 1 or time_scale < 0:
        raise ValueError("--length-scale must be >= 1 and --time-scale >= 0")
    loaded = load_trace(path, max_sessions=max_sessions)
    if max_requests is not None:
        loaded = loaded[:max_requests]
    t0 = loaded[0].arrival_s if loaded else 0.0
    prefix = tool_prefix(tokens, tools_len, seed) if tools_len else []
    reqs: list[BenchRequest] = []
    for i, tr in enumerate(loaded):
        block_len = max(1, tr.block_size // length_scale)
        ids = tr.hash_ids
        if tr.tail_id >= 0:
            ids = np.concatenate([ids, tr.tail_id + np.arange(tr.num_tail_blocks)])
        # Keep the number of blocks the input spans: a partial last block stays partial.
        full, rest = divmod(tr.input_length, tr.block_size)
        length = full * block_len + math.ceil(rest * block_len / tr.block_size)
        length = max(1, min(length, len(ids) * block_len))
        if max_prompt_len is not None:  # keeps the leading blocks, so the prefix structure
            length = max(1, min(length, max_prompt_len - len(prefix)))
        out = output_len if output_len is not None else max(1, -(-tr.output_length // length_scale))
        reqs.append(
            BenchRequest(
                index=i,
                prompt_ids=prefix + block_tokens(ids, block_len, length, tokens, seed),
                max_tokens=out,
                group=tr.session,
                arrival_s=(tr.arrival_s - t0) * time_scale,
            )
        )
    params: dict[str, Any] = dict(
        trace=display_path(path),  # repository-relative in every report
        time_scale=time_scale,
        length_scale=length_scale,
        max_requests=max_requests,
        max_sessions=max_sessions,
        max_prompt_len=max_prompt_len,
        output_len=output_len,
        tools_len=tools_len,
        block_size=loaded[0].block_size if loaded else 0,
    )
    return Workload(name="trace", requests=reqs, seed=seed, params=params)


def tool_prefix(tokens: TokenSource, n: int, seed: int) -> list[int]:
    """`n` token ids of a tool list: generated tools encoded by the source's tokenizer, or seeded
    ids from its pool when it has none."""
    if tokens.tokenizer is None:
        rng = np.random.default_rng([seed, 0x7001])
        return tokens.draw(rng, n)
    from radixkv.bench.agent.agent_tools import tool_list, tools_text

    def count(text: str) -> int:
        return len(tokens.encode(text))

    return tokens.encode(tools_text(tool_list(count, max(n, 64), seed)))[:n]
