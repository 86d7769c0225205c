"""Edge cases of the gateway's telemetry that make metrics lie if they go wrong: a
request finished twice, a 503 after failed attempts, tokens of forwarded requests,
replica ids that come and go, and a client's own trace context."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from firstlight.region import ReplicaStats
from firstlight.telemetry import GatewayTelemetry
from tests.conftest import FakeClock
from tests.telemetry.test_metrics import (
    MODEL,
    by,
    clock,
    find,
    make_config,
    make_state,
    make_telemetry,
    scrape,
    serve,
    telemetry,
)

__all__ = ["clock", "telemetry"]  # the shared fixtures, used by name below


def test_finish_twice_counts_once(telemetry: GatewayTelemetry) -> None:
    obs = serve(telemetry)
    telemetry.finish(obs)
    samples = scrape(telemetry)
    assert by(samples, "firstlight_route_decisions_total", "reason") == {"local": 1}
    count = by(samples, "gen_ai_server_request_duration_seconds_count", "route")
    assert count == {"local": 1}


def test_503_after_failed_attempts_is_rejected_not_the_last_route(
    telemetry: GatewayTelemetry,
) -> None:
    obs = serve(telemetry, route="fail_over", ttft_s=None, status=503)
    assert (obs.served_region, obs.replica) == (None, None)
    samples = scrape(telemetry)
    assert by(samples, "firstlight_route_decisions_total", "reason") == {"rejected": 1}
    assert telemetry.decisions[0].route == "rejected"
    assert telemetry.decisions[0].region is None


def test_tokens_count_where_they_were_served(telemetry: GatewayTelemetry) -> None:
    serve(telemetry, route="spill_over", output_tokens=9)  # the peer counts these
    serve(telemetry, route="from_peer", output_tokens=4)
    serve(telemetry, route=None, ttft_s=None, status=503)  # refused: nothing processed
    samples = scrape(telemetry)
    outputs = find(samples, "gen_ai_client_token_usage_sum", gen_ai_token_type="output")
    assert [(labels["route"], v) for labels, v in outputs] == [("from_peer", 4.0)]


def test_replicas_that_are_gone_vanish_from_the_scrape(clock: FakeClock) -> None:
    state = make_state(clock)
    telemetry = make_telemetry(clock, {MODEL: state})
    try:
        before = by(scrape(telemetry), "firstlight_replica_kv_cache_usage", "replica")
        assert set(before) == {"r-a", "r-b"}
        state.stats = {"r-new": ReplicaStats(kv_cache_usage=0.5, running=1)}  # restarted
        after = scrape(telemetry)
        assert set(by(after, "firstlight_replica_kv_cache_usage", "replica")) == {"r-new"}
        queue = by(after, "firstlight_replica_queue_depth", "replica", "state")
        assert queue == {("r-new", "running"): 1, ("r-new", "waiting"): 0}
    finally:
        telemetry.shutdown()


def test_a_clients_traceparent_is_ignored_a_peers_is_followed(clock: FakeClock) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = GatewayTelemetry(
        make_config(), "r1", lambda: {}, None, tracer=provider.get_tracer("t"), clock=clock
    )
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    # A client's, even with a hop header (whose signature the gateway did not verify),
    # then a verified peer's.
    forged = {"traceparent": parent, "x-firstlight-hop": "r2"}
    for headers, from_peer in (({"traceparent": parent}, False), (forged, False), (forged, True)):
        obs = telemetry.start("chat", headers, from_peer=from_peer)
        telemetry.finish(obs)
    client, forger, peer = exporter.get_finished_spans()
    assert client.parent is None
    assert forger.parent is None
    assert peer.parent is not None
    assert format(peer.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    telemetry.shutdown()
    provider.shutdown()


def test_a_requests_span_is_named_for_its_operation_and_model(clock: FakeClock) -> None:
    """OpenTelemetry's GenAI conventions: "{gen_ai.operation.name} {gen_ai.request.model}"
    once the model is known; a request refused before that keeps the operation alone."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = GatewayTelemetry(
        make_config(), "r1", lambda: {}, None, tracer=provider.get_tracer("t"), clock=clock
    )
    served = telemetry.start("chat")
    served.admitted(group="g", model="m", request_id="chatcmpl-1", input_tokens=4)
    telemetry.finish(served)
    refused = telemetry.start("text")
    refused.ended(401)
    telemetry.finish(refused)
    named, unnamed = exporter.get_finished_spans()
    assert named.name == "chat m"
    assert named.attributes is not None
    assert named.attributes["gen_ai.response.model"] == "m"
    assert unnamed.name == "text_completion"
    assert unnamed.attributes is not None
    assert "gen_ai.response.model" not in unnamed.attributes
    telemetry.shutdown()
    provider.shutdown()


def test_genai_metrics_carry_the_conventions_attribute_names(telemetry: GatewayTelemetry) -> None:
    serve(telemetry, output_tokens=3)
    serve(telemetry, model="unknown", route=None, ttft_s=None, status=404)
    samples = scrape(telemetry)
    for name in (
        "gen_ai_server_time_to_first_token_seconds_count",
        "gen_ai_server_time_per_output_token_seconds_count",
        "gen_ai_server_request_duration_seconds_count",
        "gen_ai_client_token_usage_count",
    ):
        found = find(samples, name)
        assert found, name
        for labels, _ in found:
            # Dots become underscores in Prometheus; `model` stays for Firstlight's joins.
            assert labels["gen_ai_request_model"] == labels["model"], (name, labels)
            assert labels["gen_ai_provider_name"] == "firstlight", (name, labels)
            assert labels["gen_ai_operation_name"] in ("chat", "text_completion"), name
            assert labels["region"], name
    models = by(samples, "gen_ai_server_request_duration_seconds_count", "gen_ai_request_model")
    assert models == {MODEL: 1, "unknown": 1}
