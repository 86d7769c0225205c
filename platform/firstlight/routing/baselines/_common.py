"""Pieces the baseline policies share: the base class, candidate lists, power of two.

Every baseline ranks *all* candidates best first; ``Candidate.score`` is the policy's own
ranking key (lower is better) and never decreases along the ranking.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from firstlight.routing.baselines._prefix_tree import ApproxPrefixTree
from firstlight.routing.decision import Candidate
from firstlight.routing.views import ReplicaView, RequestView

__all__ = ["BaselinePolicy", "by_position", "by_score", "power_of_two_order"]


class BaselinePolicy:
    """Hooks a baseline does not need are no-ops; subclasses override what they use.

    None of the peers re-implemented here calibrates on observed TTFT or reserves work,
    so ``on_first_token`` and ``on_done`` have nothing to record.
    """

    name: str
    predicts_ttft = False

    def __init__(self, *, rng: random.Random, clock: Callable[[], float]) -> None:
        self._rng = rng
        self._clock = clock

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """Stateless baselines keep no routing history."""

    def on_first_token(
        self, request: RequestView, chosen: Candidate, observed_ttft_ms: float
    ) -> None:
        """Baselines do not calibrate."""

    def on_done(self, request: RequestView, chosen: Candidate) -> None:
        """Baselines hold nothing per request."""

    def on_replica_reset(self, replica_id: str) -> None:
        """Baselines learn nothing per replica."""


class TreePolicy(BaselinePolicy):
    """A baseline that keeps its own approximate prefix tree of routed requests
    (``cache_aware``, ``prefix_affinity``), evicted on its own schedule."""

    def __init__(self, *, rng: random.Random, clock: Callable[[], float]) -> None:
        super().__init__(rng=rng, clock=clock)
        self._tree = ApproxPrefixTree()
        self._last_eviction = clock()

    def tree_size(self, replica_id: str) -> int:
        """Blocks in the router's tree for ``replica_id`` (tests, dashboards)."""
        return self._tree.size(replica_id)


def by_position(replicas: Sequence[ReplicaView], order: Sequence[int]) -> tuple[Candidate, ...]:
    """Candidates in ``order`` (indices into ``replicas``), scored by rank: 0, 1, 2, ..."""
    return tuple(
        Candidate(replicas[i].replica_id, replicas[i].region, float(rank))
        for rank, i in enumerate(order)
    )


def by_score(
    replicas: Sequence[ReplicaView],
    order: Sequence[int],
    scores: Sequence[float],
    cached_blocks: Sequence[int] | None = None,
) -> tuple[Candidate, ...]:
    """Candidates in ``order`` with ``scores[i]`` (and ``cached_blocks[i]``) of replica ``i``."""
    if cached_blocks is None:
        return tuple(
            Candidate(replicas[i].replica_id, replicas[i].region, scores[i]) for i in order
        )
    return tuple(
        Candidate(replicas[i].replica_id, replicas[i].region, scores[i], None, cached_blocks[i])
        for i in order
    )


def power_of_two_order(replicas: Sequence[ReplicaView], rng: random.Random) -> list[int]:
    """Ray Serve's power of two choices: sample two distinct replicas, the shorter queue wins.

    Sampling is ``PowerOfTwoChoicesRequestRouter.choose_replicas``
    (``ray/serve/_private/request_router/pow_2_router.py``): with two candidates their
    order is shuffled by one random bit; with more, ``i = randrange(n)``,
    ``j = randrange(n - 1)``, shifted up past ``i``. The pick is
    ``RequestRouter.select_from_candidate_replicas`` (``request_router.py``): the lowest
    queue length with a strict ``<``, so a tie goes to the first sampled, which is random.
    Returns indices: the pick, the other sampled replica, then the rest by queue length.
    """
    n = len(replicas)
    if n == 1:
        return [0]
    if n == 2:
        first, second = (0, 1) if rng.getrandbits(1) else (1, 0)
    else:
        first = rng.randrange(n)
        second = rng.randrange(n - 1)
        if second >= first:
            second += 1
    if replicas[second].queue_len < replicas[first].queue_len:
        first, second = second, first
    rest = sorted(
        (i for i in range(n) if i != first and i != second), key=lambda i: replicas[i].queue_len
    )
    return [first, second, *rest]
