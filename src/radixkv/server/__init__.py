"""radixkv.server."""
