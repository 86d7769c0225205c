"""The gateway's metrics, read back from a real Prometheus exposition: requests driven
through GatewayTelemetry's lifecycle, real router states and a real peer table (no Ray,
no network), and the dashboard's rolling windows beside them."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from firstlight.config import PlatformConfig, parse_config
from firstlight.hints import BlockEvent, SubscriberStatus
from firstlight.hints.mirror import HintMirror
from firstlight.region import ReplicaStats, RouterState, RouteShareStatus
from firstlight.regions.peers import CircuitBreaker, Peer, PeerTable
from firstlight.regions.summary import ModelSummary, RegionSummary
from firstlight.routing import ReplicaView, build_policy
from firstlight.telemetry import CATALOG, GatewayTelemetry, RequestObservation
from firstlight.telemetry.catalog import spec
from tests.conftest import FakeClock

MODEL, IDLE_MODEL = "sim-a", "sim-b"
WALL = 1_764_480_000.0


def make_config(metrics_enabled: bool = True) -> PlatformConfig:
    """Region r1 with peers r2 and r3, two ``sim`` models, a local-mode config."""
    peers = [{"region": "r2", "rtt_ms": 40}, {"region": "r3", "rtt_ms": 90}]
    data = {
        "mode": "local",
        "regions": [{"name": "r1", "peers": peers}, {"name": "r2"}, {"name": "r3"}],
        "models": [{"name": MODEL, "engine": "sim"}, {"name": IDLE_MODEL, "engine": "sim"}],
        "router": {"slo": {"ttft_p95_ms": 250, "tpot_p95_ms": 40}},
        "telemetry": {"metrics_enabled": metrics_enabled},
    }
    return parse_config(data, "test")


def replica_stats(running: int, waiting: int, hits: int, queries: int) -> ReplicaStats:
    """Routing stats as a replica reports them (wall-clock ``at``, cumulative counters)."""
    return ReplicaStats(
        at=time.time(), running=running, waiting=waiting, kv_cache_usage=0.25,
        prefix_cache_queries=queries, prefix_cache_hits=hits, spec_draft_tokens=30,
        spec_accepted_tokens=21, accepting=True, prefill_tokens_per_s=5000.0,
    )  # fmt: skip


def make_state(clock: FakeClock, **kwargs: Any) -> RouterState:
    """A router state with replicas r-b (1 running, 2 waiting) and r-a (0, 0)."""
    policy = build_policy("firstlight", {}, rng=random.Random(0), clock=clock)
    state = RouterState("r1", MODEL, policy, clock=clock, **kwargs)
    state.set_replicas({rid: ReplicaView(rid, "r1", queue_len=0) for rid in ("r-b", "r-a")})
    state.stats = {"r-b": replica_stats(1, 2, 40, 100), "r-a": replica_stats(0, 0, 0, 0)}
    return state


def make_peers(clock: FakeClock) -> PeerTable:
    """r2 answered just now (up, 42 ms); r3 never answered (down, its prior 90 ms)."""
    summary = RegionSummary("r2", WALL, {MODEL: ModelSummary(2, 15.0, 0.2)})
    fresh = Peer("r2", "http://r2", 42.0, 40.0, CircuitBreaker(clock=clock), summary, clock())
    silent = Peer("r3", "http://r3", 90.0, 90.0, CircuitBreaker(clock=clock))
    return PeerTable([fresh, silent], httpx.AsyncClient(), clock=clock)


def make_telemetry(
    clock: FakeClock,
    states: dict[str, RouterState | None],
    peers: PeerTable | None = None,
    *,
    metrics_enabled: bool = True,
) -> GatewayTelemetry:
    return GatewayTelemetry(
        make_config(metrics_enabled),
        "r1",
        states=lambda: states,
        peers=peers,
        clock=clock,
        wall_clock=lambda: WALL,
    )


def serve(
    telemetry: GatewayTelemetry,
    *,
    model: str = MODEL,
    route: str | None = "local",
    ttft_s: float | None = 0.3,
    decode_s: float = 0.2,
    output_tokens: int = 5,
    status: int = 200,
    kind: str = "chat",
    explanation: str | None = None,
) -> RequestObservation:
    """One request through start → begin_route → first_token → finish; the gateway's
    monotonic times are pinned after the fact so the numbers are exact."""
    obs = telemetry.start(kind)
    obs.started -= 1.0  # lasted about a second
    obs.model, obs.input_tokens, obs.explanation = model, 12, explanation
    if route is not None:
        telemetry.begin_route(obs, route)
        obs.served_region, obs.replica, obs.predicted_ttft_ms = "r1", "r-a", 280.0
    if ttft_s is not None:
        obs.first_token()
        obs.first_token_at = obs.started + ttft_s
        obs.last_token_at = obs.first_token_at + decode_s
        obs.output_tokens = output_tokens
    obs.status = status
    telemetry.finish(obs)
    return obs


Scrape = list[tuple[str, dict[str, str], float]]


def scrape(telemetry: GatewayTelemetry) -> Scrape:
    body, content_type = telemetry.render()
    assert content_type.startswith("text/plain")
    families = text_string_to_metric_families(body.decode())
    return [(s.name, s.labels, s.value) for f in families for s in f.samples]


def find(samples: Scrape, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [(lb, v) for n, lb, v in samples if n == name and labels.items() <= lb.items()]


def by(samples: Scrape, name: str, *keys: str) -> dict[Any, float]:
    """``{label value (or a tuple of them): sample value}``; a missing label reads ``""``
    (as in PromQL)."""
    found = find(samples, name)
    if len(keys) == 1:
        return {lb.get(keys[0], ""): v for lb, v in found}
    return {tuple(lb.get(k, "") for k in keys): v for lb, v in found}


def value(samples: Scrape, name: str, **labels: str) -> float:
    found = find(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0][1]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def telemetry(clock: FakeClock) -> Iterator[GatewayTelemetry]:
    made = make_telemetry(clock, {MODEL: make_state(clock), IDLE_MODEL: None}, make_peers(clock))
    yield made
    made.shutdown()


def test_ttft_histogram_uses_the_catalog_buckets(telemetry: GatewayTelemetry) -> None:
    serve(telemetry, ttft_s=0.3)
    samples = scrape(telemetry)
    name = "gen_ai_server_time_to_first_token_seconds"
    buckets = find(samples, f"{name}_bucket", model=MODEL, route="local")
    bounds = [float(labels["le"]) for labels, _ in buckets if labels["le"] != "+Inf"]
    assert bounds == list(spec("gen_ai.server.time_to_first_token").buckets)
    assert value(samples, f"{name}_count", gen_ai_operation_name="chat") == 1
    assert value(samples, f"{name}_sum") == pytest.approx(0.3)
    assert value(samples, f"{name}_bucket", le="0.25") == 0
    assert value(samples, f"{name}_bucket", le="0.5") == 1


def test_tpot_is_decode_time_over_tokens_after_the_first(telemetry: GatewayTelemetry) -> None:
    serve(telemetry, decode_s=0.2, output_tokens=5)
    serve(telemetry, output_tokens=1)  # a single token has no time per output token
    samples = scrape(telemetry)
    name = "gen_ai_server_time_per_output_token_seconds"
    assert value(samples, f"{name}_count") == 1
    assert value(samples, f"{name}_sum") == pytest.approx(0.2 / 4)
    assert telemetry.itl[MODEL].values() == [pytest.approx(50.0)]


def test_duration_carries_error_type_only_for_errors(telemetry: GatewayTelemetry) -> None:
    serve(telemetry)
    serve(telemetry, route=None, ttft_s=None, status=503, kind="text")
    samples = scrape(telemetry)
    name = "gen_ai_server_request_duration_seconds_count"
    # The exporter writes error_type="" on the successes: the same as absent in PromQL.
    counts = by(samples, name, "route", "gen_ai_operation_name", "error_type")
    assert counts == {("local", "chat", ""): 1, ("none", "text_completion", "503"): 1}
    ok = value(samples, "gen_ai_server_request_duration_seconds_sum", route="local")
    assert 1.0 <= ok < 2.0


def test_token_usage_by_type(telemetry: GatewayTelemetry) -> None:
    serve(telemetry, output_tokens=7)
    samples = scrape(telemetry)
    name = "gen_ai_client_token_usage_sum"
    assert value(samples, name, gen_ai_token_type="input") == 12
    assert value(samples, name, gen_ai_token_type="output") == 7


def test_decisions_by_reason(telemetry: GatewayTelemetry) -> None:
    for route in ("local", "local", "spill_over", "from_peer"):
        serve(telemetry, route=route)
    serve(telemetry, route=None, ttft_s=None, status=503)  # no capacity anywhere
    serve(telemetry, route=None, ttft_s=None, status=429)  # refused before any decision
    serve(telemetry, model="unknown", route=None, ttft_s=None, status=503)
    serve(telemetry, model="unknown", route=None, ttft_s=None, status=404)
    samples = scrape(telemetry)
    expected = {"local": 2, "spill_over": 1, "from_peer": 1, "rejected": 1}
    name = "firstlight_route_decisions_total"
    assert by(samples, name, "reason") == expected
    assert set(by(samples, name, "model", "policy", "region")) == {(MODEL, "firstlight", "r1")}
    assert telemetry.routes[MODEL].counts() == expected
    # Requests of an unknown model still count in the request duration.
    assert len(find(samples, "gen_ai_server_request_duration_seconds_count", model="unknown")) == 2


@pytest.mark.parametrize(
    ("predicted_ms", "observed_ms", "direction", "error_s"),
    [(100.0, 250.0, "under", 0.15), (300.0, 250.0, "over", 0.05)],
)
def test_prediction_error_direction(
    telemetry: GatewayTelemetry,
    predicted_ms: float,
    observed_ms: float,
    direction: str,
    error_s: float,
) -> None:
    telemetry.routed(MODEL, 2e-5, predicted_ms, observed_ms)
    telemetry.routed(MODEL, None, None, observed_ms)  # nothing predicted, nothing timed
    samples = scrape(telemetry)
    name = "firstlight_route_ttft_prediction_error_seconds"
    assert by(samples, f"{name}_sum", "direction") == {direction: pytest.approx(error_s)}
    decision = "firstlight_route_decision_duration_seconds"
    assert value(samples, f"{decision}_count", policy="firstlight") == 1
    assert value(samples, f"{decision}_sum") == pytest.approx(2e-5)


def test_replica_gauges_and_counters(telemetry: GatewayTelemetry) -> None:
    samples = scrape(telemetry)
    assert by(samples, "firstlight_replica_queue_depth", "replica", "state") == {("r-a", "running"): 0, ("r-a", "waiting"): 0, ("r-b", "running"): 1,
                     ("r-b", "waiting"): 2}  # fmt: skip
    rb = {"model": MODEL, "replica": "r-b", "region": "r1"}
    assert value(samples, "firstlight_replica_prefix_cache_hit_tokens_total", **rb) == 40
    assert value(samples, "firstlight_replica_prefix_cache_queried_tokens_total", **rb) == 100
    assert value(samples, "firstlight_replica_spec_decode_draft_tokens_total", **rb) == 30
    assert value(samples, "firstlight_replica_spec_decode_accepted_tokens_total", **rb) == 21
    assert value(samples, "firstlight_replica_kv_cache_usage", **rb) == 0.25


def test_healthy_replicas_zero_without_a_router(telemetry: GatewayTelemetry) -> None:
    samples = scrape(telemetry)
    assert by(samples, "firstlight_replicas_healthy", "model") == {MODEL: 2, IDLE_MODEL: 0}


def test_peers_and_objectives(telemetry: GatewayTelemetry) -> None:
    samples = scrape(telemetry)
    assert by(samples, "firstlight_peer_up", "peer") == {"r2": 1, "r3": 0}
    rtt = by(samples, "firstlight_peer_rtt_seconds", "peer")
    # r3 never answered a probe: its RTT is only the configured prior, not exported.
    assert rtt == {"r2": pytest.approx(0.042)}
    assert value(samples, "firstlight_slo_time_to_first_token_seconds", region="r1") == 0.25
    assert value(samples, "firstlight_slo_time_per_output_token_seconds", region="r1") == 0.04


def test_no_peer_table_exports_no_peer_series(clock: FakeClock) -> None:
    telemetry = make_telemetry(clock, {MODEL: None, IDLE_MODEL: None})
    samples = scrape(telemetry)
    assert find(samples, "firstlight_peer_up") == []
    assert find(samples, "firstlight_peer_rtt_seconds") == []
    telemetry.shutdown()


@pytest.fixture
def disabled(clock: FakeClock) -> Iterator[GatewayTelemetry]:
    made = make_telemetry(clock, {MODEL: None, IDLE_MODEL: None}, metrics_enabled=False)
    assert not made.enabled
    serve(made, ttft_s=0.3, decode_s=0.2, output_tokens=5)
    made.routed(MODEL, 2e-5, 100.0, 250.0)
    yield made
    made.shutdown()


def test_metrics_disabled_records_nothing(disabled: GatewayTelemetry) -> None:
    recorded = {n for n, _, _ in scrape(disabled)}
    assert not {n for n in recorded if n.startswith(("gen_ai_", "firstlight_route_"))}
    assert disabled.routes[MODEL].counts() == {"local": 1}
    assert [d.route for d in disabled.decisions] == ["local"]


def test_metrics_disabled_still_fills_the_dashboard_percentiles(
    disabled: GatewayTelemetry,
) -> None:
    # The dashboard does not depend on /metrics: its TTFT and ITL windows must fill too.
    assert disabled.ttft[MODEL].values() == [pytest.approx(300.0)]
    assert disabled.itl[MODEL].values() == [pytest.approx(50.0)]


def test_decision_log_keeps_the_newest_30_newest_first(telemetry: GatewayTelemetry) -> None:
    for i in range(35):
        serve(telemetry, explanation=f"#{i}")
    serve(telemetry, model="unknown", route=None, ttft_s=None, status=404)  # not logged
    log = telemetry.decisions
    assert [d.explanation for d in log] == [f"#{i}" for i in range(34, 4, -1)]
    newest = log[0]
    assert (newest.at, newest.model, newest.route) == (WALL, MODEL, "local")
    assert (newest.region, newest.replica, newest.predicted_ttft_ms) == ("r1", "r-a", 280.0)
    assert newest.observed_ttft_ms == pytest.approx(300.0)


async def test_every_catalog_metric_is_exported(clock: FakeClock) -> None:
    # async: the asyncio-tasks gauge counts the running loop's tasks, as on a gateway
    mirror = HintMirror(ttl_s=60.0, clock=clock)
    mirror.apply(BlockEvent("r-a", 0, stored=(11, 12, 13), removed=()))
    feed = SubscriberStatus(False, WALL - 5.0, 0, 1, None, 0, 0, "connection refused")
    share = RouteShareStatus(connected=False, sent=7, heard=5, dropped=2)
    state = make_state(clock, cache=mirror, hints_feed=lambda: feed, route_share=lambda: share)
    state.fallbacks = 3
    telemetry = make_telemetry(clock, {MODEL: state, IDLE_MODEL: None}, make_peers(clock))
    serve(telemetry)
    telemetry.routed(MODEL, 2e-5, 100.0, 250.0)
    telemetry.metrics_shared = True  # what a gateway's ExpositionShare sets
    samples = scrape(telemetry)
    names = {n for n, _, _ in samples}
    for metric in CATALOG:
        base = metric.prometheus_name
        shown = f"{base}_count" if metric.kind == "histogram" else base
        assert shown in names, metric.name
    assert value(samples, "firstlight_route_fallbacks_total", model=MODEL) == 3
    assert value(samples, "firstlight_hints_staleness_seconds", model=MODEL) == 5.0
    assert value(samples, "firstlight_hints_redis_up") == 0
    assert value(samples, "firstlight_hints_mirror_blocks", model=MODEL) == 3
    assert value(samples, "firstlight_gateway_asyncio_tasks") >= 1, "this test's own task"
    assert value(samples, "firstlight_gateway_metrics_shared") == 1
    assert value(samples, "firstlight_route_share_up", model=MODEL) == 0
    for direction, count in (("sent", 7), ("heard", 5), ("dropped", 2)):
        shared = value(samples, "firstlight_route_shared_events_total", direction=direction)
        assert shared == count
    telemetry.shutdown()


def test_migrations_count_by_model_and_outcome_from_zero(clock: FakeClock) -> None:
    telemetry = make_telemetry(clock, {MODEL: None, IDLE_MODEL: None})
    telemetry.migrated(MODEL, "resumed")
    telemetry.migrated(MODEL, "resumed")
    telemetry.migrated(MODEL, "gave_up")
    samples = scrape(telemetry)
    name = "firstlight_request_migrations_total"
    assert value(samples, name, model=MODEL, outcome="resumed") == 2
    assert value(samples, name, model=MODEL, outcome="gave_up") == 1
    assert value(samples, name, model=MODEL, outcome="retried") == 0
    assert value(samples, name, model=IDLE_MODEL, outcome="retried") == 0, "exported at 0"
    telemetry.shutdown()
