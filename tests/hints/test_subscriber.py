"""The subscriber's timing: how often it prunes the mirror, and how long it waits for a
Redis that does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
from types import SimpleNamespace
from typing import Any, cast

from redis.asyncio import Redis

from firstlight.hints import (
    BlockEvent,
    HintMirror,
    HintPublisher,
    HintSubscriber,
    SubscriberStatus,
)
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


class _VirtualClockSelector(selectors.SelectSelector):
    """Never waits: where the event loop would wait for its next timer, the clock moves
    to that timer instead, so a test spans seconds of the loop's time in no time."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert timeout is not None, "the loop would wait forever: nothing is scheduled"
        self.now += max(timeout, 0.0)
        return super().select(0)


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _VirtualClockSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


class _LateEmptyRedis:
    """A Redis with an empty feed whose every ``XREAD`` answers (nothing) ``late_s``
    after its block ends, as a loaded Redis may; notes whether each read was answered
    or abandoned by the caller."""

    def __init__(self, late_s: float, reads: int) -> None:
        self.connection_pool = SimpleNamespace(connection_kwargs={})
        self.late_s = late_s
        self.outcomes: list[str] = []
        self.reads_ended = asyncio.Event()
        """Set once ``reads`` reads were answered or abandoned."""
        self._reads = reads

    def set_retry(self, retry: object) -> None:
        pass

    async def xrevrange(self, *args: object, **kwargs: object) -> list[Any]:
        return []

    async def scan(self, *args: object, **kwargs: object) -> tuple[int, list[bytes]]:
        return 0, []

    async def xread(self, streams: object, count: int, block: int) -> list[Any]:
        try:
            await asyncio.sleep(block / 1000 + self.late_s)
        except asyncio.CancelledError:
            self._ended("abandoned")
            raise
        self._ended("answered")
        return []

    def _ended(self, outcome: str) -> None:
        self.outcomes.append(outcome)
        if len(self.outcomes) == self._reads:
            self.reads_ended.set()

    async def aclose(self) -> None:
        pass


def test_a_blocking_read_waits_timeout_s_beyond_its_block() -> None:
    """An ``XREAD`` that finds nothing is answered once ``block_ms`` is over; the
    subscriber gives that answer ``timeout_s`` more, as it gives any other call, so a
    reply just inside that is read, not abandoned as a lost feed. Run on a loop whose
    clock jumps to its next timer: 10 s blocks, a reply 5 ms inside the deadline."""

    async def follow_three_reads() -> tuple[list[str], int, SubscriberStatus]:
        redis = _LateEmptyRedis(late_s=0.495, reads=3)
        clients = 0

        def factory() -> Redis:
            nonlocal clients
            clients += 1
            return cast(Redis, redis)

        mirror = HintMirror(TTL_S)
        sub = HintSubscriber(
            factory, "fltest:", MODEL, mirror, FakeClock(), timeout_s=0.5, block_ms=10_000
        )
        task = asyncio.create_task(sub.run())
        try:
            async with asyncio.timeout(3 * 60):  # of the loop's clock
                await redis.reads_ended.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return redis.outcomes[:3], clients, sub.status

    loop = _VirtualTimeLoop()
    try:
        outcomes, clients, status = loop.run_until_complete(follow_three_reads())
    finally:
        loop.close()
    assert outcomes == ["answered"] * 3
    assert clients == 1, "the feed was never lost"
    assert status.connected
    assert status.last_error is None
