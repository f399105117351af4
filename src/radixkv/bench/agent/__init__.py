"""`radixkv bench agent`: agent sessions (a shared tool list, a system prompt, a growing
history) through a server's chat API, the TTFT probe, and the report."""
