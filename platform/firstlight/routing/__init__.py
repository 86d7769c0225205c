"""Routing: pure, synchronous code that ranks replicas for a request.

Adapters (the Ray Serve request router, the benchmark's simulator) build
:class:`RoutingInput` views and call a :class:`RoutingPolicy` from :func:`build_policy`.
Nothing in this package does I/O or imports Ray or Redis.
"""

from firstlight.routing.cost import Calibrator, CostRates, Reservations, predict_ttft
from firstlight.routing.decision import Candidate, Decision, TtftTerms
from firstlight.routing.policy import PolicyParams, RoutingPolicy
from firstlight.routing.predicted_ttft import FirstlightParams, FirstlightPolicy
from firstlight.routing.registry import REGISTRY, PolicyDeps, PolicySpec, build_policy, policy_names
from firstlight.routing.views import (
    NO_CACHE,
    CacheView,
    ReplicaView,
    RequestView,
    RoutingInput,
    TieredCacheView,
)

__all__ = [
    "NO_CACHE",
    "REGISTRY",
    "CacheView",
    "Calibrator",
    "Candidate",
    "CostRates",
    "Decision",
    "FirstlightParams",
    "FirstlightPolicy",
    "PolicyDeps",
    "PolicyParams",
    "PolicySpec",
    "ReplicaView",
    "RequestView",
    "Reservations",
    "RoutingInput",
    "RoutingPolicy",
    "TieredCacheView",
    "TtftTerms",
    "build_policy",
    "policy_names",
    "predict_ttft",
]
