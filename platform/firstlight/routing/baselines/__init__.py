"""Baseline routing policies: peers' published algorithms with their published defaults.

Each module re-implements one arm of the benchmark (see ``BENCHMARKS.md``, "Arms") behind
the :class:`~firstlight.routing.policy.RoutingPolicy` protocol and cites its source.
The approximate prefix-aware ones (``cache_aware``, ``prefix_affinity``,
``weighted_scorer``) learn only from their own routing history (``on_routed``), never
from the real cache state, exactly as those peers do; the token-load ones
(``llmd_sticky``, ``dynamo_kv``) read the cache view fed by the engines' KV events, as
their peers' precise indexes do, and count their own work in flight. Pure code:
randomness from the injected ``random.Random``, time from the injected clock. Built by
:func:`firstlight.routing.registry.build_policy`.
"""

from firstlight.routing.baselines.cache_aware import CacheAwareParams, CacheAwarePolicy
from firstlight.routing.baselines.dynamo_kv import DynamoKvParams, DynamoKvPolicy
from firstlight.routing.baselines.least_queue import LeastQueueParams, LeastQueuePolicy
from firstlight.routing.baselines.llmd_sticky import LlmdStickyParams, LlmdStickyPolicy
from firstlight.routing.baselines.power_of_two import PowerOfTwoParams, PowerOfTwoPolicy
from firstlight.routing.baselines.prefix_affinity import (
    PrefixAffinityParams,
    PrefixAffinityPolicy,
)
from firstlight.routing.baselines.round_robin import RoundRobinParams, RoundRobinPolicy
from firstlight.routing.baselines.uniform_random import RandomParams, RandomPolicy
from firstlight.routing.baselines.weighted_scorer import (
    ScorerScores,
    WeightedScorerParams,
    WeightedScorerPolicy,
)

__all__ = [
    "CacheAwareParams",
    "CacheAwarePolicy",
    "DynamoKvParams",
    "DynamoKvPolicy",
    "LeastQueueParams",
    "LeastQueuePolicy",
    "LlmdStickyParams",
    "LlmdStickyPolicy",
    "PowerOfTwoParams",
    "PowerOfTwoPolicy",
    "PrefixAffinityParams",
    "PrefixAffinityPolicy",
    "RandomParams",
    "RandomPolicy",
    "RoundRobinParams",
    "RoundRobinPolicy",
    "ScorerScores",
    "WeightedScorerParams",
    "WeightedScorerPolicy",
]
