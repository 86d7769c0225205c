"""The ``llmd_sticky`` baseline: llm-d's "sticky until saturated" default scheduler.

Algorithm (llm-d router EPP, ``llm-d/llm-d-router``, 2026; blog
``2026-08-17_bottleneck-aware-scheduling-for-llm-inference``, "Sticky Until
Saturated"), a filter → scorer → picker pipeline:

1. ``prefix-cache-affinity-filter``
   (``pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go``): each
   endpoint's match ratio is its own ``MatchBlocks / TotalBlocks`` for the prompt; the
   *sticky* set is the endpoints with ratio ≥ ``affinityThreshold``. With one endpoint,
   an empty sticky set, or a draw below ``explorationProbability``, every endpoint
   passes. Otherwise, if ``maxTTFTPenaltyMs > 0`` and some endpoints are not sticky,
   each endpoint's backlog is priced ``ttft = inFlightTokens / peakPrefillThroughput``
   and stickiness is **released** (every endpoint passes) when the least-loaded sticky
   endpoint's is more than ``maxTTFTPenaltyMs`` above the least-loaded other's:
   τ = ``peakPrefillThroughput * maxTTFTPenaltyMs`` tokens of backlog gap. Else only
   the sticky set passes.
2. ``token-load-scorer`` (``scorer/tokenload/token_load.go``): ``load = inFlightTokens
   + uncachedRequestTokens`` (the lookahead: this request's uncached tokens on that
   endpoint), ``score = 1 - min(load, Q) / Q`` with ``queueThresholdTokens`` Q.
3. ``max-score-picker`` (``picker/maxscore/picker.go``): the highest score; equal
   scores rotate round robin.

``inFlightTokens`` is the router's own count (``requestcontrol/dataproducer/inflightload``):
each routed request adds its uncached tokens to its endpoint; with the default
``addEstimatedOutputTokens: false`` they are released at the first response chunk.

Defaults, the current filter's and scorer's: ``affinityThreshold`` 0.80,
``explorationProbability`` 0, ``maxTTFTPenaltyMs`` 18,000, ``peakPrefillThroughput``
15,928 tokens/s (τ ≈ 286,700 tokens; the blog's runs: 20,480 * 14 s = 286,720, for
Qwen3-32B on H100), ``queueThresholdTokens`` 4,194,304.

Where our inputs differ:

* Prefix matches come from the cache view (the hint mirror, fed by vLLM's KV events):
  llm-d's ``precise-prefix-cache-producer``, not its approximate LRU of past routes.
* ``peak_prefill_tokens_per_s`` is the model and hardware's, as an operator sets it; the
  benchmark sets it to its profile's prefill rate (as it sets ``firstlight``'s priors).
* Filtered-out endpoints are ranked after the kept ones (for the request router's
  fallback), by the same load.
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

__all__ = ["LlmdStickyParams", "LlmdStickyPolicy"]


class LlmdStickyParams(PolicyParams):
    """Parameters of the ``llmd_sticky`` policy (llm-d's published defaults)."""

    affinity_threshold: Annotated[float, Field(ge=0, le=1)] = 0.8
    """An endpoint is sticky when its own prefix match ratio reaches this
    (``affinityThreshold``)."""
    exploration_probability: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Chance that a request ignores stickiness (``explorationProbability``)."""
    max_ttft_penalty_ms: Annotated[float, Field(ge=0, le=3_600_000)] = 18_000.0
    """Stickiness is released when the sticky set's least backlog exceeds the others'
    by more than this much prefill time (``maxTTFTPenaltyMs``); 0 never releases."""
    peak_prefill_tokens_per_s: Annotated[float, Field(gt=0, le=10_000_000)] = 15_928.0
    """Prefill throughput that prices a backlog (``prefillThroughput``)."""
    queue_threshold_tokens: Annotated[int, Field(ge=1, le=2**40)] = 4_194_304
    """Load at which an endpoint's score reaches 0 (``queueThresholdTokens``)."""


def _uncached_tokens(request: RequestView, matched_blocks: int) -> int:
    """``UncachedRequestTokens``: the prompt's tokens past the matched blocks."""
    return max(request.prompt_tokens - matched_blocks * request.block_size, 0)


class LlmdStickyPolicy(BaselinePolicy):
    """Prefix-affinity filter with a saturation release, token-load scorer, max picker.

    Reasons: ``sticky`` (only sticky endpoints passed), ``saturation-release`` (sticky
    endpoints existed but their backlog passed τ), ``no-affinity`` (none was sticky, or
    exploration). Scores are the token load (lower is better); ``cached_blocks`` is the
    endpoint's match.
    """

    name = "llmd_sticky"

    def __init__(
        self, params: LlmdStickyParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params
        self.in_flight = InFlight()
        self._turn = 0

    def choose(self, routing: RoutingInput) -> Decision:
        p = self.params
        request, replicas = routing.request, routing.replicas
        hashes = request.block_hashes
        matched = routing.cache.longest_prefix(hashes) if hashes else {}
        cached = [matched.get(r.replica_id, 0) for r in replicas]
        backlog = [self.in_flight.prefill_tokens(r.replica_id) for r in replicas]
        sticky = [
            i for i, c in enumerate(cached) if hashes and c / len(hashes) >= p.affinity_threshold
        ]
        n = len(replicas)
        kept = list(range(n))
        reason = "no-affinity"
        if n > 1 and sticky and self._rng.random() >= p.exploration_probability:
            sticky_set = set(sticky)
            others = [i for i in kept if i not in sticky_set]
            released = False
            if p.max_ttft_penalty_ms > 0 and others:
                gap_tokens = min(backlog[i] for i in sticky) - min(backlog[i] for i in others)
                gap_ms = gap_tokens * 1000.0 / p.peak_prefill_tokens_per_s
                released = gap_ms > p.max_ttft_penalty_ms
            if released:
                reason = "saturation-release"
            else:
                kept, reason = sticky, "sticky"
        load = [backlog[i] + _uncached_tokens(request, cached[i]) for i in range(n)]
        q = p.queue_threshold_tokens
        score = [1.0 - min(x, q) / q for x in load]
        best = max(score[i] for i in kept)
        tied = [i for i in kept if score[i] == best]
        winner = tied[self._turn % len(tied)]
        self._turn += 1
        kept_set = set(kept)
        rest = sorted((i for i in kept if i != winner), key=lambda i: (-score[i], i))
        dropped = sorted((i for i in range(n) if i not in kept_set), key=load.__getitem__)
        # Lower is better and never decreases along the ranking: kept ones by load, the
        # filtered-out ones after the highest kept load.
        ceiling = max(load[i] for i in kept) + 1.0
        ranks = [float(load[i]) if i in kept_set else ceiling + load[i] for i in range(n)]
        order = [winner, *rest, *dropped]
        return Decision(self.name, by_score(replicas, order, ranks, cached), reason)

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """Count the request's uncached tokens against its endpoint until its first token."""
        self.in_flight.add(
            chosen.replica_id, request.request_id, _uncached_tokens(request, chosen.cached_blocks)
        )

    def on_first_token(
        self, request: RequestView, chosen: Candidate, observed_ttft_ms: float
    ) -> None:
        self.in_flight.done(request.request_id)

    def on_done(self, request: RequestView, chosen: Candidate) -> None:
        self.in_flight.done(request.request_id)
