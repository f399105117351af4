"""radixkv.memory."""
