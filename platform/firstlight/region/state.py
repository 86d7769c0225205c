"""What one model's request router knows, shared with the gateway in the same process.

Ray Serve builds the :class:`~firstlight.serve.request_router.FirstlightRequestRouter`
inside the gateway replica's deployment handle, so the gateway cannot hold a reference
to it. Instead the router registers its :class:`RouterState` under its deployment
(:mod:`firstlight.region.registry`), and the gateway reads it: how many replicas are
live (fail-over), the local predicted TTFT (spill-over), which replica a request went to
and what was predicted (response headers), and it reports first tokens back
(calibration). Each request's route here is a :class:`~firstlight.region.ticket.Ticket`.

Everything here runs on the gateway's event loop; nothing does I/O.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, field, replace

from firstlight.hints import HintMirror, SubscriberStatus
from firstlight.region.shared_routes import RouteEvent, RouteShareStatus
from firstlight.region.stats import ReplicaStats
from firstlight.region.ticket import Ticket
from firstlight.regions.summary import ModelSummary
from firstlight.routing import (
    NO_CACHE,
    CacheView,
    Candidate,
    Decision,
    ReplicaView,
    RequestView,
    RoutingInput,
    RoutingPolicy,
)
from firstlight.routing.predicted_ttft import FirstlightParams, FirstlightPolicy

__all__ = ["PeerRoute", "Route", "RouterState", "ServedBy"]

_MAX_ROUTES = 10_000
"""Routes kept for requests whose gateway never collected them (bounded memory)."""
PEER_ROUTE_TTL_S = 600.0
"""A peer router's route whose ``done`` never came (its gateway died) stops counting
after this long."""


@dataclass(frozen=True, slots=True)
class ServedBy:
    """The first item of every ModelServer stream: which replica actually serves it
    (the ground truth for ``x-firstlight-replica``)."""

    replica_id: str


@dataclass(slots=True)
class Route:
    """Where one request went and why."""

    request: RequestView
    decision: Decision
    chosen: Candidate | None = None
    """Set when Ray actually sent the request (``on_request_routed``)."""
    routed_at: float = 0.0
    decision_s: float | None = None
    """How long the policy took to rank the replicas (metrics)."""


@dataclass(frozen=True, slots=True)
class PeerRoute:
    """A request another router of the region announced as routed, until its ``done``."""

    request: RequestView
    chosen: Candidate
    heard_at: float
    """Clock time the announcement arrived (it stops counting after
    :data:`PEER_ROUTE_TTL_S`)."""
    router: str
    """The announcing router's id (``""`` where the caller does not tell them apart)."""


@dataclass
class RouterState:
    """The live routing state of one model deployment in one region.

    Written by the request router (replica set, stats views, decisions); read by the
    gateway. ``policy`` is the configured policy; ``estimator`` is always the cost
    model, used for the region decision whatever the policy (baselines do not predict
    milliseconds). ``cache`` is the hint mirror, or ``NO_CACHE`` without Redis.
    """

    region: str
    model: str
    policy: RoutingPolicy
    cache: CacheView = NO_CACHE
    clock: Callable[[], float] = time.time
    replicas: dict[str, ReplicaView] = field(default_factory=dict)
    routes: OrderedDict[str, Route] = field(default_factory=OrderedDict)
    hints_status: Callable[[], str] = lambda: "off"
    """``off``, ``connected`` or ``stale since <time>`` (the hint subscriber's state)."""
    hints_feed: Callable[[], SubscriberStatus | None] = lambda: None
    """The hint subscriber's status; ``None`` when hints are off (metrics)."""
    stats: dict[str, ReplicaStats] = field(default_factory=dict)
    """The last routing stats of every live replica, accepting or draining, as the
    replica reported them (metrics and the dashboard read the counters in them)."""
    estimator: RoutingPolicy = field(init=False)
    prefilled: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    """Per replica: (clock time, tokens) of prefills that finished, kept until a stats
    snapshot newer than them arrives (see :meth:`set_replicas`)."""
    unrouted: dict[str, int] = field(default_factory=dict)
    """Prefill tokens of requests the gateway has sent here that Ray has not routed yet
    (request id → tokens): a burst must see its own earlier members as queued work."""
    fallbacks: int = 0
    """Requests Ray sent to another replica than the policy's first choice (the first
    choice did not answer Ray's queue-length probe in time, or was full)."""
    route_share: Callable[[], RouteShareStatus | None] = lambda: None
    """The route share's status; ``None`` without one (metrics)."""
    route_sink: Callable[[RouteEvent], None] | None = None
    """Where this router announces its routes to the region's other routers
    (:mod:`firstlight.region.shared_routes`); ``None``: it is the only one."""
    peer_routes: OrderedDict[str, PeerRoute] = field(default_factory=OrderedDict)
    """Other routers' requests in flight here, as their announcements told, by request
    id, oldest first (bounded in number and age)."""
    present: frozenset[str] = frozenset()
    """Ray's current replica set (ids), as :meth:`replica_set` last received it."""

    def __post_init__(self) -> None:
        import random

        if self.policy.predicts_ttft:
            # The routing policy itself, so estimates include its reservations.
            self.estimator = self.policy
        else:
            self.estimator = FirstlightPolicy(
                FirstlightParams(), rng=random.Random(0), clock=self.clock, name="estimate"
            )

    # --- written by the request router ------------------------------------------------

    def replica_set(self, replica_ids: Iterable[str]) -> dict[str, int]:
        """Ray's replica set is now ``replica_ids`` (a replica started, or autoscaling or
        a failure removed one). Each replica that left has its hints dropped from the
        mirror at once, not left to their TTL, and the policy forgets what it learned
        about it (``on_replica_reset``; Ray never reuses a replica id). Returns the
        hinted blocks dropped per replica that left.

        Called by :meth:`FirstlightRequestRouter.update_replicas
        <firstlight.serve.request_router.FirstlightRequestRouter.update_replicas>` and by
        the index-faults benchmark's router (``firstlight_bench.tools.index_faults``)."""
        present = frozenset(replica_ids)
        dropped = {}
        for gone in sorted(self.present - present):
            mirror = self.cache
            dropped[gone] = mirror.drop_replica(gone) if isinstance(mirror, HintMirror) else 0
            self.policy.on_replica_reset(gone)
            if self.estimator is not self.policy:
                self.estimator.on_replica_reset(gone)
        self.present = present
        return dropped

    def set_replicas(self, views: dict[str, ReplicaView]) -> None:
        """The replica set changed, or fresher stats arrived. Prefill work that finished
        after a replica's stats snapshot (its first token reached the gateway) is taken
        off the snapshot's pending tokens: stats travel through Ray's controller and can
        be a second old, long enough to make the replica that just served a prompt look
        busy with it."""
        adjusted = {}
        for rid, view in views.items():
            done = self.prefilled.get(rid)
            if done:
                done[:] = [(at, tokens) for at, tokens in done if at >= view.stats_at]
                finished = sum(tokens for _, tokens in done)
                if finished and view.pending_prefill_tokens:
                    pending = max(view.pending_prefill_tokens - finished, 0)
                    view = replace(view, pending_prefill_tokens=pending)
            adjusted[rid] = view
        for rid in set(self.prefilled) - set(views):
            del self.prefilled[rid]
        self.replicas = adjusted

    def record_decision(
        self, request: RequestView, decision: Decision, decision_s: float | None = None
    ) -> None:
        self.routes[request.request_id] = Route(request, decision, decision_s=decision_s)
        self.routes.move_to_end(request.request_id)
        while len(self.routes) > _MAX_ROUTES:
            request_id, old = self.routes.popitem(last=False)
            if old.chosen is not None:
                self.policy.on_done(old.request, old.chosen)
                self._announce(RouteEvent("done", request_id))

    def record_routed(self, request_id: str, replica_id: str) -> None:
        self.unrouted.pop(request_id, None)
        route = self.routes.get(request_id)
        if route is None:
            return
        if route.decision.winner.replica_id != replica_id:
            self.fallbacks += 1
        chosen = next((c for c in route.decision.ranked if c.replica_id == replica_id), None)
        if chosen is None:  # Ray fell back to a replica the decision did not rank
            chosen = Candidate(replica_id, self.region, float("inf"))
        route.chosen = chosen
        route.routed_at = self.clock()
        self.policy.on_routed(route.request, chosen)
        if self.route_sink is not None:
            request = route.request
            self.route_sink(
                RouteEvent(
                    "routed",
                    request_id,
                    replica_id,
                    request.prompt_tokens,
                    request.block_size,
                    request.block_hashes,
                    chosen.cached_blocks,
                    terms=chosen.terms,
                )
            )

    # --- read and reported by the gateway ---------------------------------------------

    def hint_blocks(self) -> int:
        """Blocks in the hint mirror (0 without hints)."""
        return len(self.cache) if isinstance(self.cache, Sized) else 0

    @property
    def healthy_replicas(self) -> int:
        return len(self.replicas)

    def route_of(self, request_id: str) -> Route | None:
        return self.routes.get(request_id)

    def first_token(self, request_id: str, observed_ttft_ms: float) -> None:
        """The gateway saw the first token ``observed_ttft_ms`` after routing."""
        route = self.routes.get(request_id)
        if route is not None and route.chosen is not None:
            self._prefill_done(route.request, route.chosen, observed_ttft_ms)
            self._announce(RouteEvent("first_token", request_id, observed_ttft_ms=observed_ttft_ms))

    def _prefill_done(self, request: RequestView, chosen: Candidate, observed_ms: float) -> None:
        self.policy.on_first_token(request, chosen, observed_ms)
        cached = chosen.cached_blocks * request.block_size
        tokens = max(request.prompt_tokens - cached, 1)
        self.prefilled.setdefault(chosen.replica_id, []).append((self.clock(), tokens))

    def dispatched(self, request_id: str, prefill_tokens: int) -> None:
        """The gateway is sending a request here; until Ray routes it, its prefill work
        counts in :meth:`estimate` (spread over the replicas)."""
        self.unrouted[request_id] = prefill_tokens

    def finished(self, request_id: str) -> None:
        """The request ended (any outcome): release what the policy holds for it."""
        self.unrouted.pop(request_id, None)
        route = self.routes.pop(request_id, None)
        if route is not None and route.chosen is not None:
            self.policy.on_done(route.request, route.chosen)
            self._announce(RouteEvent("done", request_id))

    def _announce(self, event: RouteEvent) -> None:
        if self.route_sink is not None:
            self.route_sink(event)

    def apply_peer_route(self, event: RouteEvent, router: str = "") -> None:
        """Router ``router`` of the region announced ``event``: its request counts in this
        router's policy (reservations, work and memory in flight, placements) as one of
        its own would, until its ``done``, and its first token calibrates the replica's
        correction with the terms the peer predicted. Called by the route-share adapter
        and by the simulator; events of requests this router never heard routed are
        ignored."""
        peers = self.peer_routes
        if event.stage == "routed":
            request = RequestView(
                event.request_id, event.prompt_tokens, event.block_hashes, event.block_size
            )
            chosen = Candidate(event.replica_id, self.region, 0.0, event.terms, event.cached_blocks)
            now = self.clock()
            peers[event.request_id] = PeerRoute(request, chosen, now, router)
            self.policy.on_routed(request, chosen)
            while peers:
                oldest_id, oldest = next(iter(peers.items()))
                if len(peers) <= _MAX_ROUTES and now - oldest.heard_at <= PEER_ROUTE_TTL_S:
                    break
                del peers[oldest_id]
                self.policy.on_done(oldest.request, oldest.chosen)
            return
        known = peers.get(event.request_id)
        if known is None:
            return
        if event.stage == "first_token":
            self._prefill_done(known.request, known.chosen, event.observed_ttft_ms)
        else:
            del peers[event.request_id]
            self.policy.on_done(known.request, known.chosen)

    def forget_peer_routes(self, router: str | None = None) -> int:
        """Release the routes heard from ``router`` (``None``: from every router), whose
        ``done`` may never come (the share lost messages); returns how many. Until new
        announcements arrive, this router counts them no more, as with no share."""
        gone = [rid for rid, peer in self.peer_routes.items() if router in (None, peer.router)]
        for request_id in gone:
            peer = self.peer_routes.pop(request_id)
            self.policy.on_done(peer.request, peer.chosen)
        return len(gone)

    def estimate(self, request: RequestView) -> Decision | None:
        """The cost model's view of the best local replica, or ``None`` when there is
        no replica. Used by the gateway's region decision; reserves nothing."""
        if not self.replicas:
            return None
        views = tuple(self.replicas.values())
        if self.unrouted:
            share = sum(self.unrouted.values()) // len(views)
            views = tuple(
                replace(v, pending_prefill_tokens=(v.pending_prefill_tokens or 0) + share)
                for v in views
            )
        return self.estimator.choose(RoutingInput(request, views, self.cache))

    def admit(self, request: RequestView, *, estimate: bool = True) -> Ticket:
        """The request's ticket in this region: the cost model's estimate now (for the
        region decision), to be committed if the request is served here. Called by the
        gateway once per request and once per retry (:mod:`firstlight.api.gateway`), and
        by the benchmark's simulator (:mod:`firstlight_bench.simulator.sim_region`), which passes
        ``estimate=False`` where no region decision is taken: the ticket then holds no
        estimate and :meth:`Ticket.commit` runs the policy."""
        if not estimate:
            return Ticket(self, request, None, 0.0)
        started = time.perf_counter()
        local = self.estimate(request)
        return Ticket(self, request, local, time.perf_counter() - started)

    def decide(self, request: RequestView) -> Decision | None:
        """Run the routing policy for ``request`` and record its decision as the route
        to execute (``None`` without replicas). Called when no estimate can stand for the
        policy's choice: a baseline policy, or a resumed stream's continuation."""
        if not self.replicas:
            return None
        started = time.perf_counter()
        decision = self.policy.choose(
            RoutingInput(request, tuple(self.replicas.values()), self.cache)
        )
        self.record_decision(request, decision, time.perf_counter() - started)
        return decision

    def summary(self, hot_blocks: frozenset[int] = frozenset()) -> ModelSummary:
        """This model's entry in the region's summary for peers: the cost model's floor
        (queueing + step overhead on the best replica, nothing cached), the same averaged
        over the replicas, the calibrated prefill cost on the best one, and of
        ``hot_blocks`` (served recently) those a replica still caches by the hint mirror.
        Called by the gateway per summary request and by the benchmark's simulator per
        probe."""
        decision = self.estimate(RequestView("summary", 1))
        if decision is None or decision.winner.terms is None:
            return ModelSummary(0, 0.0, 0.0)
        terms = decision.winner.terms
        best = self.replicas.get(decision.winner.replica_id)
        # A one-token request with nothing cached: each candidate's score is its wait,
        # overhead and one token's prefill (no affinity penalty applies).
        ms_per_token = terms.prefill_ms / max(terms.uncached_tokens, 1)
        scores = [c.score for c in decision.ranked]
        views = list(self.replicas.values())
        if self.cache is not NO_CACHE:
            # Served recently *and* still cached on a replica here (the hint mirror):
            # a block the engines evicted is no hit for a peer's request.
            lookup = self.cache.longest_prefix
            hot_blocks = frozenset(b for b in hot_blocks if lookup((b,)))
        reported = all(v.kv_cache_blocks for v in views)
        return ModelSummary(
            healthy_replicas=self.healthy_replicas,
            predicted_wait_ms=terms.wait_ms + terms.overhead_ms,
            prefill_ms_per_token=ms_per_token,
            hot_blocks=hot_blocks,
            measured=best is not None and best.prefill_tokens_per_s is not None,
            mean_wait_ms=max(sum(scores) / len(scores) - ms_per_token, 0.0),
            step_ms=terms.overhead_ms,
            kv_used_blocks=round(sum(v.kv_cache_usage * (v.kv_cache_blocks or 0) for v in views))
            if reported
            else None,
            kv_total_blocks=sum(v.kv_cache_blocks or 0 for v in views) if reported else None,
            mean_queue_len=sum(v.queue_len for v in views) / len(views) if views else None,
        )
