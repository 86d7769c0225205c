"""The ``random`` baseline: a uniformly random candidate.

As in sgl-router's ``RandomPolicy`` (``sgl-router/src/policies/random.rs``): one uniform
draw over the candidate list, from the injected random source.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from firstlight.routing.baselines._common import BaselinePolicy, by_position
from firstlight.routing.decision import Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RoutingInput

__all__ = ["RandomParams", "RandomPolicy"]


class RandomParams(PolicyParams):
    """The ``random`` policy has no parameters."""


class RandomPolicy(BaselinePolicy):
    """Candidate ``rng.randrange(n)`` (in the adapter's order) wins; the others follow it
    cyclically, so a fallback is as uniform as the pick. Reason ``random``."""

    name = "random"

    def __init__(
        self, params: RandomParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params

    def choose(self, routing: RoutingInput) -> Decision:
        replicas = routing.replicas
        n = len(replicas)
        start = self._rng.randrange(n)
        order = [*range(start, n), *range(start)]
        return Decision(self.name, by_position(replicas, order), "random")
