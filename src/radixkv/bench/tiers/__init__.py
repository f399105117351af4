"""`radixkv bench tiers | tierload | storage`: what the host (L2) and storage (L3) tiers
buy, the load path alone, and the L3 stores side by side."""
