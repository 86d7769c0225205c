"""What a request's response says of its route, and what the first token records.

Called by :class:`~firstlight.api.in_region.LocalServer` once per request served in this
region: :func:`route_info` turns the router's record of the decision (region, replica,
predicted TTFT, the decision's explanation) into the ``x-firstlight-*`` headers;
:func:`observe_first_token` records the first token (or its absence) in the request's
observation, its route span and the gateway's metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from firstlight.region.state import Route
from firstlight.telemetry import GatewayTelemetry, RequestObservation

__all__ = ["RouteInfo", "observe_first_token", "route_info"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """Where a request was served and why, as its response headers say it."""

    route: str
    region: str
    replica: str
    predicted_ms: float | None
    explanation: str | None = None

    def headers(self) -> dict[str, str]:
        out = {
            "x-firstlight-route": self.route,
            "x-firstlight-region": self.region,
            "x-firstlight-replica": self.replica,
        }
        if self.predicted_ms is not None:
            out["x-firstlight-predicted-ttft-ms"] = f"{self.predicted_ms:.1f}"
        if self.explanation is not None:
            out["x-firstlight-decision"] = self.explanation
        return out


def route_info(
    region: str,
    routed: Route | None,
    request_id: str,
    route: str,
    predicted: float | None,
    served_by: str,
) -> RouteInfo:
    """The route as the response tells it: the chosen replica and its predicted TTFT
    with the decision's explanation, or only the serving replica when the router's
    choice is unknown or another replica served (logged)."""
    if routed is None or routed.chosen is None:
        return RouteInfo(route, region, served_by, predicted)
    chosen = routed.chosen
    if chosen.replica_id != served_by:
        _log.warning(
            "%s: %s was routed to %s but served by %s",
            region,
            request_id,
            chosen.replica_id,
            served_by,
        )
        return RouteInfo(route, region, served_by, None)
    terms_ms = chosen.terms.total_ms if chosen.terms is not None else predicted
    explanation = routed.decision.explain().encode("ascii", "replace").decode()
    return RouteInfo(route, region, chosen.replica_id, terms_ms, explanation)


def observe_first_token(
    region: str,
    telemetry: GatewayTelemetry,
    obs: RequestObservation,
    info: RouteInfo,
    routed: Route | None,
    ttft_ms: float | None,
) -> None:
    """At the first token (or at the end when none came): the observation's route,
    metrics, the route span's decision terms and the dashboard's decision log;
    ``ttft_ms`` is ``None`` when the first token was not seen (nothing is timed)."""
    obs.served(
        region,
        replica=info.replica,
        predicted_ttft_ms=info.predicted_ms,
        explanation=info.explanation,
    )
    obs.observed_ttft_ms = ttft_ms  # from dispatch, as the prediction
    span = obs.route_span
    chosen = routed.chosen if routed is not None else None
    if span is not None and span.is_recording():
        span.set_attribute("firstlight.replica", info.replica)
        if info.predicted_ms is not None:
            span.set_attribute("firstlight.predicted_ttft_ms", info.predicted_ms)
        if ttft_ms is not None:
            span.set_attribute("firstlight.observed_ttft_ms", ttft_ms)
        if chosen is not None and chosen.terms is not None:
            for term in ("rtt_ms", "wait_ms", "prefill_ms", "reload_ms", "overhead_ms"):
                span.set_attribute(f"firstlight.terms.{term}", getattr(chosen.terms, term))
            span.set_attribute("firstlight.cached_tokens", chosen.terms.cached_tokens)
            span.set_attribute("firstlight.uncached_tokens", chosen.terms.uncached_tokens)
            span.set_attribute("firstlight.host_tier_tokens", chosen.terms.host_tokens)
        if routed is not None and len(routed.decision.ranked) > 1:
            runner_up = routed.decision.ranked[1]
            span.set_attribute("firstlight.runner_up", runner_up.replica_id)
            if runner_up.predicted_ttft_ms is not None:
                span.set_attribute("firstlight.runner_up_ttft_ms", runner_up.predicted_ttft_ms)
    if ttft_ms is None:  # end the route span, but record no first token
        if obs.route_span is not None:
            obs.route_span.end()
            obs.route_span = None
    else:
        obs.first_token()
    telemetry.routed(
        obs.model,
        routed.decision_s if routed is not None else None,
        info.predicted_ms if ttft_ms is not None else None,
        ttft_ms or 0.0,
    )
