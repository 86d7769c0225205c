"""The ``firstlight`` policy: rank replicas by predicted time to first token.

The cost model is :mod:`firstlight.routing.cost`; this module is its hot loop (every
candidate, every request) and its bookkeeping hooks. A prompt's cached prefix is read
from the routing input's cache view: device-tier blocks by ``longest_prefix`` and, when
the view is a :class:`~firstlight.routing.views.TieredCacheView` (the hint mirror), the
host-tier blocks right after them by ``host_prefix``, credited at
``reload_ms_per_token``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Annotated, Literal

from pydantic import Field

from firstlight.routing.cost import (
    DEFAULT_RELOAD_MS_PER_TOKEN,
    Calibrator,
    CostRates,
    Reservations,
    predict_ttft,
    routed_spoken_for,
)
from firstlight.routing.decision import Candidate, Decision
from firstlight.routing.inflight import InFlight
from firstlight.routing.placements import Placements
from firstlight.routing.policy import PolicyParams
from firstlight.routing.views import ReplicaView, RequestView, RoutingInput

__all__ = ["FirstlightParams", "FirstlightPolicy"]

_EXPLAINED = 4
"""Candidates that get their full cost terms (the winner, the runner-up and the next
tiers the request router may fall back to); the rest carry only their predicted TTFT."""
_BY_TTFT_THEN_LOAD = itemgetter(0, 1)
_NO_HOST: Mapping[str, int] = {}

_HostPrefix = Callable[[Sequence[int], Mapping[str, int]], Mapping[str, int]]


class FirstlightParams(PolicyParams):
    """Parameters of the ``firstlight`` policy."""

    prefill_tokens_per_s: Annotated[float, Field(gt=0, le=10_000_000)] = 5000.0
    """Prefill throughput assumed until a replica reports its own measurement."""
    step_overhead_ms: Annotated[float, Field(ge=0, le=10_000)] = 5.0
    """Fixed cost of the engine step that emits the first token."""
    decode_ms_per_running_seq: Annotated[float, Field(ge=0, le=1000)] = 0.05
    """Extra step time per sequence already decoding on the replica."""
    mean_prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 512
    """Work assumed per waiting request when a replica reports only its queue length."""
    mean_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 128
    """Decode steps a running request is assumed to still need: how long requests that
    wait for KV memory on a replica wait (the cost model's slot wait)."""
    kv_full_fraction: Annotated[float, Field(ge=0, le=1)] = 0.7
    """On a replica that does not report its KV capacity: the usage from which its
    waiting requests are taken to wait for memory (slot wait). Below "full" because the
    reported usage is up to a stats period old; 0 counts every waiting request (which
    also prices waits for the token budget twice, and sends a merely busy region's
    requests away). On every replica, the memory use (spoken for ÷ capacity, or the
    reported usage) from which the affinity penalty counts the requests a copy there
    would hold up (``affinity_weight``)."""
    affinity_weight: Annotated[float, Field(ge=0, le=10)] = 1.0
    """Ranking penalty, in multiples of the prefill it causes, for sending a request
    away from the replica holding most of its prefix — by the hint mirror or by where
    this router last sent it (``placement_memory``): the copy it makes evicts other
    prefixes, which later requests pay for. On a pressed replica (more requests than
    it runs, or its memory at ``kv_full_fraction``) the copy's extra prefill holds up,
    or its blocks evict the prefixes of, every request there, so the prefill is counted
    once for the request and once for each request there (``1 + queue length``);
    elsewhere once. Without that factor, predicted queueing under overload pushed copies
    onto other replicas until the hit rate collapsed (``w1-overload`` in
    docs/benchmarks.md). Ranking only: predictions stay TTFTs."""
    placement_memory: Annotated[int, Field(ge=0, le=100_000_000)] = 1_000_000
    """Prefix checkpoints remembered of where this router sent requests (a weak hint
    beside the mirror, for the affinity penalty: a prefix the engine evicted still pulls
    its next request back where it will be cached again); 0 turns it off."""
    tie_margin_ms: Annotated[float, Field(ge=0, le=1000)] = 2.0
    """Candidates within one engine step (``step_overhead_ms``) plus this much of the
    best are near-ties: the one with the fewest requests outstanding wins, at random
    among equals."""
    calibration_alpha: Annotated[float, Field(gt=0, le=1)] = 0.05
    """EWMA weight of each new observed TTFT in a replica's correction factor. Small:
    single TTFTs are noisy (a request that waited for KV memory looks like a slow
    replica), and per-replica corrections that swing with them herd traffic onto
    whichever replica looks fast this second (W3 in docs/benchmarks.md)."""
    min_correction: Annotated[float, Field(gt=0, le=1)] = 0.25
    """Lower bound of the correction factor."""
    max_correction: Annotated[float, Field(ge=1, le=100)] = 4.0
    """Upper bound of the correction factor."""
    reservation_ttl_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """A reservation whose first token never came is dropped after this long."""
    reload_ms_per_token: Annotated[float, Field(ge=0, le=1000)] = DEFAULT_RELOAD_MS_PER_TOKEN
    """Cost of reloading one prompt token's KV from a replica's host tier (KV offloading:
    blocks its device evicted to host memory), milliseconds: the default model's 23,040
    KV bytes per token over a PCIe 4.0 x16 link's ~25 GB/s, rounded up to 0.001
    (:data:`~firstlight.routing.cost.DEFAULT_RELOAD_MS_PER_TOKEN`; Llama-3.1-8B: 0.0052).
    Host-tier tokens cost this instead of prefill; 0 prices them as free."""
    host_tier: bool = True
    """Read the host tier from the hint mirror and credit its blocks at
    ``reload_ms_per_token``; ``false`` sees device-tier blocks only and prices host-tier
    ones as misses (recomputed), as before the host tier was known."""
    memory_signal: Literal["router", "stats"] = "router"
    """Where the memory term's blocks spoken for come from: ``router``, this router's own
    record of the requests it sent and has not seen end (exact and current; right while
    it sees all the replicas' traffic, as with one gateway per region), or ``stats``, the
    replicas' reported usage moved by Ray's queue length (sees every router's traffic,
    coarser between stats)."""


class FirstlightPolicy:
    """Predicted-TTFT routing with calibration, reservations and random near-tie breaks.

    Built by :func:`firstlight.routing.registry.build_policy`; see
    :mod:`firstlight.routing.policy` for who calls each method.
    """

    predicts_ttft = True

    def __init__(
        self,
        params: FirstlightParams,
        *,
        rng: random.Random,
        clock: Callable[[], float],
        name: str = "firstlight",
    ) -> None:
        self.name = name
        self.params = params
        self._rng = rng
        self._clock = clock
        self._rates = CostRates(
            prefill_tokens_per_s=params.prefill_tokens_per_s,
            step_overhead_ms=params.step_overhead_ms,
            decode_ms_per_running_seq=params.decode_ms_per_running_seq,
            mean_prompt_tokens=params.mean_prompt_tokens,
            mean_output_tokens=params.mean_output_tokens,
            kv_full_fraction=params.kv_full_fraction,
            reload_ms_per_token=params.reload_ms_per_token,
        )
        self.calibrator = Calibrator(
            params.calibration_alpha, params.min_correction, params.max_correction
        )
        self.reservations = Reservations(params.reservation_ttl_s, clock)
        """Prefill tokens routed to each replica, until their first token."""
        self.in_flight = InFlight()
        """Requests routed to each replica, until they end (the ``router`` memory signal)."""
        self._routed_spoken_for: dict[str, float] = {}
        self.placements = Placements(params.placement_memory)
        """Where this router last sent each prefix (the affinity penalty's weak hint)."""
        self._routed_memory = params.memory_signal == "router"
        self._reset_at: dict[str, float] = {}
        """When each reset replica was last reset (first tokens of requests routed
        before are not calibrated on)."""

    def choose(self, routing: RoutingInput) -> Decision:
        request = routing.request
        cached = routing.cache.longest_prefix(request.block_hashes) if request.block_hashes else {}
        host = _NO_HOST
        if request.block_hashes and self.params.host_tier:
            host_prefix: _HostPrefix | None = getattr(routing.cache, "host_prefix", None)
            if host_prefix is not None:
                host = host_prefix(request.block_hashes, cached)
        scored = self._score_all(request, routing, cached, host)
        scored.sort(key=_BY_TTFT_THEN_LOAD)
        best = scored[0][0]
        # A prediction cannot tell apart candidates whose first tokens land in the same
        # engine step: the step is the scheduler's granularity.
        margin = self.params.tie_margin_ms + self._rates.step_overhead_ms
        near = [item for item in scored if item[0] - best <= margin]
        reason = "lowest-predicted-ttft"
        if len(near) > 1:
            # Near-ties go to the replica with the most KV memory to spare (the share
            # spoken for: in use, queued, routed since its stats), or, when replicas do
            # not report their capacity, the fewest requests outstanding; then at
            # random. When no prefill is queued anywhere the predictions differ by
            # little more than decode noise, and a random pick among them is the
            # ``random`` arm: it fills some replicas' memory while others have room, and
            # the next requests there wait for memory.
            self._rng.shuffle(near)
            near.sort(key=lambda item: item[1])
            reason = "near-tie"
        ordered = near + scored[len(near) :]
        ranked = [
            self._explained(request, routing, item, host.get(item[3].replica_id, 0))
            for item in ordered[:_EXPLAINED]
        ]
        # ``_make`` from a tuple: a third of the keyword-capable constructor's cost, for
        # every candidate of every decision.
        make = Candidate._make
        ranked += [
            make((replica.replica_id, replica.region, total, None, blocks))
            for total, _, blocks, replica in ordered[_EXPLAINED:]
        ]
        return Decision(self.name, tuple(ranked), reason)

    def _score_all(
        self,
        request: RequestView,
        routing: RoutingInput,
        cached: Mapping[str, int],
        host: Mapping[str, int] = _NO_HOST,
    ) -> list[tuple[float, float, int, ReplicaView]]:
        """Predicted TTFT of every replica: the hot loop, inlined for speed. Each value
        equals ``predict_ttft(...).total_ms`` (a test holds the two together).
        ``cached``: device-tier leading blocks per replica; ``host``: host-tier blocks
        right after them (empty without KV offloading)."""
        rates = self._rates
        correction_of = self.calibrator.corrections.get
        reservations_of = self.reservations.by_replica.get
        reserved_after = self.reservations.amount_after
        rtt_of = routing.rtt_ms.get
        prompt, block_size = request.prompt_tokens, request.block_size
        default_rate, mean_prompt = rates.prefill_tokens_per_s, rates.mean_prompt_tokens
        step_ms, per_seq_ms = rates.step_overhead_ms, rates.decode_ms_per_running_seq
        mean_output, kv_full = rates.mean_output_tokens, rates.kv_full_fraction
        reload_per_token = rates.reload_ms_per_token
        scored = []
        # Prefix held by each candidate (hints or placements) and its ms per token, for
        # the affinity penalty once the best holder is known. Only candidates count: the
        # mirror can still hold hints of replicas that are gone, and a penalty for
        # leaving a replica that cannot be chosen is no signal.
        holders: list[tuple[int, float]] = []
        most = 0
        placed = self.placements.held(request.block_hashes) if request.block_hashes else {}
        placed_get = placed.get
        now = self._clock()
        routed_memory = self._routed_memory
        spoken_of = self._routed_spoken_for.get
        for replica in routing.replicas:
            rid = replica.replica_id
            blocks = cached.get(rid, 0)
            reported = replica.pending_prefill_tokens
            if reported is None:
                reported = max(replica.queue_len - replica.running, 0) * mean_prompt
            queued: float = reported
            if reservations_of(rid):
                queued += reserved_after(rid, replica.stats_at)
            uncached = max(prompt - blocks * block_size, 1)
            reloaded = 0
            reload_ms = 0.0
            host_blocks = host.get(rid, 0) if host else 0
            if host_blocks:  # predict_ttft's host tokens, inlined
                device_tokens = min(blocks * block_size, prompt)
                reloaded = min(host_blocks * block_size, max(prompt - device_tokens - 1, 0))
                uncached = max(prompt - device_tokens - reloaded, 1)
                reload_ms = reloaded * reload_per_token
            ms_per_token = 1000.0 / (replica.prefill_tokens_per_s or default_rate)
            running = replica.running
            overhead = replica.step_ms
            if overhead is None:
                overhead = step_ms + running * per_seq_ms
            slot_ms = 0.0
            capacity = replica.kv_cache_blocks
            load: float = replica.queue_len
            if capacity:
                pending = replica.pending_prefill_tokens
                if pending is None:
                    pending = replica.waiting * mean_prompt
                need = (uncached + reloaded + mean_output) / block_size
                if routed_memory:  # kept by on_routed/on_done (_note_in_flight)
                    spoken_for = spoken_of(rid, 0.0)
                else:  # memory_spoken_for(), inlined
                    at_stats = replica.kv_cache_usage * capacity + pending / block_size
                    requests_at_stats = running + replica.waiting
                    per_request = at_stats / requests_at_stats if requests_at_stats else need
                    spoken_for = at_stats + (replica.queue_len - requests_at_stats) * per_request
                    age_ms = (now - replica.stats_at) * 1000.0
                    if age_ms > 0 and overhead > 0:
                        grown = running * age_ms / overhead / block_size
                        spoken_for += grown if grown < capacity else capacity
                    if spoken_for < 0:
                        spoken_for = 0.0
                load = spoken_for / capacity
                short = spoken_for + need - capacity
                if short > 0:
                    slot_ms = short / capacity * mean_output * overhead
            elif replica.kv_cache_usage >= kv_full:
                slot_ms = (replica.waiting + 1) * mean_output * overhead / max(running, 1)
            service = (
                (queued + uncached) * ms_per_token + reload_ms + overhead + slot_ms
            ) * correction_of(rid, 1.0)
            total = rtt_of(replica.region, 0.0) + service
            held = placed_get(rid, 0)
            if held < blocks + host_blocks:  # a host-tier copy is held, too
                held = blocks + host_blocks
            if held > most:
                most = held
            # On a pressed replica (requests waiting, or KV memory at kv_full) the
            # copy's extra prefill holds up, or its blocks evict the prefixes of, every
            # request there: priced once per such request. Elsewhere one prefill: the
            # copy only shares the steps of the requests decoding beside it.
            if replica.queue_len > running or (
                load >= kv_full if capacity else replica.kv_cache_usage >= kv_full
            ):
                holders.append((held, ms_per_token * (1 + replica.queue_len)))
            else:
                holders.append((held, ms_per_token))
            scored.append((total, load, blocks, replica))
        affinity = self.params.affinity_weight
        if affinity and most:
            for i, (held, ms_per_token) in enumerate(holders):
                if held < most:
                    total, load, blocks, replica = scored[i]
                    total += affinity * (most - held) * block_size * ms_per_token
                    scored[i] = (total, load, blocks, replica)
        return scored

    def _explained(
        self,
        request: RequestView,
        routing: RoutingInput,
        item: tuple[float, float, int, ReplicaView],
        host_blocks: int = 0,
    ) -> Candidate:
        """A candidate with its full cost terms (the first ``_EXPLAINED`` of a decision);
        ``host_blocks``: its host-tier blocks after the ``item``'s device-tier ones."""
        total, _, blocks, replica = item
        terms = predict_ttft(
            request,
            replica,
            cached_blocks=blocks,
            rtt_ms=routing.rtt_ms.get(replica.region, 0.0),
            reserved_tokens=self.reservations.amount_after(replica.replica_id, replica.stats_at),
            correction=self.calibrator.correction(replica.replica_id),
            rates=self._rates,
            stats_age_ms=(self._clock() - replica.stats_at) * 1000.0,
            spoken_for=self._spoken_for(replica.replica_id, request.block_size),
            host_blocks=host_blocks,
        )
        return Candidate(replica.replica_id, replica.region, total, terms, blocks)

    def _spoken_for(self, replica_id: str, block_size: int) -> float | None:
        """The router's own record of ``replica_id``'s KV blocks spoken for, or ``None``
        under the ``stats`` memory signal."""
        if not self._routed_memory:
            return None
        return self._routed_spoken_for.get(replica_id, 0.0)

    def _note_in_flight(self, replica_id: str, block_size: int) -> None:
        """Refresh ``replica_id``'s blocks spoken for by the router's record (after a
        request was added or ended there), so a decision reads it in one lookup."""
        flight = self.in_flight
        self._routed_spoken_for[replica_id] = routed_spoken_for(
            flight.active_blocks(replica_id), flight.requests(replica_id), block_size, self._rates
        )

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        if chosen.terms is not None:  # host-tier tokens are reloaded, not prefilled
            tokens = chosen.terms.uncached_tokens
        else:
            cached_tokens = chosen.cached_blocks * request.block_size
            tokens = max(request.prompt_tokens - cached_tokens, 1)
        self.reservations.reserve(chosen.replica_id, request.request_id, tokens)
        self.placements.record(request.block_hashes, chosen.replica_id)
        partial = request.prompt_tokens > len(request.block_hashes) * request.block_size
        self.in_flight.add(
            chosen.replica_id, request.request_id, 0, request.block_hashes, int(partial)
        )
        self._note_in_flight(chosen.replica_id, request.block_size)

    def on_first_token(
        self, request: RequestView, chosen: Candidate, observed_ttft_ms: float
    ) -> None:
        routed_at = self.reservations.release(request.request_id)
        if chosen.terms is None:
            return
        reset_at = self._reset_at.get(chosen.replica_id)
        if routed_at is not None and reset_at is not None and routed_at < reset_at:
            # Predicted with what the reset forgot (the prior rate before the replica's
            # first measurement): alpha is small, so one such sample would skew the
            # fresh calibration for dozens of requests.
            return
        self.calibrator.observe(chosen.replica_id, chosen.terms, observed_ttft_ms)

    def on_done(self, request: RequestView, chosen: Candidate) -> None:
        self.reservations.release(request.request_id)
        replica_id = self.in_flight.done(request.request_id)
        if replica_id is not None:
            self._note_in_flight(replica_id, request.block_size)

    def on_replica_reset(self, replica_id: str) -> None:
        """Corrections learned against the prior rate do not apply to the replica's own
        measurement (or to its restarted engine): calibrate it afresh, from the first
        tokens of requests routed after now."""
        self.calibrator.forget(replica_id)
        self._reset_at[replica_id] = self._clock()
