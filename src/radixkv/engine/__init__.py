"""radixkv.engine."""
