"""The configuration chain (model / cache / scheduler / server sections); see
radixkv.config.chain. Imports no torch."""

from radixkv.config.chain import ConfigError, EngineConfig
from radixkv.config.sections import CacheConfig, ModelConfig, SchedulerConfig, ServerConfig

__all__ = [
    "CacheConfig",
    "ConfigError",
    "EngineConfig",
    "ModelConfig",
    "SchedulerConfig",
    "ServerConfig",
]
