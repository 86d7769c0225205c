"""The ``round_robin`` baseline: take the candidates in turn.

As in sgl-router's ``RoundRobinPolicy`` (``sgl-router/src/policies/round_robin.rs``): a
counter advanced once per decision indexes the candidate list. The list is ordered by
replica id here, so the cycle does not depend on the order an adapter lists replicas in.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from firstlight.routing.baselines._common import BaselinePolicy, by_position
from firstlight.routing.decision import Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RoutingInput

__all__ = ["RoundRobinParams", "RoundRobinPolicy"]


class RoundRobinParams(PolicyParams):
    """The ``round_robin`` policy has no parameters."""


class RoundRobinPolicy(BaselinePolicy):
    """Candidate ``k mod n`` (by replica id) wins the ``k``-th decision; the others follow
    in cyclic order. Reason ``round-robin``."""

    name = "round_robin"

    def __init__(
        self, params: RoundRobinParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params
        self._counter = 0

    def choose(self, routing: RoutingInput) -> Decision:
        replicas = routing.replicas
        n = len(replicas)
        by_id = sorted(range(n), key=lambda i: replicas[i].replica_id)
        start = self._counter % n
        self._counter += 1
        return Decision(
            self.name, by_position(replicas, by_id[start:] + by_id[:start]), "round-robin"
        )
