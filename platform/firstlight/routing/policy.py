"""The routing policy contract: one Protocol, implemented by every arm.

Who calls what, and how often:

* :meth:`RoutingPolicy.choose` — by the Ray Serve request router (``choose_replicas``)
  and the benchmark, once per request, on the hot path: synchronous, no I/O.
* :meth:`RoutingPolicy.on_routed` — once the request is actually sent to
  ``chosen`` (Ray's ``on_request_routed``); policies record their own state here
  (reservations, approximate prefix trees, counters).
* :meth:`RoutingPolicy.on_first_token` — when the first token arrives, with the
  observed TTFT (calibration; releases reservations).
* :meth:`RoutingPolicy.on_done` — when the request ends, whatever the outcome (after
  its last token, on failure or cancel), and for a route the region core stops tracking,
  so nothing stays reserved or counted in flight.
* :meth:`RoutingPolicy.on_replica_reset` — by the request router when what the policy
  learned about a replica no longer holds (it began reporting its own measurements, or
  restarted); rare.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from firstlight.routing.decision import Candidate, Decision
from firstlight.routing.views import RequestView, RoutingInput

__all__ = ["PolicyParams", "RoutingPolicy"]


class PolicyParams(BaseModel):
    """Base of each policy's parameters (``router.params`` in the configuration):
    immutable, no unknown keys, a docstring and bounds on every field."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class RoutingPolicy(Protocol):
    """Ranks candidate replicas for a request."""

    name: str
    predicts_ttft: bool
    """Whether its decisions carry predicted TTFTs with their terms: the region decision
    then uses the policy itself as its estimate (reservations included); otherwise it
    asks a cost model of its own."""

    def choose(self, routing: RoutingInput) -> Decision:
        """Rank ``routing.replicas`` (never empty) best first."""
        ...

    def on_routed(self, request: RequestView, chosen: Candidate) -> None:
        """The request was sent to ``chosen``."""
        ...

    def on_first_token(
        self, request: RequestView, chosen: Candidate, observed_ttft_ms: float
    ) -> None:
        """The first token arrived ``observed_ttft_ms`` after routing."""
        ...

    def on_done(self, request: RequestView, chosen: Candidate) -> None:
        """The request ended without (or after) its first token; release its state."""
        ...

    def on_replica_reset(self, replica_id: str) -> None:
        """Forget what was learned about ``replica_id`` (calibration, history)."""
        ...
