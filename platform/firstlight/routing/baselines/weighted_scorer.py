"""The ``weighted_scorer`` baseline: llm-d's default endpoint-picker (EPP) scoring.

The default scheduling profile of the inference extension's ``inferencepool`` Helm chart,
which llm-d deploys (``config/charts/inferencepool/templates/epp-config.yaml`` in
kubernetes-sigs/gateway-api-inference-extension, ``default-plugins.yaml``): three scorers
with weights ``queue-scorer: 2``, ``kv-cache-utilization-scorer: 2``,
``prefix-cache-scorer: 3``, and the default ``max-score-picker``. Sources under
``pkg/epp/scheduling/framework/plugins/``:

* queue (``scorer/queue.go``): ``(max - q) / (max - min)`` over the candidates' waiting
  queue sizes, 1 when all are equal;
* KV-cache utilization (``scorer/kvcache_utilization.go``): ``1 - usage``;
* prefix cache (``multi/prefix/plugin.go``, ``indexer.go``): the prompt's first
  ``maxPrefixBlocksToMatch = 256`` block hashes are looked up in an index of what was
  routed where (``PreRequest`` adds the routed prompt's hashes to the chosen server, each
  server an LRU of ``lruCapacityPerServer = 31250`` hashes); ``matchLongestPrefix`` walks
  the blocks until one no server holds, crediting each server one per block it holds;
  score = credited / prompt blocks;
* the scheduler clamps each score to [0, 1] and sums ``weight * score``;
  ``picker/max_score_picker.go`` shuffles then sorts by score, so ties break at random.

Where our inputs differ:

* The prefix index is keyed by ``RequestView.block_hashes`` (the engine's chained block
  hashes) instead of xxhash over 64-character chunks of the request body, so "blocks"
  are the engine's blocks. With ``autoTune`` the EPP sizes each server's LRU from the
  engine's ``CacheNumGPUBlocks``; we do not get that metric, so the published fixed
  capacity applies.
* The queue scorer reads the *waiting* queue (vLLM's ``num_requests_waiting``):
  ``queue_len - running`` here.
* The picker's ranking beyond the winner keeps candidate order among equal scores (one
  random draw per decision instead of a shuffle); only the winner is used by the EPP.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Annotated, NamedTuple

from pydantic import Field

from firstlight.routing.baselines._block_index import BlockIndex
from firstlight.routing.baselines._common import BaselinePolicy, by_score
from firstlight.routing.decision import Candidate, Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import ReplicaView, RequestView, RoutingInput

__all__ = ["ScorerScores", "WeightedScorerParams", "WeightedScorerPolicy"]


class WeightedScorerParams(PolicyParams):
    """Parameters of the ``weighted_scorer`` policy (the EPP's published defaults)."""

    queue_weight: Annotated[float, Field(ge=0, le=1000)] = 2.0
    """Weight of the queue scorer."""
    kv_cache_weight: Annotated[float, Field(ge=0, le=1000)] = 2.0
    """Weight of the KV-cache-utilization scorer."""
    prefix_weight: Annotated[float, Field(ge=0, le=1000)] = 3.0
    """Weight of the prefix-cache scorer."""
    max_prefix_blocks: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Only the prompt's first this many blocks are matched and indexed
    (``maxPrefixBlocksToMatch``)."""
    lru_capacity_blocks: Annotated[int, Field(ge=1, le=100_000_000)] = 31_250
    """Block hashes the index keeps per server, least recently routed dropped first
    (``lruCapacityPerServer``)."""


class ScorerScores(NamedTuple):
    """Each scorer's score per candidate (in the candidates' order), each in [0, 1]."""

    queue: list[float]
    kv_cache: list[float]
    prefix: list[float]
    prefix_blocks: list[int]
    """Blocks credited to each candidate by the prefix index."""


def _queue_scores(replicas: Sequence[ReplicaView]) -> list[float]:
    """The queue scorer: shorter waiting queue, higher score; 1 for all when all equal.

    ``low <= w <= high`` keeps every score in [0, 1] without a clamp.
    """
    waiting = [max(r.queue_len - r.running, 0) for r in replicas]
    low, high = min(waiting), max(waiting)
    if high == low:
        return [1.0] * len(waiting)
    span = high - low
    return [(high - w) / span for w in waiting]


def _kv_cache_scores(replicas: Sequence[ReplicaView]) -> list[float]:
    """The KV-cache-utilization scorer: ``1 - usage``, clamped to [0, 1] (a usage that is
    not a number scores 0)."""
    return [
        1.0 - u if 0.0 <= u <= 1.0 else 1.0 if u < 0.0 else 0.0
        for u in [r.kv_cache_usage for r in replicas]
    ]


class WeightedScorerPolicy(BaselinePolicy):
    """Highest weighted sum of clamped scorer scores wins, ties at random.

    Score = minus the weighted sum (lower is better); reason ``weighted-score``;
    ``cached_blocks`` is what the prefix index credits the candidate with.
    """

    name = "weighted_scorer"

    def __init__(
        self, params: WeightedScorerParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params
        self._index = BlockIndex(params.lru_capacity_blocks)

    def indexed_blocks(self, replica_id: str) -> int:
        """Block hashes the prefix index holds for ``replica_id`` (tests, dashboards)."""
        return self._index.size(replica_id)

    def component_scores(self, routing: RoutingInput) -> ScorerScores:
        """Every scorer's clamped score for every candidate. Read-only."""
        replicas = routing.replicas
        hashes = routing.request.block_hashes[: self.params.max_prefix_blocks]
        credited = self._index.match(hashes) if hashes else {}
        blocks = [credited.get(r.replica_id, 0) for r in replicas]
        total = len(hashes)
        # A server is credited at most once per walked block, so b <= total.
        prefix = [b / total for b in blocks] if total else [0.0] * len(replicas)
        return ScorerScores(_queue_scores(replicas), _kv_cache_scores(replicas), prefix, blocks)

    def choose(self, routing: RoutingInput) -> Decision:
        p = self.params
        parts = self.component_scores(routing)
        scores = [
            -(p.queue_weight * q + p.kv_cache_weight * kv + p.prefix_weight * px)
            for q, kv, px in zip(parts.queue, parts.kv_cache, parts.prefix, strict=True)
        ]
        order = sorted(range(len(scores)), key=scores.__getitem__)
        tied = 1
        while tied < len(order) and scores[order[tied]] == scores[order[0]]:
            tied += 1
        if tied > 1:
            pick = self._rng.randrange(tied)
            order[0], order[pick] = order[pick], order[0]
        ranked = by_score(routing.replicas, order, scores, parts.prefix_blocks)
        return Decision(self.name, ranked, "weighted-score")

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """Index the prompt's leading blocks under the chosen replica (``PreRequest``)."""
        hashes = request.block_hashes[: self.params.max_prefix_blocks]
        if hashes:
            self._index.add(hashes, chosen.replica_id)
