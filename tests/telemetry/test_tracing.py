"""Trace plumbing: the OTLP URL, the no-op tracer without an endpoint, and the W3C
``traceparent`` carrier that crosses the Ray handle call (gateway → replica)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from firstlight.config import TelemetryConfig
from firstlight.telemetry.tracing import build_tracer, extract, inject, traces_url


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otel.example.com/v1/traces", "https://otel.example.com/v1/traces"),
        ("https://otel.example.com/v1/traces/", "https://otel.example.com/v1/traces"),
        ("http://gw:4318/otlp", "http://gw:4318/otlp/v1/traces"),
    ],
)
def test_traces_url(endpoint: str, expected: str) -> None:
    assert traces_url(endpoint) == expected


def test_no_endpoint_gives_a_non_recording_tracer() -> None:
    tracer = build_tracer(TelemetryConfig(), "r1", "gateway")
    span = tracer.start_span("chat")
    assert not span.is_recording()
    assert not span.get_span_context().is_valid
    assert inject(span) == {}
    span.end()


def test_with_an_endpoint_spans_record() -> None:
    config = TelemetryConfig.model_validate({"otlp_endpoint": "http://127.0.0.1:9/"})
    tracer = build_tracer(config, "r1", "replica")
    span = tracer.start_span("generate")
    assert span.is_recording()
    assert isinstance(span, ReadableSpan)
    assert span.resource.attributes["cloud.region"] == "r1"
    assert span.resource.attributes["firstlight.role"] == "replica"
    assert span.resource.attributes["service.name"] == "firstlight"
    assert inject(span)["traceparent"].startswith("00-")
    # Not ended, so nothing is exported to the (closed) port; stop the batch thread.
    assert isinstance(tracer, sdk_trace.Tracer)
    tracer.span_processor.shutdown()


@pytest.mark.parametrize("carrier", [None, {}])
def test_extract_of_nothing_is_none(carrier: dict[str, str] | None) -> None:
    assert extract(carrier) is None


@pytest.fixture
def recorded() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def test_inject_extract_round_trip(recorded: tuple[trace.Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = recorded
    route = tracer.start_span("firstlight.route")
    carrier = inject(route)
    route_context = route.get_span_context()
    assert set(carrier) == {"traceparent"}
    version, trace_id, span_id, flags = carrier["traceparent"].split("-")
    assert (version, trace_id) == ("00", f"{route_context.trace_id:032x}")
    assert span_id == f"{route_context.span_id:016x}"
    assert int(flags, 16) & 0x01  # sampled

    parent = extract(carrier)
    assert parent is not None
    remote = trace.get_current_span(parent).get_span_context()
    assert remote.is_remote
    assert (remote.trace_id, remote.span_id) == (route_context.trace_id, route_context.span_id)

    child = tracer.start_span("generate", context=parent)
    child.end()
    route.end()
    finished = {s.name: s for s in exporter.get_finished_spans()}
    generate = finished["generate"]
    assert generate.context is not None
    assert generate.context.trace_id == route_context.trace_id
    assert generate.parent is not None
    assert generate.parent.span_id == route_context.span_id
