"""Outlier capture: the rolling-median detector alone (seeded latency streams), then a
planted slow request through GatewayTelemetry's lifecycle with a real router state, a
real recording tracer and a real Prometheus exposition, down to the dashboard's JSON."""

from __future__ import annotations

import json
import logging
import math
import random
import statistics
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from firstlight.config import PlatformConfig, parse_config
from firstlight.dashboard import dashboard_state
from firstlight.errors import ConfigError
from firstlight.region import RouterState
from firstlight.regions.summary import RegionSummary
from firstlight.routing import Candidate, Decision, RequestView, TtftTerms
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from firstlight.telemetry.outliers import (
    OutlierDetector,
    OutlierRecord,
    RollingMedian,
    record_json,
)
from tests.conftest import FakeClock
from tests.telemetry.test_metrics import MODEL, WALL, make_peers, make_state, scrape, value

TTFT_MEDIAN_MS, E2E_MEDIAN_MS, SIGMA = 200.0, 2000.0, 0.3


def lognormal_stream(seed: int, n: int) -> list[tuple[float, float]]:
    """``n`` (ttft_ms, e2e_ms) pairs, each lognormal around its median with a sigma of
    0.3 (a p99 about twice the median): a steady service with realistic jitter."""
    rng = random.Random(seed)
    return [
        (
            rng.lognormvariate(math.log(TTFT_MEDIAN_MS), SIGMA),
            rng.lognormvariate(math.log(E2E_MEDIAN_MS), SIGMA),
        )
        for _ in range(n)
    ]


# --- the rolling median ----------------------------------------------------------------


def test_rolling_median_odd_even_and_bounded() -> None:
    window = RollingMedian(3)
    assert window.median() is None
    window.add(5.0)
    assert window.median() == 5.0
    window.add(1.0)
    assert window.median() == 3.0
    window.add(9.0)
    assert window.median() == 5.0
    window.add(100.0)  # 5.0 (the oldest) leaves: 1, 9, 100
    assert len(window) == 3
    assert window.median() == 9.0


def test_rolling_median_matches_statistics_over_a_sliding_window() -> None:
    rng = random.Random(7)
    window = RollingMedian(101)
    values = [round(rng.uniform(0, 50), 1) for _ in range(600)]  # duplicates included
    for i, v in enumerate(values):
        window.add(v)
        assert window.median() == statistics.median(values[max(0, i - 100) : i + 1])


def test_rolling_median_rejects_an_empty_window() -> None:
    with pytest.raises(ValueError, match="max_samples"):
        RollingMedian(0)


# --- the detector --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_no_false_capture_in_a_steady_run_then_a_planted_15x_is_caught(seed: int) -> None:
    detector = OutlierDetector(factor=10.0, min_samples=50, window_samples=1000)
    captured = [detector.observe(MODEL, ttft, e2e) for ttft, e2e in lognormal_stream(seed, 1000)]
    assert [c for c in captured if c] == []
    median = detector.median_ms(MODEL, "ttft")
    assert median is not None
    assert median == pytest.approx(TTFT_MEDIAN_MS, rel=0.1)
    (hit,) = detector.observe(MODEL, 15 * TTFT_MEDIAN_MS, E2E_MEDIAN_MS)
    assert hit.kind == "ttft"
    assert hit.observed_ms == 15 * TTFT_MEDIAN_MS
    assert hit.median_ms == pytest.approx(median)
    (slow_end,) = detector.observe(MODEL, TTFT_MEDIAN_MS, 15 * E2E_MEDIAN_MS)
    assert slow_end.kind == "e2e"


def test_the_same_stream_is_captured_with_a_tight_factor() -> None:
    """The steady run above is silent because of the factor, not because the detector
    never fires: at 1.5 times the median the same jitter is flagged often."""
    detector = OutlierDetector(factor=1.5, min_samples=50, window_samples=1000)
    kinds = [
        e.kind for t, e2e in lognormal_stream(1, 1000) for e in detector.observe(MODEL, t, e2e)
    ]
    assert kinds.count("ttft") > 20
    assert kinds.count("e2e") > 20


def test_nothing_is_judged_before_min_samples() -> None:
    detector = OutlierDetector(factor=10.0, min_samples=50, window_samples=1000)
    for _ in range(49):
        detector.observe(MODEL, 100.0, 1000.0)
    assert detector.observe(MODEL, 100_000.0, 1_000_000.0) == []  # the 50th sample
    assert [e.kind for e in detector.observe(MODEL, 100_000.0, 1_000_000.0)] == ["ttft", "e2e"]


def test_models_and_kinds_have_their_own_medians() -> None:
    detector = OutlierDetector(factor=10.0, min_samples=5, window_samples=100)
    for _ in range(10):
        detector.observe("fast", 10.0, 100.0)
        detector.observe("slow", 1000.0, 10_000.0)
    assert detector.observe("slow", 1000.0, 10_000.0) == []
    assert [e.kind for e in detector.observe("fast", 1000.0, 100.0)] == ["ttft"]
    # No TTFT measured (no first token timed): only the end-to-end time is judged.
    assert [e.kind for e in detector.observe("fast", None, 100_000.0)] == ["e2e"]
    assert detector.median_ms("unseen", "ttft") is None


def test_a_lasting_shift_moves_the_median_instead_of_flagging_forever() -> None:
    detector = OutlierDetector(factor=10.0, min_samples=10, window_samples=21)
    for _ in range(21):
        detector.observe(MODEL, 10.0, 100.0)
    flagged = [bool(detector.observe(MODEL, 500.0, 100.0)) for _ in range(40)]
    assert flagged[0] is True
    assert flagged[-1] is False  # the window now holds the new level
    assert detector.median_ms(MODEL, "ttft") == 500.0


@pytest.mark.parametrize(
    ("factor", "min_samples", "window", "match"),
    [(1.0, 50, 1000, "factor"), (10.0, 0, 1000, "min_samples"), (10.0, 60, 50, "min_samples")],
)
def test_detector_rejects_bad_parameters(
    factor: float, min_samples: int, window: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        OutlierDetector(factor, min_samples, window)


# --- configuration -------------------------------------------------------------------------


def config_with(**telemetry: object) -> PlatformConfig:
    data = {
        "mode": "local",
        "regions": [{"name": "r1", "peers": [{"region": "r2", "rtt_ms": 40}]}, {"name": "r2"}],
        "models": [{"name": MODEL, "engine": "sim"}],
        "telemetry": telemetry,
    }
    return parse_config(data, "test")


def test_config_defaults_and_bounds() -> None:
    t = config_with().telemetry
    assert (t.outlier_factor, t.outlier_min_samples, t.outlier_window_samples) == (10.0, 50, 1000)
    for bad in ({"outlier_factor": 1.0}, {"outlier_factor": 1001}, {"outlier_min_samples": 0}):
        with pytest.raises(ConfigError, match="outlier_"):
            config_with(**bad)
    with pytest.raises(ConfigError, match=r"outlier_window_samples.*outlier_min_samples \(50\)"):
        config_with(outlier_window_samples=20)


# --- through the gateway's telemetry ----------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state(clock: FakeClock) -> RouterState:
    return make_state(clock)


@pytest.fixture
def telemetry(clock: FakeClock, state: RouterState) -> Iterator[GatewayTelemetry]:
    provider = TracerProvider()  # recording, exporting nowhere: spans have trace ids
    made = GatewayTelemetry(
        config_with(outlier_min_samples=50),
        "r1",
        states=lambda: {MODEL: state},
        peers=make_peers(clock),
        tracer=provider.get_tracer("test"),
        clock=clock,
        wall_clock=lambda: WALL,
    )
    yield made
    made.shutdown()
    provider.shutdown()


def request(
    telemetry: GatewayTelemetry,
    state: RouterState,
    request_id: str,
    *,
    ttft_s: float,
    e2e_s: float,
    status: int = 200,
) -> RequestObservation:
    """One locally served request the way the gateway drives it: the router records
    its decision and Ray routes it before the first token; then the request ends."""
    obs = telemetry.start("chat")
    obs.model, obs.request_id, obs.input_tokens = MODEL, request_id, 512
    telemetry.begin_route(obs, "local")
    terms = TtftTerms(
        rtt_ms=0.0, wait_ms=35.0, prefill_ms=60.0, overhead_ms=5.0,
        cached_tokens=64, uncached_tokens=448,
    )  # fmt: skip
    runner_terms = TtftTerms(0.0, 80.0, 70.0, 5.0, 0, 512)
    decision = Decision(
        "firstlight",
        (Candidate("r-a", "r1", 100.0, terms, 2), Candidate("r-b", "r1", 155.0, runner_terms)),
        "lowest-predicted-ttft",
    )
    state.record_decision(RequestView(request_id, 512), decision)
    state.record_routed(request_id, "r-a")
    obs.served_region, obs.replica = "r1", "r-a"
    obs.predicted_ttft_ms, obs.explanation = 100.0, decision.explain()
    obs.observed_ttft_ms = ttft_s * 1000.0 - 2.0
    obs.first_token()  # the telemetry reads the route's terms here
    state.finished(request_id)  # the route is gone before the request's end
    obs.output_tokens = 40
    now = time.monotonic()
    obs.started = now - e2e_s
    obs.first_token_at = obs.started + ttft_s
    obs.last_token_at = now
    obs.status = status
    telemetry.finish(obs)
    return obs


def steady(telemetry: GatewayTelemetry, state: RouterState, n: int) -> None:
    for i, (ttft_ms, e2e_ms) in enumerate(lognormal_stream(11, n)):
        request(telemetry, state, f"steady-{i}", ttft_s=ttft_ms / 1e3, e2e_s=e2e_ms / 1e3)


def test_a_planted_slow_request_is_captured_with_every_field(
    telemetry: GatewayTelemetry, state: RouterState, caplog: pytest.LogCaptureFixture
) -> None:
    steady(telemetry, state, 200)
    assert telemetry.outliers == []
    with caplog.at_level(logging.WARNING, logger="firstlight.outliers"):
        slow = request(telemetry, state, "chatcmpl-slow", ttft_s=3.0, e2e_s=4.5)
    (record,) = telemetry.outliers
    trace_id = format(slow.span.get_span_context().trace_id, "032x")
    assert record == OutlierRecord(
        at=WALL,
        model=MODEL,
        kinds=("ttft",),
        factor=10.0,
        request_id="chatcmpl-slow",
        trace_id=trace_id,
        route="local",
        served_region="r1",
        peer_region=None,
        replica="r-a",
        explanation=record.explanation,
        predicted_ttft_ms=100.0,
        ttft_ms=pytest.approx(3000.0, abs=1.0),  # type: ignore[arg-type]
        dispatch_ttft_ms=pytest.approx(2998.0, abs=1.0),  # type: ignore[arg-type]
        median_ttft_ms=record.median_ttft_ms,
        e2e_ms=pytest.approx(4500.0, abs=1.0),  # type: ignore[arg-type]
        median_e2e_ms=record.median_e2e_ms,
        predicted_queue_wait_ms=35.0,
        replica_queue_len=0,
        cached_tokens=64,
        runner_up="r-b",
        runner_up_ttft_ms=155.0,
        input_tokens=512,
        output_tokens=40,
    )
    assert record.explanation is not None
    assert "r-a" in record.explanation
    assert record.median_ttft_ms == pytest.approx(TTFT_MEDIAN_MS, rel=0.15)
    assert record.median_e2e_ms == pytest.approx(E2E_MEDIAN_MS, rel=0.15)
    assert len(trace_id) == 32
    assert int(trace_id, 16) != 0
    # One structured log line, the record as JSON.
    (line,) = [r for r in caplog.records if r.name == "firstlight.outliers"]
    assert line.levelno == logging.WARNING
    logged = json.loads(line.getMessage())
    assert logged == json.loads(record_json(record))
    assert logged["trace_id"] == trace_id
    assert logged["request_id"] == "chatcmpl-slow"
    assert logged["kinds"] == ["ttft"]
    # Counted by kind.
    samples = scrape(telemetry)
    assert value(samples, "firstlight_outliers_total", model=MODEL, kind="ttft") == 1.0
    assert value(samples, "firstlight_outliers_total", model=MODEL, kind="e2e") == 0.0


def test_a_slow_request_served_by_a_peer_is_captured_with_the_peer_decision(
    telemetry: GatewayTelemetry, state: RouterState
) -> None:
    """Forwarded the way ``api/forward.py`` drives it: the peer, its prediction against
    the local one, and no replica facts of this region."""
    steady(telemetry, state, 200)
    obs = telemetry.start("chat")
    obs.model, obs.request_id, obs.input_tokens = MODEL, "chatcmpl-far", 512
    telemetry.begin_route(obs, "spill_over")
    obs.served_region, obs.predicted_ttft_ms = "r2", 180.0
    obs.explanation = "spill-over to r2: predicted 180.0 ms (rtt 80.0 ms) vs local r-a: 900 ms"
    now = time.monotonic()
    obs.started = now - 5.0
    obs.first_token_at = obs.started + 4.0
    obs.last_token_at = now
    obs.status = 200
    telemetry.finish(obs)
    (record,) = telemetry.outliers
    assert (record.route, record.served_region, record.peer_region) == ("spill_over", "r2", "r2")
    assert record.explanation == obs.explanation
    assert record.predicted_ttft_ms == 180.0
    assert record.ttft_ms == pytest.approx(4000.0, abs=1.0)
    assert (record.replica, record.dispatch_ttft_ms, record.replica_queue_len) == (None,) * 3
    assert record.trace_id is not None


def test_no_capture_in_a_steady_run_of_a_thousand_requests(
    telemetry: GatewayTelemetry, state: RouterState, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="firstlight.outliers"):
        steady(telemetry, state, 1000)
    assert telemetry.outliers == []
    assert [r for r in caplog.records if r.name == "firstlight.outliers"] == []
    counted = [v for n, _, v in scrape(telemetry) if n == "firstlight_outliers_total"]
    assert counted == [0.0, 0.0]  # every series from 0: ttft and e2e of the one model


def test_warm_up_and_failed_requests_are_not_judged(
    telemetry: GatewayTelemetry, state: RouterState
) -> None:
    steady(telemetry, state, 10)
    request(telemetry, state, "early-slow", ttft_s=30.0, e2e_s=40.0)  # before min_samples
    steady(telemetry, state, 100)
    request(telemetry, state, "failed-slow", ttft_s=30.0, e2e_s=40.0, status=500)
    assert telemetry.outliers == []
    request(telemetry, state, "slow", ttft_s=30.0, e2e_s=40.0)
    assert [r.request_id for r in telemetry.outliers] == ["slow"]
    assert telemetry.outliers[0].kinds == ("ttft", "e2e")


def test_the_dashboard_lists_outliers_newest_first_with_trace_ids(
    telemetry: GatewayTelemetry, state: RouterState, clock: FakeClock
) -> None:
    steady(telemetry, state, 60)
    for i in range(telemetry.outliers_kept + 3):
        request(telemetry, state, f"slow-{i}", ttft_s=3.0, e2e_s=4.0)
    states: dict[str, RouterState | None] = {MODEL: state}
    summary = RegionSummary("r1", WALL, {MODEL: state.summary(frozenset())})
    data = dashboard_state(telemetry.config, "r1", states, make_peers(clock), summary, telemetry)
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["outlier_factor"] == 10.0
    assert data["trace_url"] is None  # telemetry.trace_url unset: ids shown as text
    linked = telemetry.config.model_copy(
        update={
            "telemetry": telemetry.config.telemetry.model_copy(
                update={"trace_url": "https://jaeger.example/trace/{trace_id}"}
            )
        }
    )
    data_linked = dashboard_state(linked, "r1", states, make_peers(clock), summary, telemetry)
    assert data_linked["trace_url"] == "https://jaeger.example/trace/{trace_id}"
    listed = data["outliers"]
    assert len(listed) == telemetry.outliers_kept == 50
    newest = telemetry.outliers[0]
    assert newest.request_id == f"slow-{telemetry.outliers_kept + 2}"
    assert listed[0]["trace_id"] == newest.trace_id is not None
    assert listed[0]["kinds"] == ["ttft"]
    assert listed[0]["predicted_queue_wait_ms"] == 35.0
    assert "request_id" not in listed[0]  # the dashboard needs no key: no request ids
    assert set(listed[0]) == set(json.loads(record_json(newest))) - {"request_id"}


def test_record_json_writes_non_finite_numbers_as_null() -> None:
    record = OutlierRecord(
        WALL, MODEL, ("e2e",), 10.0, None, None, "local", "r1", None, "r-a", None,
        None, None, None, None, 5000.0, 100.0, None, None, None, "r-b", math.inf, None, None,
    )  # fmt: skip
    assert json.loads(record_json(record))["runner_up_ttft_ms"] is None
