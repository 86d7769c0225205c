"""Observability end to end on a running local platform (two regions of ``sim`` replicas,
hints through the real Redis): ``/metrics`` carries every catalog metric, a real
Prometheus server scrapes it and answers TTFT quantiles and hit ratios, the Grafana
dashboards and alert rules use only names a real scrape shows, traces reach a real OTLP
receiver as gateway → route → replica → engine, and the built-in dashboard renders both
regions with live numbers in headless Chromium."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from firstlight._ports import free_port
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight.telemetry import CATALOG
from firstlight.telemetry.engine_metrics import VLLM_SERIES
from tests.serve.cluster import platform_config
from tests.telemetry.promql import (
    dashboard_expressions,
    dashboard_files,
    metric_names,
    rule_expressions,
    rule_files,
    substitute_grafana_variables,
)

MODEL = "sim-obs"
EAST, WEST = "obs-east", "obs-west"
# A system prompt long enough to fill several 32-token blocks: shared by every request,
# so the second request onwards hits the prefix cache.
SYSTEM = "You are a careful assistant for the observability test. " * 12


@dataclass
class _OtlpReceiver:
    """A minimal OTLP/HTTP trace receiver: decodes every export it gets."""

    port: int
    spans: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.arrived = threading.Condition(self.lock)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.arrived:
                    for resource_spans in request.resource_spans:
                        resource = {
                            a.key: a.value.string_value for a in resource_spans.resource.attributes
                        }
                        for scope in resource_spans.scope_spans:
                            receiver.spans.extend((resource, s) for s in scope.spans)
                    receiver.arrived.notify_all()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def wait_for(self, predicate: Any, timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        with self.arrived:
            while not predicate(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.arrived.wait(left)
            return list(self.spans)


@pytest.fixture(scope="module")
def otlp() -> Iterator[_OtlpReceiver]:
    receiver = _OtlpReceiver(free_port())
    server = ThreadingHTTPServer(("127.0.0.1", receiver.port), receiver.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def platform(serve_port: int, otlp: _OtlpReceiver) -> Iterator[LocalPlatform]:
    model = {
        "name": MODEL,
        "engine": "sim",
        "replicas": 2,
        "max_model_len": 4096,
        "resources": {"num_cpus": 0},
    }
    regions = [
        {"name": EAST, "peers": [{"region": WEST, "rtt_ms": 30}]},
        {"name": WEST, "peers": [{"region": EAST, "rtt_ms": 30}]},
    ]
    telemetry = {"otlp_endpoint": f"http://127.0.0.1:{otlp.port}"}
    # The tests below assert route shapes (a local route span, local decisions, cache hits
    # in the region asked): no spill-over, whatever the peer predicts on a busy machine.
    router = {"spill_over_margin_ms": 60_000}
    extra = {"telemetry": telemetry, "router": router}
    config = platform_config(serve_port, regions, [model], extra=extra)
    running = start_local(config, timeout_s=120)
    try:
        yield running
    finally:
        stop_local(running)


def _chat(url: str, question: str, *, stream: bool = False) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        "max_tokens": 8,
        "stream": stream,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


@pytest.fixture(scope="module")
def traffic(platform: LocalPlatform) -> LocalPlatform:
    """Real requests through both regions: shared prefixes, streamed and not, one
    refused (unknown model) so error series exist too."""
    for region in (EAST, WEST):
        url = platform.endpoints[region]
        for i in range(6):
            _chat(url, f"Question {i}: what is {i} + {i}?", stream=i % 2 == 0)
        bad = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert bad.status_code == 404
    return platform


def _scrape(platform: LocalPlatform, region: str) -> dict[str, list[Any]]:
    """Series name → samples of one gateway's ``/metrics``."""
    response = httpx.get(f"{platform.endpoints[region]}/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    series: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample)
    return series


def _wait_for_stats(platform: LocalPlatform, region: str, timeout_s: float = 30) -> None:
    """Until the region's replicas have reported prefix-cache hits in their routing
    stats (they travel every 0.5 s through Ray's controller)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        series = _scrape(platform, region)
        hits = series.get("firstlight_replica_prefix_cache_hit_tokens_total", [])
        if sum(s.value for s in hits) > 0:
            return
        time.sleep(0.2)  # polling a remote state with a deadline, not synchronisation
    raise AssertionError(f"{region}: no prefix-cache hits reported within {timeout_s} s")


ONE_GATEWAY_ABSENT = frozenset(
    {"firstlight_route_share_up", "firstlight_route_shared_events_total"}
)
"""Series absent by design on this platform, which runs one gateway per region: there is
no route share to report (tests/telemetry/test_metrics.py exports them from a router
state that has one)."""
SIM_ABSENT = frozenset(VLLM_SERIES)
"""vLLM's own series: this platform's replicas are `sim` engines, which have none
(tests/telemetry/test_engine_metrics.py scrapes them from a real vLLM engine)."""


def test_metrics_endpoint_exports_every_catalog_metric(traffic: LocalPlatform) -> None:
    _wait_for_stats(traffic, EAST)
    series = _scrape(traffic, EAST)
    assert traffic.config.gateway.replicas == 1
    for spec in CATALOG:
        name = spec.prometheus_name
        if name in ONE_GATEWAY_ABSENT:
            assert name not in series, f"{name} with one gateway"
            continue
        names = (
            {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            if spec.kind == "histogram"
            else {name}
        )
        assert names <= set(series), f"{spec.name} ({name}) missing from /metrics"
    ttft = [
        s
        for s in series["gen_ai_server_time_to_first_token_seconds_count"]
        if s.labels["model"] == MODEL
    ]
    assert sum(s.value for s in ttft) >= 6
    assert {s.labels["region"] for s in ttft} == {EAST}
    errors = series["gen_ai_server_request_duration_seconds_count"]
    assert any(
        s.labels.get("error_type") == "404" and s.labels["model"] == "unknown" for s in errors
    )
    replicas = {s.labels["replica"] for s in series["firstlight_replica_queue_depth"]}
    assert len(replicas) == 2
    assert series["firstlight_hints_redis_up"][0].value == 1.0
    peers = series["firstlight_peer_up"]
    assert [(s.labels["peer"], s.value) for s in peers] == [(WEST, 1.0)]
    slo = series["firstlight_slo_time_to_first_token_seconds"][0].value
    assert slo == pytest.approx(0.5)


def test_no_high_cardinality_labels(traffic: LocalPlatform) -> None:
    allowed = {
        "region",
        "model",
        "replica",
        "peer",
        "route",
        "reason",
        "policy",
        "state",
        "direction",
        "outcome",
        "kind",  # firstlight_outliers_total: ttft or e2e
        "error_type",
        "gen_ai_operation_name",
        "gen_ai_request_model",
        "gen_ai_provider_name",
        "gen_ai_token_type",
        "le",
        "otel_scope_name",
        "otel_scope_version",
        "otel_scope_schema_url",
        # One value per live gateway replica of the region (gateway.replicas, at most 64),
        # like Prometheus' own `instance`; a gone gateway leaves the scrape within seconds.
        "gateway",
    }
    series = _scrape(traffic, EAST)
    gateways: set[str] = set()
    for name, samples in series.items():
        if name == "target_info":
            continue
        for sample in samples:
            assert set(sample.labels) <= allowed, (name, sample.labels)
            gateways.add(sample.labels.get("gateway", ""))
            for value in sample.labels.values():
                assert not value.startswith(("chatcmpl-", "cmpl-")), (name, sample.labels)
    assert len(gateways - {""}) <= traffic.config.gateway.replicas, gateways


def test_grafana_and_rules_use_only_scraped_names(traffic: LocalPlatform) -> None:
    _wait_for_stats(traffic, EAST)
    scraped = set(_scrape(traffic, EAST)) | set(_scrape(traffic, WEST))
    used: dict[str, str] = {}
    for path in dashboard_files():
        for title, expr in dashboard_expressions(path):
            for name in metric_names(substitute_grafana_variables(expr)):
                used.setdefault(name, f"{path.name}: {title}")
    for path in rule_files():
        for rule, expr in rule_expressions(path):
            for name in metric_names(expr):
                used.setdefault(name, f"{path.name}: {rule}")
    assert used, "no metric names found in the dashboards and rules"
    missing = {
        name: where
        for name, where in used.items()
        if name not in scraped | ONE_GATEWAY_ABSENT | SIM_ABSENT
    }
    assert not missing, f"names not in a real scrape: {missing}"


@pytest.fixture(scope="module")
def prometheus(traffic: LocalPlatform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus server scraping both gateways every second."""
    binary = shutil.which("prometheus")
    assert binary is not None, "Prometheus is missing: install Debian's `prometheus` package"
    port = free_port()
    work = tmp_path_factory.mktemp("prometheus")
    proxy = traffic.endpoints[EAST].rsplit("/", 1)[0].removeprefix("http://")
    jobs = [
        {
            "job_name": f"firstlight-{region}",
            "scrape_interval": "1s",
            "metrics_path": f"/{region}/metrics",
            "static_configs": [{"targets": [proxy]}],
        }
        for region in (EAST, WEST)
    ]
    (work / "prometheus.yml").write_text(json.dumps({"scrape_configs": jobs}))
    url = f"http://127.0.0.1:{port}"
    with (work / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            _until(lambda: _targets_up(url) == 2, 60, f"Prometheus targets up ({work})")
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def _targets_up(url: str) -> int:
    try:
        data = httpx.get(f"{url}/api/v1/targets", timeout=5).json()
    except (httpx.HTTPError, ValueError):  # not listening yet, or still starting up
        return 0
    return sum(t["health"] == "up" for t in data["data"]["activeTargets"])


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    data = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def _positive(url: str, expr: str) -> float | None:
    """The single value ``expr`` evaluates to, if it is a positive number."""
    result = _query(url, expr)
    value = float(result[0]["value"][1]) if result else math.nan
    return value if math.isfinite(value) and value > 0 else None


def _until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)  # polling a remote server with a deadline
    raise AssertionError(f"timed out waiting for {what}")


def test_prometheus_answers_ttft_quantile_and_hit_ratio(
    traffic: LocalPlatform, prometheus: str
) -> None:
    # Requests after Prometheus' first scrapes, so rate() sees them rise.
    for i in range(8):
        _chat(traffic.endpoints[EAST], f"Follow-up {i}: and {i} * {i}?", stream=i % 2 == 1)
    ttft_expr = (
        "histogram_quantile(0.95, sum by (le, region) "
        f'(rate(gen_ai_server_time_to_first_token_seconds_bucket{{region="{EAST}"}}[1m])))'
    )
    p95 = _until(lambda: _positive(prometheus, ttft_expr), 60, "a TTFT p95 from Prometheus")
    assert 0 < p95 < 10
    hit_expr = (
        f'sum(rate(firstlight_replica_prefix_cache_hit_tokens_total{{region="{EAST}"}}[1m])) / '
        f'sum(rate(firstlight_replica_prefix_cache_queried_tokens_total{{region="{EAST}"}}[1m]))'
    )
    ratio = _until(lambda: _positive(prometheus, hit_expr), 60, "a non-zero hit ratio")
    assert 0 < ratio <= 1


def test_every_dashboard_and_rule_expression_is_accepted_by_prometheus(
    traffic: LocalPlatform, prometheus: str
) -> None:
    for path in dashboard_files():
        for _title, expr in dashboard_expressions(path):
            _query(prometheus, substitute_grafana_variables(expr).replace(".*", ".+"))
    for path in rule_files():
        for _rule, expr in rule_expressions(path):
            _query(prometheus, expr)


def test_traces_cross_gateway_router_replica_and_engine(
    traffic: LocalPlatform, otlp: _OtlpReceiver
) -> None:
    response = _chat(traffic.endpoints[WEST], "Trace me: 2 + 2?")
    request_id = response.json()["id"]

    def attrs(span: Any) -> dict[str, Any]:
        out = {}
        for a in span.attributes:
            value = a.value
            out[a.key] = getattr(value, value.WhichOneof("value"))
        return out

    def of_request(spans: list[Any]) -> list[Any]:
        roots = [s for _, s in spans if attrs(s).get("gen_ai.response.id") == request_id]
        return [s for _, s in spans if roots and s.trace_id == roots[0].trace_id]

    # The request's span is named as OpenTelemetry's GenAI conventions say:
    # "{gen_ai.operation.name} {gen_ai.request.model}".
    expected = {
        f"chat {MODEL}",
        "firstlight.route",
        "firstlight.replica",
        "firstlight.engine.generate",
    }
    spans = otlp.wait_for(lambda got: {s.name for s in of_request(got)} >= expected, 30)
    assert {s.name for s in of_request(spans)} >= expected, sorted(s.name for _, s in spans)
    by_id = {s.span_id: (resource, s) for resource, s in spans}
    engine = next(s for s in of_request(spans) if s.name == "firstlight.engine.generate")
    replica_resource, replica_span = by_id[engine.parent_span_id]
    assert replica_span.name == "firstlight.replica"
    assert replica_resource["firstlight.role"] == "replica"
    _, route = by_id[replica_span.parent_span_id]
    assert route.name == "firstlight.route"
    route_attrs = attrs(route)
    assert route_attrs["firstlight.route"] == "local"
    assert route_attrs["firstlight.replica"] == response.headers["x-firstlight-replica"]
    for term in ("rtt_ms", "wait_ms", "prefill_ms", "reload_ms", "overhead_ms"):
        assert f"firstlight.terms.{term}" in route_attrs
    assert route_attrs["firstlight.host_tier_tokens"] == 0  # no KV offloading here
    gateway_resource, request_span = by_id[route.parent_span_id]
    assert request_span.name == f"chat {MODEL}"
    assert attrs(request_span)["gen_ai.response.model"] == MODEL
    assert gateway_resource["firstlight.role"] == "gateway"
    assert gateway_resource["cloud.region"] == WEST
    assert attrs(request_span)["gen_ai.request.model"] == MODEL
    assert len({s.trace_id for s in (engine, replica_span, route, request_span)}) == 1


def test_dashboard_state_lists_both_regions_and_live_numbers(traffic: LocalPlatform) -> None:
    response = httpx.get(f"{traffic.endpoints[EAST]}/dashboard/api/state", timeout=10)
    assert response.status_code == 200
    state = response.json()
    assert state["region"] == EAST
    assert state["simulated"] is True
    assert [r["name"] for r in state["regions"]] == [EAST, WEST]
    assert all(r["up"] for r in state["regions"])
    (model,) = state["models"]
    assert model["ttft_ms"]["count"] >= 6
    assert 0 < model["ttft_ms"]["p50"] <= model["ttft_ms"]["p95"] <= model["ttft_ms"]["p99"]
    assert len(model["replicas"]) == 2
    assert model["routes"]["local"] >= 6
    local = [d for d in state["decisions"] if d["route"] == "local"]
    assert local
    assert local[0]["explanation"]
    assert local[0]["replica"]
    assert local[0]["observed_ttft_ms"] > 0


def test_dashboard_page_renders_in_headless_chromium(
    traffic: LocalPlatform, tmp_path: Path
) -> None:
    chromium = shutil.which("chromium")
    assert chromium is not None, "Chromium is missing: install Debian's `chromium` package"
    url = f"{traffic.endpoints[EAST]}/dashboard"
    flags = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--virtual-time-budget=5000",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for region in (EAST, WEST):
        assert f'data-region="{region}"' in dom, f"{region} not shown"
    state = httpx.get(f"{url}/api/state", timeout=10).json()
    replica = state["models"][0]["replicas"][0]["id"]
    assert f'data-replica="{replica}"' in dom
    # Live numbers: the TTFT percentiles of this run, not placeholders.
    for quantile in ("p50", "p95", "p99"):
        match = re.search(rf'id="ttft-{quantile}-{MODEL}"[^>]*>([^<]*)<', dom)
        assert match is not None, f"no TTFT {quantile} element"
        assert float(match.group(1).replace(",", "")) > 0, match.group(0)
    shot = tmp_path / "dashboard.png"
    subprocess.run(
        [*flags, "--hide-scrollbars", "--window-size=1440,1000", f"--screenshot={shot}", url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000
