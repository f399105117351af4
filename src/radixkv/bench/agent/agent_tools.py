"""What an agent benchmark sends, generated and sized by the served model's tokenizer: a tool list
of OpenAI function tools (JSON-schema parameters, MCP-style names) of a given token budget, the
filler text of tool results and user turns, and the same tool list as plain system-prompt text for
models whose chat template cannot render `tools`.

Everything is seeded: the same seed and tokenizer give byte-identical requests, so two engines see
the same prompts. Token counts are those of the model's own tokenizer (`count`), not estimates.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

Count = Callable[[str], int]


def _bank(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_WORDS = _bank(
    "the a file path directory line range search pattern match result output command shell "
    "process exit code status error message request response header body query table row column "
    "value key index cache branch commit diff patch test suite case report summary issue comment "
    "review label user project repository module function class method argument parameter type "
    "string number list object field schema option flag default timeout limit offset page size "
    "token session context window memory buffer stream event log level warning trace span metric "
    "returns reads writes creates updates deletes lists finds runs builds checks validates parses "
    "formats sends fetches stores loads opens closes starts stops waits only when if each every "
    "all any no not with without from into over under before after between within across current "
    "new "
    "old first last next previous given optional required relative absolute recursive matching "
    "case-sensitive sorted unique maximum minimum number of lines bytes seconds items entries"
)
_SERVICES = (
    "fs",
    "git",
    "github",
    "shell",
    "web",
    "db",
    "jira",
    "slack",
    "docs",
    "k8s",
    "ci",
    "py",
)
_ACTIONS = _bank(
    "read_file write_file edit_file list_directory glob grep search_code run_command "
    "get_status create_branch commit_changes show_diff create_issue update_issue list_issues "
    "add_comment fetch_url search_web run_query describe_table send_message list_channels "
    "get_logs apply_manifest run_tests get_job_status lint_file format_file open_pull_request "
    "get_pull_request list_commits read_notebook execute_cell kill_process get_metrics"
)
_PARAMS = _bank(
    "path pattern query command cwd timeout_ms limit offset recursive include exclude branch "
    "message title body labels assignee state channel text url method headers sql database "
    "namespace name replicas dry_run encoding line_start line_end old_string new_string "
    "case_sensitive max_results sort_by format verbose job_id cell_id env"
)


def words(rng: random.Random, n: int) -> str:
    """`n` words of the bank, joined by spaces (about one token each)."""
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _sentence(rng: random.Random, n: int) -> str:
    text = words(rng, n)
    return text[:1].upper() + text[1:] + "."


def _param(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(("string", "string", "integer", "boolean", "enum", "array", "object"))
    desc = _sentence(rng, rng.randint(6, 18))
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(_WORDS, 4), "description": desc}
    if kind == "array":
        return {"type": "array", "items": {"type": "string"}, "description": desc}
    if kind == "object":
        props = {p: {"type": "string"} for p in rng.sample(_PARAMS, 2)}
        return {"type": "object", "properties": props, "description": desc}
    out: dict[str, Any] = {"type": kind, "description": desc}
    if kind == "integer":
        out["minimum"] = 0
    return out


def make_tool(rng: random.Random, name: str) -> dict[str, Any]:
    """One OpenAI function tool: a few sentences of description and 2-7 typed parameters."""
    names = rng.sample(_PARAMS, rng.randint(2, 7))
    params = {p: _param(rng) for p in names}
    required = names[: rng.randint(1, len(names))]
    desc = " ".join(_sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(2, 5)))
    schema = {"type": "object", "properties": params, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": desc, "parameters": schema},
    }


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The tool list as chat templates show it: one JSON object per line (`tool | tojson`)."""
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def tool_names(n: int) -> list[str]:
    """`n` distinct MCP-style names (`mcp__git__show_diff`), in a fixed order."""
    names = [f"mcp__{s}__{a}" for a in _ACTIONS for s in _SERVICES]
    if n > len(names):
        raise ValueError(f"at most {len(names)} tools")
    return random.Random(0).sample(names, n)


def tool_list(count: Count, budget: int, seed: int = 0) -> list[dict[str, Any]]:
    """Tools whose `tools_text` is `budget` tokens by `count` (at most, and within a few): whole
    tools are added while they fit, then the last one's description grows to fill the rest."""
    if budget < 64:
        raise ValueError(f"a tool list needs at least 64 tokens, got {budget}")
    rng = random.Random(seed)
    names = tool_names(len(_ACTIONS) * len(_SERVICES))
    tools: list[dict[str, Any]] = []
    est = 0  # per-tool counts (+1 per newline) estimate the whole; exact only near the budget
    while True:
        tool = make_tool(rng, names[len(tools)])
        est += count(tools_text([tool])) + 1
        if est > budget - 256 and count(tools_text([*tools, tool])) > budget:
            break
        tools.append(tool)
    if not tools:  # the first tool alone is too long: start from a bare one
        schema = {"type": "object", "properties": {"path": {"type": "string"}}}
        tools = [{"type": "function", "function": {"name": names[0], "parameters": schema}}]
    last = tools[-1]["function"]
    head = last.get("description", "")
    extra = words(rng, max(1, budget - count(tools_text(tools))) * 2).split()
    # k more words add about k tokens: the most that still fit.
    lo, hi = 0, len(extra)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        last["description"] = " ".join([head, *extra[:mid]]).strip()
        if count(tools_text(tools)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    last["description"] = " ".join([head, *extra[:lo]]).strip()
    return tools


_RESULT_KINDS = ("lines", "json", "log")


def filler(count: Count, n: int, rng: random.Random, kind: str | None = None) -> str:
    """Text of `n` tokens by `count` (within a few tokens) shaped like a tool result: numbered
    file lines, a JSON object, or log lines."""
    if n <= 0:
        return ""
    kind = kind or rng.choice(_RESULT_KINDS)
    parts: list[str] = []
    est = 0
    while est < n + n // 10 + 8:  # per-part counts (+1 per newline) estimate the whole
        i = len(parts) + 1
        if kind == "lines":
            part = f"{i:4d}  {words(rng, rng.randint(3, 10))}"
        elif kind == "json":
            part = f'"{rng.choice(_PARAMS)}_{i}": "{words(rng, rng.randint(2, 8))}",'
        else:
            part = f"[{rng.choice(('INFO', 'WARN', 'DEBUG'))}] {words(rng, rng.randint(4, 12))}"
        parts.append(part)
        est += count(part) + 1
    pieces = "\n".join(parts).split(" ")
    lo, hi = 0, len(pieces)  # the most space-separated pieces whose text fits in n tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(pieces[:mid])) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(pieces[:lo])


def system_with_tools(system: str, tools: list[dict[str, Any]]) -> str:
    """The tool list inside the system prompt as plain text (Hermes' wording), for a model whose
    chat template cannot render `tools`: the same tokens on every engine."""
    return (
        f"{system}\n\nYou may call one or more functions to assist with the user query. "
        "The function signatures are within <tools></tools> XML tags:\n<tools>\n"
        f"{tools_text(tools)}\n</tools>\n\nFor each function call, return a JSON object with the "
        "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
