"""The forward step's batch lives with the model (radixkv.model.batch); this name stays for the
engine's callers."""

from radixkv.model.batch import ForwardBatch

__all__ = ["ForwardBatch"]
