"""Losing Redis: the mirror keeps answering, the status says it is stale, and it resyncs
when a restarted Redis comes back (own ``redis-server`` on a free port)."""

from __future__ import annotations

import logging

import pytest

from firstlight.errors import HintPublishError
from firstlight.hints import Backoff, BlockEvent, HintMirror, HintPublisher, HintSubscriber
from firstlight.routing import ReplicaView, RequestView, RoutingInput, build_policy
from tests.hints.conftest import MODEL, FakeClock, RedisServer, Spawn, client_for, eventually

TTL_S = 60.0
PREFIX = "fltest:restart:"


async def test_mirror_survives_a_redis_restart_and_resyncs(
    redis_server: RedisServer, spawn: Spawn
) -> None:
    mirror = HintMirror(TTL_S)
    policy = build_policy("firstlight", {})
    request = RequestView("q", prompt_tokens=96, block_hashes=(1, 2, 3), block_size=32)
    replicas = [ReplicaView("r1", "local", queue_len=0), ReplicaView("r2", "local", queue_len=0)]
    sub = HintSubscriber(
        lambda: client_for(redis_server.url, timeout_s=1.0),
        PREFIX,
        MODEL,
        mirror,
        backoff=Backoff(initial_s=0.02, max_s=0.2),
        timeout_s=1.0,
        block_ms=200,
    )
    spawn(sub.run())
    publisher_client = client_for(redis_server.url, timeout_s=1.0)
    try:
        publisher = HintPublisher(publisher_client, PREFIX, MODEL, "r1", 1, TTL_S, timeout_s=1.0)
        await eventually(lambda: sub.status.connected)
        await publisher.start_epoch()
        await publisher.publish(BlockEvent("r1", 1, (1, 2, 3), ()))
        await eventually(lambda: mirror.longest_prefix([1, 2, 3]) == {"r1": 3})

        await redis_server.stop()
        await eventually(lambda: not sub.status.connected)
        lost = sub.status
        assert lost.stale_since is not None
        assert lost.last_error is not None
        assert mirror.longest_prefix([1, 2, 3]) == {"r1": 3}, "routing keeps the mirror"
        decision = policy.choose(RoutingInput(request, replicas, mirror))
        assert decision.winner.replica_id == "r1", "routing still uses the hints"
        assert decision.winner.cached_blocks == 3
        with pytest.raises(HintPublishError):
            await publisher.publish(BlockEvent("r1", 1, (4,), ()))

        await redis_server.start()
        await publisher.publish(BlockEvent("r1", 1, (7, 8), ()))
        await eventually(
            lambda: sub.status.connected and mirror.longest_prefix([7, 8]) == {"r1": 2}
        )
        back = sub.status
        assert back.stale_since is None
        assert back.reconnects == 1
        assert back.bootstraps == 2, "the restarted Redis lost the feed: re-bootstrapped"
        # After a re-bootstrap the mirror holds what Redis holds; the restarted Redis lost
        # the first batch (the replica's periodic re-announcement restores such blocks).
        assert mirror.longest_prefix([1, 2, 3]) == {}

        await publisher.publish(BlockEvent("r1", 1, (9,), ()))
        await eventually(lambda: mirror.longest_prefix([9]) == {"r1": 1})
    finally:
        await publisher_client.aclose()


async def test_subscriber_resumes_from_its_last_entry_after_a_dropped_connection(
    redis_server: RedisServer, spawn: Spawn
) -> None:
    mirror = HintMirror(TTL_S)
    sub = HintSubscriber(
        lambda: client_for(redis_server.url, timeout_s=1.0),
        PREFIX,
        MODEL,
        mirror,
        backoff=Backoff(initial_s=0.02, max_s=0.2),
        timeout_s=1.0,
        block_ms=200,
    )
    admin = client_for(redis_server.url, timeout_s=1.0)
    try:
        publisher = HintPublisher(admin, PREFIX, MODEL, "r1", 1, TTL_S)
        await publisher.publish(BlockEvent("r1", 1, (1,), ()))
        spawn(sub.run())
        await eventually(lambda: sub.status.connected)

        await admin.client_kill_filter(_type="normal", skipme=True)
        await eventually(lambda: sub.status.reconnects == 1 and sub.status.connected)
        await publisher.publish(BlockEvent("r1", 1, (2,), ()))
        await eventually(lambda: mirror.longest_prefix([1, 2]) == {"r1": 2})
        assert sub.status.bootstraps == 1, "the feed still held the last entry: resumed"
    finally:
        await admin.aclose()


async def test_each_dropped_connection_is_retried_after_the_first_delay_and_its_outage_logged(
    redis_server: RedisServer, spawn: Spawn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="firstlight.hints.subscriber")
    clock = FakeClock()
    delays: list[float] = []

    async def sleep(delay_s: float) -> None:  # the backoff's wait, on the subscriber's clock
        delays.append(delay_s)
        clock.advance(delay_s)

    sub = HintSubscriber(
        lambda: client_for(redis_server.url, timeout_s=1.0),
        PREFIX,
        MODEL,
        HintMirror(TTL_S),
        clock,
        backoff=Backoff(initial_s=2.0, max_s=60.0, jitter=0.0),
        sleep=sleep,
        block_ms=200,
    )
    admin = client_for(redis_server.url, timeout_s=1.0)
    publisher = HintPublisher(admin, PREFIX, MODEL, "r1", 1, TTL_S)

    async def read_then_drop(n: int) -> None:
        await publisher.publish(BlockEvent("r1", 1, (n,), ()))
        await eventually(lambda: sub.status.events_applied == n)  # it reads again
        await admin.client_kill_filter(_type="normal", skipme=True)
        await eventually(lambda: sub.status.reconnects == n and sub.status.connected)

    try:
        spawn(sub.run())
        await eventually(lambda: sub.status.connected)
        await read_then_drop(1)
        await read_then_drop(2)
    finally:
        await admin.aclose()
    # Reading again counts as success: each outage backs off from the first delay.
    assert delays == [2.0, 2.0]
    assert caplog.text.count("reconnected (resumed) after 2.0 s stale") == 2


async def test_the_reconnection_log_says_how_long_the_feed_was_stale(
    redis_server: RedisServer, spawn: Spawn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="firstlight.hints.subscriber")
    # Lost at 1.5 on the subscriber's clock, back after the backoff's 4.0 s: 4.0 s stale.
    clock = FakeClock(1.5)
    delays: list[float] = []

    async def sleep(delay_s: float) -> None:
        delays.append(delay_s)
        clock.advance(delay_s)

    sub = HintSubscriber(
        lambda: client_for(redis_server.url, timeout_s=1.0),
        PREFIX,
        MODEL,
        HintMirror(TTL_S),
        clock,
        backoff=Backoff(initial_s=4.0, max_s=60.0, jitter=0.0),
        sleep=sleep,
        block_ms=200,
    )
    admin = client_for(redis_server.url, timeout_s=1.0)
    try:
        spawn(sub.run())
        await eventually(lambda: sub.status.connected)
        await admin.client_kill_filter(_type="normal", skipme=True)
        await eventually(lambda: sub.status.reconnects == 1 and sub.status.connected)
    finally:
        await admin.aclose()
    assert delays == [4.0]
    assert "reconnected (re-bootstrapped) after 4.0 s stale" in caplog.text
