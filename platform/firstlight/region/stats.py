"""The stats a model replica reports to its routers, as one typed record.

Produced by the ModelServer replica (:meth:`ModelServer.record_routing_stats`) every
stats period; Ray Serve carries it to every router as a plain dict
(:meth:`ReplicaStats.to_wire`), and the request router turns it back into this record
(:meth:`ReplicaStats.from_wire`) once, on arrival. Everything else — the router state,
the cost model's replica views, the per-replica metrics, the dashboard — reads the
record's fields, never the dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from firstlight.engine.protocol import EngineStats
from firstlight.routing import ReplicaView

__all__ = ["ReplicaStats", "with_shared_rates"]


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """One replica's load, rates and counters at clock time ``at``."""

    at: float = 0.0
    """Wall-clock time of the snapshot (the replica's clock)."""
    running: int = 0
    """Requests decoding."""
    waiting: int = 0
    """Requests the engine holds but has not admitted yet."""
    pending_prefill_tokens: int | None = None
    """Prompt tokens admitted but not yet prefilled; ``None`` when not reported."""
    kv_cache_usage: float = 0.0
    """Fraction of KV-cache blocks in use, 0..1."""
    kv_cache_blocks: int | None = None
    """KV-cache capacity in blocks; ``None`` when the engine does not say."""
    prefill_tokens_per_s: float | None = None
    """Marginal prefill throughput the engine measured."""
    inter_token_latency_ms: float | None = None
    """Recent mean time between output tokens."""
    step_ms: float | None = None
    """Recent duration of a decode-only step: the fixed cost of a step."""
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache since the engine started."""
    prefix_cache_hits: int = 0
    """Of those, tokens found cached."""
    spec_draft_tokens: int = 0
    """Speculative draft tokens proposed since start."""
    spec_accepted_tokens: int = 0
    """Of those, tokens accepted."""
    inflight: int = 0
    """Streams the replica is serving."""
    accepting: bool = True
    """False while the replica drains: routers send it nothing new."""
    simulated: bool = False
    """True for the ``sim`` engine: every number is simulated."""
    epoch: int = 0
    """The replica's start time in milliseconds (its hints are fenced by it)."""
    data_address: str | None = None
    """``host:port`` where the replica serves its tokens to gateways
    (:mod:`firstlight.serve.replica_port`); ``None``: through its Ray handle only."""
    port_streams: int = 0
    """Streams served on that port since the replica started."""

    @classmethod
    def of_engine(
        cls,
        stats: EngineStats,
        *,
        at: float,
        inflight: int = 0,
        accepting: bool = True,
        epoch: int = 0,
        data_address: str | None = None,
        port_streams: int = 0,
    ) -> ReplicaStats:
        """The record of an engine's :class:`EngineStats` at time ``at``: built by the
        ModelServer replica and by the benchmark's simulator for its replicas alike."""
        return cls(
            at=at,
            running=stats.running,
            waiting=stats.waiting,
            pending_prefill_tokens=stats.pending_prefill_tokens,
            kv_cache_usage=stats.kv_cache_usage,
            kv_cache_blocks=stats.kv_cache_blocks,
            prefill_tokens_per_s=stats.prefill_tokens_per_s,
            inter_token_latency_ms=stats.inter_token_latency_ms,
            step_ms=stats.step_ms,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            spec_draft_tokens=stats.spec_draft_tokens,
            spec_accepted_tokens=stats.spec_accepted_tokens,
            inflight=inflight,
            accepting=accepting,
            simulated=stats.simulated,
            epoch=epoch,
            data_address=data_address,
            port_streams=port_streams,
        )

    def to_wire(self) -> dict[str, Any]:
        """Plain data for Ray's routing stats (crosses processes)."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ReplicaStats:
        """The record from Ray's routing stats; keys it does not know are ignored and
        missing ones take their defaults (a replica of another version)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def view(self, replica_id: str, region: str, queue_len: int | None) -> ReplicaView:
        """The cost model's view of the replica; ``queue_len`` is Ray's cached queue
        length when known (fresher than these stats between snapshots)."""
        return ReplicaView(
            replica_id=replica_id,
            region=region,
            queue_len=queue_len if queue_len is not None else self.running + self.waiting,
            running=self.running,
            waiting=self.waiting,
            pending_prefill_tokens=self.pending_prefill_tokens,
            kv_cache_usage=self.kv_cache_usage,
            kv_cache_blocks=self.kv_cache_blocks or None,
            prefill_tokens_per_s=self.prefill_tokens_per_s or None,
            step_ms=self.step_ms or None,
            stats_at=self.at,
        )


def with_shared_rates(views: dict[str, ReplicaView]) -> dict[str, ReplicaView]:
    """Give replicas that have not measured their prefill rate or step time yet the mean
    of those that have: replicas of one model in one region run the same engine on the
    same hardware, and a configured prior (optimistic by design) would make every fresh
    replica look faster than a measured one that holds the prompt's prefix."""
    rates = [v.prefill_tokens_per_s for v in views.values() if v.prefill_tokens_per_s]
    steps = [v.step_ms for v in views.values() if v.step_ms]
    if len(rates) in (0, len(views)) and len(steps) in (0, len(views)):
        return views
    rate = sum(rates) / len(rates) if rates else None
    step = sum(steps) / len(steps) if steps else None
    return {
        rid: replace(
            v,
            prefill_tokens_per_s=v.prefill_tokens_per_s or rate,
            step_ms=v.step_ms or step,
        )
        for rid, v in views.items()
    }
