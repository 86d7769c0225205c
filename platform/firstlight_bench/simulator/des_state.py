"""The discrete-event run's state, and what happens inside a region: the base of the
simulation's run (:class:`firstlight_bench.simulator.des._Run`).

:class:`_RunState` holds everything one run of :func:`~firstlight_bench.simulator.des.simulate`
keeps (the regions, the event heaps, the requests in flight and the outcomes) and does
what is the same for every arm once a request has its region: it travels there
(:meth:`_RunState._send`), is routed to a replica by the region's request router, the
replicas' steps are applied (first tokens, finished requests, cache events), and the
replicas' stats and the regions' summaries are refreshed on their periods. How an arm
picks the region is in :mod:`firstlight_bench.simulator.des_proxies` (GORGO's proxy,
SkyWalker's load balancers) and :mod:`firstlight_bench.simulator.des` (the event loop,
the ``firstlight`` region decision, fleet events). Only those two modules and
:mod:`firstlight_bench.simulator.des_warm` (a request's :class:`_Flight`) import this
one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from firstlight.config import RouterConfig
from firstlight.engine.protocol import GenerationRequest, SamplingSettings, Usage
from firstlight.engine.sim import (
    VirtualSim,
    VirtualStep,
)
from firstlight.region.ticket import Ticket
from firstlight.region.warm import (
    WarmOption,
)
from firstlight.routing import RequestView
from firstlight_bench.reports.results import Outcome
from firstlight_bench.simulator.cluster import ARMS, ClusterSpec
from firstlight_bench.simulator.region_arms import (
    Gorgo,
    RateWindow,
    RegionLoad,
    nearest_first,
)
from firstlight_bench.simulator.sim_region import SimRegion
from firstlight_bench.simulator.skywalker import SkyLb
from firstlight_bench.simulator.warm import WarmRecord
from firstlight_bench.workloads import FleetEvent, TraceRequest, Workload


class _Clock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class _Flight:
    """A request in flight (mutable bookkeeping)."""

    request: TraceRequest
    view: RequestView
    served_region: int | None = None
    replica: str | None = None
    dispatched_s: float = 0.0
    back_s: float = 0.0
    """Half the round trip back to the client (forwarded requests)."""
    first_token_s: float | None = None
    decision_us: float | None = None
    preset_replica: str | None = None
    """The replica a proxy that sees every region (``gorgo``) or a region's load
    balancer (``skywalker``) already chose."""
    pushed: bool = False
    """``skywalker``: another region's load balancer pushed it here (not again)."""
    predicted_first_s: float | None = None
    """When the router that chose its route predicted its first token (the cost-model
    arms): the peer's prediction for a spilled request, the region router's for one
    served where it was placed."""
    ticket: Ticket | None = None
    """Its route in the region that serves it, from :meth:`SimRegion.route` to its end;
    before that, the ticket the region decision admitted it with (``firstlight``, served
    where it arrived at that same instant)."""


def _by_distance(cluster: ClusterSpec, home: int) -> list[int]:
    """Every region, ``home`` first, then by round trip from it (ties by index)."""
    return nearest_first([cluster.rtt(home, g) for g in range(cluster.regions)], home)


class _RunState:
    """One run's state, and the steps every arm shares once a request has its region
    (see the module docstring); :class:`~firstlight_bench.simulator.des._Run` adds the
    event loop and the region decisions."""

    def __init__(
        self,
        workload: Workload,
        arm: str,
        cluster: ClusterSpec,
        seed: int,
        hashes: Mapping[str, tuple[int, ...]],
    ) -> None:
        self.workload = workload
        self.hashes = hashes
        self.arm = arm
        self.cluster = cluster
        self.clock = _Clock()
        spec = ARMS[arm]
        policy_name, self.mode = spec.policy, spec.regions
        self.probes = self.mode in ("firstlight", "waterfall", "global_pool")
        self.router = RouterConfig(spill_over_margin_ms=cluster.spill_over_margin_ms)
        profile = cluster.build_profile()
        self.block_size = profile.block_size
        self.regions = [
            SimRegion.build(g, cluster, policy_name, seed, self.clock)
            for g in range(cluster.regions)
        ]
        count = cluster.regions
        self.by_distance = [_by_distance(cluster, a) for a in range(count)]
        """Per client region, every region nearest first (itself first)."""
        self.region_of = {rid: region.index for region in self.regions for rid in region.sims}
        self.gorgo = Gorgo(profile.kv_cache_blocks) if self.mode == "gorgo" else None
        self.lbs = (
            [SkyLb(g, profile.kv_cache_blocks) for g in range(count)]
            if self.mode == "skywalker"
            else []
        )
        # Load balancer passes (skywalker): (tick, region); a pass runs at tick x PASS_S.
        self.passes: list[tuple[int, int]] = []
        self.pass_due: dict[int, int] = {}
        self.rates = [RateWindow() for _ in range(count)]
        self.loads: list[RegionLoad] = []
        # Fleet events: (time, sequence, event, starting).
        self.fleet_events: list[tuple[float, int, FleetEvent, bool]] = []
        for i, event in enumerate(workload.events):
            self.fleet_events.append((event.start_s, 2 * i, event, True))
            self.fleet_events.append((event.end_s, 2 * i + 1, event, False))
        heapq.heapify(self.fleet_events)
        self.flights: dict[str, _Flight] = {}
        self.outcomes: list[Outcome] = []
        # Replica step ends: (end time, sequence, region, replica id); an entry whose
        # time is not the replica's current step end (``scheduled``) is stale.
        self.steps: list[tuple[float, int, int, str]] = []
        self.scheduled: dict[str, float] = {}
        # Forwarded requests arriving at a peer: (time, sequence, region, request id).
        self.forwards: list[tuple[float, int, int, str]] = []
        # Pulled KV landing (the warm region): (time, sequence, region, request id,
        # replica, blocks).
        self.pulls: list[tuple[float, int, int, str, str, int]] = []
        self.seq = 0
        self.imbalance_sum = 0.0
        self.imbalance_n = 0
        self.next_arrival = 0
        self.next_stats = 0.0
        self.next_probe = 0.0
        self.next_lb_probe = 0.0 if self.lbs else math.inf
        self.warm: list[WarmRecord] = []
        self.forced: tuple[str, WarmOption] | None = None
        """In a hindsight fork: the request whose way is forced, and the way."""
        self.replay_all = False
        """Replay the way the run takes too (tests: a fork reproduces the run)."""
        self.kv_bytes_per_token = profile.kv_bytes_per_token

    # --- between regions -------------------------------------------------------------

    def _send(self, flight: _Flight, source: int, target: int, t: float) -> None:
        """The request travels from region ``source`` to ``target`` (half a round trip);
        its tokens will come back the same way."""
        one_way_s = self.cluster.rtt(source, target) / 2000.0
        flight.back_s += one_way_s
        self.seq += 1
        heapq.heappush(self.forwards, (t + one_way_s, self.seq, target, flight.request.request_id))

    def _lose(self, flight: _Flight, reason: str) -> None:
        """No region can take the request: it ends in an error."""
        request = flight.request
        self.flights.pop(request.request_id, None)
        self.outcomes.append(
            Outcome(
                request_id=request.request_id,
                arrival_s=request.arrival_s,
                first_token_s=None,
                finish_s=None,
                prompt_tokens=len(request.prompt),
                output_tokens=0,
                cached_tokens=0,
                client_region=request.client_region,
                served_region=None,
                replica=None,
                error=reason,
            )
        )

    # --- in-region routing (the request router's choose_replicas) ----------------------

    def _route_in_region(self, region: SimRegion, flight: _Flight, t: float) -> None:
        if flight.preset_replica is not None:
            replica = flight.preset_replica
            flight.ticket = None
        else:
            routed = region.route(flight.view, flight.ticket)
            flight.ticket, replica, flight.decision_us = (
                routed.ticket,
                routed.replica,
                routed.decision_us,
            )
            predicted_ms = routed.predicted_ttft_ms
            if predicted_ms is not None and flight.predicted_first_s is None:
                flight.predicted_first_s = t + predicted_ms / 1000.0
        flight.served_region, flight.replica, flight.dispatched_s = region.index, replica, t
        sim = region.sims[replica]
        self._apply(region, replica, sim.advance_to(t))
        request = flight.request
        sim.add(
            GenerationRequest(
                request.request_id, request.prompt, SamplingSettings(max_tokens=request.max_tokens)
            ),
            block_hashes=flight.view.block_hashes,
        )
        self._schedule(region.index, replica, sim)

    def _schedule(self, g: int, replica: str, sim: VirtualSim) -> None:
        """Keep one live heap entry for the replica's current step end."""
        end = sim.next_event_s()
        if end is None:
            self.scheduled.pop(replica, None)
        elif self.scheduled.get(replica) != end:
            self.scheduled[replica] = end
            self.seq += 1
            heapq.heappush(self.steps, (end, self.seq, g, replica))

    # --- replica steps ----------------------------------------------------------------

    def _step_end(self, region: SimRegion, replica: str, t: float) -> None:
        sim = region.sims[replica]
        self._apply(region, replica, sim.advance_to(t))
        self._schedule(region.index, replica, sim)

    def _apply(self, region: SimRegion, replica: str, steps: list[VirtualStep]) -> None:
        """Record what completed steps did: first tokens (calibration), finished
        requests, and the cache events the region's hint mirror learns from."""
        if not steps:
            return
        for step in steps:
            result = step.result
            for request_id in result.first_token_ids:
                flight = self.flights[request_id]
                if flight.first_token_s is None:  # else: a request placed again
                    flight.first_token_s = step.end_s
                if region.index != flight.request.client_region:  # its answer starts
                    self.regions[flight.request.client_region].forwarded_work(
                        region.index
                    ).answered(request_id)
                if region.announced:  # as any gateway that reads its state does
                    region.deliver_routes()
                if flight.ticket is not None:
                    flight.ticket.first_token((step.end_s - flight.dispatched_s) * 1000.0)
            for finished in result.finished:
                self._finish(region, finished.request_id, step.end_s, finished.usage)
        region.learn_cache_events(replica)

    def _finish(self, region: SimRegion, request_id: str, t: float, usage: Usage) -> None:
        flight = self.flights.pop(request_id)
        self._completed(request_id)
        region.release(request_id)
        if flight.ticket is not None:
            flight.ticket.finished()
        request = flight.request
        back = flight.back_s
        first = flight.first_token_s
        predicted = flight.predicted_first_s
        self.outcomes.append(
            Outcome(
                request_id=request_id,
                arrival_s=request.arrival_s,
                first_token_s=None if first is None else first + back,
                finish_s=t + back,
                prompt_tokens=len(request.prompt),
                output_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_prompt_tokens,
                client_region=request.client_region,
                served_region=flight.served_region,
                replica=flight.replica,
                decision_us=flight.decision_us,
                predicted_ttft_ms=None
                if predicted is None
                else (predicted - request.arrival_s) * 1000.0,
            )
        )

    # --- periodic: stats and summaries ----------------------------------------------

    def _refresh_stats(self) -> None:
        for region in self.regions:
            region.refresh_stats(self.clock.now)

    def _refresh_summaries(self) -> None:
        for region in self.regions:
            region.refresh_summary()
        for region in self.regions:  # each gateway reads its peers' new summaries
            for work in region.forwarded.values():
                work.reset()
        self.loads = [region.load() for region in self.regions]

    def _rescrape(self) -> None:
        """What a multicluster gateway scrapes of every region (at each probe, and at
        once when a region goes down or comes back: health checks)."""
        self.loads = [region.load() for region in self.regions]

    def _completed(self, request_id: str) -> None:
        """The request ended or its replica was lost: the proxies' load counts drop it."""
        if self.gorgo is not None:
            self.gorgo.completed(request_id)
        for lb in self.lbs:
            lb.completed(request_id)

    def _sample_imbalance(self) -> None:
        loads = [load for region in self.regions for load in region.loads()]
        mean = sum(loads) / len(loads)
        if mean > 0:
            self.imbalance_sum += max(loads) / mean
            self.imbalance_n += 1
