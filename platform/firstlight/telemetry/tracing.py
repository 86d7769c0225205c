"""Traces: one span per request, gateway → route → replica → engine, exported by OTLP.

:func:`build_tracer` is called once per process by the gateway and by each model
replica. Without ``telemetry.otlp_endpoint`` it returns OpenTelemetry's no-op tracer, so
spans cost nothing; with one, spans go to ``<endpoint>/v1/traces`` (OTLP over HTTP,
protobuf) in batches. The tracer provider is this process's own, not the global one, so
Firstlight never changes what Ray's or vLLM's instrumentation does.

Context crosses the Ray handle call as a W3C ``traceparent`` carrier (:func:`inject`
in the gateway, :func:`extract` in the replica), passed as the ``trace_context``
keyword of ``ModelServer.generate``.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from firstlight.config import TelemetryConfig

__all__ = ["build_tracer", "extract", "inject", "shutdown_tracer", "traces_url"]

_PROPAGATOR = TraceContextTextMapPropagator()
_BATCH_DELAY_MS = 1000


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a configured endpoint (``http://collector:4318`` →
    ``http://collector:4318/v1/traces``; a URL already ending in ``/v1/traces`` stays)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


def build_tracer(telemetry: TelemetryConfig, region: str, role: str) -> trace.Tracer:
    """This process's tracer; ``role`` is ``gateway`` or ``replica`` (a resource
    attribute, beside ``service.name`` and the region)."""
    if telemetry.otlp_endpoint is None:
        return trace.NoOpTracer()
    # Imported here: processes without an endpoint never load the exporter.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": telemetry.service_name,
            "service.namespace": "firstlight",
            "cloud.region": region,
            "firstlight.role": role,
        }
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=traces_url(str(telemetry.otlp_endpoint)))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=_BATCH_DELAY_MS))
    tracer = provider.get_tracer("firstlight")
    _PROVIDERS[id(tracer)] = provider
    return tracer


_PROVIDERS: dict[int, object] = {}
"""Tracer → its provider (the SDK's tracer does not expose it), for :func:`shutdown_tracer`."""


def shutdown_tracer(tracer: trace.Tracer) -> None:
    """Export what is still batched and stop (process shutdown); no-op without export."""
    provider = _PROVIDERS.pop(id(tracer), None)
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def inject(span: trace.Span) -> dict[str, str]:
    """A carrier holding ``span``'s context (empty for a non-recording span)."""
    carrier: dict[str, str] = {}
    if span.get_span_context().is_valid:
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract(carrier: dict[str, str] | None) -> Context | None:
    """The parent context carried by ``carrier``; ``None`` when there is none."""
    if not carrier:
        return None
    return _PROPAGATOR.extract(carrier)
