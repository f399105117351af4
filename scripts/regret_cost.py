"""What the live regret window costs the engine's thread: `python -m scripts.regret_cost`.

Prints the time of the page keys of a 32k-token prompt (page sizes 1 and 16; as Python ints and,
what the window records, as an array), the per-call time
of `record` and `advance` over a stream of 1,200 admissions of 4k tokens (8 shared 2k prefixes,
page size 1, a replay every 64 admissions, three scheduler steps between admissions), and the
time of one whole replay (`compute`) of the full window.
"""

from __future__ import annotations

import time

import numpy as np

from radixkv.cache.policies.research import belady
from radixkv.cache.policies.research.regret import RegretWindow


def _keys_ms(q: np.ndarray, page_size: int, name: str) -> list[float]:
    fn = getattr(belady, name)
    out = []
    for _ in range(7):
        t0 = time.perf_counter()
        fn(q, page_size)
        out.append((time.perf_counter() - t0) * 1e3)
    return sorted(out)


def main() -> None:
    rng = np.random.default_rng(0)
    q = rng.integers(0, 49152, 32768, dtype=np.int64)
    for name in ("page_keys", "page_keys_array"):  # the window records the array since it exists
        for ps in (1, 16):
            if hasattr(belady, name):
                ts = _keys_ms(q, ps, name)
                print(f"{name} 32k tokens, page {ps}: best {ts[0]:.2f} ms, median {ts[3]:.2f}")
    prefixes = [rng.integers(0, 49152, 2048, dtype=np.int64) for _ in range(8)]
    w = RegretWindow(page_size=1, capacity_tokens=22_000, every=64)
    calls = []
    for i in range(1200):
        p = np.concatenate([prefixes[i % 8], rng.integers(0, 49152, 2048, dtype=np.int64)])
        t0 = time.perf_counter()
        w.record(p, None, len(p), 2048)  # an admission
        calls.append(time.perf_counter() - t0)
        for _ in range(3):  # scheduler steps between admissions
            t0 = time.perf_counter()
            getattr(w, "advance", lambda: None)()  # (absent before the replay was sliced)
            calls.append(time.perf_counter() - t0)
    s = np.array(calls) * 1e3
    t0 = time.perf_counter()
    w.compute()
    whole = (time.perf_counter() - t0) * 1e3
    print(
        f"stream of 1,200 x 4k tokens: per call max {s.max():.1f} ms, "
        f"p99.9 {np.percentile(s, 99.9):.1f}, p99 {np.percentile(s, 99):.2f}, "
        f"mean {s.mean():.3f}; one whole replay ({len(w)} requests) {whole:.1f} ms"
    )


if __name__ == "__main__":
    main()
