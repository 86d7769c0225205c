"""A routing decision and its explanation.

Returned by every :class:`~firstlight.routing.policy.RoutingPolicy`; the request router
turns it into Ray Serve tiers, the gateway into ``x-firstlight-*`` headers and the
dashboard into "why this route".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Candidate", "Decision", "TtftTerms"]


@dataclass(frozen=True, slots=True)
class TtftTerms:
    """The predicted time to first token of one candidate, term by term."""

    rtt_ms: float
    wait_ms: float
    """Queued prefill work ahead of the request, at the replica's rate."""
    prefill_ms: float
    """The request's own uncached tokens, at the replica's rate."""
    overhead_ms: float
    cached_tokens: int
    uncached_tokens: int
    correction: float = 1.0
    """Calibration factor already applied to the replica's terms."""
    host_tokens: int = 0
    """Prompt tokens held in the replica's host tier (KV offloading) right after its
    device-tier ones (``cached_tokens``): reloaded, not recomputed, so neither cached
    nor in ``uncached_tokens``."""
    reload_ms: float = 0.0
    """Reloading ``host_tokens`` from host memory, at the policy's reload rate."""

    @property
    def total_ms(self) -> float:
        return self.rtt_ms + self.wait_ms + self.prefill_ms + self.reload_ms + self.overhead_ms

    @property
    def service_ms(self) -> float:
        """What the replica itself takes (everything but the network)."""
        return self.wait_ms + self.prefill_ms + self.reload_ms + self.overhead_ms


class Candidate(NamedTuple):
    """One ranked replica. ``score`` is the policy's own ranking key (lower is better;
    for the cost-model policies the predicted TTFT in ms plus any ranking-only penalty,
    so compare :attr:`predicted_ttft_ms`, not ``score``, with other TTFTs).

    A named tuple rather than a frozen dataclass: policies build one per candidate per
    request, and this is three times cheaper while staying immutable."""

    replica_id: str
    region: str
    score: float
    terms: TtftTerms | None = None
    """Cost-model terms, where the policy computed them."""
    cached_blocks: int = 0

    @property
    def predicted_ttft_ms(self) -> float | None:
        """The cost model's predicted TTFT, ``None`` where the policy computed no terms.
        The gateway's spill-over decision compares this, never ``score``, with a peer's
        prediction."""
        return self.terms.total_ms if self.terms is not None else None


@dataclass(frozen=True, slots=True)
class Decision:
    """Candidates best first, and why the first one won."""

    policy: str
    ranked: tuple[Candidate, ...]
    reason: str
    """Short, stable reason code (``lowest-predicted-ttft``, ``near-tie``, ...)."""

    def __post_init__(self) -> None:
        if not self.ranked:
            raise ValueError("a decision needs at least one candidate")

    @property
    def winner(self) -> Candidate:
        return self.ranked[0]

    @property
    def runner_up(self) -> Candidate | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    def explain(self) -> str:
        """One line for logs, the dashboard and the ``x-firstlight-decision`` header:
        winner, terms (the reload of host-tier tokens only when there are any), margin
        over runner-up."""
        win = self.winner
        text = f"{self.policy}: {win.replica_id} ({self.reason})"
        if win.terms is not None:
            t = win.terms
            text += (
                f" ttft={t.total_ms:.1f}ms = rtt {t.rtt_ms:.1f} + wait {t.wait_ms:.1f}"
                f" + prefill {t.prefill_ms:.1f} ({t.uncached_tokens} uncached,"
                f" {t.cached_tokens} cached)"
            )
            if t.host_tokens:
                text += f" + reload {t.reload_ms:.1f} ({t.host_tokens} host-tier)"
            text += f" + overhead {t.overhead_ms:.1f}"
        second = self.runner_up
        if second is not None:
            text += f"; runner-up {second.replica_id} +{second.score - win.score:.1f}"
        return text
