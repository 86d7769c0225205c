"""The ``power_of_two`` baseline: Ray Serve's default request router.

``PowerOfTwoChoicesRequestRouter`` (``ray/serve/_private/request_router/pow_2_router.py``)
samples two distinct replicas uniformly at random and sends the request to the one with
the shorter queue (``RequestRouter.select_from_candidate_replicas`` in
``request_router.py``; a tie goes to the first sampled, which is random). Ray probes each
replica's queue length; here it is ``ReplicaView.queue_len``. Ray's locality and
multiplexing preferences do not apply (the adapter already chose the candidates).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from firstlight.routing.baselines._common import BaselinePolicy, by_position, power_of_two_order
from firstlight.routing.decision import Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RoutingInput

__all__ = ["PowerOfTwoParams", "PowerOfTwoPolicy"]


class PowerOfTwoParams(PolicyParams):
    """The ``power_of_two`` policy has no parameters (Ray's has none for the choice)."""


class PowerOfTwoPolicy(BaselinePolicy):
    """The shorter-queued of two sampled candidates wins, the other sampled one is second,
    the rest follow by queue length; scores are ranks. Reason ``power-of-two``."""

    name = "power_of_two"

    def __init__(
        self, params: PowerOfTwoParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params

    def choose(self, routing: RoutingInput) -> Decision:
        order = power_of_two_order(routing.replicas, self._rng)
        return Decision(self.name, by_position(routing.replicas, order), "power-of-two")
