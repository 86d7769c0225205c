"""The gateway's metrics: OpenTelemetry instruments, exported in Prometheus' format.

One :class:`GatewayTelemetry` per gateway process, built by the gateway deployment and
handed to :class:`~firstlight.api.gateway.GatewayCore`. Per request the core calls
:meth:`GatewayTelemetry.start`, fills the returned :class:`RequestObservation` as the
request goes (route, first token, output tokens, status) and calls
:meth:`GatewayTelemetry.finish` once at the end. Everything else is read when
``/metrics`` is scraped, through observable instruments: the model routers' state
(replicas with the counters they report in their routing stats, the hint mirror and
feed) and the peer table.

Replicas have no HTTP endpoint of their own inside Ray Serve; what they measure travels
with their routing stats (every 0.5 s) to the routers in the gateway's process and is
exported here, labelled ``replica``. One scrape target per gateway therefore covers the
region. The names and attributes are those of :mod:`firstlight.telemetry.catalog`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from firstlight.advisor import PrefixAdvisor
from firstlight.config import PlatformConfig
from firstlight.routing.predicted_ttft import FirstlightParams
from firstlight.telemetry._dashboard_data import DashboardData
from firstlight.telemetry.catalog import CATALOG, GEN_AI_PROVIDER, MetricSpec
from firstlight.telemetry.observation import UNKNOWN_MODEL, RequestObservation
from firstlight.telemetry.observers import ScrapeObservers
from firstlight.telemetry.outliers import (
    OUTLIER_KINDS,
    OutlierDetector,
    OutlierRecord,
    outlier_record,
    record_json,
    route_facts,
)
from firstlight.telemetry.replicas import PER_REPLICA, ReplicaCollector
from firstlight.telemetry.tracing import build_tracer, extract, shutdown_tracer

if TYPE_CHECKING:
    from firstlight.region import RouterState
    from firstlight.regions.peers import PeerTable

__all__ = ["GatewayTelemetry", "RequestObservation"]

"""The ``model`` attribute of requests that named no served model (bounded labels)."""
_OPERATION = {"chat": "chat", "text": "text_completion", "embeddings": "embeddings"}
_OUTLIER_LOG = 50
_outlier_log = logging.getLogger("firstlight.outliers")
_SERVED_HERE = ("local", "from_peer")
MIGRATION_OUTCOMES = ("retried", "resumed", "resumed_in_peer", "gave_up")
"""Outcomes of ``firstlight.request.migrations``: re-sent before the first token,
continued mid-stream, or attempts used up."""


class GatewayTelemetry(DashboardData):
    """Metrics, traces and the dashboard's rolling data of one gateway process (that
    data, and the methods the dashboard reads it with, are :class:`DashboardData`'s:
    :mod:`firstlight.telemetry._dashboard_data`)."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        states: Callable[[], Mapping[str, RouterState | None]],
        peers: PeerTable | None,
        *,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.region = region
        self.enabled = config.telemetry.metrics_enabled
        self._states = states
        self._policy = config.router.policy
        self.tracer = tracer or build_tracer(config.telemetry, region, "gateway")
        self.registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(registry=self.registry)
        resource = Resource.create(
            {"service.name": config.telemetry.service_name, "cloud.region": region}
        )
        self._provider = MeterProvider(metric_readers=[reader], resource=resource)
        meter = self._provider.get_meter("firstlight")
        self._instruments: dict[str, Any] = {}
        self.migrations = {
            (m.name, outcome): 0 for m in config.models for outcome in MIGRATION_OUTCOMES
        }
        """Requests re-sent after a replica failed, by model and outcome (the
        ``firstlight.request.migrations`` counter reads it)."""
        self.metrics_shared: bool | None = None
        """Whether this gateway's metrics reach the region's shared scrape (set by its
        :class:`~firstlight.telemetry.gateways.ExpositionShare`; ``None`` without one)."""
        observers = ScrapeObservers(
            config, region, states, peers, self.migrations, wall_clock, lambda: self.metrics_shared
        ).callbacks()
        for spec in CATALOG:
            if spec in PER_REPLICA:
                continue  # ReplicaCollector: replica ids must not pile up in the SDK
            self._instruments[spec.name] = _create(meter, spec, observers.get(spec.name))
        if self.enabled:
            self.registry.register(ReplicaCollector(region, states))
        # The dashboard's rolling windows, per model, and its decision log.
        super().__init__(config, clock, wall_clock)
        self.outlier_detector = OutlierDetector(
            config.telemetry.outlier_factor,
            config.telemetry.outlier_min_samples,
            config.telemetry.outlier_window_samples,
        )
        self.outliers: list[OutlierRecord] = []
        """The last outliers this gateway captured, newest first (the dashboard lists
        them)."""
        self.outliers_kept = _OUTLIER_LOG
        """How many outliers :attr:`outliers` keeps."""
        self.advisor = PrefixAdvisor(1000.0 / FirstlightParams().prefill_tokens_per_s)
        """The prefix-cache advisor's ledger of the requests served here
        (:mod:`firstlight.advisor`); the dashboard and ``/v1/firstlight/advisor`` read it."""
        if self.enabled:  # every series from 0, so the first outlier shows in increase()
            for model in config.models:
                for kind in OUTLIER_KINDS:
                    attrs = {"region": region, "model": model.name, "kind": kind}
                    self._instruments["firstlight.outliers"].add(0, attrs)

    # --- per request (called by GatewayCore) -----------------------------------------

    def start(
        self, kind: str, headers: Mapping[str, str] | None = None, *, from_peer: bool = False
    ) -> RequestObservation:
        """A request arrived (``kind`` is ``chat`` or ``text``). A peer's forward (a hop
        whose signature the gateway verified: ``from_peer``) carries its route span's
        ``traceparent``: this request's span continues that trace. A client's own
        ``traceparent`` is not followed (it could switch sampling off), whatever
        headers it sends."""
        operation = _OPERATION.get(kind, kind)
        parent = None
        if from_peer and headers is not None and "traceparent" in headers:
            parent = extract({"traceparent": headers["traceparent"]})
        span = self.tracer.start_span(operation, context=parent, kind=trace.SpanKind.SERVER)
        span.set_attribute("gen_ai.operation.name", operation)
        span.set_attribute("firstlight.region", self.region)
        return RequestObservation(
            operation, time.monotonic(), span, on_first_token=self._take_route_facts
        )

    def begin_route(self, obs: RequestObservation, route: str) -> trace.Span:
        """The region decision chose ``route``; the route span covers the time until the
        first token (or the end)."""
        obs.route = route
        if obs.route_span is not None:  # an earlier attempt (a peer that failed)
            obs.route_span.end()
        context = trace.set_span_in_context(obs.span)
        span = self.tracer.start_span("firstlight.route", context=context)
        span.set_attribute("firstlight.route", route)
        span.set_attribute("firstlight.policy", self._policy)
        obs.route_span = span
        return span

    def routed(
        self, model: str, decision_s: float | None, predicted_ms: float | None, observed_ms: float
    ) -> None:
        """A locally routed request got its first token: the policy took ``decision_s``
        and predicted ``predicted_ms``; the gateway observed ``observed_ms``."""
        if not self.enabled:
            return
        base = {"region": self.region, "model": model}
        if decision_s is not None:
            self._instruments["firstlight.route.decision.duration"].record(
                decision_s, {**base, "policy": self._policy}
            )
        if predicted_ms is not None:
            error_ms = observed_ms - predicted_ms
            direction = "under" if error_ms > 0 else "over"
            self._instruments["firstlight.route.ttft_prediction_error"].record(
                abs(error_ms) / 1000.0, {**base, "direction": direction}
            )

    def migrated(self, model: str, outcome: str) -> None:
        """A request of ``model`` was sent to another replica after its replica failed
        (``outcome``: one of :data:`MIGRATION_OUTCOMES`); called by the gateway."""
        self.migrations[(model, outcome)] += 1

    def finish(self, obs: RequestObservation) -> None:
        """The request ended (response complete, stream closed, or refused). Idempotent:
        the second call of the same observation does nothing."""
        if obs.finished:
            return
        obs.finished = True
        now = time.monotonic()
        if obs.route_span is not None:
            obs.route_span.end()
            obs.route_span = None
        self._end_span(obs)
        route = obs.route
        if obs.status == 503 and obs.first_token_at is None:
            # Every attempt failed (or none could be made): no capacity anywhere.
            route, obs.served_region, obs.replica = "rejected", None, None
        ttft_s = None if obs.first_token_at is None else obs.first_token_at - obs.started
        tpot_s = _tpot_s(obs)
        if obs.model != UNKNOWN_MODEL:  # the dashboard's windows, metrics on or off
            if route is not None:
                self.routes[obs.model].add(route)
                self._log_decision(obs, route)
            if ttft_s is not None:
                self.ttft[obs.model].add(ttft_s * 1000.0)
            if tpot_s is not None:
                self.itl[obs.model].add(tpot_s * 1000.0)
            if obs.status < 400 and route is not None:
                self._judge_outlier(obs, route, ttft_s, now - obs.started)
            if obs.status < 400 and obs.prompt_sample is not None and ttft_s is not None:
                self.advisor.observe(replace(obs.prompt_sample, ttft_ms=ttft_s * 1000.0))
        if not self.enabled:
            return
        attrs = {
            "region": self.region,
            "model": obs.model,
            "route": obs.route or "none",
            "gen_ai.operation.name": obs.operation,
            "gen_ai.request.model": obs.model,
            "gen_ai.provider.name": GEN_AI_PROVIDER,
        }
        if obs.model != UNKNOWN_MODEL and route is not None:
            self._instruments["firstlight.route.decisions"].add(
                1,
                {
                    "region": self.region,
                    "model": obs.model,
                    "reason": route,
                    "policy": self._policy,
                },
            )
        duration_attrs = dict(attrs)
        if obs.status >= 400:
            duration_attrs["error.type"] = str(obs.status)
        self._instruments["gen_ai.server.request.duration"].record(
            now - obs.started, duration_attrs
        )
        if ttft_s is not None:
            self._instruments["gen_ai.server.time_to_first_token"].record(ttft_s, attrs)
        if tpot_s is not None:
            self._instruments["gen_ai.server.time_per_output_token"].record(tpot_s, attrs)
        if obs.route in _SERVED_HERE and obs.first_token_at is not None:
            # Tokens count where they were processed, so summing regions counts once.
            usage = self._instruments["gen_ai.client.token.usage"]
            if obs.input_tokens is not None:
                usage.record(obs.input_tokens, {**attrs, "gen_ai.token.type": "input"})
            if obs.output_tokens is not None:
                usage.record(obs.output_tokens, {**attrs, "gen_ai.token.type": "output"})

    def render(self) -> tuple[bytes, str]:
        """The Prometheus exposition of this process's metrics (``GET /metrics``)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        """Flush and stop metrics and traces (the gateway's ``__del__``)."""
        self._provider.shutdown()
        shutdown_tracer(self.tracer)

    # --- helpers ------------------------------------------------------------------------

    def _end_span(self, obs: RequestObservation) -> None:
        span = obs.span
        if not span.is_recording():
            return
        # OpenTelemetry's GenAI conventions (semantic conventions v1.37+): the span is
        # named "{gen_ai.operation.name} {gen_ai.request.model}" once the model is known.
        if obs.model != UNKNOWN_MODEL:
            span.update_name(f"{obs.operation} {obs.model}")
            span.set_attribute("gen_ai.response.model", obs.model)
        span.set_attribute("gen_ai.request.model", obs.model)
        if obs.request_id is not None:
            span.set_attribute("gen_ai.response.id", obs.request_id)
        span.set_attribute("http.response.status_code", obs.status)
        if obs.input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", obs.input_tokens)
        if obs.output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", obs.output_tokens)
        if obs.first_token_at is not None:
            span.set_attribute(
                "gen_ai.server.time_to_first_token", obs.first_token_at - obs.started
            )
        if obs.status >= 500:
            span.set_status(trace.StatusCode.ERROR)
        span.end()

    def _take_route_facts(self, obs: RequestObservation) -> None:
        # At the first token: the router's route of the request is gone by its end.
        if obs.request_id is None:
            return
        state = self._states().get(obs.model)
        route = None if state is None else state.route_of(obs.request_id)
        if state is not None and route is not None and route.chosen is not None:
            obs.route_facts = route_facts(route, state.replicas.get(route.chosen.replica_id))

    def _judge_outlier(
        self, obs: RequestObservation, route: str, ttft_s: float | None, e2e_s: float
    ) -> None:
        ttft_ms = None if ttft_s is None else ttft_s * 1000.0
        exceeded = self.outlier_detector.observe(obs.model, ttft_ms, e2e_s * 1000.0)
        if not exceeded:
            return
        record = outlier_record(
            obs,
            self.outlier_detector,
            exceeded,
            region=self.region,
            route=route,
            at=self._wall(),
            ttft_ms=ttft_ms,
            e2e_ms=e2e_s * 1000.0,
        )
        self.outliers.insert(0, record)
        del self.outliers[self.outliers_kept :]
        _outlier_log.warning("%s", record_json(record))
        if self.enabled:
            counter = self._instruments["firstlight.outliers"]
            for kind in record.kinds:
                counter.add(1, {"region": self.region, "model": obs.model, "kind": kind})


def _tpot_s(obs: RequestObservation) -> float | None:
    if obs.first_token_at is None or obs.last_token_at is None or not obs.output_tokens:
        return None
    if obs.output_tokens < 2 or obs.last_token_at <= obs.first_token_at:
        return None
    return (obs.last_token_at - obs.first_token_at) / (obs.output_tokens - 1)


def _create(
    meter: Any,
    spec: MetricSpec,
    observer: Callable[[CallbackOptions], Iterable[Observation]] | None,
) -> Any:
    if spec.kind == "histogram":
        return meter.create_histogram(
            spec.name,
            unit=spec.unit,
            description=spec.description,
            explicit_bucket_boundaries_advisory=list(spec.buckets),
        )
    if spec.kind == "counter":
        return meter.create_counter(spec.name, unit=spec.unit, description=spec.description)
    if observer is None:
        raise ValueError(f"{spec.name}: an observable instrument needs a callback")
    factory = (
        meter.create_observable_gauge if spec.kind == "gauge" else meter.create_observable_counter
    )
    return factory(spec.name, [observer], unit=spec.unit, description=spec.description)
