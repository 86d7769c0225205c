"""The compact summary a region publishes for its peers, and what a peer predicts from it.

Every gateway serves its region's :class:`RegionSummary` at ``GET /v1/firstlight/summary``
(built by the gateway from its router states); peers fetch it with their RTT probe
(:mod:`firstlight.regions.peers`) and call :func:`predict_peer_ttft` on the hot path.
Only this crosses regions: no per-request state, no Redis.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from firstlight.routing import Decision, RequestView

__all__ = [
    "DENSE_BLOCKS",
    "ForwardedWork",
    "HotPrefixes",
    "ModelSummary",
    "PeerEstimate",
    "RegionSummary",
    "estimate_peer",
    "is_landmark",
    "leading_blocks",
    "predict_peer_ttft",
    "spills_over",
]

_DEFAULT_HOT_BLOCKS = 4096

DENSE_BLOCKS = 16
"""Hot prefixes keep each prompt's first ``DENSE_BLOCKS`` blocks, then every
``DENSE_BLOCKS``-th block and its last one (its *landmarks*). Block hashes are chained (a
block's hash covers every token before it, as vLLM's do), so a held block stands for the
whole prefix up to it and :func:`leading_blocks` reads the longest leading run from the
landmarks alone: a 12,000-token prompt in 16-token blocks is 62 entries instead of 750,
so the bounded set (and the summary peers fetch) covers twelve times more prefix, and a
long conversation's history stays visible to peers (the warm region)."""


def _always_kept(index: int) -> bool:
    """Block ``index`` is a landmark of every prompt long enough to have it."""
    return index < DENSE_BLOCKS or (index + 1) % DENSE_BLOCKS == 0


def is_landmark(index: int, count: int) -> bool:
    """Whether block ``index`` of a ``count``-block prompt is kept (:data:`DENSE_BLOCKS`)."""
    return _always_kept(index) or index == count - 1


def leading_blocks(blocks: Iterable[int], held: Container[int]) -> int:
    """How many of ``blocks``, from the first, a set of landmarks ``held`` stands for:
    up to the last held one, stopping at the first missing block that would have been a
    landmark (:data:`DENSE_BLOCKS`)."""
    count = 0
    for index, block in enumerate(blocks):
        if block in held:
            count = index + 1
        elif _always_kept(index):
            break
    return count


@dataclass(frozen=True, slots=True)
class ModelSummary:
    """One model in one region."""

    healthy_replicas: int
    predicted_wait_ms: float
    """Predicted queueing + step overhead on the region's best replica for a request
    with nothing cached (the region's floor), excluding the request's own prefill."""
    prefill_ms_per_token: float
    """Calibrated prefill cost on that replica."""
    hot_blocks: frozenset[int] = frozenset()
    """Hint-form hashes of prompt blocks the region served recently (its hot prefixes)."""
    measured: bool = False
    """Whether ``prefill_ms_per_token`` comes from a replica's measurement (``False``:
    the configured prior, which peers replace by their own measured rate)."""
    mean_wait_ms: float | None = None
    """The same prediction averaged over all healthy replicas: what forwarded requests
    meet once the peer's router spreads them (``None`` from an older peer)."""
    step_ms: float | None = None
    """The engine step that emits a first token on that replica (part of
    ``predicted_wait_ms``): a request's own time there, not a queue (``None`` from an
    older peer, which then counts it as queue)."""
    kv_used_blocks: int | None = None
    """KV-cache blocks held by running requests, summed over the healthy replicas
    (``None``: a replica does not report its capacity, or an older peer)."""
    kv_total_blocks: int | None = None
    """KV-cache capacity in blocks, summed over the healthy replicas."""
    mean_queue_len: float | None = None
    """Requests on a replica (waiting or running), averaged over the healthy replicas:
    how many requests a spilled request's extra prefill holds up there."""


@dataclass(frozen=True, slots=True)
class RegionSummary:
    """What a region says about itself; ``at`` is its wall-clock time of building it."""

    region: str
    at: float
    models: Mapping[str, ModelSummary] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "at": self.at,
            "models": {
                name: {
                    "healthy_replicas": m.healthy_replicas,
                    "predicted_wait_ms": m.predicted_wait_ms,
                    "prefill_ms_per_token": m.prefill_ms_per_token,
                    "hot_blocks": sorted(m.hot_blocks),
                    "measured": m.measured,
                    "mean_wait_ms": m.mean_wait_ms,
                    "step_ms": m.step_ms,
                    "kv_used_blocks": m.kv_used_blocks,
                    "kv_total_blocks": m.kv_total_blocks,
                    "mean_queue_len": m.mean_queue_len,
                }
                for name, m in self.models.items()
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> RegionSummary:
        """Parse a peer's summary; raises ``ValueError`` on anything malformed."""
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise ValueError("summary must be an object with a 'models' object")
        try:
            models = {}
            for name, m in data["models"].items():
                models[str(name)] = ModelSummary(
                    healthy_replicas=int(m["healthy_replicas"]),
                    predicted_wait_ms=float(m["predicted_wait_ms"]),
                    prefill_ms_per_token=float(m["prefill_ms_per_token"]),
                    hot_blocks=frozenset(int(h) for h in m.get("hot_blocks", ())),
                    measured=bool(m.get("measured", False)),
                    mean_wait_ms=None
                    if m.get("mean_wait_ms") is None
                    else float(m["mean_wait_ms"]),
                    step_ms=None if m.get("step_ms") is None else float(m["step_ms"]),
                    kv_used_blocks=_int_or_none(m.get("kv_used_blocks")),
                    kv_total_blocks=_int_or_none(m.get("kv_total_blocks")),
                    mean_queue_len=None
                    if m.get("mean_queue_len") is None
                    else float(m["mean_queue_len"]),
                )
            return cls(str(data["region"]), float(data["at"]), models)
        except (KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise ValueError(f"malformed summary: {type(exc).__name__}: {exc}") from exc


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class PeerEstimate:
    """What a request would meet in a peer region, term by term (milliseconds)."""

    rtt_ms: float
    wait_ms: float
    """Queueing there: the region's wait plus what this gateway forwarded since (with
    the step that emits the first token, ``step_ms``)."""
    service_ms: float
    """The request's own prefill of what the peer's hot prefixes miss."""
    step_ms: float = 0.0
    """The engine step included in ``wait_ms``: the request's own time, not a queue."""
    kv_usage: float | None = None
    """The share of the peer's KV cache in use once this request and what this gateway
    forwarded since the summary hold their prompts' blocks there (``None``: the peer
    does not say)."""
    cached_tokens: int = 0
    """Prompt tokens the peer's hot prefixes hold."""
    ms_per_token: float = 0.0
    """The prefill cost there (what ``service_ms`` was priced at)."""

    @property
    def total_ms(self) -> float:
        return self.rtt_ms + self.wait_ms + self.service_ms


def estimate_peer(
    summary: ModelSummary,
    request: RequestView,
    rtt_ms: float,
    local_ms_per_token: float | None = None,
    forwarded_tokens: int = 0,
    forwarded_blocks: int = 0,
) -> PeerEstimate:
    """The terms of :func:`predict_peer_ttft` (whose docstring says what they hold), and
    the peer's KV usage with this request and ``forwarded_blocks`` added."""
    cached_blocks = leading_blocks(request.block_hashes, summary.hot_blocks)
    uncached = max(request.prompt_tokens - cached_blocks * request.block_size, 1)
    wait_ms = summary.predicted_wait_ms
    if summary.mean_wait_ms is not None:
        wait_ms = max(wait_ms, summary.mean_wait_ms)
    ms_per_token = summary.prefill_ms_per_token
    if not summary.measured and local_ms_per_token is not None and ms_per_token > 0:
        wait_ms *= local_ms_per_token / ms_per_token
        ms_per_token = local_ms_per_token
    backlog_ms = forwarded_tokens * ms_per_token / max(summary.healthy_replicas, 1)
    step_ms = summary.step_ms or 0.0
    if not summary.measured and local_ms_per_token is not None and summary.prefill_ms_per_token:
        step_ms *= local_ms_per_token / summary.prefill_ms_per_token
    step_ms = min(step_ms, wait_ms)
    kv_usage = None
    if summary.kv_used_blocks is not None and summary.kv_total_blocks:
        held = (
            summary.kv_used_blocks
            + forwarded_blocks
            + max(request.prompt_blocks - cached_blocks, 1)
        )
        kv_usage = held / summary.kv_total_blocks
    return PeerEstimate(
        rtt_ms,
        wait_ms + backlog_ms,
        uncached * ms_per_token,
        step_ms,
        kv_usage,
        cached_blocks * request.block_size,
        ms_per_token,
    )


def predict_peer_ttft(
    summary: ModelSummary,
    request: RequestView,
    rtt_ms: float,
    local_ms_per_token: float | None = None,
    forwarded_tokens: int = 0,
) -> float:
    """Predicted TTFT of ``request`` if forwarded to a region with ``summary``: the
    round trip, the region's mean wait over its replicas (its floor, the best replica's,
    from a peer that does not publish the mean), the prefill work this gateway has
    forwarded there since the summary was built (``forwarded_tokens``, spread over its
    healthy replicas: without it every overloaded region forwards to the same peer until
    that peer's next summary), and the prefill of what its hot prefixes miss.

    The mean, not the best replica: the peer's router spreads forwarded requests over
    its replicas, and a summary is up to a probe interval old.

    A peer that has not measured its prefill rate yet is assumed to run at
    ``local_ms_per_token`` (the same model on the same kind of hardware) rather than at
    its optimistic prior, which would otherwise attract every request to an idle peer.
    """
    return estimate_peer(summary, request, rtt_ms, local_ms_per_token, forwarded_tokens).total_ms


def spills_over(local: Decision | None, best_peer_ms: float | None, margin_ms: float) -> bool:
    """Whether a request leaves a healthy region for its best peer: the peer's predicted
    TTFT (round trip included) beats the local winner's by more than ``margin_ms``.

    The local side is the winner's *predicted TTFT*, not its ranking score: the score
    can carry ranking-only penalties (prefix affinity) that no peer prediction has, and
    comparing them would send requests away from a region that serves them faster. The
    gateway and the benchmark's simulator both decide with this function."""
    if local is None or best_peer_ms is None:
        return False
    local_ms = local.winner.predicted_ttft_ms
    if local_ms is None:
        return False
    return best_peer_ms + margin_ms < local_ms


class ForwardedWork:
    """The prefill work a gateway has forwarded to one peer that the peer's summary does
    not show yet: requests sent since that summary whose answer has not started (their
    first token, or the end of a whole answer, has not come back). Work that has started
    is no longer queued there, so the charge clocks itself: a peer that serves quickly
    takes spilled requests as fast as it answers them, one that queues them is charged
    until its next summary shows the queue. Their KV blocks stay charged until that
    summary whether answered or not: an answered request still holds its cache there
    while it decodes, and the summary's KV usage is what counts it.

    Written by the gateway's forwarder (:mod:`firstlight.api.forward`) and by the
    benchmark's simulator; read by the region decision through
    :attr:`~firstlight.region.PeerOption.forwarded_tokens`. Not thread-safe (one event
    loop)."""

    __slots__ = ("_blocks", "_blocks_of", "_sent", "_tokens")

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._tokens = 0
        self._blocks_of: dict[str, int] = {}
        self._blocks = 0

    @property
    def tokens(self) -> int:
        """Prompt tokens sent and not answered since the last summary."""
        return self._tokens

    @property
    def blocks(self) -> int:
        """KV blocks of the prompts sent since the last summary, answered or not: a
        forwarded request holds its blocks there while it decodes, until the peer's
        next summary counts them."""
        return self._blocks

    def sent(self, request_id: str, tokens: int, blocks: int = 0) -> None:
        """``request_id`` was forwarded with ``tokens`` prompt tokens to prefill, in
        ``blocks`` KV blocks."""
        self._tokens += tokens - self._sent.get(request_id, 0)
        self._sent[request_id] = tokens
        self._blocks += blocks - self._blocks_of.get(request_id, 0)
        self._blocks_of[request_id] = blocks

    def answered(self, request_id: str) -> None:
        """Its answer started, or the forward failed: no longer queued there."""
        tokens = self._sent.pop(request_id, None)
        if tokens is not None:
            self._tokens -= tokens

    def reset(self) -> None:
        """A new summary arrived: it shows whatever of this work was still queued."""
        self._sent.clear()
        self._tokens = 0
        self._blocks_of.clear()
        self._blocks = 0

    def __len__(self) -> int:
        return len(self._sent)


class HotPrefixes:
    """The landmark blocks (:data:`DENSE_BLOCKS`) of prompts a region served recently
    (LRU, bounded).

    The gateway adds every locally served request's blocks; its summary publishes them.
    """

    def __init__(self, capacity: int = _DEFAULT_HOT_BLOCKS) -> None:
        self._capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, blocks: Sequence[int]) -> None:
        count = len(blocks)
        kept = self._blocks
        for index, block in enumerate(blocks):
            if is_landmark(index, count):
                kept[block] = None
                kept.move_to_end(block)
        while len(kept) > self._capacity:
            kept.popitem(last=False)

    def snapshot(self) -> frozenset[int]:
        return frozenset(self._blocks)
