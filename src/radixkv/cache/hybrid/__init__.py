"""The prefix tree of a hybrid model: `HybridCache` (`cache.py`) on the shared tree core, its
eviction across components (`evict.py`), its contract (`components.py`), the contract of one
component (`component.py`), its components (`swa.py`, `state.py`) and the vote over what the
tiers hold (`tier_vote.py`). No torch."""
