"""radixkv.cache.policies: eviction policies and the registry that names them.

`base` is the contract (`EvictionPolicy`, the node fields a policy reads); `core` holds the
classic policies (lru, the default, mru, lfu, fifo, priority, and `session-<base>` over any of
them); `research/` holds what our eviction studies added (docs/eviction.md): the s3fifo,
predict and density policies, and the offline optimum (`belady`) with the live regret window
that compares a running cache with it. Every name a user passes (`--eviction-policy`,
`radixkv replay --policy`) is registered here, by this module, whatever was imported before.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from radixkv.cache.policies.base import EvictionPolicy, PolicyKey, PolicyNode
from radixkv.cache.policies.core import (
    FIFOPolicy,
    LFUPolicy,
    LRUPolicy,
    MRUPolicy,
    PriorityPolicy,
    SessionAwarePolicy,
)

CORE_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "mru": MRUPolicy,
    "lfu": LFUPolicy,
    "fifo": FIFOPolicy,
    "priority": PriorityPolicy,
    "session-lru": lambda: SessionAwarePolicy(LRUPolicy()),
}


def _research(module: str, name: str) -> Callable[[], EvictionPolicy]:
    """A research policy's factory that imports its module on first use: nothing in
    `research/` loads unless a user names one of its policies."""

    def make() -> EvictionPolicy:
        policy: EvictionPolicy = getattr(import_module(f"{__name__}.research.{module}"), name)()
        return policy

    return make


RESEARCH_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "s3fifo": _research("segmented", "S3FIFOPolicy"),
    "predict": _research("predictive", "PredictivePolicy"),
    "density": _research("density", "DensityPolicy"),
}
_REGISTRY: dict[str, Callable[[], EvictionPolicy]] = {**CORE_POLICIES, **RESEARCH_POLICIES}


def owns_queue(name: str) -> bool:
    """Whether the registered policy `name` keeps its own queue of leaves (then it has no
    `session-<name>` form). The research policies all do, and are not imported to say so."""
    if name in RESEARCH_POLICIES and _REGISTRY.get(name) is RESEARCH_POLICIES[name]:
        return True
    return type(make_policy(name)).make_queue is not EvictionPolicy.make_queue


def register_policy(name: str, factory: Callable[[], EvictionPolicy]) -> None:
    """Make a custom policy available by name to every cache constructor."""
    _REGISTRY[name] = factory


def available_policies() -> list[str]:
    """Every registered name, sorted (the `session-<base>` forms are resolved on demand)."""
    return sorted(_REGISTRY)


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """Resolve a policy name (or pass an instance through); unknown names are a ValueError.
    `session-<base>` wraps any registered base policy that does not own its queue."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if policy.startswith("session-") and policy not in _REGISTRY:
        base = policy.removeprefix("session-")
        if base in _REGISTRY and not base.startswith("session-"):
            return SessionAwarePolicy(_REGISTRY[base]())
    try:
        return _REGISTRY[policy]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {policy!r}; choose one of {available_policies()}"
        ) from None


__all__ = [
    "CORE_POLICIES",
    "RESEARCH_POLICIES",
    "EvictionPolicy",
    "PolicyKey",
    "PolicyNode",
    "available_policies",
    "make_policy",
    "register_policy",
]
