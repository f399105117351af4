"""Eviction research (docs/eviction.md): policies beyond the classic ones and the oracle.

- `segmented` (s3fifo), `predictive` (predict), `density` (with `lifetable`, what it learns):
  online policies, registered by name in `radixkv.cache.policies`;
- `belady`: the offline optimum over a known request sequence (`radixkv replay --policy belady`);
- `regret`: the live window that replays a running cache's recent requests through `belady`
  (`--regret-window`).

Nothing here is needed by the default configuration (lru); the cache core never imports it.
"""
