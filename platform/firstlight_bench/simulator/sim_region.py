"""One simulated region: its replicas, its gateways' router states and what they know.

The discrete-event loop (:mod:`firstlight_bench.simulator.des`) owns time, arrivals and requests
in flight; a :class:`SimRegion` owns what the region's gateways and request routers hold,
built from the serving package's own objects: one
:class:`~firstlight.region.state.RouterState` with its own instance of the arm's policy
per gateway (``ClusterSpec.gateways``; requests go to them in turn, as the ingress
spreads connections; each announces its routes to the others, who apply them
``ClusterSpec.route_share_ms`` later, as the Redis pub/sub share does), a
:class:`~firstlight.hints.HintMirror` fed with the replicas' cache events (shared, as the
Redis feed is), the region's hot prefixes, the last stats snapshot of each replica and
the region's last summary as its peers read it. Called only by
:class:`firstlight_bench.simulator.des._Run`.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from firstlight.engine.sim import SimCacheEvent, SimCore, SimProfile, VirtualSim
from firstlight.hints import BlockEvent, HintMirror
from firstlight.region import ReplicaStats, RouteEvent, RouterState, Ticket, with_shared_rates
from firstlight.regions.summary import ForwardedWork, HotPrefixes, ModelSummary
from firstlight.routing import ReplicaView, RequestView, build_policy
from firstlight_bench.simulator.cluster import ClusterSpec
from firstlight_bench.simulator.region_arms import RegionLoad

__all__ = ["Routed", "SimRegion"]

_MODEL = "bench"


@dataclass(frozen=True, slots=True)
class Routed:
    """Where :meth:`SimRegion.route` sent a request, and its ticket for what follows."""

    ticket: Ticket
    """Told the request's first token and end by the event loop."""
    replica: str
    decision_us: float
    """Wall-clock decision time (estimate, choice and bookkeeping)."""
    predicted_ttft_ms: float | None
    """What the policy predicted (``None`` from a policy without a cost model)."""


@dataclass(slots=True)
class SimRegion:
    """One region of the simulated deployment (mutable; the event loop drives it)."""

    index: int
    sims: dict[str, VirtualSim]
    gateways: list[RouterState]
    """One router state per gateway; the first also makes the region's summary."""
    mirror: HintMirror
    hot: HotPrefixes = field(default_factory=HotPrefixes)
    snapshots: dict[str, ReplicaView] = field(default_factory=dict)
    summary: ModelSummary | None = None
    forwarded: dict[int, ForwardedWork] = field(default_factory=dict)
    """Peer region → the work this region forwarded there that its last summary does
    not show (the gateway's ``Peer.forwarded``)."""
    taken_by: dict[str, RouterState] = field(default_factory=dict)
    """Request id → the gateway that took it, until it ends here or is forwarded."""
    turn: int = 0
    clock: Callable[[], float] = time.time
    share_delay_s: float | None = None
    """Route announcements reach the other gateways this much later; ``None``: no share."""
    announced: deque[tuple[float, int, RouteEvent]] = field(default_factory=deque)
    """(delivery time, announcing gateway, event), oldest first."""
    up: bool = True
    """``False`` during an outage: no replica, no stats, no summary."""
    slowdown: float = 1.0
    """The replicas' step-time factor (a brownout), kept for replicas that restart."""
    restart: Callable[[str, float, int], VirtualSim] | None = None
    """Builds a fresh, cold replica ``rid`` starting at a time (after an outage), seeded
    by its generation."""
    generation: int = 0
    """How many outages the region went through (the restarted replicas' seeds)."""

    @classmethod
    def build(
        cls,
        g: int,
        cluster: ClusterSpec,
        policy_name: str,
        seed: int,
        clock: Callable[[], float],
    ) -> SimRegion:
        """Region ``g``'s replicas and router, seeded from ``seed``; the policy reads the
        hint mirror, fed with the replicas' cache events."""
        profiles = {f"g{g}-r{i:02d}": p for i, p in enumerate(cluster.region_profiles(g))}

        def replica(rid: str, start_s: float, generation: int) -> VirtualSim:
            profile: SimProfile = profiles[rid]
            i = int(rid.rsplit("r", 1)[1])
            core_seed = seed * 7919 + g * 131 + i + generation * 1_000_003
            return VirtualSim(
                SimCore(profile, hash_seed=cluster.hash_seed, seed=core_seed), start_s=start_s
            )

        sims = {rid: replica(rid, 0.0, 0) for rid in profiles}
        mirror = HintMirror(ttl_s=1e12, clock=clock)
        gateways = []
        for k in range(cluster.gateways):
            policy = build_policy(
                policy_name,
                cluster.policy_params.get(policy_name, {}),
                rng=random.Random(seed * 1_000_003 + g + k * 7_919),
                clock=clock,
            )
            gateways.append(RouterState(f"region-{g}", _MODEL, policy, cache=mirror, clock=clock))
        share = cluster.route_share_ms
        region = cls(g, sims, gateways, mirror, clock=clock, restart=replica)
        if len(gateways) > 1 and share is not None:
            region.share_delay_s = share / 1000.0
        region.rebind()
        return region

    def rebind(self) -> None:
        """Point each gateway's route sink at this region's announcements (after
        :meth:`build`, and in a copy of the simulation: a copied sink would still feed
        the original)."""
        if self.share_delay_s is not None:
            for k, state in enumerate(self.gateways):
                state.route_sink = self.announcer(k)

    def announcer(self, k: int) -> Callable[[RouteEvent], None]:
        """Gateway ``k``'s route sink: queue the event for the other gateways."""
        delay = self.share_delay_s or 0.0

        def announce(event: RouteEvent) -> None:
            self.announced.append((self.clock() + delay, k, event))

        return announce

    def deliver_routes(self) -> None:
        """Apply every announcement due by now to the gateways that did not make it."""
        now = self.clock()
        announced = self.announced
        while announced and announced[0][0] <= now:
            _, source, event = announced.popleft()
            for k, state in enumerate(self.gateways):
                if k != source:
                    state.apply_peer_route(event)

    @property
    def state(self) -> RouterState:
        """The first gateway's router state (the region's summary is made from it)."""
        return self.gateways[0]

    def gateway_for(self, request_id: str) -> RouterState:
        """The gateway that takes ``request_id`` (the next in turn for a new request),
        with every route announcement due by now applied."""
        if self.announced:
            self.deliver_routes()
        state = self.taken_by.get(request_id)
        if state is None:
            state = self.gateways[self.turn % len(self.gateways)]
            self.turn += 1
            self.taken_by[request_id] = state
        return state

    def release(self, request_id: str) -> RouterState | None:
        """The request ended here or was forwarded: the gateway that held it, if any."""
        return self.taken_by.pop(request_id, None)

    def fresh_views(self) -> None:
        """Give the router the last stats snapshot of each replica with its current
        queue length: Ray's queue-length cache is current between stats, the rest of a
        view (running, waiting, KV usage, pending prefill) is as old as the stats, as the
        gateway's request router has them."""
        if not self.up:
            for state in self.gateways:
                state.set_replicas({})
            return
        views = with_shared_rates(
            {
                rid: dataclasses.replace(
                    self.snapshots[rid], queue_len=sim.core.num_running + sim.core.num_waiting
                )
                for rid, sim in self.sims.items()
            }
        )
        for state in self.gateways:
            state.set_replicas(views)

    def admit(self, view: RequestView) -> Ticket:
        """The gateway that takes ``view`` admits it with the cost model's estimate (for
        the region decision), on the replicas' views as of now; the decision time of the
        estimate is the ticket's ``estimate_s``."""
        state = self.gateway_for(view.request_id)
        self.fresh_views()
        return state.admit(view)

    def route(self, view: RequestView, ticket: Ticket | None = None) -> Routed:
        """Serve ``view`` here: its ticket is committed and executed, as the gateway's
        transport does (``ticket``: the one :meth:`admit` gave the region decision just
        now; ``None``: admitted here without an estimate, since no region decision is
        taken, and the policy chooses at the commit — one run of the policy either way).
        The decision time covers the estimate, the choice and the bookkeeping after it
        (the policy's ``on_routed``: reservations, prefix-tree inserts), not the refresh
        of the replicas' views (the request router's stats, kept apart)."""
        if ticket is None:
            state = self.gateway_for(view.request_id)
            self.fresh_views()
            ticket = state.admit(view, estimate=False)
        began = time.perf_counter_ns()
        decision = ticket.commit()
        assert decision is not None, "routed only in a region with replicas"
        replica = decision.winner.replica_id
        ticket.routed(replica)
        decision_us = (time.perf_counter_ns() - began) / 1000.0 + ticket.estimate_s * 1e6
        self.hot.add(view.block_hashes)
        return Routed(ticket, replica, decision_us, decision.winner.predicted_ttft_ms)

    def learn_cache_events(self, replica: str) -> None:
        """Feed the replica's cache events since the last call to the hint mirror, with
        their host-tier changes (a replica with KV offloading emits
        :class:`~firstlight.engine.sim.SimCacheEvent`)."""
        for event in self.sims[replica].core.drain_cache_events():
            if isinstance(event, SimCacheEvent):
                block_event = BlockEvent(
                    replica,
                    1,
                    event.stored,
                    event.removed,
                    event.cleared,
                    event.offloaded,
                    event.offload_removed,
                )
            else:
                block_event = BlockEvent(replica, 1, event.stored, event.removed, event.cleared)
            self.mirror.apply(block_event)

    def refresh_stats(self, now: float) -> None:
        """Every replica reports its stats (Ray's controller relays them)."""
        if not self.up:
            return
        for rid, sim in self.sims.items():
            # As the gateway's routers see a replica: its stats record, turned into the
            # cost model's view by the same code (waiting included).
            stats = ReplicaStats.of_engine(sim.core.stats(), at=now)
            self.snapshots[rid] = stats.view(rid, self.state.region, None)

    def refresh_summary(self) -> None:
        """The summary peers read at their next probe (none while the region is down)."""
        if not self.up:
            self.summary = None
            return
        self.state.set_replicas(with_shared_rates(dict(self.snapshots)))
        self.summary = self.state.summary(self.hot.snapshot())

    def forwarded_work(self, peer: int) -> ForwardedWork:
        """What this region's gateway forwarded to ``peer`` since its last summary."""
        work = self.forwarded.get(peer)
        if work is None:
            work = self.forwarded[peer] = ForwardedWork()
        return work

    def load(self) -> RegionLoad:
        """The region as a multicluster gateway scrapes it (its last stats)."""
        views = list(self.snapshots.values()) if self.up else []
        count = max(len(views), 1)
        return RegionLoad(
            self.index,
            self.up and bool(self.sims),
            len(self.sims) if self.up else 0,
            sum(v.waiting for v in views) / count,
            sum(v.kv_cache_usage for v in views) / count,
            self.hot.snapshot() if self.up else frozenset(),
        )

    def set_slowdown(self, factor: float) -> None:
        """A brownout starts (``factor`` > 1) or ends (1): every step of every replica."""
        self.slowdown = factor
        for sim in self.sims.values():
            sim.core.slowdown = factor

    def go_down(self, t: float) -> None:
        """An outage: every replica is gone (the caller has taken their requests), the
        routers forget them and their hints; they come back cold when it ends."""
        assert self.restart is not None
        self.up = False
        self.summary = None
        self.hot = HotPrefixes()
        self.generation += 1
        for rid in list(self.sims):
            self.mirror.drop_replica(rid)
            for state in self.gateways:
                state.policy.on_replica_reset(rid)
            sim = self.restart(rid, t, self.generation)
            sim.core.slowdown = self.slowdown
            self.sims[rid] = sim
        self.fresh_views()

    def loads(self) -> list[int]:
        """Outstanding requests per replica."""
        return [sim.core.num_running + sim.core.num_waiting for sim in self.sims.values()]
