"""The cross-region arms' own machinery in the discrete-event run: SkyWalker's load
balancers (their 10 ms passes and probes), GORGO's proxy, and the nearest healthy region
the local arms fall back to (latency DNS with health checks).

:class:`_ProxiedRun` sits between :class:`~firstlight_bench.simulator.des_state._RunState`
(the run's state, in-region routing, replica steps) and
:class:`firstlight_bench.simulator.des._Run`, whose event loop and region decision call
these methods; the designs themselves are :mod:`firstlight_bench.simulator.skywalker` and
:mod:`firstlight_bench.simulator.region_arms`.
"""

from __future__ import annotations

import heapq
import time

from firstlight_bench.simulator.des_state import _Flight, _RunState


class _ProxiedRun(_RunState):
    """A run with the cross-region arms' proxies and load balancers (see the module
    docstring)."""

    # --- skywalker's load balancers ------------------------------------------------------

    def _schedule_pass(self, g: int, tick: int) -> None:
        if g not in self.pass_due:
            self.pass_due[g] = tick
            heapq.heappush(self.passes, (tick, g))

    def _lb_pass(self, g: int, tick: int, t: float) -> None:
        """One 10 ms pass of region ``g``'s load balancer over the head of its queue."""
        del self.pass_due[g]
        lb = self.lbs[g]
        if not lb.queue:
            return
        flight = self.flights[lb.queue[0]]
        began = time.perf_counter_ns()
        replica = lb.pick_replica(flight.view)
        peer = None if replica is not None else lb.pick_peer(flight.view)
        flight.decision_us = (time.perf_counter_ns() - began) / 1000.0
        if replica is not None:
            lb.dispatched(flight.view, replica)
            flight.preset_replica = replica
            self._route_in_region(self.regions[g], flight, t)
        elif peer is not None:
            lb.forwarded(flight.view, peer)
            self.regions[g].release(flight.request.request_id)
            flight.pushed = True
            self._send(flight, g, peer, t)
        if lb.queue:  # else the next request to arrive schedules the next pass
            self._schedule_pass(g, tick + 1)

    def _probe_lbs(self) -> None:
        """Every load balancer probes its replicas' waiting queues and its peers."""
        statuses = {lb.region: lb.status() for lb in self.lbs if self.regions[lb.region].up}
        for lb in self.lbs:
            region = self.regions[lb.region]
            waiting = {rid: sim.core.waiting_after_schedule for rid, sim in region.sims.items()}
            peers = {g: s for g, s in statuses.items() if g != lb.region}
            lb.probe(waiting if region.up else {}, peers)

    def _nearest_up(self, home: int) -> int | None:
        return next((g for g in self.by_distance[home] if self.regions[g].up), None)

    def _gorgo_target(self, home: int, flight: _Flight) -> int | None:
        """GORGO's proxy picks the replica among every healthy region's; its region."""
        assert self.gorgo is not None
        # Placed again (its region went down): what the proxy queued for it is gone.
        self.gorgo.completed(flight.request.request_id)
        began = time.perf_counter_ns()
        candidates = [
            (rid, self.cluster.rtt(home, g))
            for g in self.by_distance[home]
            if self.regions[g].up
            for rid in self.regions[g].sims
        ]
        replica = self.gorgo.choose(flight.view, candidates)
        flight.decision_us = (time.perf_counter_ns() - began) / 1000.0
        if replica is None:
            return None
        self.gorgo.dispatched(flight.view, replica)
        flight.preset_replica = replica
        return self.region_of[replica]
