"""The ``cache_aware`` baseline: SGLang's model gateway, now Shepherd Model Gateway (SMG).

Algorithm (``lightseekorg/smg``, ``model_gateway/src/policies/cache_aware.rs`` at
1cb0593, release 1.7; before it ``sgl-router/src/policies/cache_aware.rs``):

1. Load is *imbalanced* when ``max_load - min_load > balance_abs_threshold`` **and**
   ``max_load > min_load * balance_rel_threshold``; then the least loaded worker wins
   (``min_by_key``: the first of equals).
2. Otherwise the router looks the prompt up in its approximate radix tree of previously
   routed prompts. If the best ``match_rate = matched / prompt length`` is
   ``> cache_threshold``, the worker with that match wins; else the least loaded worker
   (SMG; sgl-router took the worker with the smallest tree, which floods a busy worker
   on misses, sglang#14532).
3. The routed prompt is inserted into the winner's tree; a background thread evicts
   least recently used leaves every ``eviction_interval_secs`` from trees larger than
   ``max_tree_size`` (``tree.rs``: ``evict_tenant_by_size``).

Defaults are the gateway's command-line defaults (SMG ``main.rs`` at 1cb0593, the same
as sgl-router's ``RouterArgs``): ``cache_threshold=0.3``, ``balance_abs_threshold=64``,
``balance_rel_threshold=1.5``, ``eviction_interval_secs=120``, ``max_tree_size=2**26``.
(The Rust ``CacheAwareConfig::default()``, 0.5 / 32 / 1.1 / 30 / 10,000, is only used
when the policy is built without the launcher's arguments.) Newer SMG builds add
KV-usage triggers and a per-request spill gate, off by default and not re-implemented.

Where our inputs differ:

* The tree is keyed by ``RequestView.block_hashes`` (leading block first) rather than the
  prompt's characters, so match rate is matched blocks / prompt blocks and tree sizes and
  ``max_tree_size_blocks`` count blocks where sgl-router counts characters (the
  published number is kept as is).
* Load is ``ReplicaView.queue_len`` (requests on the replica); sgl-router counts its own
  in-flight requests per worker, the same quantity seen from the router.
* When several replicas share the best match, sgl-router takes the first tenant in its
  concurrent map's iteration order (arbitrary but stable); here, the first in candidate
  order. Only candidates are considered (sgl-router can match a tenant that is no longer
  a worker and then falls back to the first healthy worker).
* Eviction runs inside ``on_routed`` once ``eviction_interval_s`` has passed on the
  injected clock (``0`` evicts on every routed request), not on a thread. A lookup does
  not refresh the matched tenant's recency (sgl-router's ``prefix_match`` does); the
  insert of the routed prompt does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from firstlight.routing.baselines._common import TreePolicy, by_score
from firstlight.routing.decision import Candidate, Decision
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import RequestView, RoutingInput

__all__ = ["CacheAwareParams", "CacheAwarePolicy"]


class CacheAwareParams(PolicyParams):
    """Parameters of the ``cache_aware`` policy (sgl-router's launch defaults)."""

    cache_threshold: Annotated[float, Field(ge=0, le=1)] = 0.3
    """Route by prefix match only when the best match rate exceeds this (sgl-router
    ``--cache-threshold``)."""
    balance_abs_threshold: Annotated[int, Field(ge=0, le=1_000_000)] = 64
    """Load is imbalanced only if max minus min queue length exceeds this
    (``--balance-abs-threshold``)."""
    balance_rel_threshold: Annotated[float, Field(gt=0, le=1000)] = 1.5
    """... and max queue length exceeds min times this (``--balance-rel-threshold``)."""
    eviction_interval_s: Annotated[float, Field(ge=0, le=86_400)] = 120.0
    """Seconds between eviction passes over the trees (``--eviction-interval-secs``);
    0 evicts after every routed request."""
    max_tree_size_blocks: Annotated[int, Field(ge=1, le=2**40)] = 2**26
    """An eviction pass trims each replica's tree to this many blocks
    (``--max-tree-size``, which counts characters)."""


class CacheAwarePolicy(TreePolicy):
    """Shortest queue when imbalanced, else best approximate prefix match above the
    threshold, else least loaded.

    Reasons and scores (lower is better; ties keep candidate order):
    ``imbalanced-shortest-queue`` (score = queue length), ``prefix-match``
    (1 - match rate), ``least-load`` (queue length). ``cached_blocks`` is the
    candidate's match in the tree.
    """

    name = "cache_aware"

    def __init__(
        self, params: CacheAwareParams, *, rng: random.Random, clock: Callable[[], float]
    ) -> None:
        super().__init__(rng=rng, clock=clock)
        self.params = params

    def choose(self, routing: RoutingInput) -> Decision:
        p = self.params
        replicas = routing.replicas
        n = len(replicas)
        hashes = routing.request.block_hashes
        matched = self._tree.match(hashes) if hashes else {}
        cached = [matched.get(r.replica_id, 0) for r in replicas]
        loads = [r.queue_len for r in replicas]
        max_load, min_load = max(loads), min(loads)
        if max_load - min_load > p.balance_abs_threshold and (
            max_load > min_load * p.balance_rel_threshold
        ):
            scores = [float(q) for q in loads]
            reason = "imbalanced-shortest-queue"
        else:
            best = max(cached)
            if hashes and best / len(hashes) > p.cache_threshold:
                scores = [1.0 - c / len(hashes) for c in cached]
                reason = "prefix-match"
            else:
                scores = [float(q) for q in loads]
                reason = "least-load"
        order = sorted(range(n), key=scores.__getitem__)
        return Decision(self.name, by_score(replicas, order, scores, cached), reason)

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """Insert the prompt into the chosen replica's tree; run an eviction pass if due."""
        if request.block_hashes:
            self._tree.insert(request.block_hashes, chosen.replica_id)
        now = self._clock()
        if now - self._last_eviction >= self.params.eviction_interval_s:
            self._last_eviction = now
            limit = self.params.max_tree_size_blocks
            for tenant in self._tree.tenants():
                if self._tree.size(tenant) > limit:
                    self._tree.evict(tenant, limit)
