"""The dashboard's JSON (``GET /dashboard/api/state``) from real router states, a real
peer table and real telemetry windows: no Ray, no network, no mocks of Firstlight."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from firstlight.advisor import PromptSample
from firstlight.dashboard import dashboard_state
from firstlight.region.state import RouterState
from firstlight.regions.peers import PeerTable
from firstlight.regions.summary import ModelSummary, RegionSummary
from firstlight.telemetry import GatewayTelemetry
from firstlight.telemetry.rolling import DecisionRecord
from firstlight.telemetry.windows import GatewayWindow, ModelWindow
from tests.conftest import FakeClock
from tests.telemetry.test_metrics import (
    IDLE_MODEL,
    MODEL,
    WALL,
    make_config,
    make_peers,
    make_state,
    make_telemetry,
    serve,
)

NO_SAMPLES = {"p50": None, "p95": None, "p99": None, "count": 0}
ADVISOR_GROUP = "team-a"
BLOCK_SIZE = 32
STATIC_TOKENS = tuple((t * 7919) % 50_000 + 1 for t in range(400))
"""A static system prompt's 400 tokens."""
VARYING_TOKENS = 12


def variable_prefix_samples(
    count: int = 20, *, group: str = ADVISOR_GROUP, model: str = MODEL
) -> list[PromptSample]:
    """``count`` prompts of a first line that differs in each (``VARYING_TOKENS`` tokens:
    a date, a request id) before the same static tokens, as the gateway would sample them:
    each prompt's chained block hashes differ from every other's from the first block on,
    nothing was cached or held by any replica, prefill costs 0.5 ms per token."""
    samples = []
    for i in range(count):
        tokens = tuple(60_000 + i * VARYING_TOKENS + j for j in range(VARYING_TOKENS))
        tokens += STATIC_TOKENS
        blocks = tuple(1_000_000 * (i + 1) + b for b in range(len(tokens) // BLOCK_SIZE))
        samples.append(
            PromptSample(
                group=group,
                model=model,
                token_ids=tokens,
                block_hashes=blocks,
                block_size=BLOCK_SIZE,
                prompt_tokens=len(tokens),
                cached_tokens=0,
                held_tokens=0,
                ms_per_token=0.5,
            )
        )
    return samples


class Gateway:
    """What a gateway holds, wired as GatewayCore wires it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.config = make_config()
        self.state = make_state(clock)
        self.states: dict[str, RouterState | None] = {MODEL: self.state, IDLE_MODEL: None}
        self.peers: PeerTable = make_peers(clock)
        self.summary = RegionSummary(
            "r1", WALL, {MODEL: ModelSummary(2, 12.5, 0.2), IDLE_MODEL: ModelSummary(1, 0.0, 0.2)}
        )
        self.telemetry: GatewayTelemetry = make_telemetry(clock, self.states, self.peers)

    def poll(self) -> dict[str, Any]:
        return dashboard_state(
            self.config, "r1", self.states, self.peers, self.summary, self.telemetry
        )

    def model(self, name: str = MODEL) -> dict[str, Any]:
        return next(m for m in self.poll()["models"] if m["name"] == name)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    made = Gateway(FakeClock())
    yield made
    made.telemetry.shutdown()


def test_dashboard_imports_on_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import firstlight.dashboard"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-600:]


def test_top_level(gateway: Gateway) -> None:
    state = gateway.poll()
    assert state["region"] == "r1"
    assert state["window_s"] == 300.0
    assert state["simulated"] is True
    assert state["generated_at"] == pytest.approx(time.time(), abs=60)
    assert [m["name"] for m in state["models"]] == [MODEL, IDLE_MODEL]
    assert state["decisions"] == []
    assert state["advisor"] == []


def test_state_is_plain_json(gateway: Gateway) -> None:
    serve(gateway.telemetry, explanation="predicted 280 ms")
    state = gateway.poll()
    assert json.loads(json.dumps(state, allow_nan=False)) == state


def test_regions_local_first_then_peers(gateway: Gateway) -> None:
    local, fresh, silent = gateway.poll()["regions"]
    assert local == {
        "name": "r1",
        "local": True,
        "up": True,
        "rtt_ms": 0.0,
        "breaker": "closed",
        "summary_age_s": 0.0,
        "models": {
            MODEL: {"healthy_replicas": 2, "predicted_wait_ms": 12.5},
            IDLE_MODEL: {"healthy_replicas": 1, "predicted_wait_ms": 0.0},
        },
    }
    assert fresh == {
        "name": "r2",
        "local": False,
        "up": True,
        "rtt_ms": 42.0,
        "breaker": "closed",
        "summary_age_s": 0.0,
        "last_error": None,
        "models": {MODEL: {"healthy_replicas": 2, "predicted_wait_ms": 15.0}},
    }
    assert silent == {
        "name": "r3",
        "local": False,
        "up": False,
        "rtt_ms": None,
        "breaker": "closed",
        "summary_age_s": None,
        "last_error": None,
        "models": {},
    }


def test_local_region_down_when_a_model_has_no_replica(gateway: Gateway) -> None:
    gateway.summary = RegionSummary(
        "r1", WALL, {MODEL: ModelSummary(2, 12.5, 0.2), IDLE_MODEL: ModelSummary(0, 0.0, 0.2)}
    )
    assert gateway.poll()["regions"][0]["up"] is False


def test_peer_state_follows_the_table(gateway: Gateway) -> None:
    fresh = gateway.peers.peers["r2"]
    for _ in range(3):
        gateway.peers.record_failure(fresh, "ConnectError: refused")
    gateway.clock.advance(4.0)
    peer = gateway.poll()["regions"][1]
    assert (peer["breaker"], peer["up"], peer["last_error"]) == (
        "open",
        False,
        "ConnectError: refused",
    )
    assert peer["summary_age_s"] == 4.0


def test_replicas_sorted_with_queue_depth(gateway: Gateway) -> None:
    replicas = gateway.model()["replicas"]
    assert [r["id"] for r in replicas] == ["r-a", "r-b"]
    busy = replicas[1]
    assert (busy["queue_depth"], busy["running"], busy["waiting"]) == (3, 1, 2)
    assert replicas[0]["queue_depth"] == 0
    assert busy["kv_cache_usage"] == 0.25
    assert busy["prefill_tokens_per_s"] == 5000.0
    assert busy["accepting"] is True
    assert 0.0 <= busy["stats_age_s"] < 60.0


def test_replica_without_rate_or_draining(gateway: Gateway) -> None:
    gateway.state.stats["r-a"] = replace(
        gateway.state.stats["r-a"], prefill_tokens_per_s=0, accepting=False
    )
    idle = gateway.model()["replicas"][0]
    assert idle["prefill_tokens_per_s"] is None
    assert idle["accepting"] is False


def test_hit_ratio_over_successive_polls(gateway: Gateway) -> None:
    # Until the polls span a minute: the ratio since the replica started (40 of 100).
    assert gateway.model()["replicas"][1]["hit_ratio"] == pytest.approx(0.4)
    gateway.state.stats["r-b"] = replace(
        gateway.state.stats["r-b"], prefix_cache_hits=100, prefix_cache_queries=200
    )
    gateway.clock.advance(2.0)
    assert gateway.model()["replicas"][1]["hit_ratio"] == pytest.approx(0.5)
    # A minute later: the last minute only ((190 - 100) / (300 - 200)).
    gateway.state.stats["r-b"] = replace(
        gateway.state.stats["r-b"], prefix_cache_hits=190, prefix_cache_queries=300
    )
    gateway.clock.advance(60.0)
    assert gateway.model()["replicas"][1]["hit_ratio"] == pytest.approx(0.9)
    gateway.state.stats["r-b"] = replace(
        gateway.state.stats["r-b"], prefix_cache_hits=3, prefix_cache_queries=5
    )  # restarted
    gateway.clock.advance(2.0)
    assert gateway.model()["replicas"][1]["hit_ratio"] == pytest.approx(0.6)
    gateway.state.stats["r-b"] = replace(
        gateway.state.stats["r-b"], prefix_cache_hits=0, prefix_cache_queries=0
    )
    gateway.clock.advance(2.0)
    assert gateway.model()["replicas"][1]["hit_ratio"] is None


def test_model_without_traffic_or_router(gateway: Gateway) -> None:
    idle = gateway.model(IDLE_MODEL)
    assert idle["replicas"] == []
    assert idle["hints"] == {"status": "off", "blocks": 0}
    assert idle["ttft_ms"] == NO_SAMPLES
    assert idle["itl_ms"] == NO_SAMPLES
    assert idle["routes"] == {
        "local": 0, "spill_over": 0, "fail_over": 0, "from_peer": 0, "rejected": 0,
    }  # fmt: skip
    assert idle["requests_per_min"] == 0.0
    assert (idle["engine"], idle["simulated"], idle["policy"]) == ("sim", True, "firstlight")
    assert idle["slo_ttft_p95_ms"] == 250.0


def test_percentiles_routes_and_rate(gateway: Gateway) -> None:
    for ttft_s, route in ((0.1, "local"), (0.2, "local"), (0.3, "spill_over")):
        serve(gateway.telemetry, ttft_s=ttft_s, route=route, decode_s=0.4, output_tokens=5)
    serve(gateway.telemetry, route=None, ttft_s=None, status=503)
    gateway.clock.advance(120.0)  # the gateway is 2 minutes old: the rate is over those
    model = gateway.model()
    assert model["ttft_ms"]["count"] == 3
    assert isinstance(model["ttft_ms"]["count"], int)
    assert model["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert model["ttft_ms"]["p95"] == pytest.approx(290.0)
    assert model["itl_ms"] == {
        "p50": pytest.approx(100.0), "p95": pytest.approx(100.0), "p99": pytest.approx(100.0),
        "count": 3,
    }  # fmt: skip
    assert model["routes"] == {
        "local": 2, "spill_over": 1, "fail_over": 0, "from_peer": 0, "rejected": 1,
    }  # fmt: skip
    assert model["requests_per_min"] == pytest.approx(4 * 60 / 120)
    gateway.clock.advance(181.0)  # past the 300 s window: everything rolled out
    model = gateway.model()
    assert model["ttft_ms"] == NO_SAMPLES
    assert model["requests_per_min"] == 0.0


def test_decisions_newest_first(gateway: Gateway) -> None:
    serve(gateway.telemetry, explanation="first", ttft_s=0.3)
    serve(gateway.telemetry, route=None, ttft_s=None, status=503, explanation="none left")
    decisions = gateway.poll()["decisions"]
    assert [d["route"] for d in decisions] == ["rejected", "local"]
    assert decisions[1] == {
        "at": WALL,
        "model": MODEL,
        "route": "local",
        "region": "r1",
        "replica": "r-a",
        "predicted_ttft_ms": 280.0,
        "observed_ttft_ms": pytest.approx(300.0),
        "explanation": "first",
    }
    assert decisions[0]["observed_ttft_ms"] is None


def test_the_region_view_merges_every_gateways_windows(gateway: Gateway) -> None:
    serve(gateway.telemetry, ttft_s=0.3, explanation="here")
    gateway.clock.advance(60.0)
    other = GatewayWindow(
        "gw-b",
        120.0,
        {MODEL: ModelWindow((100.0, 200.0), (50.0,), {"spill_over": 2})},
        (DecisionRecord(WALL + 1, MODEL, "spill_over", "r2", None, 90.0, 95.0, "there"),),
    )
    state = dashboard_state(
        gateway.config,
        "r1",
        gateway.states,
        gateway.peers,
        gateway.summary,
        gateway.telemetry,
        [gateway.telemetry.window("gw-a"), other],
    )
    assert state["gateways"] == ["gw-a", "gw-b"]
    model = next(m for m in state["models"] if m["name"] == MODEL)
    assert model["ttft_ms"]["count"] == 3
    assert model["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert model["itl_ms"]["count"] == 2
    assert (model["routes"]["local"], model["routes"]["spill_over"]) == (1, 2)
    assert model["requests_per_min"] == pytest.approx(1 * 60 / 60 + 2 * 60 / 120)
    assert [d["explanation"] for d in state["decisions"]] == ["there", "here"]


def test_a_gateway_alone_says_so(gateway: Gateway) -> None:
    assert gateway.poll()["gateways"] == ["local"]


def test_advisor_rows_come_from_this_gateways_ledger(gateway: Gateway) -> None:
    serve(gateway.telemetry)  # a request without a prompt sample teaches the advisor nothing
    assert gateway.poll()["advisor"] == []
    for sample in variable_prefix_samples():
        gateway.telemetry.advisor.observe(sample)
    other = variable_prefix_samples(1, group="team-b")[0]  # a prompt of its own
    gateway.telemetry.advisor.observe(
        replace(other, token_ids=tuple(range(1, 413)), block_hashes=tuple(range(-12, 0)))
    )

    state = gateway.poll()
    assert json.loads(json.dumps(state, allow_nan=False)) == state  # findings a JSON list
    # Every caller group (the API shows a caller its own), most to recover first.
    assert [(r["group"], r["model"]) for r in state["advisor"]] == [
        (ADVISOR_GROUP, MODEL),
        ("team-b", MODEL),
    ]
    row, quiet = state["advisor"]
    prompt = VARYING_TOKENS + len(STATIC_TOKENS)
    assert (row["requests"], row["prompt_tokens"], row["cached_tokens"]) == (20, 20 * prompt, 0)
    assert row["cached_share"] == 0.0
    assert row["shared_prefix_tokens_p50"] == 0  # no block in common
    assert row["prefill_ms_per_100_tokens"] == pytest.approx(50.0)  # 0.5 ms per token
    kinds = [f["kind"] for f in row["findings"]]
    assert kinds == ["variable_prefix"]
    finding = row["findings"][0]
    assert finding["requests"] == 19  # the first prompt had nothing to repeat
    assert 0 < finding["tokens_per_request"] <= len(STATIC_TOKENS)
    assert finding["saving_ms_per_request"] == pytest.approx(
        finding["tokens_per_request"] * 0.5, abs=0.01
    )
    assert finding["diverge_at_token"] == 0
    assert VARYING_TOKENS <= finding["agree_from_token"] < prompt - BLOCK_SIZE
    assert "move the part that changes" in finding["advice"]
    assert (quiet["requests"], quiet["findings"]) == (1, [])
    # Exactly what the ledger reports (GET /v1/firstlight/advisor's rows).
    assert state["advisor"] == json.loads(
        json.dumps([r.to_json() for r in gateway.telemetry.advisor.report()])
    )


def test_advisor_is_this_gateways_even_when_windows_are_merged(gateway: Gateway) -> None:
    for sample in variable_prefix_samples(5):
        gateway.telemetry.advisor.observe(sample)
    other = GatewayWindow("gw-b", 60.0, {MODEL: ModelWindow((100.0,), (), {})}, ())
    state = dashboard_state(
        gateway.config,
        "r1",
        gateway.states,
        gateway.peers,
        gateway.summary,
        gateway.telemetry,
        [gateway.telemetry.window("gw-a"), other],
    )
    assert state["advisor"] == gateway.poll()["advisor"]
    assert [r["requests"] for r in state["advisor"]] == [5]
