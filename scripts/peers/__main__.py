"""`python -m scripts.peers ...` from a checkout: the head-to-head against vLLM (was `radixkv
bench peers`; docs/vllm.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scripts.peers import run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.peers")
    sub = parser.add_subparsers(dest="command", required=True)
    run.register(sub)
    # One command: `python -m scripts.peers --vllm-python PY` runs it.
    args = parser.parse_args(["peers", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
