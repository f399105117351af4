"""The sections of the configuration chain: model, cache, scheduler, server.

Each field is declared once with `opt` (default, flag, help, checks); see radixkv.config.fields.
Field names are the keyword names `Engine(**overrides)` and `EngineConfig(**flat)` accept, except
two whose flat names are kept from the flat config: `model` (ModelConfig.path) and `cache`
(CacheConfig.kind); see radixkv.config.chain.FLAT_ALIASES.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from radixkv.config.fields import Section, opt
from radixkv.config.kv_events import parse_kv_events_config

# Names resolve_dtype understands (radixkv.engine.setup maps them to torch dtypes).
DTYPE_NAMES = ("auto", "float32", "fp32", "float", "float16", "fp16", "half", "bfloat16", "bf16")
CACHE_KINDS = ("radix", "blockhash")
SCHEDULE_POLICIES = ("lpm", "fcfs")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
PREFETCH_POLICIES = ("cost_aware", "best_effort", "wait_complete", "timeout")
STORAGE_BACKENDS = ("file", "redis", "mooncake")
_MOONCAKE_ENV = ("MOONCAKE_MASTER", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH")
LOG_LEVELS = ("debug", "info", "warning", "error")
_DEVICE = re.compile(r"auto|cpu|mps|xpu|cuda(:\d+)?")
_TIERS = "hierarchical cache (host L2, storage L3)"


def eviction_policy_names() -> list[str]:
    """Registered policies, plus session-aware forms of the base ones (`session-<base>`) that
    exist: a base that owns its queue of leaves (s3fifo, predict, density) has none."""
    from radixkv.cache.policies import available_policies, owns_queue

    names = available_policies()
    bases = [n for n in names if not n.startswith("session-") and not owns_queue(n)]
    return names + [f"session-{b}" for b in bases if f"session-{b}" not in names]


@dataclass(frozen=True)
class ModelConfig(Section):
    """What runs: the checkpoint, and on which device in which dtype."""

    title = "model"

    path: str | None = opt(
        None,
        "HF checkpoint dir, or an embedded model's short name: gemma3-270m, smollm2-135m "
        "(default: the embedded SmolLM2-135M-Instruct)",
        flag="--model",
    )
    device: str = opt("auto", "auto (cuda when torch sees a GPU, else cpu) | cpu | cuda[:N]")
    dtype: str = opt(
        "auto",
        "weights and KV dtype (auto: bfloat16 on GPUs and on CPUs with native bf16, else float32)",
        choices=DTYPE_NAMES,
    )
    # Off by default everywhere (`radixkv serve` included: the compiled and eager models compute
    # the same bits equally fast, and eager starts sooner, see docs/determinism.md); a command
    # may give its flag another default (`add_engine_args(compile_default=...)`), none does.
    compile: bool = opt(
        False,
        "torch.compile the model (inductor; first start compiles, later starts reuse the "
        "on-disk cache under the RadixKV cache dir)",
        negatable=True,
    )
    cuda_graph_max_bs: int | None = opt(
        None,
        "decode as CUDA graphs captured per batch size up to N (buckets 1, 2, 4, 8, 16, 24, ...); "
        "0: eager decode. Default: 32 on CUDA with a backend that supports graphs (Triton); "
        "always off on CPU and for hybrid models",
        type=int,
        min=0,
    )

    def check(self) -> list[tuple[str, str]]:
        if not _DEVICE.fullmatch(self.device):
            return [("device", f"{self.device!r} is not auto, cpu, mps, xpu or cuda[:N]")]
        return []


@dataclass(frozen=True)
class CacheConfig(Section):
    """The KV pool, the prefix cache over it, its eviction, and the host/storage tiers."""

    title = "cache"

    kind: str = opt(
        "radix",
        "prefix-cache design (blockhash: the vLLM-style peer, for comparison)",
        flag="--cache",
        choices=CACHE_KINDS,
    )
    disable_radix_cache: bool = opt(False, "no prefix caching")
    page_size: int = opt(1, "tokens per KV page", min=1)
    eviction_policy: str = opt(
        "lru",
        "order in which unlocked cached prefixes are evicted (session-*: requests with a "
        "session_id keep their prefix ahead of the base policy until the session closes)",
        choices=eviction_policy_names,
    )
    num_slots: int | None = opt(
        None, "KV pool size in tokens (default: from --kv-cache-mb)", type=int, min=1
    )
    kv_cache_bytes: int = opt(
        512 * 2**20,
        "KV pool budget in MiB (ignored when --num-slots is given)",
        flag="--kv-cache-mb",
        unit=2**20,
        positive=True,
    )
    # Hybrid models (SWA / STATE components; ignored otherwise).
    swa_num_slots: int | None = opt(
        None,
        "hybrid: SWA KV pool in tokens (default: each running request's window + 2 pages, one "
        "prefill chunk, and the windows + a page of max(4, max-running/4) cached prefixes; at "
        "most the full pool, whose share of --kv-cache-mb grows by what SWA does not take)",
        flag="--swa-slots",
        type=int,
        min=1,
    )
    state_num_slots: int | None = opt(
        None,
        "hybrid: STATE pool slots (default: 2 per running request + 32)",
        flag="--state-slots",
        type=int,
        min=1,
    )
    state_checkpoint_interval: int = opt(
        256, "hybrid: prefill tokens between recurrent-state checkpoints (page-aligned)", min=1
    )
    regret_window: int = opt(
        2048,
        "recent requests over which the live hit rate is compared with Belady's (0: off)",
        min=0,
    )
    # Hierarchical cache (host L2, storage L3); names follow SGLang's HiCache flags.
    enable_hierarchical_cache: bool = opt(
        False, "keep evicted prefixes in host RAM (L2)", group=_TIERS
    )
    hicache_size: float | None = opt(
        None,
        "L2 size in MiB (default: 2x the device pool)",
        type=float,
        positive=True,
        group=_TIERS,
    )
    hicache_write_policy: str = opt(
        "write_through",
        "when pages are copied to L2: on insert, on the second hit, or on L1 eviction",
        choices=WRITE_POLICIES,
        group=_TIERS,
    )
    hicache_storage_backend: str | None = opt(
        None, "L3 storage (default: none)", choices=STORAGE_BACKENDS, group=_TIERS
    )
    hicache_storage_url: str | None = opt(
        None,
        "file: a directory; redis: redis://host:port[/db] or redis-cluster://host:port,...; "
        "mooncake: the master's host:port or a JSON config (default: MOONCAKE_* variables)",
        group=_TIERS,
    )
    hicache_storage_prefetch_policy: str = opt(
        "cost_aware",
        "whether a request waits for its L3 pages (never for what L1/L2 hold): cost_aware "
        "waits when loading is predicted cheaper than recomputing (measured fetch bandwidth vs "
        "measured prefill speed); best_effort never; wait_complete until fetched; timeout up "
        "to --hicache-prefetch-timeout",
        choices=PREFETCH_POLICIES,
        group=_TIERS,
    )
    hicache_prefetch_timeout_s: float = opt(
        2.0,
        "seconds a request waits for L3 at most under the timeout policy (and under cost_aware "
        "until the prefill speed is measured; then the predicted recompute time bounds it)",
        flag="--hicache-prefetch-timeout",
        positive=True,
        group=_TIERS,
    )
    hicache_storage_timeout_s: float = opt(
        1.0,
        "timeout of every storage call, seconds",
        flag="--hicache-storage-timeout",
        positive=True,
        group=_TIERS,
    )
    hicache_flush_timeout_s: float = opt(
        10.0,
        "at a clean shutdown, seconds pending L3 writes get",
        flag="--hicache-flush-timeout",
        min=0,
        group=_TIERS,
    )
    # KV cache events for routers (vLLM's wire format): radixkv.config.kv_events.
    kv_events_config: str | None = opt(
        None,
        "JSON, as vLLM's and SGLang's: publish cached/evicted blocks on ZMQ, e.g. "
        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}\' (docs/kv-events.md)',
    )

    @property
    def tiers_enabled(self) -> bool:
        return self.enable_hierarchical_cache or self.hicache_storage_backend is not None

    @property
    def prefix_cache_enabled(self) -> bool:
        return not self.disable_radix_cache

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.num_slots is not None and self.page_size >= 1 and self.num_slots < self.page_size:
            out.append(("num_slots", f"must hold at least one page ({self.page_size} tokens)"))
        if self.hicache_storage_backend not in (None, "mooncake") and not self.hicache_storage_url:
            out.append(
                (
                    "hicache_storage_url",
                    f"is needed with --hicache-storage-backend {self.hicache_storage_backend}",
                )
            )
        if (
            self.hicache_storage_backend == "mooncake"
            and not self.hicache_storage_url
            and not any(os.environ.get(v) for v in _MOONCAKE_ENV)
        ):
            out.append(
                (
                    "hicache_storage_url",
                    "is needed with --hicache-storage-backend mooncake (the master's host:port "
                    "or a JSON config) unless MOONCAKE_MASTER or "
                    "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH is set",
                )
            )
        if self.tiers_enabled and not self.prefix_cache_enabled:
            out.append(("disable_radix_cache", "the hierarchical cache needs the prefix cache"))
        if self.tiers_enabled and self.kind != "radix":
            out.append(("kind", "the hierarchical cache needs --cache radix"))
        try:
            parse_kv_events_config(self.kv_events_config, max(1, self.page_size))
        except ValueError as exc:
            out.append(("kv_events_config", str(exc)))
        return out


@dataclass(frozen=True)
class SchedulerConfig(Section):
    """Which requests run when, and the limits every request is held to."""

    title = "scheduler"

    schedule_policy: str = opt(
        "lpm",
        "lpm: longest cached prefix first; fcfs: arrival order",
        choices=SCHEDULE_POLICIES,
    )
    schedule_wait_budget_s: float = opt(
        1.0,
        "lpm: seconds of arrival order a cached prefix can buy; no request is passed by one "
        "that arrived more than this after it, so cold prompts are not starved (0: arrival "
        "order)",
        flag="--schedule-wait-budget",
        min=0,
    )
    chunked_prefill_size: int = opt(2048, "max new prompt tokens per step", min=1)
    decode_stall_ms: float = opt(
        500.0,
        "while requests decode, cap a step's prompt tokens at what the measured prefill rate "
        "computes in this many ms (at least 64 tokens), so a long prompt is spread over steps "
        "that each also advance every decoding stream; while none decodes, a step takes no "
        "further prompt once it holds that much (0: off, the whole budget)",
        min=0,
    )
    max_running_requests: int = opt(32, "requests decoded together", min=1)
    max_queued_requests: int = opt(
        256, "waiting-queue bound; past it new requests are refused (503)", min=0
    )
    max_model_len: int | None = opt(
        None,
        "max prompt + output tokens (default: the model's max_position_embeddings)",
        type=int,
        min=1,
    )
    max_n: int = opt(16, "max choices (n) per request; beyond it a 400", min=1)
    seed: int = opt(0, "seed for unseeded sampling")

    def check(self) -> list[tuple[str, str]]:
        if not math.isfinite(self.schedule_wait_budget_s):
            return [("schedule_wait_budget_s", "must be a finite number of seconds")]
        if not math.isfinite(self.decode_stall_ms):
            return [("decode_stall_ms", "must be a finite number of milliseconds")]
        return []


# The formats radixkv.server.tool_calling.tool_parsers reads (a test keeps the two lists equal).
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "pythonic")


@dataclass(frozen=True)
class ServerConfig(Section):
    """The HTTP front end of `radixkv serve` (the engine ignores this section)."""

    title = "server"

    host: str = opt("127.0.0.1", "address to listen on")
    port: int = opt(8000, "port to listen on (0: any free port)", min=0, max=65535)
    api_key: str | None = opt(
        None, "require 'Authorization: Bearer KEY' on every route but /health", secret=True
    )
    served_model_name: str | None = opt(
        None, "model id clients must send (default: the checkpoint's directory name)"
    )
    log_level: str = opt("info", "server log level", choices=LOG_LEVELS)
    tool_call_parser: str | None = opt(
        None,
        "how tool calls are read from the model's output on /v1/chat/completions (tool_choice "
        "auto): hermes (Qwen2.5/3 <tool_call> JSON), llama3_json, pythonic; default: the "
        "format the chat template's tool instructions name",
        choices=TOOL_CALL_PARSERS,
    )
    chat_template: str | None = opt(
        None,
        "a Jinja chat template to use instead of the checkpoint's: a file's path, or the template "
        "itself (text holding Jinja tags); --tool-call-parser then defaults to the format it names",
    )
    retry_after: int = opt(
        1,
        "seconds in the Retry-After header of a 503 (overloaded: --max-running-requests running "
        "and --max-queued-requests waiting); a router retries another worker at once",
        min=0,
    )
    # Where the engine runs (radixkv.server.engine_link.launch): its own process by default.
    threads: int = opt(
        0,
        "torch CPU threads for the engine (0: torch's default, one per core)",
        min=0,
        group="engine process",
    )
    in_process: bool = opt(
        False,
        "run the engine on a thread of the server process instead of its own process "
        "(for debugging and comparison)",
        group="engine process",
    )
