"""radixkv.model."""
