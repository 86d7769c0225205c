"""One request's route in one region: its :class:`Ticket`, from the region decision to
its end.

Made by :meth:`firstlight.region.state.RouterState.admit` (the gateway, once per request
and per retry; the benchmark's simulator the same way); committed by whatever serves the
request here, told its first token and its end by the gateway's local server. Pure; no
I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from firstlight.routing import Decision, RequestView

if TYPE_CHECKING:
    from firstlight.region.state import Route, RouterState

__all__ = ["Ticket"]


@dataclass(slots=True)
class Ticket:
    """One request's route in one region, from the region decision to its end: the only
    place a replica is chosen for it (:meth:`commit`), reserved (:meth:`routed`),
    calibrated (:meth:`first_token`) and released (:meth:`finished`).

    Made by :meth:`RouterState.admit`. The gateway commits it when the request is served
    here; whatever carries the request executes the committed decision — the gateway's
    replica-port transport, or Ray's request router, which finds the decision recorded
    under the request id and does not rank the replicas again."""

    state: RouterState
    request: RequestView
    estimate: Decision | None
    """The cost model's view of the best local replica (``None``: no replica)."""
    estimate_s: float
    """How long the estimate took (the decision-time metric)."""

    @property
    def predicted_ttft_ms(self) -> float | None:
        return None if self.estimate is None else self.estimate.winner.predicted_ttft_ms

    def commit(self, prefill_tokens: int | None = None) -> Decision | None:
        """Serve the request here: its ``prefill_tokens`` (default: the prompt's tokens
        the estimate does not find cached, at least one) count as queued work until it is
        routed, and its decision is recorded — the estimate itself when the policy is the
        cost model (one run of it per request), else the policy's own choice."""
        state = self.state
        if prefill_tokens is None:
            request, local = self.request, self.estimate
            cached = local.winner.cached_blocks * request.block_size if local else 0
            prefill_tokens = max(request.prompt_tokens - cached, 1)
        state.dispatched(self.request.request_id, prefill_tokens)
        if state.estimator is state.policy and self.estimate is not None:
            state.record_decision(self.request, self.estimate, self.estimate_s)
            return self.estimate
        return state.decide(self.request)

    @property
    def route(self) -> Route | None:
        """The committed route, with the replica it left for once it left (``None``
        before :meth:`commit` and after :meth:`finished`)."""
        return self.state.route_of(self.request.request_id)

    def routed(self, replica_id: str) -> None:
        """The request left for ``replica_id``: the policy reserves its work there."""
        self.state.record_routed(self.request.request_id, replica_id)

    def first_token(self, observed_ttft_ms: float) -> None:
        """Its first token came ``observed_ttft_ms`` after dispatch: calibration."""
        self.state.first_token(self.request.request_id, observed_ttft_ms)

    def finished(self) -> None:
        """It ended, any outcome: what the policy holds for it is released."""
        self.state.finished(self.request.request_id)
