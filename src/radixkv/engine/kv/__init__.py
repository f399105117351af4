"""Slot ownership: the KV manager (the one mover of KV slots between the allocator, the
prefix tree and running requests), the hybrid components' side of it, the loads it carries
out for the tiers' plans, and the memory built at start (`memory_factory`)."""
