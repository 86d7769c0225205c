"""Several gateways, one scrape: each gateway's exposition published to a real Redis, and
``/metrics`` on any gateway answering for all live ones, each sample labelled with its
gateway (no Ray: real GatewayTelemetry instances and the shared Redis on 6379)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from firstlight._ports import free_port
from firstlight.region import RouterState
from firstlight.telemetry import GatewayTelemetry
from firstlight.telemetry.gateways import (
    LIVE_FOR_S,
    WATCHED_FOR_S,
    ExpositionShare,
    merge_expositions,
)
from tests.conftest import FakeClock
from tests.telemetry.test_metrics import MODEL, make_state, make_telemetry, serve

REDIS_URL = "redis://127.0.0.1:6379/0"


def _ttft_count(text: bytes | str) -> dict[str, float]:
    """``gen_ai_server_time_to_first_token_seconds_count`` by gateway label."""
    text = text.decode() if isinstance(text, bytes) else text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gen_ai_server_time_to_first_token_seconds_count":
                gateway = s.labels.get("gateway", "")
                out[gateway] = out.get(gateway, 0.0) + s.value
    return out


def _gateway(clock: FakeClock, requests: int) -> GatewayTelemetry:
    states: dict[str, RouterState | None] = {MODEL: make_state(clock)}
    telemetry = make_telemetry(clock, states)
    for _ in range(requests):
        serve(telemetry)
    return telemetry


def test_merged_exposition_labels_every_sample_and_lists_each_family_once() -> None:
    clock = FakeClock()
    a, b = _gateway(clock, 3), _gateway(clock, 5)
    merged = merge_expositions({"gw-a": a.render()[0].decode(), "gw-b": b.render()[0].decode()})
    text = merged.decode()

    assert _ttft_count(text) == {"gw-a": 3.0, "gw-b": 5.0}
    families = list(text_string_to_metric_families(text))
    assert families, "the merged exposition parses"
    for family in families:
        for s in family.samples:
            assert s.labels.get("gateway") in ("gw-a", "gw-b"), (s.name, s.labels)
    type_lines = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(type_lines) == len(set(type_lines)), "a family appears once"
    # Per-replica series come from both gateways (dashboards read them with max by replica).
    queue = {
        s.labels["gateway"]
        for f in families
        for s in f.samples
        if s.name == "firstlight_replica_queue_depth" and s.labels.get("replica") == "r-b"
    }
    assert queue == {"gw-a", "gw-b"}


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    key_prefix = f"fltest:{uuid.uuid4().hex[:8]}:"
    yield key_prefix
    client = Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{key_prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_any_gateway_scrapes_every_live_one_and_a_silent_one_drops_out(
    prefix: str,
) -> None:
    clock = FakeClock(1_000.0)
    a, b = _gateway(clock, 2), _gateway(clock, 7)
    client = Redis.from_url(REDIS_URL)
    try:
        share_a = ExpositionShare("gw-a", a, client, prefix, clock=clock)
        share_b = ExpositionShare("gw-b", b, client, prefix, clock=clock)
        await share_a.publish()
        await share_b.publish()

        assert _ttft_count(await share_a.collect()) == {"gw-a": 2.0, "gw-b": 7.0}
        serve(a)  # the scraped gateway's own numbers are fresh, not its last publication
        assert _ttft_count(await share_a.collect()) == {"gw-a": 3.0, "gw-b": 7.0}
        assert a.metrics_shared is True

        clock.advance(LIVE_FOR_S + 1)  # b stops publishing (its process died)
        await share_a.publish()
        assert _ttft_count(await share_a.collect()) == {"gw-a": 3.0}
    finally:
        await client.aclose()


async def test_without_redis_a_scrape_shows_this_gateway_and_says_it_is_alone() -> None:
    clock = FakeClock()
    a = _gateway(clock, 4)
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.05)
    try:
        share = ExpositionShare("gw-a", a, dead, "fltest:none:", clock=clock)
        text = (await share.collect()).decode()
    finally:
        await dead.aclose()
    assert _ttft_count(text) == {"gw-a": 4.0}
    shared = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "firstlight_gateway_metrics_shared"
    ]
    assert shared == [0.0]
    assert share.up is False


async def test_a_dashboard_poll_gets_every_gateways_windows_once_they_see_it_watched(
    prefix: str,
) -> None:
    clock = FakeClock(1_000.0)
    a, b = _gateway(clock, 2), _gateway(clock, 5)
    client = Redis.from_url(REDIS_URL)
    try:
        share_a = ExpositionShare("gw-a", a, client, prefix, clock=clock)
        share_b = ExpositionShare("gw-b", b, client, prefix, clock=clock)
        await share_b.publish()  # nobody watches yet: b's windows stay home
        first = await share_a.windows()
        assert [(w.gateway, len(w.models[MODEL].ttft_ms)) for w in first] == [("gw-a", 2)]

        await share_b.publish()  # a's poll marked the dashboard watched
        both = await share_a.windows()
        assert sorted((w.gateway, len(w.models[MODEL].ttft_ms)) for w in both) == [
            ("gw-a", 2),
            ("gw-b", 5),
        ]
        assert 0 < await client.pttl(f"{prefix}dashboard-watched") <= WATCHED_FOR_S * 1000

        clock.advance(LIVE_FOR_S + 1)  # b died: it leaves the dashboard with the scrape
        assert [w.gateway for w in await share_a.windows()] == ["gw-a"]
    finally:
        await client.aclose()


async def test_without_redis_the_dashboard_shows_this_gateway_alone() -> None:
    clock = FakeClock()
    a = _gateway(clock, 3)
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.05)
    try:
        windows = await ExpositionShare("gw-a", a, dead, "fltest:none:", clock=clock).windows()
    finally:
        await dead.aclose()
    assert [(w.gateway, len(w.models[MODEL].ttft_ms)) for w in windows] == [("gw-a", 3)]
