"""The benchmark's discrete-event simulation: regions of simulated replicas in virtual
time, routed by the same code the gateway runs.

:func:`simulate` replays one :class:`~firstlight_bench.workloads.Workload` through one
routing arm and returns every request's :class:`~firstlight_bench.results.Outcome`.
Called by ``firstlight bench sim`` (:mod:`firstlight_bench.sim`) once per arm and load,
on the same trace. Deterministic for a seed; one process; no asyncio, no sleeping.

What runs, per region: ``replicas`` :class:`~firstlight.engine.sim.VirtualSim` replicas
of one GPU profile; a :class:`~firstlight.region.state.RouterState` with the arm's
policy (the object the gateway's request router fills); a
:class:`~firstlight.hints.HintMirror` fed with every replica's cache events at the end of
each step (the ``oracle`` arm reads the true caches instead). Requests arrive in their
client's region. Arms that may leave the region (``firstlight``, ``oracle``) take the
gateway's region decision — the same function, :func:`~firstlight.region.decide_region`,
over peers ranked by :func:`~firstlight.region.rank_peers` from their summaries
(refreshed every ``probe_interval_s``); a forwarded request reaches the peer half a round
trip later and its tokens come back half a round trip after they exist.
Every other arm (and ``firstlight_local``) routes inside the client's region only.

Replicas report stats every ``stats_period_s`` (pending prefill tokens, KV usage,
measured prefill rate: what Ray's controller relays); the queue length is always
current (Ray's queue-length cache). The policy's decision time is measured in wall
clock (``decision_us``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from firstlight.config import RouterConfig
from firstlight.engine.protocol import GenerationRequest, SamplingSettings, Usage
from firstlight.engine.sim import (
    SimCore,
    SimProfile,
    TrueCacheView,
    VirtualSim,
    VirtualStep,
    get_profile,
)
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.hints import BlockEvent, HintMirror
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.region import ReplicaStats, RouterState, with_shared_rates
from firstlight.region.decision import PeerOption, decide_region, rank_peers
from firstlight.regions.summary import HotPrefixes, ModelSummary
from firstlight.routing import ReplicaView, RequestView, RoutingInput, build_policy
from firstlight.routing.registry import REGISTRY
from firstlight_bench.results import Outcome
from firstlight_bench.workloads import TraceRequest, Workload

__all__ = [
    "ARMS",
    "ClusterSpec",
    "SimRun",
    "arm_names",
    "block_hashes",
    "kv_blocks_for",
    "simulate",
]

_MODEL = "bench"
_COST_MODEL_POLICIES = ("firstlight", "oracle")

ARMS: dict[str, tuple[str, bool]] = {
    **{name: (name, False) for name in REGISTRY},
    "firstlight": ("firstlight", True),
    "oracle": ("oracle", True),
    "firstlight_local": ("firstlight", False),
}
"""Arm name → (routing policy, may spill over to a peer region)."""


def arm_names() -> tuple[str, ...]:
    return tuple(ARMS)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The simulated deployment."""

    regions: int
    replicas_per_region: int
    profile: str = "h100-llama-8b"
    kv_cache_blocks: int | None = None
    """Per replica; ``None`` keeps the profile's."""
    rtt_ms: tuple[tuple[float, ...], ...] = ()
    """``rtt_ms[a][b]``: round trip between regions a and b; empty means 0 everywhere."""
    spill_over_margin_ms: float = 50.0
    stats_period_s: float = 0.5
    probe_interval_s: float = 1.0
    hash_seed: int = 0
    policy_params: dict[str, object] = field(default_factory=dict)
    """Parameters of the cost-model arms (``firstlight``, ``oracle``); baselines keep
    their published defaults."""

    def rtt(self, a: int, b: int) -> float:
        return self.rtt_ms[a][b] if self.rtt_ms else 0.0

    def build_profile(self) -> SimProfile:
        profile = get_profile(self.profile)
        if self.kv_cache_blocks is not None:
            # A smaller cache also caps the longest request it can hold.
            longest = min(profile.max_model_len, self.kv_cache_blocks * profile.block_size)
            profile = dataclasses.replace(
                profile, kv_cache_blocks=self.kv_cache_blocks, max_model_len=longest
            )
        return profile


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


@dataclass(slots=True)
class _Region:
    index: int
    sims: dict[str, VirtualSim]
    state: RouterState
    mirror: HintMirror
    hot: HotPrefixes
    snapshots: dict[str, ReplicaView] = field(default_factory=dict)
    summary: ModelSummary | None = None
    forwarded: dict[int, int] = field(default_factory=dict)
    """Peer region → prompt tokens this region forwarded there since the last probe
    (the gateway's ``Peer.forwarded_tokens``)."""


def block_hashes(workload: Workload, cluster: ClusterSpec) -> dict[str, tuple[int, ...]]:
    """Every request's hint-form block hashes (the gateway's), computed once per
    workload content and shared by all arms and loads (they do not depend on the rate)."""
    scheme = HashScheme(cluster.build_profile().block_size, cluster.hash_seed)
    return {r.request_id: hint_hashes(r.prompt, scheme) for r in workload.requests}


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

    Raises :class:`ConfigError` for an unknown arm, a workload with more client regions
    than the cluster has, or an RTT matrix of the wrong shape.
    """
    if arm not in ARMS:
        raise ConfigError(
            [ConfigProblem("arms", f"unknown arm; known: {', '.join(ARMS)}", arm, True)]
        )
    if workload.regions > cluster.regions:
        raise ConfigError(
            [
                ConfigProblem(
                    "regions",
                    f"the workload has {workload.regions} client regions",
                    cluster.regions,
                    True,
                )
            ]
        )
    if cluster.rtt_ms and (
        len(cluster.rtt_ms) != cluster.regions
        or any(len(row) != cluster.regions for row in cluster.rtt_ms)
    ):
        raise ConfigError(
            [
                ConfigProblem(
                    "rtt_ms", f"must be {cluster.regions} x {cluster.regions}", cluster.rtt_ms, True
                )
            ]
        )
    started = time.perf_counter()
    if hashes is None:
        hashes = block_hashes(workload, cluster)
    return _Run(workload, arm, cluster, seed, hashes).run(started)


class _Run:
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
        policy_name, self.may_spill = ARMS[arm]
        self.router = RouterConfig(spill_over_margin_ms=cluster.spill_over_margin_ms)
        profile = cluster.build_profile()
        self.block_size = profile.block_size
        self.regions: list[_Region] = []
        oracle = REGISTRY[policy_name].needs_true_cache
        for g in range(cluster.regions):
            sims = {
                f"g{g}-r{i:02d}": VirtualSim(
                    SimCore(profile, hash_seed=cluster.hash_seed, seed=seed * 7919 + g * 131 + i)
                )
                for i in range(cluster.replicas_per_region)
            }
            mirror = HintMirror(ttl_s=1e12, clock=self.clock)
            cache = TrueCacheView({rid: s.core for rid, s in sims.items()}) if oracle else mirror
            policy = build_policy(
                policy_name,
                cluster.policy_params if policy_name in _COST_MODEL_POLICIES else {},
                rng=random.Random(seed * 1_000_003 + g),
                clock=self.clock,
            )
            state = RouterState(f"region-{g}", _MODEL, policy, cache=cache, clock=self.clock)
            self.regions.append(_Region(g, sims, state, mirror, HotPrefixes()))
        self.flights: dict[str, _Flight] = {}
        self.outcomes: list[Outcome] = []
        # Replica step ends: (end time, sequence, region, replica id); an entry whose
        # time is not the replica's current step end (``scheduled``) is stale.
        self.steps: list[tuple[float, int, int, str]] = []
        self.scheduled: dict[str, float] = {}
        # Forwarded requests arriving at a peer: (time, sequence, region, request id).
        self.forwards: list[tuple[float, int, int, str]] = []
        self.seq = 0
        self.imbalance_sum = 0.0
        self.imbalance_n = 0

    # --- the event loop -------------------------------------------------------------

    def run(self, wall_started: float) -> SimRun:
        arrivals = self.workload.requests
        next_arrival = 0
        next_stats = 0.0
        next_probe = 0.0
        self._refresh_stats()
        self._refresh_summaries()
        while next_arrival < len(arrivals) or self.steps or self.forwards:
            candidates = [
                arrivals[next_arrival].arrival_s if next_arrival < len(arrivals) else math.inf,
                self.steps[0][0] if self.steps else math.inf,
                self.forwards[0][0] if self.forwards else math.inf,
            ]
            t = min(candidates)
            # Periodic stats and peer summaries happen at their own times.
            if next_stats <= t:
                self.clock.now = next_stats
                self._refresh_stats()
                next_stats += self.cluster.stats_period_s
                continue
            if self.may_spill and next_probe <= t:
                self.clock.now = next_probe
                self._refresh_summaries()
                next_probe += self.cluster.probe_interval_s
                continue
            self.clock.now = t
            if t == candidates[1]:
                _, _, g, rid = heapq.heappop(self.steps)
                if self.scheduled.get(rid) == t:
                    self._step_end(self.regions[g], rid, t)
            elif t == candidates[2]:
                _, _, g, request_id = heapq.heappop(self.forwards)
                self._route_in_region(self.regions[g], self.flights[request_id], t)
            else:
                self._arrive(arrivals[next_arrival], t)
                next_arrival += 1
        first = arrivals[0].arrival_s if arrivals else 0.0
        return SimRun(
            self.arm,
            tuple(sorted(self.outcomes, key=lambda o: o.request_id)),
            self.imbalance_sum / self.imbalance_n if self.imbalance_n else 1.0,
            self.clock.now - first,
            time.perf_counter() - wall_started,
        )

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
        home = self.regions[request.client_region]
        if self.may_spill:
            peer = self._peer_target(home, view)
            if peer is not None:
                home.forwarded[peer] = home.forwarded.get(peer, 0) + view.prompt_tokens
                one_way_s = self.cluster.rtt(home.index, peer) / 2000.0
                flight.back_s = one_way_s
                self.seq += 1
                heapq.heappush(self.forwards, (t + one_way_s, self.seq, peer, request.request_id))
                return
        self._route_in_region(home, flight, t)

    def _peer_target(self, home: _Region, view: RequestView) -> int | None:
        """The gateway's region decision on this state: the peer region the request is
        forwarded to (simulated peers always answer), or ``None`` to serve it at home."""
        self._fresh_views(home)
        local = home.state.estimate(view)
        peers = [
            PeerOption(
                str(region.index),
                region.summary,
                self.cluster.rtt(home.index, region.index),
                home.forwarded.get(region.index, 0),
            )
            for region in self.regions
            if region is not home
            and region.summary is not None
            and region.summary.healthy_replicas > 0
        ]
        decision = decide_region(
            local,
            healthy=bool(home.state.replicas),
            from_peer=False,
            peers=rank_peers(view, peers, local),
            router=self.router,
        )
        if decision.peers:
            return int(decision.peers[0].region)
        if decision.route != "local" and decision.fallback == "refuse":
            raise RuntimeError(f"the simulation refused {view.request_id}: {decision}")
        return None

    # --- in-region routing (the request router's choose_replicas) ----------------------

    def _fresh_views(self, region: _Region) -> None:
        """The last stats snapshot of each replica with its current queue length."""
        views = {
            rid: dataclasses.replace(
                region.snapshots[rid],
                queue_len=sim.core.num_running + sim.core.num_waiting,
                running=sim.core.num_running,
                waiting=sim.core.num_waiting,
            )
            for rid, sim in region.sims.items()
        }
        region.state.set_replicas(with_shared_rates(views))

    def _route_in_region(self, region: _Region, flight: _Flight, t: float) -> None:
        state = region.state
        self._fresh_views(region)
        began = time.perf_counter_ns()
        decision = state.policy.choose(
            RoutingInput(flight.view, tuple(state.replicas.values()), state.cache)
        )
        flight.decision_us = (time.perf_counter_ns() - began) / 1000.0
        state.record_decision(flight.view, decision, flight.decision_us / 1e6)
        replica = decision.winner.replica_id
        state.record_routed(flight.view.request_id, replica)
        region.hot.add(flight.view.block_hashes)
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

    def _step_end(self, region: _Region, replica: str, t: float) -> None:
        sim = region.sims[replica]
        self._apply(region, replica, sim.advance_to(t))
        self._schedule(region.index, replica, sim)

    def _apply(self, region: _Region, replica: str, steps: list[VirtualStep]) -> None:
        """Record what completed steps did: first tokens (calibration), finished
        requests, and the cache events the region's hint mirror learns from."""
        if not steps:
            return
        sim = region.sims[replica]
        for step in steps:
            result = step.result
            for request_id in result.first_token_ids:
                flight = self.flights[request_id]
                flight.first_token_s = step.end_s
                observed_ms = (step.end_s - flight.dispatched_s) * 1000.0
                region.state.first_token(request_id, observed_ms)
            for finished in result.finished:
                self._finish(region, finished.request_id, step.end_s, finished.usage)
        for event in sim.core.drain_cache_events():
            region.mirror.apply(BlockEvent(replica, 1, event.stored, event.removed, event.cleared))

    def _finish(self, region: _Region, request_id: str, t: float, usage: Usage) -> None:
        flight = self.flights.pop(request_id)
        region.state.finished(request_id)
        request = flight.request
        back = flight.back_s
        first = flight.first_token_s
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
            )
        )

    # --- periodic: stats and summaries ----------------------------------------------

    def _refresh_stats(self) -> None:
        for region in self.regions:
            for rid, sim in region.sims.items():
                # As the gateway's routers see a replica: its stats record, turned
                # into the cost model's view by the same code (waiting included).
                stats = ReplicaStats.of_engine(sim.core.stats(), at=self.clock.now)
                region.snapshots[rid] = stats.view(rid, region.state.region, None)

    def _refresh_summaries(self) -> None:
        for region in self.regions:
            region.state.set_replicas(with_shared_rates(dict(region.snapshots)))
            region.summary = region.state.summary(region.hot.snapshot())
            region.forwarded.clear()  # the new summaries show what was forwarded

    def _sample_imbalance(self) -> None:
        loads = [
            sim.core.num_running + sim.core.num_waiting
            for region in self.regions
            for sim in region.sims.values()
        ]
        mean = sum(loads) / len(loads)
        if mean > 0:
            self.imbalance_sum += max(loads) / mean
            self.imbalance_n += 1


def kv_blocks_for(
    workload: Workload,
    hashes: Mapping[str, tuple[int, ...]],
    replicas: int,
    profile: SimProfile,
    share: float = 0.7,
    min_requests: int = 16,
) -> int:
    """Per-replica KV-cache blocks such that the workload's distinct shared blocks (held
    by more than one request) need ``share`` of the whole cluster's cache (BENCHMARKS.md),
    but at least room for ``min_requests`` requests of the workload's mean size at once
    (a replica that can hold only a handful of requests measures its KV cache, not
    routing)."""
    seen: dict[int, int] = {}
    for block_list in hashes.values():
        for block in block_list:
            seen[block] = seen.get(block, 0) + 1
    shared = sum(1 for count in seen.values() if count > 1)
    mean_tokens = workload.mean_prompt_tokens() + workload.mean_output_tokens()
    longest = max((len(r.prompt) + r.max_tokens) for r in workload.requests)
    floor_tokens = max(min_requests * mean_tokens, 2 * longest)
    wanted = math.ceil(shared / (share * replicas)) if shared else 0
    return max(wanted, math.ceil(floor_tokens / profile.block_size))
