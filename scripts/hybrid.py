"""`python scripts/hybrid.py --model DIR`: a hybrid model (SWA and/or STATE layers) on a
multi-turn workload through the in-process Engine, unified component tree vs cache off.

Reports, per mode: token hit rate against the ideal (every token shared with an earlier prompt),
mean / p50 TTFT, and the KV bytes a running request holds, sampled after every step:
  full  = FULL slots it can read (cached prefix + own pages) x FULL bytes per token
  swa   = live SWA entries of its row x SWA bytes per token (about W once past the window)
  state = its working state (+ snapshot) x state bytes per slot
next to what keeping full KV in the SWA layers would take (kv_len x SWA bytes per token).
Checkpoints for the benchmark: `python scripts/hybrid_ckpt.py --family gemma3|qwen3_5`.
Numbers depend on the machine and its load; compare modes within one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from radixkv.bench.engine_driver import drive
from radixkv.bench.inputs import workloads as wl
from radixkv.bench.inputs.tokens import id_source
from radixkv.memory.hybrid import FULL, STATE, SWA


class _Sampler:
    """Wraps an Engine: after every step, records the bytes each running request holds."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        spec = engine.kv.comp.spec if engine.kv.comp is not None else None
        dtype = engine.pool.config.dtype
        self.full_b = spec.slot_bytes(FULL, dtype) if spec else 0
        self.swa_b = spec.slot_bytes(SWA, dtype) if spec else 0
        state = engine.pools.state() if engine.pools is not None else None
        self.state_b = state.config.bytes_per_slot if state is not None else 0
        self.rows: list[tuple[int, int, int, int]] = []  # per request-step: full, swa, state, naive

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def step(self) -> Any:
        out = self.engine.step()
        eng = self.engine
        ps = eng.config.cache.page_size
        swa_mem = eng.kv.comp.kinds.get(SWA) if eng.pools is not None else None
        swa_table = swa_mem.table if swa_mem is not None else None
        for r in eng.scheduler.running:
            cap = r.prefix_len + len(r.own_pages) * ps
            swa = 0
            if swa_table is not None and r.kv_len:
                swa = int((swa_table.get_numpy(r.row, 0, r.kv_len) >= 0).sum())
            st = r.kv_kinds.get(STATE)
            states = 0 if st is None else (st.slot >= 0) + (st.snap_slot >= 0)
            self.rows.append(
                (
                    cap * self.full_b,
                    swa * self.swa_b,
                    states * self.state_b,
                    r.kv_len * self.swa_b,
                )
            )
        return out

    def summary(self) -> dict[str, float]:
        if not self.rows:
            return {}
        a = np.asarray(self.rows, dtype=np.float64)
        full, swa, state, naive = a.mean(axis=0)
        return {
            "mean_full_kv_bytes": float(full),
            "mean_swa_kv_bytes": float(swa),
            "mean_state_bytes": float(state),
            "mean_bytes_held": float(full + swa + state),
            "mean_bytes_if_swa_kept_full_kv": float(full + naive + state),
            # The longest request's peak (the last turn of a long conversation).
            "peak_bytes_held": float((a[:, 0] + a[:, 1] + a[:, 2]).max()),
            "peak_bytes_if_full_kv": float((a[:, 0] + a[:, 3] + a[:, 2]).max()),
        }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from radixkv.engine.setup import resolve_dtype
    from radixkv.model import load_model

    return run_lm(load_model(args.model, "cpu", resolve_dtype(args.dtype, "cpu")), args)


def run_lm(lm: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark on an already loaded model (anything with .model/.config/.tokenizer)."""
    from radixkv.engine.engine import Engine

    vocab = int(lm.config.vocab_size)
    tokens = id_source(None, (min(1000, vocab // 4), min(30000, vocab)))
    work = wl.multi_turn(
        tokens,
        num_conversations=args.conversations,
        num_turns=args.turns,
        system_len=args.system_len,
        question_len=args.question_len,
        output_len=args.output_len,
        seed=args.seed,
    )
    out: dict[str, Any] = {"workload": work.describe(), "modes": {}}
    for mode in args.modes:
        engine = Engine(
            lm,
            device="cpu",
            page_size=args.page_size,
            disable_radix_cache=mode == "off",
            chunked_prefill_size=args.chunk,
            max_running_requests=args.concurrency,
            state_checkpoint_interval=args.interval,
            num_slots=args.num_slots,
            dtype=args.dtype,
        )
        sampler = _Sampler(engine)
        res = drive(sampler, work.requests, args.concurrency)
        pools = engine.metrics().component_pools
        out["modes"][mode] = {
            **res.summary(work.ideal_hit_rate()),
            **sampler.summary(),
            **_tree_bytes(pools, sampler.full_b, sampler.swa_b),
            "pools": pools,
        }
    return out


def _tree_bytes(pools: dict[str, Any], full_b: int, swa_b: int) -> dict[str, float]:
    """KV bytes the tree keeps at the end (FULL for every cached token, SWA where a window is
    still needed) next to full KV in every layer for the same tokens."""
    full = pools.get("full", {}).get("cached", 0)
    swa = pools.get("swa", {}).get("cached", 0)
    return {
        "tree_kv_bytes": float(full * full_b + swa * swa_b),
        "tree_bytes_if_full_kv": float(full * (full_b + swa_b)),
    }


SIZE_CONFIGS: list[dict[str, Any]] = [
    {},
    {"page_size": 16},
    {"page_size": 16, "max_running_requests": 8, "chunked_prefill_size": 512},
]


def kw_text(kw: dict[str, Any]) -> str:
    names = {
        "page_size": "page",
        "max_running_requests": "running",
        "chunked_prefill_size": "chunk",
    }
    return ", ".join(f"{names[k]} {v}" for k, v in kw.items()) or "defaults"


def sizes_table(spec: Any) -> str:
    """Default pool sizes (engine.kv.kinds.pool_sizes) at the default 512 MiB budget against the
    even split (as many SWA as FULL slots, the rule before the demand-sized SWA pool)."""
    import torch

    from radixkv.config import EngineConfig
    from radixkv.engine.kv.kinds import pool_sizes
    from radixkv.memory.hybrid import FULL, SWA

    head = (
        f"{'dtype':<9} {'config':<28} {'FULL':>8} {'SWA':>7} {'SWA_MiB':>7} {'even':>7} {'gain':>6}"
    )
    lines = [head, "-" * len(head)]
    for dtype in (torch.bfloat16, torch.float32):
        full_b, swa_b = spec.slot_bytes(FULL, dtype), spec.slot_bytes(SWA, dtype)
        for kw in SIZE_CONFIGS:
            cfg = EngineConfig(**kw)
            sizes = pool_sizes(cfg, spec, dtype)
            full, swa = sizes[FULL], sizes.get(SWA, 0)
            even = cfg.cache.kv_cache_bytes // (full_b + swa_b)
            even -= even % cfg.cache.page_size
            lines.append(
                f"{str(dtype).split('.')[-1]:<9} {kw_text(kw):<28} {full:>8} "
                f"{swa:>7} {swa * swa_b / 2**20:>7.0f} {even:>7} {full / even:>5.2f}x"
            )
    return "\n".join(lines)


def _naive_swa(m: dict[str, Any]) -> float:
    """SWA bytes a running request would hold with full KV in its SWA layers."""
    full_kv = m.get("mean_bytes_if_swa_kept_full_kv", 0.0)
    return float(full_kv - m.get("mean_full_kv_bytes", 0.0) - m.get("mean_state_bytes", 0.0))


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'mode':<6} {'hit':>6} {'ideal':>6} {'ttft_mean_s':>11} {'ttft_p50_s':>10} "
        f"{'held_MB':>8} {'swa_MB':>7} {'swa_fullkv_MB':>13} {'state_MB':>8} "
        f"{'tree_MB':>7} {'tree_fullkv_MB':>14}"
    )
    lines = [head, "-" * len(head)]
    for mode, m in result["modes"].items():
        mb = 1 / 2**20
        lines.append(
            f"{mode:<6} {m['token_hit_rate']:>6.1%} {m['ideal_hit_rate']:>6.1%} "
            f"{m['ttft_mean_s']:>11.3f} {m['ttft_p50_s']:>10.3f} "
            f"{m.get('mean_bytes_held', 0) * mb:>8.2f} {m.get('mean_swa_kv_bytes', 0) * mb:>7.2f} "
            f"{max(0.0, _naive_swa(m)) * mb:>13.2f} "
            f"{m.get('mean_state_bytes', 0) * mb:>8.2f} "
            f"{m.get('tree_kv_bytes', 0) * mb:>7.2f} "
            f"{m.get('tree_bytes_if_full_kv', 0) * mb:>14.2f}"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="hybrid HF checkpoint directory")
    p.add_argument("--modes", nargs="+", default=["off", "radix"], choices=["off", "radix"])
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=300)
    p.add_argument("--question-len", type=int, default=150)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--interval", type=int, default=256, help="--state-checkpoint-interval")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--num-slots", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", help="model and KV dtype (as --dtype)")
    p.add_argument("--json", default=None, help="also write the full result here")
    p.add_argument(
        "--sizes", action="store_true", help="print the default pool sizes only (no model run)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.model is None:
        raise SystemExit("--model DIR is required (see scripts/hybrid_ckpt.py)")
    if args.sizes:
        from radixkv.model.checkpoints.embedded import resolve_model
        from radixkv.model.loader import load_config

        print(sizes_table(load_config(resolve_model(args.model)).pool_spec()))
        return 0
    result = run(args)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
