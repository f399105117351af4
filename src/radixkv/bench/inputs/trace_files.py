"""Where the public traces live (`data/traces/` in the repository) and how reports name paths.

`resolve_trace(name)` accepts, in this order: an existing path; a path relative to the traces
folder (`mooncake-fast25/synthetic_trace.jsonl`); or a short name from NAMED_TRACES (`mooncake`,
`mooncake-synthetic`, `claude-code`). The traces folder is `$RADIXKV_TRACES_DIR` if set, else
`data/traces` of the repository this package runs from (an editable install or a source
checkout), else `data/traces` under the working directory.

`display_path(path)` is how generated reports (replay JSON, bench results, docs/benchmarks.md)
name a file: relative to the repository when it lies inside it, so a report says
`data/traces/...` and never an absolute path of the machine that made it.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# src/radixkv/bench/inputs/trace_files.py -> the repository root (for a source checkout).
REPO_ROOT = Path(__file__).resolve().parents[4]

NAMED_TRACES: dict[str, str] = {
    "mooncake": "mooncake-fast25/conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake-fast25/synthetic_trace.jsonl",
    "claude-code": "kv-cache-tester-claude-code/claude_code_traces_710.tar.xz",
}
DEFAULT_REPLAY_TRACE = "mooncake"
DEFAULT_WORKLOAD_TRACE = "claude-code"


def traces_dir() -> Path:
    """The folder holding the shipped traces (see the module docstring for the search order)."""
    env = os.environ.get("RADIXKV_TRACES_DIR")
    if env:
        return Path(env)
    repo = REPO_ROOT / "data" / "traces"
    return repo if repo.is_dir() else Path.cwd() / "data" / "traces"


def resolve_trace(name: str | Path) -> Path:
    """The trace file or directory `name` refers to; FileNotFoundError (naming what was tried
    and the short names) if there is none."""
    given = Path(name)
    if given.exists():
        return given
    base = traces_dir()
    tried = [given, base / given]
    if not given.is_absolute():
        tried.append(REPO_ROOT / given)  # a report's repository-relative path, from anywhere
    for path in tried[1:]:
        if path.exists():
            return path
    named = NAMED_TRACES.get(str(name))
    if named is not None:
        if (base / named).exists():
            return base / named
        tried.append(base / named)
    raise FileNotFoundError(
        f"no trace {str(name)!r} (tried {', '.join(dict.fromkeys(map(display_path, tried)))}); "
        f"short names: {', '.join(NAMED_TRACES)}; the shipped traces are under "
        f"{display_path(base)}/"
    )


def display_path(path: str | Path) -> str:
    """`path` relative to the repository root (or the working directory) when inside it, with
    forward slashes; otherwise unchanged."""
    p = Path(path)
    absolute = p if p.is_absolute() else Path.cwd() / p
    for root in (REPO_ROOT, Path.cwd()):
        try:
            return absolute.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def display_args(argv: list[str]) -> list[str]:
    """Command-line arguments for reports: absolute paths inside the repository (alone or as
    `--flag=PATH`) become repository-relative."""

    def rel(arg: str) -> str:
        flag, eq, value = arg.partition("=")
        if eq and value.startswith("/"):
            return f"{flag}={display_path(value)}"
        return display_path(arg) if arg.startswith("/") else arg

    return [rel(a) for a in argv]


def display_command(argv: list[str]) -> str:
    """`display_args(argv)` as one shell command line."""
    return shlex.join(display_args(argv))
