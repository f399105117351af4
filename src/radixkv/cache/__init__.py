"""radixkv.cache."""
