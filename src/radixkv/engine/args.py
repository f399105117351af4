"""Command-line flags for engine settings (ecosystem-style names), shared by `radixkv serve`,
`radixkv generate` and the benchmarks. Each flag maps 1:1 onto an EngineConfig field."""

from __future__ import annotations

import argparse

from radixkv.cache.policy import available_policies
from radixkv.engine.types import EngineConfig

_D = EngineConfig()


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the engine flags to `parser` (in an "engine" argument group)."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="HF checkpoint dir (default: embedded SmolLM2)")
    g.add_argument("--page-size", type=int, default=_D.page_size, help="tokens per KV page")
    g.add_argument(
        "--eviction-policy",
        default=_D.eviction_policy,
        choices=available_policies(),
        help="order in which unlocked cached prefixes are evicted (session-*: requests with a "
        "session_id keep their prefix ahead of the base policy until the session closes)",
    )
    g.add_argument(
        "--schedule-policy",
        default=_D.schedule_policy,
        choices=["lpm", "fcfs"],
        help="lpm: longest cached prefix first; fcfs: arrival order",
    )
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=_D.chunked_prefill_size,
        help="max new prompt tokens per step",
    )
    g.add_argument("--max-running-requests", type=int, default=_D.max_running_requests)
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=_D.max_queued_requests,
        help="waiting-queue bound; past it new requests are refused (503)",
    )
    g.add_argument("--disable-radix-cache", action="store_true", help="no prefix caching")
    g.add_argument(
        "--cache",
        default=_D.cache,
        choices=["radix", "blockhash"],
        help="prefix-cache design (blockhash: the vLLM-style peer, for comparison)",
    )
    g.add_argument("--num-slots", type=int, default=None, help="KV pool size in tokens")
    g.add_argument(
        "--kv-cache-mb",
        type=float,
        default=_D.kv_cache_bytes / 2**20,
        help="KV pool budget in MiB (ignored when --num-slots is given)",
    )
    g.add_argument("--max-model-len", type=int, default=None, help="max prompt + output tokens")
    g.add_argument("--device", default=_D.device, help="auto | cpu | cuda[:N]")
    g.add_argument("--dtype", default=_D.dtype, help="auto | float32 | bfloat16 | float16")
    g.add_argument("--seed", type=int, default=_D.seed, help="seed for unseeded sampling")
    g.add_argument("--swa-slots", type=int, default=None, help="hybrid: SWA KV pool in tokens")
    g.add_argument("--state-slots", type=int, default=None, help="hybrid: STATE pool slots")
    g.add_argument(
        "--state-checkpoint-interval",
        type=int,
        default=_D.state_checkpoint_interval,
        help="hybrid: prefill tokens between recurrent-state checkpoints (page-aligned)",
    )
    g.add_argument(
        "--regret-window",
        type=int,
        default=_D.regret_window,
        help="recent requests over which the live hit rate is compared with Belady's (0: off)",
    )
    g.add_argument(
        "--max-n", type=int, default=_D.max_n, help="max choices (n) per request; beyond it a 400"
    )
    _add_tier_args(parser)
    return parser


def _add_tier_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("hierarchical cache (host L2, storage L3)")
    g.add_argument(
        "--enable-hierarchical-cache", action="store_true", help="keep evicted prefixes in host RAM"
    )
    g.add_argument("--hicache-size", type=float, default=None, help="L2 MiB (default 2x device)")
    g.add_argument(
        "--hicache-write-policy",
        default=_D.hicache_write_policy,
        choices=["write_through", "write_through_selective", "write_back"],
        help="when pages are copied to L2: on insert, on the second hit, or on L1 eviction",
    )
    g.add_argument("--hicache-storage-backend", default=None, choices=["file", "redis"])
    g.add_argument(
        "--hicache-storage-url", default=None, help="directory (file) or redis://host:port[/db]"
    )
    g.add_argument(
        "--hicache-storage-prefetch-policy",
        default=_D.hicache_storage_prefetch_policy,
        choices=["best_effort", "wait_complete", "timeout"],
        help="how long a request waits for its L3 pages before recomputing the rest",
    )
    g.add_argument(
        "--hicache-prefetch-timeout",
        type=float,
        default=_D.hicache_prefetch_timeout_s,
        help="seconds a request waits for L3 under the timeout policy",
    )
    g.add_argument(
        "--hicache-storage-timeout",
        type=float,
        default=_D.hicache_storage_timeout_s,
        help="timeout of every storage call, seconds",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags added by `add_engine_args` describe."""
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        page_size=args.page_size,
        eviction_policy=args.eviction_policy,
        schedule_policy=args.schedule_policy,
        cache=args.cache,
        disable_radix_cache=args.disable_radix_cache,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        max_queued_requests=args.max_queued_requests,
        num_slots=args.num_slots,
        kv_cache_bytes=int(args.kv_cache_mb * 2**20),
        max_model_len=args.max_model_len,
        seed=args.seed,
        swa_num_slots=getattr(args, "swa_slots", None),
        state_num_slots=getattr(args, "state_slots", None),
        state_checkpoint_interval=getattr(
            args, "state_checkpoint_interval", _D.state_checkpoint_interval
        ),
        regret_window=args.regret_window,
        max_n=args.max_n,
        enable_hierarchical_cache=args.enable_hierarchical_cache,
        hicache_size=args.hicache_size,
        hicache_write_policy=args.hicache_write_policy,
        hicache_storage_backend=args.hicache_storage_backend,
        hicache_storage_url=args.hicache_storage_url,
        hicache_storage_prefetch_policy=args.hicache_storage_prefetch_policy,
        hicache_prefetch_timeout_s=args.hicache_prefetch_timeout,
        hicache_storage_timeout_s=args.hicache_storage_timeout,
    )
