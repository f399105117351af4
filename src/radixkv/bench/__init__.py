"""radixkv.bench."""
