"""vLLM's own metrics in the region's scrape: each replica renders the ``vllm:*`` families
of its process registry, labelled with its region and replica, and publishes them to the
real Redis on 6379; any gateway's scrape adds every live replica's, once, without a
``gateway`` label (no Ray, no vLLM: registries filled with vLLM's metric names)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from redis.asyncio import Redis

from firstlight._ports import free_port
from firstlight.hints._redis import REDIS_ERRORS
from firstlight.telemetry.engine_metrics import (
    VLLM_LABELS,
    ReplicaMetricsPublisher,
    render_vllm_metrics,
)
from firstlight.telemetry.gateways import LIVE_FOR_S, ExpositionShare
from tests.conftest import FakeClock
from tests.telemetry.test_gateways import _gateway

REDIS_URL = "redis://127.0.0.1:6379/0"


def _vllm_registry(running: float, prefix_hits: float) -> CollectorRegistry:
    """A registry holding what vLLM's PrometheusStatLogger registers (its names and
    labels), plus a family that must not leave the replica."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "running", labels, registry=registry).labels("m", "0").set(
        running
    )
    Counter("vllm:prefix_cache_hits", "hits", labels, registry=registry).labels("m", "0").inc(
        prefix_hits
    )
    Histogram(
        "vllm:time_to_first_token_seconds", "ttft", labels, buckets=(0.1, 1.0), registry=registry
    ).labels("m", "0").observe(0.3)
    Gauge("ray_replica_private", "not vLLM's", registry=registry).set(1)
    return registry


def _samples(text: bytes | str, name: str) -> list[Sample]:
    text = text.decode() if isinstance(text, bytes) else text
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_render_keeps_only_vllm_families_and_labels_them_with_region_and_replica() -> None:
    text = render_vllm_metrics("eu", "r-1", _vllm_registry(running=3, prefix_hits=40))

    families = {
        f.name for f in text_string_to_metric_families(text) if not f.name.endswith("_created")
    }
    assert families == {
        "vllm:num_requests_running",
        "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds",
    }
    (running,) = _samples(text, "vllm:num_requests_running")
    assert running.value == 3
    assert running.labels == {"model_name": "m", "engine": "0", "region": "eu", "replica": "r-1"}
    (hits,) = _samples(text, "vllm:prefix_cache_hits_total")
    assert hits.value == 40
    buckets = _samples(text, "vllm:time_to_first_token_seconds_bucket")
    assert [(b.labels["le"], b.value) for b in buckets] == [("0.1", 0), ("1.0", 1), ("+Inf", 1)]
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert set(s.labels) - {"le"} == set(VLLM_LABELS), (s.name, s.labels)


def test_a_process_without_vllm_renders_nothing() -> None:
    assert render_vllm_metrics("eu", "r-1", CollectorRegistry()) == ""


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    key_prefix = f"fltest:{uuid.uuid4().hex[:8]}:"
    yield key_prefix
    client = Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{key_prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_any_gateway_scrape_shows_every_live_replica_once_and_a_dead_one_leaves(
    prefix: str,
) -> None:
    clock = FakeClock(1_000.0)
    client = Redis.from_url(REDIS_URL)
    try:
        r1 = ReplicaMetricsPublisher(
            client, prefix, "eu", "r-1", registry=_vllm_registry(2, 10), clock=clock
        )
        r2 = ReplicaMetricsPublisher(
            client, prefix, "eu", "r-2", registry=_vllm_registry(5, 70), clock=clock
        )
        assert await r1.publish() is True
        assert await r2.publish() is True
        gw_a = ExpositionShare("gw-a", _gateway(clock, 1), client, prefix, clock=clock)
        gw_b = ExpositionShare("gw-b", _gateway(clock, 1), client, prefix, clock=clock)
        await gw_a.publish()
        await gw_b.publish()

        for share in (gw_a, gw_b):  # whichever gateway HAProxy picks
            text = await share.collect()
            running = _samples(text, "vllm:num_requests_running")
            assert sorted((s.labels["replica"], s.value) for s in running) == [
                ("r-1", 2.0),
                ("r-2", 5.0),
            ], "each replica once, not once per gateway"
            assert all("gateway" not in s.labels for s in running)
            hits = _samples(text, "vllm:prefix_cache_hits_total")
            assert {s.labels["replica"]: s.value for s in hits} == {"r-1": 10.0, "r-2": 70.0}
            # The gateways' own series are still there, labelled with their gateway.
            ttft = _samples(text, "gen_ai_server_time_to_first_token_seconds_count")
            assert {s.labels["gateway"] for s in ttft} == {"gw-a", "gw-b"}

        clock.advance(LIVE_FOR_S + 1)  # r-2's process died; r-1 and gw-b keep publishing
        await r1.publish()
        await gw_b.publish()
        running = _samples(await gw_a.collect(), "vllm:num_requests_running")
        assert [s.labels["replica"] for s in running] == ["r-1"]
    finally:
        await client.aclose()


async def test_a_replica_without_vllm_publishes_nothing(prefix: str) -> None:
    clock = FakeClock(1_000.0)
    client = Redis.from_url(REDIS_URL)
    try:
        sim = ReplicaMetricsPublisher(
            client, prefix, "eu", "r-sim", registry=CollectorRegistry(), clock=clock
        )
        assert await sim.publish() is False
        assert [k async for k in client.scan_iter(match=f"{prefix}*")] == []
    finally:
        await client.aclose()


async def test_without_redis_a_replica_reports_it_and_a_scrape_has_no_replica_series() -> None:
    clock = FakeClock()
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.05)
    try:
        publisher = ReplicaMetricsPublisher(
            dead, "fltest:none:", "eu", "r-1", registry=_vllm_registry(1, 1), clock=clock
        )
        with pytest.raises(REDIS_ERRORS):
            await publisher.publish()
        text = await ExpositionShare(
            "gw-a", _gateway(clock, 2), dead, "fltest:none:", clock=clock
        ).collect()
    finally:
        await dead.aclose()
    assert _samples(text, "vllm:num_requests_running") == []
    assert _samples(text, "gen_ai_server_time_to_first_token_seconds_count")
