"""What one request did: :class:`RequestObservation`, the telemetry's one per-request
record. :meth:`~firstlight.telemetry.GatewayTelemetry.start` makes it, the gateway tells
it each event of the request's life through its methods, and
:meth:`~firstlight.telemetry.GatewayTelemetry.finish` reads it into metrics, the span,
the dashboard's windows and the outlier log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import trace

from firstlight.advisor import PromptSample

if TYPE_CHECKING:
    from firstlight.telemetry.outliers import RouteFacts

__all__ = ["UNKNOWN_MODEL", "RequestObservation"]

UNKNOWN_MODEL = "unknown"
"""The model label of a request refused before its model was known."""


@dataclass
class RequestObservation:
    """What one request did, told by the gateway as it happens: the telemetry's one
    per-request record (``GatewayTelemetry.start`` makes it, ``GatewayTelemetry.finish``
    reads it). The gateway tells it facts through the methods below, one per event of
    the request's life — admitted, served (where, on what prediction), its first token,
    tokens streamed or completed, its status — and the telemetry keeps the route span and
    the outlier facts; nothing else writes it."""

    operation: str
    """``chat`` or ``text_completion`` (the GenAI conventions' operation name)."""
    started: float
    """Monotonic seconds when the request reached the gateway."""
    span: trace.Span
    model: str = UNKNOWN_MODEL
    request_id: str | None = None
    """The response id (traces only: never a metric attribute)."""
    route: str | None = None
    """``local``, ``spill_over``, ``fail_over`` or ``from_peer`` once decided."""
    served_region: str | None = None
    replica: str | None = None
    predicted_ttft_ms: float | None = None
    explanation: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    observed_ttft_ms: float | None = None
    """TTFT from dispatch to the replica (what the router predicted), locally served."""
    status: int = 200
    route_span: trace.Span | None = None
    finished: bool = False
    route_facts: RouteFacts | None = None
    """The in-region decision's terms, taken at the first token of a locally served
    request (read only if the request turns out an outlier)."""
    on_first_token: Callable[[RequestObservation], None] | None = field(default=None, repr=False)
    """Called by :meth:`first_token` (the telemetry takes :attr:`route_facts`)."""
    group: str = "anonymous"
    """The caller's group for the prefix-cache advisor (tenant, else key identity)."""
    prompt_sample: PromptSample | None = field(default=None, repr=False)
    """What the prefix-cache advisor learns from a request served here: set at its first
    token, its cached tokens updated from the engine's usage at the end."""

    def admitted(self, *, group: str, model: str, request_id: str, input_tokens: int) -> None:
        """The gateway authenticated and prepared the request (:mod:`firstlight.api.gateway`)."""
        self.group, self.model = group, model
        self.request_id, self.input_tokens = request_id, input_tokens

    def served(
        self,
        region: str,
        *,
        replica: str | None = None,
        predicted_ttft_ms: float | None = None,
        explanation: str | None = None,
    ) -> None:
        """Where the request is served — this region's ``replica``, or a peer region
        (its replica, when the peer says) — and the prediction and explanation of the
        choice. Told again when an attempt moves it (a peer that failed)."""
        self.served_region, self.replica = region, replica
        self.predicted_ttft_ms, self.explanation = predicted_ttft_ms, explanation

    def streamed(self, new_tokens: int) -> None:
        """``new_tokens`` more output tokens left for the client (a stream's chunk)."""
        self.output_tokens = (self.output_tokens or 0) + new_tokens
        self.last_token_at = time.monotonic()

    def completed(self, output_tokens: int | None = None) -> None:
        """The last output left for the client; ``output_tokens``: the answer's total
        (the engine's usage), when known."""
        if output_tokens is not None:
            self.output_tokens = output_tokens
        self.last_token_at = time.monotonic()

    def ended(self, status: int) -> None:
        """The status the client got (for a stream: of its error event, if any)."""
        self.status = status

    def first_token(self) -> None:
        """The first output token left for the client (ends the route span)."""
        now = time.monotonic()
        self.first_token_at = now
        self.last_token_at = now
        if self.route_span is not None:
            self.route_span.end()
            self.route_span = None
        if self.on_first_token is not None:
            self.on_first_token(self)
