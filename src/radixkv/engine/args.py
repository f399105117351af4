"""Command-line flags for engine settings (ecosystem-style names), shared by `radixkv serve`,
`radixkv generate` and the benchmarks. The flags are declared on the sections of the
configuration chain (radixkv.config); these two functions are the engine-side entry points."""

from __future__ import annotations

import argparse
from typing import Any

from radixkv.config import EngineConfig


def add_engine_args(
    parser: argparse.ArgumentParser, *, compile_default: bool = False, **defaults: Any
) -> argparse.ArgumentParser:
    """Add the model, cache and scheduler flags to `parser`, one argparse group per section;
    `compile_default` is the default of --compile/--no-compile (off unless a command asks;
    `radixkv serve` keeps it off) and `defaults` overrides other flag defaults by field name."""
    return EngineConfig.add_args(parser, compile=compile_default, **defaults)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the parsed flags describe (sections whose flags the parser lacks, e.g.
    the server's outside `serve`, keep their defaults)."""
    return EngineConfig.from_args(args)
