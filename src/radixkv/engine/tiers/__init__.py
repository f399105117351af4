"""The host (L2) and storage (L3) tiers: what they hold, the plans they return
(stores, loads, prefetches) and their setup; they never touch the tree or device slots
(the KV manager carries the plans out)."""
