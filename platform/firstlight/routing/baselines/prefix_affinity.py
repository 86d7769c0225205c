"""The ``prefix_affinity`` baseline: Ray Serve LLM's ``PrefixCacheAffinityRouter``.

Algorithm (``ray/llm/_internal/serve/request_router/prefix_aware/prefix_aware_router.py``,
``_prefix_match_best_replicas`` and ``choose_replicas``; the tree is ``prefix_tree.py``):

1. If ``max(queue_len) - min(queue_len) > imbalanced_threshold`` over the candidates,
   fall back to power of two choices (``pow_2_router.py``).
2. Otherwise match the prompt against the router's approximate prefix tree of
   previously routed prompts. If ``match_rate = matched / prompt length`` is
   ``>= match_rate_threshold``, the candidate set is the replicas holding that longest
   match; else it is the replicas with the smallest trees.
3. Ray's base router then picks the candidate with the lowest queue length (strict
   ``<``: the first of equals).
4. ``on_request_routed`` inserts the prompt into the chosen replica's tree. An optional
   loop (``do_eviction``, off by default) runs every ``eviction_interval_secs`` and trims
   every tenant above ``eviction_threshold_chars`` down to ``eviction_target_chars``,
   least recently used first, all nodes of the oldest timestamp together
   (``PrefixTree.evict_tenant_by_lru``).

Defaults are ``PrefixCacheAffinityRouter.initialize_state``'s: ``imbalanced_threshold=10``,
``match_rate_threshold=0.1``, ``do_eviction=False``, ``eviction_threshold_chars=400_000``,
``eviction_target_chars=360_000``, ``eviction_interval_secs=10``.

Where our inputs differ:

* The tree is keyed by ``RequestView.block_hashes`` (leading block first) rather than the
  prompt's characters: match rate is matched blocks / prompt blocks, and the eviction
  sizes count blocks (the published numbers are kept as is).
* ``do_eviction`` is expressed as ``eviction_interval_s``: ``None`` (the default) never
  evicts; a number evicts, inside ``on_routed``, once that many seconds have passed on
  the injected clock (Ray's loop period is 10 s).
* Ray takes the smallest tenants over its whole tree, which may include replicas that are
  not candidates; here only candidates count (one never routed to has size 0, as Ray
  adds every replica to the tree with an empty prompt).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated, Self

from pydantic import Field, model_validator

from firstlight.config import FieldValueError
from firstlight.routing.baselines._common import (
    TreePolicy,
    by_position,
    by_score,
    power_of_two_order,
)
from firstlight.routing.decision import Candidate, Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RequestView, RoutingInput

__all__ = ["PrefixAffinityParams", "PrefixAffinityPolicy"]


class PrefixAffinityParams(PolicyParams):
    """Parameters of the ``prefix_affinity`` policy (Ray's defaults)."""

    imbalanced_threshold: Annotated[int, Field(ge=0, le=1_000_000)] = 10
    """Fall back to power of two choices when max minus min queue length exceeds this."""
    match_rate_threshold: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Prefer the best-matching replicas when their match rate is at least this; below
    it, prefer the replicas with the smallest trees."""
    eviction_interval_s: Annotated[float | None, Field(ge=0, le=86_400)] = None
    """Seconds between eviction passes; ``None`` (Ray's ``do_eviction=False``) never
    evicts, 0 evicts after every routed request. Ray's period, when enabled, is 10 s."""
    eviction_threshold_blocks: Annotated[int, Field(ge=1, le=2**40)] = 400_000
    """A replica's tree larger than this is trimmed by an eviction pass (Ray's
    ``eviction_threshold_chars``)."""
    eviction_target_blocks: Annotated[int, Field(ge=0, le=2**40)] = 360_000
    """... down to this many blocks (``eviction_target_chars``)."""

    @model_validator(mode="after")
    def _target_below_threshold(self) -> Self:
        if self.eviction_target_blocks > self.eviction_threshold_blocks:
            raise FieldValueError(
                "eviction_target_blocks",
                self.eviction_target_blocks,
                f"must not exceed eviction_threshold_blocks ({self.eviction_threshold_blocks})",
            )
        return self


class PrefixAffinityPolicy(TreePolicy):
    """Power of two when imbalanced, else the least loaded of the best-matching replicas
    (match rate >= threshold) or of the smallest trees.

    Reasons and scores (lower is better): ``imbalanced-power-of-two`` (rank),
    ``prefix-match`` (1 - match rate, then queue length), ``smallest-tree`` (tree size in
    blocks, then queue length). ``cached_blocks`` is the candidate's match in the tree.
    """

    name = "prefix_affinity"

    def __init__(
        self, params: PrefixAffinityParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params

    def choose(self, routing: RoutingInput) -> Decision:
        p = self.params
        replicas = routing.replicas
        loads = [r.queue_len for r in replicas]
        if max(loads) - min(loads) > p.imbalanced_threshold:
            order = power_of_two_order(replicas, self._rng)
            return Decision(self.name, by_position(replicas, order), "imbalanced-power-of-two")
        hashes = routing.request.block_hashes
        matched = self._tree.match(hashes) if hashes else {}
        cached = [matched.get(r.replica_id, 0) for r in replicas]
        best = max(cached)
        if hashes and best / len(hashes) >= p.match_rate_threshold:
            scores = [1.0 - c / len(hashes) for c in cached]
            reason = "prefix-match"
        else:
            scores = [float(self._tree.size(r.replica_id)) for r in replicas]
            reason = "smallest-tree"
        order = sorted(range(len(replicas)), key=lambda i: (scores[i], loads[i]))
        return Decision(self.name, by_score(replicas, order, scores, cached), reason)

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """Insert the prompt into the chosen replica's tree; run an eviction pass if due."""
        if request.block_hashes:
            self._tree.insert(request.block_hashes, chosen.replica_id)
        interval = self.params.eviction_interval_s
        now = self._clock()
        if interval is not None and now - self._last_eviction >= interval:
            self._last_eviction = now
            threshold = self.params.eviction_threshold_blocks
            for tenant in self._tree.tenants():
                if self._tree.size(tenant) > threshold:
                    self._tree.evict(
                        tenant, self.params.eviction_target_blocks, whole_insertions=True
                    )
