"""The explicit registry of routing policies, built from configuration at start-up.

``router.policy`` names an entry; ``router.params`` is validated against the entry's
parameter model. Who calls it: the Ray Serve request router when it starts, and the
benchmark once per arm. Adding a policy means adding one :class:`PolicySpec` here.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from firstlight.config import validation_problems
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.routing.baselines import (
    CacheAwareParams,
    CacheAwarePolicy,
    DynamoKvParams,
    DynamoKvPolicy,
    LeastQueueParams,
    LeastQueuePolicy,
    LlmdStickyParams,
    LlmdStickyPolicy,
    PowerOfTwoParams,
    PowerOfTwoPolicy,
    PrefixAffinityParams,
    PrefixAffinityPolicy,
    RandomParams,
    RandomPolicy,
    RoundRobinParams,
    RoundRobinPolicy,
    WeightedScorerParams,
    WeightedScorerPolicy,
)
from firstlight.routing.policy import PolicyParams, RoutingPolicy
from firstlight.routing.predicted_ttft import FirstlightParams, FirstlightPolicy

__all__ = ["REGISTRY", "PolicyDeps", "PolicySpec", "build_policy", "policy_names"]


@dataclass(frozen=True, slots=True)
class PolicyDeps:
    """What a policy may depend on: a seeded random source and a clock."""

    rng: random.Random
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One registered policy."""

    name: str
    summary: str
    params: type[PolicyParams]
    build: Callable[[Any, PolicyDeps], RoutingPolicy]


def _firstlight(name: str) -> Callable[[Any, PolicyDeps], RoutingPolicy]:
    def build(params: FirstlightParams, deps: PolicyDeps) -> RoutingPolicy:
        return FirstlightPolicy(params, rng=deps.rng, clock=deps.clock, name=name)

    return build


class _BaselineClass(Protocol):
    def __call__(
        self, params: Any, *, rng: random.Random, clock: Callable[[], float]
    ) -> RoutingPolicy: ...


def _baseline(policy_class: _BaselineClass) -> Callable[[Any, PolicyDeps], RoutingPolicy]:
    def build(params: PolicyParams, deps: PolicyDeps) -> RoutingPolicy:
        return policy_class(params, rng=deps.rng, clock=deps.clock)

    return build


_SPECS: tuple[PolicySpec, ...] = (
    PolicySpec(
        "firstlight",
        "predicted TTFT from hints, queue and calibrated rates",
        FirstlightParams,
        _firstlight("firstlight"),
    ),
    PolicySpec(
        "round_robin",
        "candidates in turn, by replica id (sgl-router round_robin)",
        RoundRobinParams,
        _baseline(RoundRobinPolicy),
    ),
    PolicySpec(
        "random",
        "a uniformly random candidate (sgl-router random)",
        RandomParams,
        _baseline(RandomPolicy),
    ),
    PolicySpec(
        "least_queue",
        "join the shortest queue, random tie-break",
        LeastQueueParams,
        _baseline(LeastQueuePolicy),
    ),
    PolicySpec(
        "power_of_two",
        "shorter queue of two random candidates (Ray Serve's default router)",
        PowerOfTwoParams,
        _baseline(PowerOfTwoPolicy),
    ),
    PolicySpec(
        "cache_aware",
        "balance thresholds, then approximate prefix tree match, else smallest tree"
        " (SGLang model gateway)",
        CacheAwareParams,
        _baseline(CacheAwarePolicy),
    ),
    PolicySpec(
        "prefix_affinity",
        "imbalance falls back to power of two, else prefix match rate >= 0.1, else"
        " smallest tree (Ray Serve PrefixCacheAffinityRouter)",
        PrefixAffinityParams,
        _baseline(PrefixAffinityPolicy),
    ),
    PolicySpec(
        "weighted_scorer",
        "queue 2 + KV-cache utilization 2 + approximate prefix 3, max score (llm-d EPP)",
        WeightedScorerParams,
        _baseline(WeightedScorerPolicy),
    ),
    PolicySpec(
        "llmd_sticky",
        "prefix affinity filter (match >= 0.8) released past a backlog gap, then least"
        " token load (llm-d router, sticky until saturated)",
        LlmdStickyParams,
        _baseline(LlmdStickyPolicy),
    ),
    PolicySpec(
        "dynamo_kv",
        "lowest prefill blocks net of cached overlap plus active decode blocks"
        " (NVIDIA Dynamo KV router)",
        DynamoKvParams,
        _baseline(DynamoKvPolicy),
    ),
)

REGISTRY: Mapping[str, PolicySpec] = {spec.name: spec for spec in _SPECS}


def policy_names() -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(s.name for s in _SPECS)


def build_policy(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RoutingPolicy:
    """Build the policy ``name`` with ``params``.

    Raises :class:`ConfigError` naming ``router.policy`` or ``router.params.<field>``.
    """
    spec = REGISTRY.get(name)
    if spec is None:
        known = ", ".join(REGISTRY)
        raise ConfigError(
            [ConfigProblem("router.policy", f"unknown policy; known: {known}", name, True)]
        )
    try:
        validated = spec.params.model_validate(dict(params or {}))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, "router.params")) from exc
    return spec.build(validated, PolicyDeps(rng or random.Random(), clock))
