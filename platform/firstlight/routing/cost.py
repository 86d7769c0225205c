"""The predicted-TTFT cost model, its online calibration and the herding guard.

``predicted_ttft_ms = rtt + wait + prefill + overhead`` for a request *q* on replica *r*::

    ms_per_token = 1000 / prefill_tokens_per_s(r) * correction(r)
    step_ms      = step_ms(r), measured by the engine, or else
                   step_overhead_ms + running(r) * decode_ms_per_running_seq
    wait         = (queued prefill tokens + tokens reserved since r's stats) * ms_per_token
                   + (waiting(r) + 1) * mean_output_tokens * step_ms / running(r) * correction(r)
                     [only when r's KV cache is at least kv_full_fraction in use]
    prefill      = max(tokens(q) - cached_tokens(q, r), 1) * ms_per_token
    overhead     = step_ms * correction(r)

``prefill_tokens_per_s(r)`` is the engine's *marginal* rate and ``step_ms(r)`` its
measured fixed cost per step: a rate measured over whole steps would fold the fixed cost
into every token, and a replica that served short prompts would look slow for long ones.

The second wait term is the **slot wait**, counted when the replica reports its KV cache
at least ``kv_full_fraction`` full: vLLM admits a waiting request as soon as its KV blocks
fit, so on a full replica the requests the engine still holds *waiting*, and then this
one, wait for running ones to finish and free memory — each departure takes about
``mean_output_tokens`` decode steps spread over the ``running`` sequences. Without it, a
replica holding a hot prefix looks cheap (little prefill left to do) while its queue
waits for memory, and requests herd onto it. (On a replica with free memory, waiting
requests wait for the step's token budget: the prefill term already prices that.)

``correction(r)`` is an EWMA of observed over predicted service time, per replica
(:class:`Calibrator`); reservations (:class:`Reservations`) add a pick's prefill work to
its replica at once, so a burst of identical requests does not all land on the replica
that looked best before any of them arrived. Everything here is pure and synchronous;
the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from firstlight.routing.decision import TtftTerms
from firstlight.routing.views import ReplicaView, RequestView

__all__ = [
    "Calibrator",
    "CostRates",
    "Reservations",
    "predict_ttft",
    "slot_wait_ms",
    "step_ms",
]


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
    """KV-cache usage from which waiting requests are taken to wait for memory."""


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


def predict_ttft(
    request: RequestView,
    replica: ReplicaView,
    *,
    cached_blocks: int,
    rtt_ms: float,
    reserved_tokens: int,
    correction: float,
    rates: CostRates,
) -> TtftTerms:
    """Predict the time to first token of ``request`` on ``replica``, term by term."""
    cached = min(cached_blocks * request.block_size, request.prompt_tokens)
    # vLLM always computes at least the last prompt token, even on a full cache hit.
    uncached = max(request.prompt_tokens - cached, 1)
    if replica.pending_prefill_tokens is not None:
        queued = replica.pending_prefill_tokens
    else:
        queued = max(replica.queue_len - replica.running, 0) * rates.mean_prompt_tokens
    rate = replica.prefill_tokens_per_s or rates.prefill_tokens_per_s
    ms_per_token = 1000.0 / rate * correction
    overhead = step_ms(replica, rates)
    return TtftTerms(
        rtt_ms=rtt_ms,
        wait_ms=(queued + reserved_tokens) * ms_per_token
        + slot_wait_ms(replica, rates) * correction,
        prefill_ms=uncached * ms_per_token,
        overhead_ms=overhead * correction,
        cached_tokens=cached,
        uncached_tokens=uncached,
        correction=correction,
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

    def correction(self, replica_id: str) -> float:
        state = self._state.get(replica_id)
        return state.correction if state else 1.0

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

    def forget(self, replica_id: str) -> None:
        """Drop a replica's history (it restarted or left)."""
        self._state.pop(replica_id, None)


class Reservations:
    """Prefill work promised to replicas but not yet visible in their stats.

    A reservation counts against its replica only while it is newer than the replica's
    last stats snapshot (after that, the replica's own ``pending_prefill_tokens`` has
    it) and until the request's first token, end, or ``ttl_s`` — whichever is first.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._by_replica: dict[str, dict[str, tuple[int, float]]] = {}
        self._replica_of: dict[str, str] = {}

    def reserve(self, replica_id: str, request_id: str, tokens: int) -> None:
        self.release(request_id)
        self._by_replica.setdefault(replica_id, {})[request_id] = (tokens, self._clock())
        self._replica_of[request_id] = replica_id

    def release(self, request_id: str) -> None:
        replica_id = self._replica_of.pop(request_id, None)
        if replica_id is not None:
            self._by_replica[replica_id].pop(request_id, None)

    def tokens_after(self, replica_id: str, since: float) -> int:
        """Tokens reserved on ``replica_id`` after clock time ``since``."""
        entries = self._by_replica.get(replica_id)
        if not entries:
            return 0
        expired_before = self._clock() - self._ttl_s
        total = 0
        for request_id, (tokens, at) in list(entries.items()):
            if at < expired_before:
                del entries[request_id]
                self._replica_of.pop(request_id, None)
            elif at >= since:
                total += tokens
        return total

    def __len__(self) -> int:
        return len(self._replica_of)
