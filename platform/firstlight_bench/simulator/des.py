"""The benchmark's discrete-event simulation: regions of simulated replicas in virtual
time, routed by the same code the gateway runs.

:func:`simulate` replays one :class:`~firstlight_bench.workloads.Workload` through one
routing arm and returns every request's :class:`~firstlight_bench.reports.results.Outcome`.
Called by ``firstlight bench sim`` (:mod:`firstlight_bench.simulator.sim`) once per arm and load,
on the same trace. Deterministic for a seed; one process; no asyncio, no sleeping.

What runs, per region: ``replicas`` :class:`~firstlight.engine.sim.VirtualSim` replicas
of one GPU profile, or of the cluster's ``fleet`` (mixed GPU generations); a
:class:`~firstlight.region.state.RouterState` with the arm's
policy (the object the gateway's request router fills); a
:class:`~firstlight.hints.HintMirror` fed with every replica's cache events at the end of
each step (one :class:`~firstlight_bench.simulator.sim_region.SimRegion` per region). Requests
arrive in their client's region. ``firstlight`` takes the gateway's region decision —
the same function, :func:`~firstlight.region.decide_region`, over peers ranked by
:func:`~firstlight.region.rank_peers` from their summaries (refreshed every
``probe_interval_s``); the cross-region arms pick the region as their designs do
(:mod:`firstlight_bench.simulator.region_arms`; ``skywalker`` queues each request at its
region's load balancer, :mod:`firstlight_bench.simulator.skywalker`, which dispatches or pushes it
on its 10 ms passes); a forwarded request reaches the peer half a round
trip later and its tokens come back half a round trip after they exist. Every other arm
(and ``firstlight_local``) routes inside the client's region, or, while its region is
down, in the nearest healthy one (latency DNS with health checks).

Fleet events (W6, :class:`~firstlight_bench.workloads.FleetEvent`): a **brownout** makes
the region's replicas' steps slower; an **outage** takes every replica of the region
away at once — the requests they held are dispatched again from their client's region
(their TTFT still counts from their arrival; one whose first token had come keeps it)
and the region's peers and health checks see it gone at once — and brings it back with
cold caches. A request no arm can place anywhere is lost (an error outcome).

The warm region (``ClusterSpec.wan_gbps``, ``firstlight`` only,
:mod:`firstlight_bench.simulator.des_warm`): a request whose prefix a peer holds is recomputed
here, forwarded, or has that prefix's KV pulled here (it joins the local replica's cache
a round trip plus its transfer later); each such request's ways are replayed in
hindsight on forks of the whole run.

Replicas report stats every ``stats_period_s`` (pending prefill tokens, KV usage,
measured prefill rate: what Ray's controller relays); the queue length is always
current (Ray's queue-length cache). The policy's decision time is measured in wall
clock (``decision_us``).

The run is one object in three layers: :class:`_Run` here (the event loop, arrivals,
the region decision of each arm, the warm region's landing pulls, fleet events) on
:class:`~firstlight_bench.simulator.des_proxies._ProxiedRun` (SkyWalker's load balancers,
GORGO's proxy) on :class:`~firstlight_bench.simulator.des_state._RunState` (the run's
state, requests travelling between regions, in-region routing, replica steps, periodic
stats and summaries).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from firstlight.region.decision import (
    PeerOption,
    decide_region,
    rank_peers,
)
from firstlight.routing import RequestView
from firstlight_bench.reports.results import Outcome
from firstlight_bench.simulator.cluster import ClusterSpec, block_hashes
from firstlight_bench.simulator.des_proxies import _ProxiedRun
from firstlight_bench.simulator.des_state import _Flight
from firstlight_bench.simulator.des_warm import measured_choices, start_pull, warm_way
from firstlight_bench.simulator.region_arms import (
    global_pool,
    waterfall,
)
from firstlight_bench.simulator.sim_region import SimRegion
from firstlight_bench.simulator.skywalker import PASS_S, PROBE_S
from firstlight_bench.simulator.warm import WarmRecord
from firstlight_bench.workloads import FleetEvent, TraceRequest, Workload

__all__ = ["SimRun", "simulate"]

_MODEL = "bench"
_PULLING = -1
""":meth:`_Run._peer_target`: the request waits for its prefix's KV (not a region)."""


@dataclass(frozen=True, slots=True)
class SimRun:
    """One arm's run over one workload."""

    arm: str
    outcomes: tuple[Outcome, ...]
    imbalance: float
    """Mean over arrivals of max/mean outstanding requests per replica (1 = balanced)."""
    duration_s: float
    """Virtual time from the first arrival to the last token."""
    wall_s: float
    warm: tuple[WarmRecord, ...] = ()
    """The warm requests (``ClusterSpec.wan_gbps``, ``firstlight`` only), in order."""


def simulate(
    workload: Workload,
    arm: str,
    cluster: ClusterSpec,
    *,
    seed: int = 0,
    hashes: Mapping[str, tuple[int, ...]] | None = None,
) -> SimRun:
    """Replay ``workload`` through ``arm`` on ``cluster`` (see the module docstring);
    ``hashes`` from :func:`block_hashes` saves recomputing them per arm.

    Raises :class:`~firstlight.errors.ConfigError` for what :meth:`ClusterSpec.check`
    refuses.
    """
    cluster.check(arm, workload.regions)
    started = time.perf_counter()
    if hashes is None:
        hashes = block_hashes(workload, cluster)
    return _Run(workload, arm, cluster, seed, hashes).run(started)


class _Run(_ProxiedRun):
    # --- the event loop -------------------------------------------------------------

    def run(self, wall_started: float) -> SimRun:
        self._refresh_stats()
        self._refresh_summaries()
        while self._next_event():
            pass
        arrivals = self.workload.requests
        first = arrivals[0].arrival_s if arrivals else 0.0
        return SimRun(
            self.arm,
            tuple(sorted(self.outcomes, key=lambda o: o.request_id)),
            self.imbalance_sum / self.imbalance_n if self.imbalance_n else 1.0,
            self.clock.now - first,
            time.perf_counter() - wall_started,
            tuple(measured_choices(self)),
        )

    def _next_event(self) -> bool:
        """Handle the next event in time; ``False`` when none is left."""
        arrivals = self.workload.requests
        if not (
            self.next_arrival < len(arrivals)
            or self.steps
            or self.forwards
            or self.passes
            or self.pulls
        ):
            return False
        candidates = [
            arrivals[self.next_arrival].arrival_s
            if self.next_arrival < len(arrivals)
            else math.inf,
            self.steps[0][0] if self.steps else math.inf,
            self.forwards[0][0] if self.forwards else math.inf,
            self.passes[0][0] * PASS_S if self.passes else math.inf,
            self.pulls[0][0] if self.pulls else math.inf,
        ]
        t = min(candidates)
        if self.fleet_events and self.fleet_events[0][0] <= t:
            at, _, event, starting = heapq.heappop(self.fleet_events)
            self.clock.now = at
            self._fleet_event(event, starting, at)
            return True
        # Periodic stats and peer summaries happen at their own times.
        if self.next_stats <= t:
            self.clock.now = self.next_stats
            self._refresh_stats()
            self.next_stats += self.cluster.stats_period_s
            return True
        if self.probes and self.next_probe <= t:
            self.clock.now = self.next_probe
            self._refresh_summaries()
            self.next_probe += self.cluster.probe_interval_s
            return True
        if self.next_lb_probe <= t:
            self.clock.now = self.next_lb_probe
            self._probe_lbs()
            self.next_lb_probe += PROBE_S
            return True
        self.clock.now = t
        if t == candidates[3]:
            tick, g = heapq.heappop(self.passes)
            self._lb_pass(g, tick, t)
        elif t == candidates[1]:
            _, _, g, rid = heapq.heappop(self.steps)
            if self.scheduled.get(rid) == t:
                self._step_end(self.regions[g], rid, t)
        elif t == candidates[2]:
            _, _, g, request_id = heapq.heappop(self.forwards)
            flight = self.flights[request_id]
            if self.regions[g].up:
                self._arrive_at(self.regions[g], flight, t)
            else:  # it went down while the request travelled: placed again
                self._dispatch(flight, t)
        elif t == candidates[4]:
            _, _, g, request_id, replica, blocks = heapq.heappop(self.pulls)
            self._pulled(self.regions[g], self.flights[request_id], replica, blocks, t)
        else:
            self.next_arrival += 1  # first: a fork made during the arrival goes on after it
            self._arrive(arrivals[self.next_arrival - 1], t)
        return True

    # --- arrivals and the region decision ----------------------------------------------

    def _arrive(self, request: TraceRequest, t: float) -> None:
        view = RequestView(
            request.request_id,
            len(request.prompt),
            self.hashes[request.request_id],
            self.block_size,
        )
        flight = _Flight(request, view)
        self.flights[request.request_id] = flight
        self._sample_imbalance()
        self._dispatch(flight, t)

    def _dispatch(self, flight: _Flight, t: float) -> None:
        """Place a request that is at its client's region's gateway now: pick the region
        as the arm does, then serve it there or forward it."""
        home = self.regions[flight.request.client_region]
        flight.back_s = 0.0
        flight.preset_replica = None
        target: int | None
        flight.pushed = False
        flight.predicted_first_s = None
        flight.ticket = None
        if self.mode == "firstlight":
            target = self._peer_target(home, flight, t)
            if target == _PULLING:
                self.rates[home.index].add(t)
                return
        elif self.mode in ("local", "skywalker"):
            target = home.index if home.up else self._nearest_up(home.index)
        elif self.mode == "waterfall":
            now_rates = [window.rate(t) for window in self.rates]
            capacity = self.cluster.replica_capacity_rps or math.inf
            target = waterfall(self.by_distance[home.index], self.loads, now_rates, capacity)
        elif self.mode == "global_pool":
            ordered = [self.loads[g] for g in self.by_distance[home.index]]
            target = global_pool(flight.view, ordered)
        else:
            target = self._gorgo_target(home.index, flight)
        if target is None:
            self._lose(flight, "no region can serve it")
            return
        self.rates[target].add(t)
        if target == home.index:
            self._arrive_at(home, flight, t)
            return
        home.release(flight.request.request_id)  # a gateway of the peer region takes it
        home.forwarded_work(target).sent(
            flight.request.request_id, flight.view.prompt_tokens, flight.view.prompt_blocks
        )
        self._send(flight, home.index, target, t)

    def _arrive_at(self, region: SimRegion, flight: _Flight, t: float) -> None:
        """The request reaches the region that serves it (``skywalker``: its load
        balancer's queue, which may still push it on)."""
        if not self.lbs:
            self._route_in_region(region, flight, t)
            return
        self.lbs[region.index].enqueue(flight.request.request_id, pushed=flight.pushed)
        self._schedule_pass(region.index, math.floor(t / PASS_S) + 1)

    def _peer_target(self, home: SimRegion, flight: _Flight, t: float) -> int | None:
        """The gateway's region decision on this state: the region the request is served
        in (a peer it is forwarded to, simulated peers always answer, or ``home``),
        ``None`` when it is refused, or :data:`_PULLING` when its prefix's KV is being
        pulled to ``home`` (the warm region, ``ClusterSpec.wan_gbps``)."""
        view = flight.view
        ticket = home.admit(view)
        local = ticket.estimate
        peers = [
            PeerOption(
                str(region.index),
                region.summary,
                self.cluster.rtt(home.index, region.index),
                home.forwarded_work(region.index).tokens,
                home.forwarded_work(region.index).blocks,
            )
            for region in self.regions
            if region is not home
            and region.summary is not None
            and region.summary.healthy_replicas > 0
        ]
        ranked = rank_peers(
            view,
            peers,
            local,
            self.router.spill_copy_weight,
        )
        decision = decide_region(
            local,
            healthy=bool(home.state.replicas),
            from_peer=False,
            peers=ranked,
            router=self.router,
        )
        warm = warm_way(self, home, flight, local, ranked, decision, t)
        if warm is not None:
            way, peer, prices = warm
            if way == "pull":
                assert local is not None
                start_pull(self, home, flight, local, prices, t)
                return _PULLING
            if way == "forward":
                flight.predicted_first_s = t + prices.forward_ms / 1000.0
                return peer
            flight.ticket = ticket
            return home.index
        if decision.peers:
            flight.predicted_first_s = t + decision.peers[0].predicted_ttft_ms / 1000.0
            return int(decision.peers[0].region)
        if decision.route != "local" and decision.fallback == "refuse":
            return None  # refused: no healthy replica here and no peer answers
        flight.ticket = ticket  # served here now: the estimate is the route (one run)
        return home.index

    # --- the warm region (:mod:`firstlight_bench.simulator.des_warm`) ----------------

    def _pulled(
        self, region: SimRegion, flight: _Flight, replica: str, blocks: int, t: float
    ) -> None:
        """The pulled KV lands on ``replica`` (its cache takes what fits, its routers
        learn it at once); the request is then routed in the region as any other."""
        if not region.up or replica not in region.sims:
            self._dispatch(flight, t)  # the region went down meanwhile: placed again
            return
        sim = region.sims[replica]
        self._apply(region, replica, sim.advance_to(t))
        sim.core.receive_blocks(flight.view.block_hashes[:blocks])
        region.learn_cache_events(replica)
        self._route_in_region(region, flight, t)

    # --- fleet events (W6) ---------------------------------------------------------

    def _fleet_event(self, event: FleetEvent, starting: bool, t: float) -> None:
        region = self.regions[event.region]
        if event.kind == "brownout":
            region.set_slowdown(event.slowdown if starting else 1.0)
        elif starting:
            self._outage(region, t)
        else:
            region.up = True
            region.refresh_stats(t)
            region.refresh_summary()
            self._rescrape()

    def _outage(self, region: SimRegion, t: float) -> None:
        """Every replica of ``region`` is gone: what they held is placed again."""
        lost = [f for f in self.flights.values() if f.served_region == region.index]
        for flight in lost:
            request_id = flight.request.request_id
            region.release(request_id)
            if flight.ticket is not None:
                flight.ticket.finished()
            self._completed(request_id)
            flight.served_region = flight.replica = None
        if self.lbs:  # its load balancer's queue: the clients reconnect elsewhere
            lost += [self.flights[request_id] for request_id in self.lbs[region.index].drain()]
        region.go_down(t)
        for rid in region.sims:
            self.scheduled.pop(rid, None)
        self._rescrape()
        for flight in lost:
            self._dispatch(flight, t)
