"""The warm region in the simulator: each warm request's way (recompute here, forward to
the region holding its prefix, or pull that prefix's KV here), the pull's transfer, and
the hindsight replays on forks of the whole simulation.

Called only by :class:`firstlight_bench.simulator.des._Run` (its region decision, when the cluster
states ``wan_gbps``); the prices come from :mod:`firstlight.region.warm`, the records
are :class:`~firstlight_bench.simulator.warm.WarmRecord`. A fork is a deep copy of the run that
shares only what never changes (the trace, its block hashes, the cluster); the largest
tables (the hint mirror, the replicas' block pools) copy themselves table by table.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import zlib
from typing import TYPE_CHECKING, Any

from firstlight.region.decision import PeerChoice, RegionDecision
from firstlight.region.warm import (
    WARM_OPTIONS,
    WarmOption,
    WarmPrices,
    choose_warm,
    price_warm,
    transfer_ms,
)
from firstlight.routing import Decision
from firstlight_bench.simulator.sim_region import SimRegion
from firstlight_bench.simulator.warm import WarmRecord

if TYPE_CHECKING:
    from firstlight_bench.simulator.des import _Run
    from firstlight_bench.simulator.des_state import _Flight

__all__ = ["fork", "measured_choices", "replay", "sampled", "start_pull", "warm_way"]


def sampled(request_id: str, share: float) -> bool:
    """Whether a warm request is replayed in hindsight: a hash of its id under ``share``
    (the same requests at every arm and load)."""
    return zlib.crc32(request_id.encode()) < share * 2**32


def warm_way(
    run: _Run,
    home: SimRegion,
    flight: _Flight,
    local: Decision | None,
    ranked: tuple[PeerChoice, ...],
    decision: RegionDecision,
    t: float,
) -> tuple[WarmOption, int, WarmPrices] | None:
    """For a warm request (:func:`~firstlight.region.warm.price_warm`; only with
    ``ClusterSpec.wan_gbps``): the way the cost model takes (the forced one in a
    hindsight fork), the peer a forward goes to (the spill-over's, else the warm
    one) and the prices, recorded with its replay in hindsight when sampled.
    ``None``: not a warm request, the decision stands."""
    wan = run.cluster.wan_gbps
    if wan is None:
        return None
    rtts = {p.region: run.cluster.rtt(home.index, int(p.region)) for p in ranked}
    prices = price_warm(
        flight.view,
        local,
        ranked,
        rtts,
        kv_bytes_per_token=run.kv_bytes_per_token,
        wan_gbps=wan,
    )
    if prices is None:
        return None
    choice = choose_warm(prices, decision)
    if choice is None:
        return None
    if decision.route == "spill_over":
        peer = decision.peers[0]
        prices = dataclasses.replace(prices, forward_ms=peer.predicted_ttft_ms)
        target = int(peer.region)
    else:
        target = int(prices.peer)
    request_id = flight.view.request_id
    if run.forced is not None:
        forced_id, way = run.forced
        return (way if forced_id == request_id else choice), target, prices
    record = WarmRecord(
        request_id,
        choice,
        (prices.recompute_ms, prices.forward_ms, prices.pull_ms),
        prices.pull_bytes,
    )
    if sampled(request_id, run.cluster.hindsight_share):
        measured = replay(run, request_id, choice, t)
        record = dataclasses.replace(record, measured_ms=measured)
    run.warm.append(record)
    return choice, target, prices


def start_pull(
    run: _Run, home: SimRegion, flight: _Flight, local: Decision, prices: WarmPrices, t: float
) -> None:
    """Ask the warm peer for the prefix's KV: it lands on the local winner one round
    trip plus its transfer later (``_Run._pulled``)."""
    assert run.cluster.wan_gbps is not None
    peer = int(prices.peer)
    took_ms = run.cluster.rtt(home.index, peer) + transfer_ms(
        prices.pull_tokens, run.kv_bytes_per_token, run.cluster.wan_gbps
    )
    cached = 0 if local.winner.terms is None else local.winner.terms.cached_tokens
    blocks = (cached + prices.pull_tokens) // run.block_size
    flight.predicted_first_s = t + prices.pull_ms / 1000.0
    run.seq += 1
    heapq.heappush(
        run.pulls,
        (
            t + took_ms / 1000.0,
            run.seq,
            home.index,
            flight.request.request_id,
            local.winner.replica_id,
            blocks,
        ),
    )


def replay(
    run: _Run, request_id: str, choice: WarmOption, t: float
) -> tuple[float | None, float | None, float | None]:
    """The ways of a warm request other than ``choice`` (all three with
    ``run.replay_all``), each replayed from now to its first token on a fork of the
    whole simulation: TTFT in ms from its arrival, ``None`` when lost. The run itself
    measures the way it takes (:func:`measured_choices`)."""
    arrival = run.flights[request_id].request.arrival_s
    measured: list[float | None] = []
    for way in WARM_OPTIONS:
        if way == choice and not run.replay_all:
            measured.append(None)
            continue
        branch = fork(run)
        branch.forced = (request_id, way)
        flight = branch.flights[request_id]
        branch._dispatch(flight, t)
        while flight.first_token_s is None and request_id in branch.flights:
            if not branch._next_event():
                break
        first = flight.first_token_s
        measured.append(None if first is None else (first + flight.back_s - arrival) * 1000.0)
    return measured[0], measured[1], measured[2]


def measured_choices(run: _Run) -> list[WarmRecord]:
    """The warm records with the way each took measured by the run itself (a fork
    taking it reproduces it exactly; ``run.replay_all`` keeps the fork's)."""
    ttft = {
        o.request_id: (o.first_token_s - o.arrival_s) * 1000.0
        for o in run.outcomes
        if o.first_token_s is not None
    }
    records = []
    for record in run.warm:
        measured = record.measured_ms
        if measured is not None and not run.replay_all:
            filled = list(measured)
            filled[WARM_OPTIONS.index(record.choice)] = ttft.get(record.request_id)
            record = dataclasses.replace(record, measured_ms=(filled[0], filled[1], filled[2]))
        records.append(record)
    return records


def fork(run: _Run) -> _Run:
    """A deep copy of the simulation from now on, sharing only what never changes
    (the trace, its block hashes, the cluster); its outcomes and records start empty."""
    memo: dict[int, Any] = {
        id(run.workload): run.workload,
        id(run.hashes): run.hashes,
        id(run.cluster): run.cluster,
        id(run.router): run.router,
    }
    for hashes in run.hashes.values():
        memo[id(hashes)] = hashes
    for flight in run.flights.values():
        memo[id(flight.request)] = flight.request
        memo[id(flight.view)] = flight.view
    kept = run.outcomes, run.warm
    run.outcomes, run.warm = [], []
    try:
        copied = copy.deepcopy(run, memo)
    finally:
        run.outcomes, run.warm = kept
    for region in copied.regions:
        region.rebind()
    return copied
