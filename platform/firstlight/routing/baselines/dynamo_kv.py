"""The ``dynamo_kv`` baseline: NVIDIA Dynamo's KV-cache-aware router, default cost.

Algorithm (``ai-dynamo/dynamo``, ``lib/kv-router/src/scheduling/selector/default.rs``
and ``docs/components/router/router-concepts.md``, docs v1.2 to v1.7), per worker ``w``::

    raw_prefill_blocks = (active_prefill_tokens(w) + isl) / block_size
    credit             = overlap_score_credit * overlap_blocks(w)
    cost               = prefill_load_scale * max(0, raw_prefill_blocks - credit)
                         + decode_blocks(w)

``overlap_blocks`` is how many of the prompt's leading blocks the worker's KV cache holds
(Dynamo's radix index built from the engines' KV events); ``active_prefill_tokens`` are
the prefill tokens of the requests the router sent there whose first token has not come
(prefill ends at the first output token: ``mark_prefill_completed``);
``decode_blocks = active_blocks + new_blocks``: the distinct KV blocks of the worker's
active sequences plus the prompt's blocks they do not already hold (the new request
included), released when a request completes (output blocks are not tracked by default,
``router_track_output_blocks: false``). The lowest cost wins; with
``router_temperature`` 0 (the default) exact ties are broken uniformly at random.

Defaults: ``overlap_score_credit`` 1.0, ``prefill_load_scale`` 1.0,
``router_temperature`` 0 (softmax sampling above 0 is not re-implemented);
``host_cache_hit_weight`` 0.75 and ``disk_cache_hit_weight`` 0.25 apply to offload
tiers, which the cache view does not report (device blocks only); the active-request
weight and the credit decay are off by default. With weight and credit 1, Dynamo's older
``overlap_score_weight * prefill_blocks + decode_blocks`` is the same cost.

Where our inputs differ: overlaps come from the cache view (the hint mirror, fed by
vLLM's KV events, as Dynamo's indexer is), and an active request's prefill tokens are its
uncached tokens when routed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from firstlight.routing.baselines._common import BaselinePolicy, by_score
from firstlight.routing.decision import Candidate, Decision
from firstlight.routing.inflight import InFlight
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RequestView, RoutingInput

__all__ = ["DynamoKvParams", "DynamoKvPolicy"]


class DynamoKvParams(PolicyParams):
    """Parameters of the ``dynamo_kv`` policy (Dynamo's published defaults)."""

    overlap_score_credit: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Prefill blocks credited per cached prompt block (``router-kv-overlap-score-credit``,
    formerly ``overlap_score_weight``)."""
    prefill_load_scale: Annotated[float, Field(ge=0, le=1000)] = 1.0
    """Weight of the prefill term against decode blocks (``prefill_load_scale``)."""


def _partial_blocks(request: RequestView) -> int:
    """1 when the prompt ends in a block that is not full (it holds a KV block too)."""
    return 1 if request.prompt_tokens > len(request.block_hashes) * request.block_size else 0


class DynamoKvPolicy(BaselinePolicy):
    """Lowest ``prefill_load_scale * max(0, prefill blocks - overlap credit) + decode
    blocks``; reason ``kv-cost``. Scores are the cost in blocks; ``cached_blocks`` is the
    worker's overlap."""

    name = "dynamo_kv"

    def __init__(
        self, params: DynamoKvParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params
        self.in_flight = InFlight()

    def choose(self, routing: RoutingInput) -> Decision:
        p = self.params
        request, replicas = routing.request, routing.replicas
        hashes = request.block_hashes
        matched = routing.cache.longest_prefix(hashes) if hashes else {}
        partial = _partial_blocks(request)
        block_size = request.block_size
        cached, costs = [], []
        for replica in replicas:
            rid = replica.replica_id
            overlap = matched.get(rid, 0)
            raw = (self.in_flight.prefill_tokens(rid) + request.prompt_tokens) / block_size
            prefill = max(0.0, raw - p.overlap_score_credit * overlap)
            decode = self.in_flight.active_blocks(rid) + self.in_flight.new_blocks(
                rid, hashes, partial
            )
            cached.append(overlap)
            costs.append(p.prefill_load_scale * prefill + decode)
        # Exact ties at the lowest cost in random order (temperature 0).
        keys = [self._rng.random() for _ in replicas]
        order = sorted(range(len(replicas)), key=lambda i: (costs[i], keys[i]))
        return Decision(self.name, by_score(replicas, order, costs, cached), "kv-cost")

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """The request's uncached tokens load the worker's prefill until its first token;
        its blocks load its decode until it ends."""
        uncached = max(request.prompt_tokens - chosen.cached_blocks * request.block_size, 0)
        self.in_flight.add(
            chosen.replica_id,
            request.request_id,
            uncached,
            request.block_hashes,
            _partial_blocks(request),
        )

    def on_first_token(
        self, request: RequestView, chosen: Candidate, observed_ttft_ms: float
    ) -> None:
        self.in_flight.prefill_done(request.request_id)

    def on_done(self, request: RequestView, chosen: Candidate) -> None:
        self.in_flight.done(request.request_id)
