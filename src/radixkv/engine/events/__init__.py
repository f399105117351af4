"""KV cache events for routers (docs/kv-events.md): the sink the KV manager calls,
the per-step block records, and the publisher thread that encodes and sends them."""
