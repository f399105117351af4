"""Seeded, reproducible serving workloads and their ideal token hit rate.

A workload is an ordered list of `BenchRequest`s. Every request carries its full prompt as token
ids (and, in text mode, the text that tokenizes to exactly those ids), its output budget, a group
id (shared-prefix group, conversation, tree, agent session or trace session), and optionally:

- `parent`: the index of a request that must have *finished* before this one is sent. Multi-turn,
  tree-of-thought and agent workloads are closed loop: turn k is only sent once turn k-1 answered.
- `arrival_s`: an arrival offset from the start of the run (trace replay).

Answers inside histories are SYNTHETIC: a later turn contains the fixed, seeded answer of the
requested output length that the generator chose for the earlier turn, not the text the server
actually returned. So every server sees byte-identical prompts (comparisons are apples to apples)
and the ideal hit rate is known before the run. A server that also caches its generated tokens
cannot hit on them here, which is exactly what the ideal hit rate (prompt-to-prompt reuse) counts.

The ideal token hit rate assumes an infinite cache and sequential execution in list order: each
request hits the longest common prefix it has with ANY earlier prompt (`ideal_hits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixkv.bench.inputs.tokens import TokenSource


@dataclass
class BenchRequest:
    """One request of a workload (see the module docstring for `parent` and `arrival_s`)."""

    index: int
    prompt_ids: list[int]
    max_tokens: int
    group: str
    parent: int | None = None
    arrival_s: float | None = None
    prompt_text: str | None = None  # set in text mode; tokenizes to `prompt_ids`


@dataclass
class Workload:
    name: str
    requests: list[BenchRequest]
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt_ids) for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    def ideal_hit_rate(self) -> float:
        return ideal_hit_rate([r.prompt_ids for r in self.requests])

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "params": dict(self.params),
            "num_requests": len(self.requests),
            "prompt_tokens": self.prompt_tokens,
            "max_output_tokens": self.output_tokens,
            "ideal_hit_rate": self.ideal_hit_rate(),
        }


# ---------------------------------------------------------------------------- ideal hit rate


def _lcp(edge: Sequence[int], seq: Sequence[int], start: int) -> int:
    """Length of the common prefix of `edge` and `seq[start:]` (binary search on C-speed slices)."""
    n = min(len(edge), len(seq) - start)
    if list(edge[:n]) == list(seq[start : start + n]):
        return n
    lo, hi = 0, n  # invariant: prefix of length lo matches, of length hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(edge[:mid]) == list(seq[start : start + mid]):
            lo = mid
        else:
            hi = mid
    return lo


class _PrefixTrie:
    """A compressed trie of token sequences: node = {first token: [edge tokens, child node]}."""

    def __init__(self) -> None:
        self.root: dict[int, list[Any]] = {}

    def match_then_insert(self, seq: Sequence[int]) -> int:
        """Return the longest prefix of `seq` already present, then add `seq`."""
        node, i = self.root, 0
        while i < len(seq):
            entry = node.get(seq[i])
            if entry is None:
                node[seq[i]] = [list(seq[i:]), {}]
                return i
            edge, child = entry
            k = _lcp(edge, seq, i)
            if k < len(edge):  # split: the entry keeps edge[:k], a new node holds the rest
                tail = {edge[k]: [edge[k:], child]}
                entry[0], entry[1] = edge[:k], tail
                if i + k < len(seq):
                    tail[seq[i + k]] = [list(seq[i + k :]), {}]
                return i + k
            i += k
            node = child
        return i


def ideal_hits(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Per prompt, its longest common prefix with any earlier prompt (infinite cache, in order)."""
    trie = _PrefixTrie()
    return [trie.match_then_insert(p) for p in prompts]


def ideal_hit_rate(prompts: Sequence[Sequence[int]]) -> float:
    total = sum(len(p) for p in prompts)
    return sum(ideal_hits(prompts)) / total if total else 0.0


# ---------------------------------------------------------------------------- generators


def _finish(name: str, reqs: list[BenchRequest], seed: int, params: dict[str, Any]) -> Workload:
    for i, r in enumerate(reqs):
        if r.index != i:
            raise AssertionError("request indices must equal list positions")
    return Workload(name=name, requests=reqs, seed=seed, params=params)


def shared_prefix(
    tokens: TokenSource,
    *,
    num_groups: int = 64,
    prompts_per_group: int = 16,
    system_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
    shuffle: bool = True,
    seed: int = 0,
) -> Workload:
    """G groups × P prompts: each prompt = its group's S-token system prompt + a Q-token question.

    With `shuffle` (default) the G·P prompts are sent in a seeded random order, as real traffic
    interleaves groups; otherwise group by group.
    """
    rng = np.random.default_rng(seed)
    items: list[tuple[int, list[int]]] = []
    for g in range(num_groups):
        system = tokens.draw(rng, system_len)
        for _ in range(prompts_per_group):
            items.append((g, system + tokens.draw(rng, question_len)))
    order = rng.permutation(len(items)) if shuffle else np.arange(len(items))
    reqs = [
        BenchRequest(
            index=i, prompt_ids=items[j][1], max_tokens=output_len, group=f"g{items[j][0]}"
        )
        for i, j in enumerate(order.tolist())
    ]
    params = dict(
        num_groups=num_groups,
        prompts_per_group=prompts_per_group,
        system_len=system_len,
        question_len=question_len,
        output_len=output_len,
        shuffle=shuffle,
    )
    return _finish("shared-prefix", reqs, seed, params)


def multi_turn(
    tokens: TokenSource,
    *,
    num_conversations: int = 16,
    num_turns: int = 8,
    system_len: int = 0,
    question_len: int = 128,
    output_len: int = 128,
    seed: int = 0,
) -> Workload:
    """C conversations × T turns; turn t = turn t-1's prompt + synthetic answer + a new question.

    Requests are listed turn by turn (all first turns, then all second turns...); each turn after
    the first has `parent` = the previous turn, so it is sent only once that one has finished.
    """
    rng = np.random.default_rng(seed)
    reqs: list[BenchRequest] = []
    history: list[list[int]] = [tokens.draw(rng, system_len) for _ in range(num_conversations)]
    last: list[int | None] = [None] * num_conversations
    for _t in range(num_turns):
        for c in range(num_conversations):
            prompt = history[c] + tokens.draw(rng, question_len)
            idx = len(reqs)
            reqs.append(BenchRequest(idx, prompt, output_len, f"c{c}", parent=last[c]))
            history[c] = prompt + tokens.draw(rng, output_len)  # the synthetic answer
            last[c] = idx
    params = dict(
        num_conversations=num_conversations,
        num_turns=num_turns,
        system_len=system_len,
        question_len=question_len,
        output_len=output_len,
    )
    return _finish("multi-turn", reqs, seed, params)


def tree_of_thought(
    tokens: TokenSource,
    *,
    num_trees: int = 4,
    root_len: int = 1024,
    branches: int = 3,
    depth: int = 3,
    question_len: int = 64,
    output_len: int = 64,
    seed: int = 0,
) -> Workload:
    """Trees of depth D, B branches per node: a child = parent prompt + parent's answer + thought.

    A tree has sum(B^d, d = 0..D) nodes; the root prompt is R tokens. Nodes are listed breadth first
    across all trees; each child has `parent` = its parent node.
    """
    rng = np.random.default_rng(seed)
    reqs: list[BenchRequest] = []
    # frontier entries: (tree, node request index, its prompt + synthetic answer)
    frontier: list[tuple[int, int, list[int]]] = []
    for t in range(num_trees):
        prompt = tokens.draw(rng, root_len)
        reqs.append(BenchRequest(len(reqs), prompt, output_len, f"t{t}"))
        frontier.append((t, len(reqs) - 1, prompt + tokens.draw(rng, output_len)))
    for _d in range(depth):
        nxt: list[tuple[int, int, list[int]]] = []
        for t, parent, context in frontier:
            for _b in range(branches):
                prompt = context + tokens.draw(rng, question_len)
                reqs.append(BenchRequest(len(reqs), prompt, output_len, f"t{t}", parent=parent))
                nxt.append((t, len(reqs) - 1, prompt + tokens.draw(rng, output_len)))
        frontier = nxt
    params = dict(
        num_trees=num_trees,
        root_len=root_len,
        branches=branches,
        depth=depth,
        question_len=question_len,
        output_len=output_len,
    )
    return _finish("tree-of-thought", reqs, seed, params)


def agent(
    tokens: TokenSource,
    *,
    num_sessions: int = 8,
    num_steps: int = 8,
    tools_len: int = 1024,
    system_len: int = 512,
    question_len: int = 128,
    observation_len: int = 256,
    output_len: int = 64,
    seed: int = 0,
) -> Workload:
    """Agent loops: a fixed tool list + system prompt shared by all sessions, then per session a
    task and K steps; step k = step k-1's prompt + its synthetic thought/action + a new observation.

    Listed step by step across sessions; step k has `parent` = step k-1 of the same session.
    """
    rng = np.random.default_rng(seed)
    preamble = tokens.draw(rng, tools_len) + tokens.draw(rng, system_len)
    reqs: list[BenchRequest] = []
    context = [preamble + tokens.draw(rng, question_len) for _ in range(num_sessions)]
    last: list[int | None] = [None] * num_sessions
    for step in range(num_steps):
        for s in range(num_sessions):
            prompt = context[s] if step == 0 else context[s] + tokens.draw(rng, observation_len)
            idx = len(reqs)
            reqs.append(BenchRequest(idx, prompt, output_len, f"a{s}", parent=last[s]))
            context[s] = prompt + tokens.draw(rng, output_len)  # the synthetic thought/action
            last[s] = idx
    params = dict(
        num_sessions=num_sessions,
        num_steps=num_steps,
        tools_len=tools_len,
        system_len=system_len,
        question_len=question_len,
        observation_len=observation_len,
        output_len=output_len,
    )
    return _finish("agent", reqs, seed, params)
