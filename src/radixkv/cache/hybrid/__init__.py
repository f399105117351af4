"""The prefix tree of a hybrid model: `HybridCache` (`cache.py`) on the shared tree core, its
eviction across components (`evict.py`), its contract (`components.py`), the contract of one
component and the spec a tree is built from (`component.py`), its components (`swa.py`,
`state.py`), their names (`names.py`) and the vote over what the tiers hold (`tier_vote.py`).
No torch."""
