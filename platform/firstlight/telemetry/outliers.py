"""Outlier capture: requests far slower than their model's rolling median.

A request whose time to first token or end-to-end time exceeds ``factor`` times the
rolling median of its model (the last ``window_samples`` successful requests, judged
only once ``min_samples`` are in) is an outlier. The gateway logs it in full (one JSON
line on the ``firstlight.outliers`` logger), counts it (``firstlight.outliers``) and
lists it on the built-in dashboard.

Who calls what: :class:`~firstlight.telemetry.GatewayTelemetry` builds one
:class:`OutlierDetector` from ``telemetry.outlier_*`` and calls
:meth:`OutlierDetector.observe` once per successful request (from ``finish``); for each
outlier it builds an :class:`OutlierRecord` and logs :func:`record_json` of it. Pure
and synchronous: no clock (the window is a count of samples), no I/O.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from firstlight.region.state import Route
    from firstlight.routing import ReplicaView
    from firstlight.telemetry.observation import RequestObservation

__all__ = [
    "OUTLIER_KINDS",
    "Exceeded",
    "OutlierDetector",
    "OutlierKind",
    "OutlierRecord",
    "RollingMedian",
    "RouteFacts",
    "outlier_record",
    "record_json",
    "route_facts",
]

OutlierKind = Literal["ttft", "e2e"]
OUTLIER_KINDS: tuple[OutlierKind, ...] = ("ttft", "e2e")
"""What a request can be an outlier in: time to first token, or end-to-end time."""


class RollingMedian:
    """The median of the last ``max_samples`` values. Kept sorted beside the arrival
    order, so adding is one binary search and one list shift (cheap at a thousand
    samples) and the median is read in constant time."""

    def __init__(self, max_samples: int) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples = {max_samples!r}: must be at least 1")
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._max = max_samples

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        """Add ``value``; the oldest sample leaves once the window is full."""
        if len(self._order) == self._max:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def median(self) -> float | None:
        """The median of the window (mean of the middle two for an even count);
        ``None`` while empty."""
        n = len(self._sorted)
        if n == 0:
            return None
        mid = n // 2
        if n % 2:
            return self._sorted[mid]
        return (self._sorted[mid - 1] + self._sorted[mid]) / 2.0


@dataclass(frozen=True, slots=True)
class Exceeded:
    """One kind a request exceeded: its value and the median it was judged against."""

    kind: OutlierKind
    observed_ms: float
    median_ms: float


class OutlierDetector:
    """Rolling medians per model and kind, and the judgement against them."""

    def __init__(self, factor: float, min_samples: int, window_samples: int) -> None:
        if factor <= 1.0:
            raise ValueError(f"factor = {factor!r}: must be above 1")
        if not 1 <= min_samples <= window_samples:
            raise ValueError(
                f"min_samples = {min_samples!r}, window_samples = {window_samples!r}: "
                "need 1 <= min_samples <= window_samples"
            )
        self.factor = factor
        self.min_samples = min_samples
        self.window_samples = window_samples
        self._medians: dict[tuple[str, OutlierKind], RollingMedian] = {}

    def observe(self, model: str, ttft_ms: float | None, e2e_ms: float | None) -> list[Exceeded]:
        """Judge one successful request of ``model`` (``None``: not measured, e.g. no
        first token was timed), then add its values to the windows. A value exceeds
        when it is above ``factor`` times the median of the samples before it, once
        the window holds ``min_samples``. Called by the gateway's telemetry once per
        request; returns the kinds exceeded, TTFT first (empty for a normal request)."""
        exceeded: list[Exceeded] = []
        values: tuple[tuple[OutlierKind, float | None], ...] = (("ttft", ttft_ms), ("e2e", e2e_ms))
        for kind, value in values:
            if value is None:
                continue
            window = self._window(model, kind)
            median = window.median()
            judged = median is not None and len(window) >= self.min_samples
            if judged and median is not None and value > self.factor * median:
                exceeded.append(Exceeded(kind, value, median))
            # The outlier joins the window: a lasting shift (longer prompts, a slower
            # model version) moves the median instead of being flagged forever.
            window.add(value)
        return exceeded

    def median_ms(self, model: str, kind: OutlierKind) -> float | None:
        """The current median of ``model``'s ``kind`` (``None`` before any sample)."""
        window = self._medians.get((model, kind))
        return None if window is None else window.median()

    def _window(self, model: str, kind: OutlierKind) -> RollingMedian:
        window = self._medians.get((model, kind))
        if window is None:
            window = self._medians[(model, kind)] = RollingMedian(self.window_samples)
        return window


@dataclass(frozen=True, slots=True)
class RouteFacts:
    """What the in-region decision knew of a locally served request, taken from the
    router's state when its first token came (the route is gone by the request's end).
    Every request keeps one until it ends; only an outlier's is read."""

    predicted_queue_wait_ms: float | None
    cached_tokens: int | None
    runner_up: str | None
    runner_up_ttft_ms: float | None
    replica_queue_len: int | None


_NO_FACTS = RouteFacts(None, None, None, None, None)


def route_facts(route: Route, replica: ReplicaView | None) -> RouteFacts | None:
    """The facts of ``route`` (``None`` before Ray routed it); ``replica``: the serving
    replica's view in the router's state, if it still has one. Called by the gateway's
    telemetry at each locally served request's first token."""
    chosen = route.chosen
    if chosen is None:
        return None
    terms = chosen.terms
    second = next((c for c in route.decision.ranked if c.replica_id != chosen.replica_id), None)
    return RouteFacts(
        predicted_queue_wait_ms=None if terms is None else terms.wait_ms,
        cached_tokens=None if terms is None else terms.cached_tokens,
        runner_up=None if second is None else second.replica_id,
        runner_up_ttft_ms=None if second is None else second.predicted_ttft_ms,
        replica_queue_len=None if replica is None else replica.queue_len,
    )


@dataclass(frozen=True, slots=True)
class OutlierRecord:
    """One captured outlier, everything the gateway knew of the request (no prompt, no
    key). Logged as JSON and listed on the dashboard."""

    at: float
    """Wall-clock seconds when the request ended."""
    model: str
    kinds: tuple[OutlierKind, ...]
    """What exceeded ``factor`` times the median: ``ttft``, ``e2e`` or both."""
    factor: float
    """The configured ``telemetry.outlier_factor`` it was judged with."""
    request_id: str | None
    """The response id (the client sees it as ``id``)."""
    trace_id: str | None
    """The request's trace (32 hex digits); ``None`` when traces are off
    (``telemetry.otlp_endpoint`` unset) or the span was not sampled."""
    route: str | None
    """``local``, ``spill_over``, ``fail_over`` or ``from_peer``."""
    served_region: str | None
    """The region whose replica served it (this region, or the peer it was forwarded
    to)."""
    peer_region: str | None
    """The peer region the request was forwarded to; ``None`` when served here."""
    replica: str | None
    explanation: str | None
    """The routing decision as the dashboard's decision log shows it: the in-region
    policy's winner, terms and runner-up, or the peer's prediction against the local
    one for a forwarded request."""
    predicted_ttft_ms: float | None
    """What the decision predicted for the first token."""
    ttft_ms: float | None
    """Time to first token as the gateway measured it (from the request's arrival)."""
    dispatch_ttft_ms: float | None
    """Time to first token from dispatch to the replica (what the prediction is
    compared with); ``None`` for a forwarded request."""
    median_ttft_ms: float | None
    """The model's rolling median TTFT it was judged against."""
    e2e_ms: float
    """End-to-end time: arrival to the last byte."""
    median_e2e_ms: float | None
    predicted_queue_wait_ms: float | None
    """The decision's predicted queueing wait on the chosen replica (the gateway sees
    no queue position, so the prediction stands in for it); ``None`` for a forwarded
    request or a policy without cost terms."""
    replica_queue_len: int | None
    """Requests on the serving replica (waiting or running) in its last stats report
    when the first token came; ``None`` when not served here."""
    cached_tokens: int | None
    """Prompt tokens the decision expected to find in the replica's prefix cache."""
    runner_up: str | None
    """The replica ranked second by the in-region decision."""
    runner_up_ttft_ms: float | None
    input_tokens: int | None
    output_tokens: int | None


def outlier_record(
    obs: RequestObservation,
    detector: OutlierDetector,
    exceeded: list[Exceeded],
    *,
    region: str,
    route: str,
    at: float,
    ttft_ms: float | None,
    e2e_ms: float,
) -> OutlierRecord:
    """The record of ``obs``, a request of this gateway's ``region`` that ended at wall
    time ``at`` after ``e2e_ms`` (first token after ``ttft_ms``) and exceeded what
    ``exceeded`` says (``detector.observe``). Called by the gateway's telemetry for each
    outlier."""
    medians = {e.kind: e.median_ms for e in exceeded}
    context = obs.span.get_span_context()
    facts = obs.route_facts or _NO_FACTS
    forwarded = obs.served_region is not None and obs.served_region != region
    return OutlierRecord(
        at=at,
        model=obs.model,
        kinds=tuple(e.kind for e in exceeded),
        factor=detector.factor,
        request_id=obs.request_id,
        trace_id=format(context.trace_id, "032x") if context.is_valid else None,
        route=route,
        served_region=obs.served_region,
        peer_region=obs.served_region if forwarded else None,
        replica=obs.replica,
        explanation=obs.explanation,
        predicted_ttft_ms=obs.predicted_ttft_ms,
        ttft_ms=ttft_ms,
        dispatch_ttft_ms=obs.observed_ttft_ms,
        median_ttft_ms=medians.get("ttft", detector.median_ms(obs.model, "ttft")),
        e2e_ms=e2e_ms,
        median_e2e_ms=medians.get("e2e", detector.median_ms(obs.model, "e2e")),
        predicted_queue_wait_ms=facts.predicted_queue_wait_ms,
        replica_queue_len=facts.replica_queue_len,
        cached_tokens=facts.cached_tokens,
        runner_up=facts.runner_up,
        runner_up_ttft_ms=facts.runner_up_ttft_ms,
        input_tokens=obs.input_tokens,
        output_tokens=obs.output_tokens,
    )


def record_json(record: OutlierRecord) -> str:
    """``record`` as one line of strict JSON (the ``firstlight.outliers`` log line); a
    non-finite number (a fallback replica's unbounded score) is written as ``null``."""
    data = {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in asdict(record).items()
    }
    data["kinds"] = list(record.kinds)
    return json.dumps(data, separators=(",", ":"), allow_nan=False)
