"""The ``least_queue`` baseline: join the shortest queue (JSQ).

The classic join-shortest-queue rule on ``ReplicaView.queue_len`` (requests waiting or
running on the replica), ties broken uniformly at random.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from firstlight.routing.baselines._common import BaselinePolicy, by_score
from firstlight.routing.decision import Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RoutingInput

__all__ = ["LeastQueueParams", "LeastQueuePolicy"]


class LeastQueueParams(PolicyParams):
    """The ``least_queue`` policy has no parameters."""


class LeastQueuePolicy(BaselinePolicy):
    """Candidates by queue length (score = ``queue_len``); the winner is drawn at random
    among those tied for the shortest queue. Reason ``shortest-queue``."""

    name = "least_queue"

    def __init__(
        self, params: LeastQueueParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params

    def choose(self, routing: RoutingInput) -> Decision:
        replicas = routing.replicas
        queues = [float(r.queue_len) for r in replicas]
        order = sorted(range(len(replicas)), key=queues.__getitem__)
        tied = 1
        while tied < len(order) and queues[order[tied]] == queues[order[0]]:
            tied += 1
        if tied > 1:
            pick = self._rng.randrange(tied)
            order[0], order[pick] = order[pick], order[0]
        return Decision(self.name, by_score(replicas, order, queues), "shortest-queue")
