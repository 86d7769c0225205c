"""The subscriber's timing: how often it prunes the mirror, and how long it waits for a
Redis that does not answer."""

from __future__ import annotations

import socket

from redis.asyncio import Redis

from firstlight.hints import BlockEvent, HintMirror, HintPublisher, HintSubscriber
from tests.hints.conftest import MODEL, FakeClock, Spawn, client_for, eventually

TTL_S = 60.0


async def test_by_default_the_mirror_is_pruned_once_a_second(
    redis: Redis, key_prefix: str, spawn: Spawn
) -> None:
    clock = FakeClock(0.0)  # the subscriber's: when it prunes
    mirror_clock = FakeClock()  # the mirror's: when blocks expire
    mirror = HintMirror(10.0, mirror_clock)
    sub = HintSubscriber(lambda: client_for(), key_prefix, MODEL, mirror, clock, block_ms=200)
    spawn(sub.run())
    await eventually(lambda: sub.status.connected)
    await HintPublisher(redis, key_prefix, MODEL, "old", 1, TTL_S).publish(
        BlockEvent("old", 1, (1, 2), ())
    )
    await eventually(lambda: len(mirror) == 2)
    mirror_clock.advance(10.5)  # expired: out of lookups, held until pruned
    clock.advance(0.9)
    await HintPublisher(redis, key_prefix, MODEL, "new", 1, TTL_S).publish(
        BlockEvent("new", 1, (3,), ())
    )
    await eventually(lambda: sub.status.events_applied == 2)
    assert len(mirror) == 3, "not pruned within the second"
    clock.advance(0.1)
    await eventually(lambda: len(mirror) == 1)
    assert mirror.longest_prefix([3]) == {"new": 1}


async def test_a_call_redis_does_not_answer_is_given_up_after_timeout_s(spawn: Spawn) -> None:
    with socket.socket() as silent:  # connections are accepted (the backlog), never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        sub = HintSubscriber(
            lambda: client_for(url), "fltest:", MODEL, HintMirror(TTL_S), timeout_s=0.1
        )
        spawn(sub.run())
        # The bootstrap's first read is abandoned at 0.1 s: well inside 0.8 s.
        await eventually(lambda: sub.status.last_error is not None, within_s=0.8)
    assert sub.status.last_error is not None
    assert sub.status.last_error.startswith("TimeoutError")
    assert not sub.status.connected
