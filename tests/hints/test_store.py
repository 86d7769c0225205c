"""Publisher and subscriber against the real Redis on 127.0.0.1:6379.

Each test uses its own key prefix (deleted afterwards), waits by polling a condition
with a deadline, and leaves no task running.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from firstlight.config import HintsConfig
from firstlight.errors import HintsError, InvalidBlockEventError, StaleEpochError
from firstlight.hints import (
    MAX_BLOCK_HASH,
    Backoff,
    BlockEvent,
    HintKeys,
    HintMirror,
    HintPublisher,
    HintSubscriber,
    redis_client,
)
from firstlight.hints._codec import encode_feed_fields, unpack_hashes
from firstlight.hints._redis import with_deadline
from tests.hints.conftest import MODEL, REDIS_URL, FakeClock, Spawn, client_for, eventually

TTL_S = 60.0
FAST = Backoff(initial_s=0.02, max_s=0.2)


def subscriber(
    key_prefix: str, mirror: HintMirror, url: str = REDIS_URL, **kwargs: object
) -> HintSubscriber:
    return HintSubscriber(
        lambda: client_for(url, timeout_s=2.0),
        key_prefix,
        MODEL,
        mirror,
        backoff=FAST,
        block_ms=200,
        timeout_s=1.0,
        **kwargs,  # type: ignore[arg-type]
    )


async def started_publisher(
    redis: Redis, key_prefix: str, replica: str, epoch: int = 1, **kwargs: object
) -> HintPublisher:
    publisher = HintPublisher(redis, key_prefix, MODEL, replica, epoch, TTL_S, **kwargs)  # type: ignore[arg-type]
    await publisher.start_epoch()
    return publisher


async def test_two_mirrors_converge_after_publishes(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    mirrors = [HintMirror(TTL_S), HintMirror(TTL_S)]
    subscribers = [subscriber(key_prefix, m) for m in mirrors]
    for sub in subscribers:
        spawn(sub.run())
    await eventually(lambda: all(s.status.connected for s in subscribers))

    r1 = await started_publisher(redis, key_prefix, "us-east/SmolLM2/replica-1")
    r2 = await started_publisher(redis, key_prefix, "us-east/SmolLM2/replica-2")
    await r1.publish(BlockEvent(r1.replica_id, 1, (10, 11, MAX_BLOCK_HASH), ()))
    await r2.publish(BlockEvent(r2.replica_id, 1, (10, 11), ()))
    chain = [10, 11, MAX_BLOCK_HASH]
    expected = {r1.replica_id: 3, r2.replica_id: 2}
    await eventually(lambda: all(m.longest_prefix(chain) == expected for m in mirrors))

    await r1.publish(BlockEvent(r1.replica_id, 1, (), (11,)))
    expected = {r1.replica_id: 1, r2.replica_id: 2}
    await eventually(lambda: all(m.longest_prefix(chain) == expected for m in mirrors))
    for sub in subscribers:
        assert sub.status.events_applied == 5  # 2 epoch starts + 3 batches
        assert sub.status.bootstraps == 1
        assert sub.status.malformed_skipped == 0


async def test_a_late_mirror_bootstraps_from_redis_then_follows_the_feed(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    r1 = await started_publisher(redis, key_prefix, "r1")
    r2 = await started_publisher(redis, key_prefix, "r2", epoch=7)
    await r1.publish(BlockEvent("r1", 1, (1, 2, 3, 4), ()))
    await r1.publish(BlockEvent("r1", 1, (), (4,)))
    await r2.publish(BlockEvent("r2", 7, (1, 2), ()))

    mirror = HintMirror(TTL_S)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    assert mirror.longest_prefix([1, 2, 3, 4]) == {"r1": 3, "r2": 2}
    assert mirror.epoch_of("r2") == 7
    assert sub.status.bootstraps == 1
    assert sub.status.events_applied == 0, "everything came from the snapshot"

    await r2.publish(BlockEvent("r2", 7, (3, 4), ()))
    await eventually(lambda: mirror.longest_prefix([1, 2, 3, 4]) == {"r1": 3, "r2": 4})


@pytest.mark.parametrize("protocol", [2, 3])
async def test_subscriber_reads_both_resp_protocols(
    redis: Redis, key_prefix: str, spawn: Spawn, protocol: int
) -> None:
    publisher = await started_publisher(redis, key_prefix, "r1")
    await publisher.publish(BlockEvent("r1", 1, (1, 2), ()))
    mirror = HintMirror(TTL_S)
    url = f"{REDIS_URL}?protocol={protocol}"
    sub = subscriber(key_prefix, mirror, url=url)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    assert mirror.longest_prefix([1, 2, 3]) == {"r1": 2}
    await publisher.publish(BlockEvent("r1", 1, (3,), ()))
    await publisher.publish(BlockEvent("r1", 1, (4,), ()))
    await eventually(lambda: mirror.longest_prefix([1, 2, 3, 4]) == {"r1": 4})
    assert sub.status.events_applied == 2
    assert sub.status.malformed_skipped == 0


async def test_redis_layout(redis: Redis, key_prefix: str) -> None:
    clock = FakeClock(time.time())
    publisher = await started_publisher(redis, key_prefix, "r1", epoch=3, clock=clock)
    await publisher.publish(BlockEvent("r1", 3, (5, MAX_BLOCK_HASH), (9,)))
    keys = HintKeys(key_prefix, MODEL)

    members = await redis.zrange(keys.replica_set("r1"), 0, -1, withscores=True)
    assert sorted(members) == [(b"18446744073709551615", clock.now), (b"5", clock.now)]
    assert await redis.get(keys.replica_epoch("r1")) == b"3"
    for key in (keys.replica_set("r1"), keys.replica_epoch("r1"), keys.feed):
        assert 0 < await redis.pttl(key) <= TTL_S * 1000

    entries = await redis.xrange(keys.feed)
    assert len(entries) == 2
    first, second = (fields for _, fields in entries)
    assert first[b"cleared"] == b"1"
    assert first[b"stored"] == first[b"removed"] == b""
    assert second[b"v"] == b"1"
    assert second[b"replica"] == b"r1"
    assert second[b"epoch"] == b"3"
    assert second[b"cleared"] == b"0"
    assert float(second[b"at"]) == clock.now
    assert unpack_hashes(second[b"stored"]) == (5, MAX_BLOCK_HASH)
    assert unpack_hashes(second[b"removed"]) == (9,)


async def test_the_host_tier_moves_through_redis_and_survives_a_bootstrap(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    keys = HintKeys(key_prefix, MODEL)
    publisher = await started_publisher(redis, key_prefix, "r1")
    live = HintMirror(TTL_S)
    live_sub = subscriber(key_prefix, live)
    spawn(live_sub.run())
    await eventually(lambda: live_sub.status.connected)
    chain = [1, 2, 3, 4]
    await publisher.publish(BlockEvent("r1", 1, (1, 2, 3, 4), ()))
    await publisher.publish(BlockEvent("r1", 1, (), (), offloaded=(3, 4)))
    await eventually(lambda: live.tiered_prefix(chain) == {"r1": (2, 2)})
    assert sorted(await redis.zrange(keys.replica_set("r1"), 0, -1)) == [b"1", b"2"]
    assert sorted(await redis.zrange(keys.replica_host_set("r1"), 0, -1)) == [b"3", b"4"]
    assert 0 < await redis.pttl(keys.replica_host_set("r1")) <= TTL_S * 1000

    await publisher.publish(BlockEvent("r1", 1, (3,), (), offload_removed=(4,)))
    await eventually(lambda: live.tiered_prefix(chain) == {"r1": (3, 0)})
    assert await redis.zrange(keys.replica_host_set("r1"), 0, -1) == []
    await publisher.publish(BlockEvent("r1", 1, (), (1, 2, 3), offloaded=(1, 2)))
    await eventually(lambda: live.tiered_prefix(chain) == {"r1": (0, 2)})
    assert await redis.exists(keys.replica_set("r1")) == 0, "no device block left"

    late = HintMirror(TTL_S)
    late_sub = subscriber(key_prefix, late)
    spawn(late_sub.run())
    await eventually(lambda: late_sub.status.connected)
    assert late.tiered_prefix(chain) == {"r1": (0, 2)}, "found by its host-tier set alone"
    assert late_sub.status.events_applied == 0

    await publisher.start_epoch()  # cleared: both sets go
    await eventually(lambda: live.tiered_prefix(chain) == {})
    assert await redis.exists(keys.replica_host_set("r1")) == 0


async def test_an_epoch_bump_drops_stale_blocks_in_a_running_mirror(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    mirror = HintMirror(TTL_S)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    old = await started_publisher(redis, key_prefix, "r1", epoch=1)
    await old.publish(BlockEvent("r1", 1, (1, 2, 3), ()))
    await eventually(lambda: mirror.longest_prefix([1, 2, 3]) == {"r1": 3})

    new = await started_publisher(redis, key_prefix, "r1", epoch=2)
    await eventually(lambda: mirror.longest_prefix([1, 2, 3]) == {})
    await new.publish(BlockEvent("r1", 2, (1,), ()))
    await eventually(lambda: mirror.longest_prefix([1, 2, 3]) == {"r1": 1})

    with pytest.raises(StaleEpochError) as raised:
        await old.publish(BlockEvent("r1", 1, (2, 3), ()))
    assert (raised.value.epoch, raised.value.current_epoch) == (1, 2)
    keys = HintKeys(key_prefix, MODEL)
    assert await redis.zrange(keys.replica_set("r1"), 0, -1) == [b"1"], "nothing was written"

    # A stale event that reaches the feed anyway (an old writer) is ignored and counted.
    stale = BlockEvent("r1", 1, (2, 3), ())
    await redis.xadd(keys.feed, encode_feed_fields(stale, time.time()))  # type: ignore[arg-type]
    await eventually(lambda: mirror.stats.ignored_stale_epoch == 1)
    assert mirror.longest_prefix([1, 2, 3]) == {"r1": 1}


async def test_publish_refuses_events_of_another_replica_or_epoch(
    redis: Redis, key_prefix: str
) -> None:
    publisher = HintPublisher(redis, key_prefix, MODEL, "r1", 1, TTL_S)
    for event in (BlockEvent("r2", 1, (1,), ()), BlockEvent("r1", 2, (1,), ())):
        with pytest.raises(InvalidBlockEventError):
            await publisher.publish(event)
    await publisher.publish(BlockEvent("r1", 1, (), ()))  # empty: no round trip, no key
    assert await redis.exists(HintKeys(key_prefix, MODEL).feed) == 0


async def test_redis_trims_members_older_than_the_ttl(redis: Redis, key_prefix: str) -> None:
    clock = FakeClock(time.time())
    publisher = HintPublisher(redis, key_prefix, MODEL, "r1", 1, 1.0, clock)
    await publisher.publish(BlockEvent("r1", 1, (1, 2), ()))
    clock.advance(0.5)
    await publisher.publish(BlockEvent("r1", 1, (2,), ()))
    clock.advance(0.7)
    await publisher.publish(BlockEvent("r1", 1, (3,), ()))
    members = await redis.zrange(HintKeys(key_prefix, MODEL).replica_set("r1"), 0, -1)
    assert sorted(members) == [b"2", b"3"]


async def test_redis_keys_expire_after_the_ttl(redis: Redis, key_prefix: str) -> None:
    publisher = HintPublisher(redis, key_prefix, MODEL, "r1", 1, 1.0)
    await publisher.publish(BlockEvent("r1", 1, (1, 2), ()))
    keys = HintKeys(key_prefix, MODEL)

    async def gone() -> bool:
        return await redis.exists(keys.replica_set("r1"), keys.replica_epoch("r1"), keys.feed) == 0

    await eventually(gone, within_s=5)


async def test_a_late_mirror_does_not_load_expired_members(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    past = FakeClock(time.time() - 5)  # published 5 s ago; the set itself has not expired
    stale = HintPublisher(redis, key_prefix, MODEL, "old", 1, TTL_S, past)
    await stale.publish(BlockEvent("old", 1, (1, 2), ()))
    fresh = HintPublisher(redis, key_prefix, MODEL, "new", 1, TTL_S)
    await fresh.publish(BlockEvent("new", 1, (1,), ()))

    mirror = HintMirror(2.0)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    assert mirror.longest_prefix([1, 2]) == {"new": 1}


async def test_a_late_mirror_ages_each_set_member_from_its_score(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    """A block a replica stored 8 s before the mirror bootstrapped is 8 s old in the
    mirror: with a 10 s ttl it expires 3 s later, while one stored at bootstrap stays."""
    mirror_clock = FakeClock()
    mirror = HintMirror(10.0, mirror_clock)
    aged = HintPublisher(redis, key_prefix, MODEL, "aged", 1, TTL_S, FakeClock(time.time() - 8))
    await aged.publish(BlockEvent("aged", 1, (1, 2), ()))
    fresh = HintPublisher(redis, key_prefix, MODEL, "fresh", 1, TTL_S)
    await fresh.publish(BlockEvent("fresh", 1, (1, 2), ()))
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    assert sub.status.events_applied == 0, "both came from the replica sets"
    assert mirror.longest_prefix([1, 2]) == {"aged": 2, "fresh": 2}
    mirror_clock.advance(3.0)  # the aged blocks are now about 11 s old, the fresh ones 3 s
    assert mirror.longest_prefix([1, 2]) == {"fresh": 2}


async def test_a_running_mirror_expires_entries_by_its_own_clock(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    mirror_clock = FakeClock()
    mirror = HintMirror(10.0, mirror_clock)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    publisher = HintPublisher(redis, key_prefix, MODEL, "r1", 1, TTL_S)
    await publisher.publish(BlockEvent("r1", 1, (1, 2), ()))
    await eventually(lambda: mirror.longest_prefix([1, 2]) == {"r1": 2})
    mirror_clock.advance(10.5)
    assert mirror.longest_prefix([1, 2]) == {}


async def test_a_running_mirror_ages_a_feed_entry_from_its_publication(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    """A batch read from the feed 8 s after it was published is 8 s old in the mirror
    (it expires 8 s before a batch published now). Applied as if new, a late batch —
    a subscriber catching up after an outage — would hold up blocks the engine may
    have evicted since: every other test passed with the age ignored."""
    mirror_clock = FakeClock()
    mirror = HintMirror(10.0, mirror_clock)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    aged = HintPublisher(redis, key_prefix, MODEL, "aged", 1, TTL_S, FakeClock(time.time() - 8))
    await aged.publish(BlockEvent("aged", 1, (1, 2), ()))
    fresh = HintPublisher(redis, key_prefix, MODEL, "fresh", 1, TTL_S)
    await fresh.publish(BlockEvent("fresh", 1, (1, 2), ()))
    await eventually(lambda: mirror.longest_prefix([1, 2]) == {"aged": 2, "fresh": 2})
    mirror_clock.advance(3.0)  # the aged batch is now 11 s old, the fresh one 3 s
    assert mirror.longest_prefix([1, 2]) == {"fresh": 2}


async def test_malformed_feed_entries_are_skipped_and_counted(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    mirror = HintMirror(TTL_S)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    keys = HintKeys(key_prefix, MODEL)
    good = encode_feed_fields(BlockEvent("r1", 1, (1, 2), ()), time.time())
    bad_entries: list[dict[str, bytes]] = [
        {"garbage": b"1"},
        {**good, "v": b"9"},
        {**good, "stored": b"\x01\x02\x03"},
        {**good, "epoch": b"-3"},
        {**good, "replica": b"\xff"},
        {**good, "cleared": b"maybe"},
        {k: v for k, v in good.items() if k != "at"},
    ]
    for fields in bad_entries:
        await redis.xadd(keys.feed, fields)  # type: ignore[arg-type]
    await redis.xadd(keys.feed, good)  # type: ignore[arg-type]

    await eventually(lambda: mirror.longest_prefix([1, 2]) == {"r1": 2})
    status = sub.status
    assert status.malformed_skipped == len(bad_entries)
    assert mirror.stats.malformed_skipped == len(bad_entries)
    assert status.events_applied == 1
    assert status.connected


async def test_malformed_set_members_are_skipped_and_counted_at_bootstrap(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    keys = HintKeys(key_prefix, MODEL)
    now = time.time()
    await redis.zadd(
        keys.replica_set("r1"),
        {b"1": now, b"2": now, b"not-a-hash": now, b"-5": now, str(2**64).encode(): now},
    )
    await redis.set(keys.replica_epoch("r1"), b"4")
    await redis.zadd(keys.replica_set("r2"), {b"1": now})
    await redis.set(keys.replica_epoch("r2"), b"four")
    await redis.set(keys.replica_set("r3"), b"not a sorted set")
    await redis.set(keys.replica_epoch("r3"), b"1")

    mirror = HintMirror(TTL_S)
    sub = subscriber(key_prefix, mirror)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    assert mirror.longest_prefix([1, 2]) == {"r1": 2}
    assert mirror.epoch_of("r1") == 4
    assert sub.status.malformed_skipped == 3 + 1 + 1  # members, epoch, wrong key type
    assert mirror.stats.malformed_skipped == 5


async def test_subscriber_backs_off_while_redis_is_unreachable(spawn: Spawn) -> None:
    from tests.hints.conftest import free_port

    delays: list[float] = []
    clock = FakeClock(5_000.0)

    async def record(delay_s: float) -> None:
        delays.append(delay_s)
        clock.advance(delay_s)

    backoff = Backoff(initial_s=0.1, max_s=0.4, multiplier=2.0, jitter=0.5)
    sub = HintSubscriber(
        lambda: client_for(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5),
        "fltest:",
        MODEL,
        HintMirror(TTL_S),
        clock,
        backoff=backoff,
        sleep=record,
        block_ms=200,
    )
    spawn(sub.run())
    await eventually(lambda: len(delays) >= 5)
    for attempt, delay in enumerate(delays[:5]):
        ceiling = min(0.4, 0.1 * 2**attempt)
        assert 0.5 * ceiling <= delay <= ceiling
    status = sub.status
    assert not status.connected
    assert status.stale_since == 5_000.0, "stale since the first failed attempt"
    assert status.reconnects == status.bootstraps == 0
    assert status.last_error is not None
    assert "Connection" in status.last_error


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"decode_responses": True}, "decode_responses", id="text-replies"),
        pytest.param({"socket_timeout": 0.1}, "block_ms", id="socket-timeout-below-block"),
    ],
)
async def test_a_misconfigured_client_is_reported(options: dict[str, object], message: str) -> None:
    sub = HintSubscriber(
        lambda: Redis.from_url(REDIS_URL, **options), "fltest:", MODEL, HintMirror(TTL_S)
    )
    with pytest.raises(HintsError, match=message):
        await sub.run()


async def test_a_socket_timeout_must_exceed_block_ms(key_prefix: str, spawn: Spawn) -> None:
    """A blocking read waits up to ``block_ms`` for Redis to answer: a socket timeout of
    exactly that long would end it as Redis answers, so it is refused; a longer one is
    used."""
    even = HintSubscriber(
        lambda: Redis.from_url(REDIS_URL, socket_timeout=1.0),
        key_prefix,
        MODEL,
        HintMirror(TTL_S),
        block_ms=1000,
    )
    with pytest.raises(HintsError, match="block_ms = 1000"):
        await asyncio.wait_for(even.run(), timeout=3.0)
    longer = HintSubscriber(
        lambda: Redis.from_url(REDIS_URL, socket_timeout=1.001),
        key_prefix,
        MODEL,
        HintMirror(TTL_S),
        block_ms=1000,
    )
    spawn(longer.run())
    await eventually(lambda: longer.status.connected)


async def test_redis_client_from_the_hints_config() -> None:
    client = redis_client(HintsConfig(), connect_timeout_s=1.0)
    try:
        assert await client.ping()
        assert client.connection_pool.connection_kwargs["decode_responses"] is False
    finally:
        await client.aclose()


async def test_a_cancellation_lost_inside_a_redis_call_still_ends_the_task() -> None:
    # Python 3.11's asyncio.wait_for, used by redis-py for socket timeouts, can swallow a
    # cancellation that races with completion (CPython gh-86296); this stands in for it.
    async def call_that_swallows_cancellation() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "finished anyway"
        return "not reached"

    task = asyncio.create_task(with_deadline(call_that_swallows_cancellation(), 5.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_with_deadline_times_out() -> None:
    with pytest.raises(TimeoutError):
        await with_deadline(asyncio.sleep(10), 0.01)
