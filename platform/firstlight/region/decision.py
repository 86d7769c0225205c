"""The region decision: serve a request here, forward it to a peer region, or refuse it.

One pure function, :func:`decide_region`, called by the gateway for every request
(:meth:`firstlight.api.gateway.GatewayCore.completions`) and by the benchmark's simulator
for every simulated arrival — the simulator keeps no copy of it. The callers carry it
out: they forward to the decision's peers in order until one answers, then fall back
(serve here, or refuse), and the gateway retries failed local attempts; neither adds a
rule of its own.

The rules, in order:

1. A request a peer forwarded (``from_peer``) is never forwarded again: served here,
   unless there is no healthy replica or the predicted queueing wait exceeds
   ``router.admission_wait_ms`` (refused).
2. No healthy local replica: **fail over** to the usable peers, best predicted first;
   refused if none answers.
3. Predicted queueing wait here above ``router.admission_wait_ms``: **overflow** to the
   peers that predict a faster first token than here; refused if none answers.
4. Spill-over is on (``router.spill_over``) and the best *unsaturated* peer's
   prediction (round trip included) beats the local winner's by more than
   ``router.spill_over_margin_ms``: **spill over** to the
   unsaturated peers, best first; served here if none answers. A peer is saturated for
   a request when its predicted queueing wait (what this gateway forwarded there since
   its summary included) exceeds ``router.spill_max_peer_wait_ratio`` times the
   request's own service there: its queue already holds more work than the request, and
   sending it more only moves one region's overflow to another's users, each request
   paying a round trip (when every region is saturated, they would trade overflow back
   and forth on summaries a probe interval old). It is saturated too when the request
   (with what this gateway forwarded there since its summary) would take the peer's
   KV-cache usage over ``router.spill_max_peer_kv_usage``: a spilled request holds its
   cache there for its whole answer, and a peer whose cache is full makes its own
   users wait for room. Overflow and fail-over ignore this:
   they forward what would otherwise be refused.
5. Otherwise served here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from firstlight.config import RouterConfig
from firstlight.regions.summary import ModelSummary, estimate_peer, spills_over
from firstlight.routing import Decision, RequestView

__all__ = [
    "PeerChoice",
    "PeerOption",
    "RegionDecision",
    "decide_region",
    "local_ms_per_token",
    "predicted_wait_ms",
    "rank_peers",
]

RouteName = Literal["local", "from_peer", "spill_over", "overflow", "fail_over", "refuse"]
Refusal = Literal["no_replica", "overloaded"]


@dataclass(frozen=True, slots=True)
class PeerOption:
    """A usable peer region for the request's model, as this region knows it."""

    region: str
    summary: ModelSummary
    rtt_ms: float
    forwarded_tokens: int = 0
    """Prefill tokens forwarded there since its summary was built, not answered yet."""
    forwarded_blocks: int = 0
    """KV blocks of the prompts forwarded there since its summary was built."""


@dataclass(frozen=True, slots=True)
class PeerChoice:
    """A peer to forward to, with the TTFT predicted there (round trip included)."""

    region: str
    predicted_ttft_ms: float
    wait_ms: float = 0.0
    """The queueing wait predicted there (part of ``predicted_ttft_ms``)."""
    service_ms: float = 0.0
    """The request's own prefill there (part of ``predicted_ttft_ms``)."""
    step_ms: float = 0.0
    """The engine step that emits its first token there (part of ``wait_ms``)."""
    kv_usage: float | None = None
    """The peer's KV-cache usage with this request and what was forwarded since its
    summary added (``None``: the peer does not report it)."""
    copy_penalty_ms: float = 0.0
    """Ranking only (rule 4): the prefill of the prompt blocks the peer lacks, once for
    the request and once for each request it holds up there (``1 +`` the peer's mean
    queue length) times ``router.spill_copy_weight`` (:func:`rank_peers` says why).
    Not part of ``predicted_ttft_ms``."""
    cached_tokens: int = 0
    """Leading prompt tokens the peer's hot blocks hold (what it would not prefill)."""

    @property
    def ranking_ms(self) -> float:
        """What spill-over compares with the local prediction: the prediction plus the
        copy penalty."""
        return self.predicted_ttft_ms + self.copy_penalty_ms

    def saturated(self, max_wait_ratio: float, max_kv_usage: float = 1.0) -> bool:
        """Whether the peer's queue holds more than ``max_wait_ratio`` times the
        request's own work there, its prefill and the step that emits its first token,
        or the request would take its KV usage over ``max_kv_usage`` (rule 4 of the
        module docstring). The step is the request's own time, not queue: counted as
        queue, it made every peer that holds the prompt's prefix (a few ms of prefill
        left) look saturated however idle it was."""
        if self.kv_usage is not None and self.kv_usage > max_kv_usage:
            return True
        queue_ms = self.wait_ms - self.step_ms
        return queue_ms > max_wait_ratio * (self.service_ms + self.step_ms)


@dataclass(frozen=True, slots=True)
class RegionDecision:
    """What to do with one request."""

    route: RouteName
    """``local``/``from_peer``: serve here; ``spill-over``/``overflow``/``fail-over``:
    forward to :attr:`peers` in order; ``refuse``: answer 503 at once."""
    local: Decision | None
    """The cost model's view of the best local replica (``None``: no replica)."""
    peers: tuple[PeerChoice, ...] = ()
    """Peers to try, in order (forwarding routes only)."""
    fallback: Literal["local", "refuse"] = "refuse"
    """What to do when no peer answers (forwarding routes only)."""
    refusal: Refusal | None = None
    """Why the request is (or, after the peers, would be) refused."""
    wait_ms: float = 0.0
    """The predicted queueing wait here (the overload refusal's ``Retry-After``)."""


def predicted_wait_ms(local: Decision) -> float:
    """The queueing wait predicted on the local winner (0 when unknown)."""
    terms = local.winner.terms
    return terms.wait_ms if terms is not None else 0.0


def local_ms_per_token(local: Decision | None) -> float | None:
    """The calibrated prefill cost of the local winner, ``None`` if unknown: a peer that
    has not measured its own rate is priced at it."""
    if local is None or local.winner.terms is None:
        return None
    terms = local.winner.terms
    return terms.prefill_ms / max(terms.uncached_tokens, 1)


def rank_peers(
    request: RequestView,
    peers: Iterable[PeerOption],
    local: Decision | None,
    copy_weight: float = 1.0,
) -> tuple[PeerChoice, ...]:
    """The peers with their predicted TTFT for ``request``, best first (ties keep the
    given order), each with its copy penalty (the caller passes
    ``router.spill_copy_weight``): the prompt's full blocks the peer's hot prefixes lack,
    whether or not this region holds them. A prefix built in a peer moves where its
    group is served — the group's next requests find it there, not here, and follow it —
    while one built here serves this region's users at home. Counting only what this
    region held, cold regions spilled cold prefixes into cold peers and groups wandered
    between regions (on ``w6-small`` ``firstlight`` lost to staying home)."""
    rate = local_ms_per_token(local)
    prompt_tokens = len(request.block_hashes) * request.block_size
    choices = []
    for p in peers:
        estimate = estimate_peer(
            p.summary, request, p.rtt_ms, rate, p.forwarded_tokens, p.forwarded_blocks
        )
        missing = max(prompt_tokens - estimate.cached_tokens, 0)
        holds_up = 1.0 + (p.summary.mean_queue_len or 0.0)
        penalty = copy_weight * missing * estimate.ms_per_token * holds_up
        choices.append(
            PeerChoice(
                p.region,
                estimate.total_ms,
                estimate.wait_ms,
                estimate.service_ms,
                estimate.step_ms,
                estimate.kv_usage,
                penalty,
                estimate.cached_tokens,
            )
        )
    return tuple(sorted(choices, key=lambda c: c.predicted_ttft_ms))


def decide_region(
    local: Decision | None,
    *,
    healthy: bool,
    from_peer: bool,
    peers: tuple[PeerChoice, ...],
    router: RouterConfig,
) -> RegionDecision:
    """Apply the rules of the module docstring. ``local`` is the cost model's estimate
    here (``RouterState.estimate``), ``healthy`` whether any local replica is live,
    ``peers`` the output of :func:`rank_peers`. Pure; never raises."""
    bound_ms = router.admission_wait_ms
    wait_ms = predicted_wait_ms(local) if local is not None else 0.0
    overloaded = bound_ms is not None and local is not None and wait_ms > bound_ms
    if from_peer:
        if not healthy:
            return RegionDecision("refuse", local, refusal="no_replica")
        if overloaded:
            return RegionDecision("refuse", local, refusal="overloaded", wait_ms=wait_ms)
        return RegionDecision("from_peer", local)
    if not healthy:
        return RegionDecision("fail_over", local, peers, "refuse", "no_replica")
    if overloaded:
        assert local is not None
        local_ms = local.winner.predicted_ttft_ms or wait_ms
        better = tuple(p for p in peers if p.predicted_ttft_ms < local_ms)
        return RegionDecision("overflow", local, better, "refuse", "overloaded", wait_ms)
    if not router.spill_over:
        return RegionDecision("local", local)
    open_peers = tuple(
        sorted(
            (
                p
                for p in peers
                if not p.saturated(router.spill_max_peer_wait_ratio, router.spill_max_peer_kv_usage)
            ),
            key=lambda p: p.ranking_ms,
        )
    )
    best_ms = open_peers[0].ranking_ms if open_peers else None
    if spills_over(local, best_ms, router.spill_over_margin_ms):
        return RegionDecision("spill_over", local, open_peers, "local")
    return RegionDecision("local", local)
