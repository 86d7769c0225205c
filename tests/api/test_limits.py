"""Per-key limits shared by a region's gateways through the real Redis (two limiters
stand for two gateway replicas), their expiry, and the local fallback when Redis is
unreachable."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from firstlight.api import limits as limits_module
from firstlight.api.limits import KeyLimits
from firstlight.errors import RateLimitedError
from tests.api.conftest import REDIS_URL


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def clients() -> AsyncIterator[list[Redis]]:
    made: list[Redis] = []
    yield made
    for client in made:
        await client.aclose()


def _limits(
    clients: list[Redis], prefix: str, clock: Clock, concurrent: int, per_minute: int | None
) -> KeyLimits:
    client = Redis.from_url(REDIS_URL)
    clients.append(client)
    return KeyLimits(concurrent, per_minute, client, key_prefix=prefix, clock=clock)


async def test_concurrency_is_shared_by_the_gateways(clients: list[Redis], prefix: str) -> None:
    clock = Clock()
    one, two = (_limits(clients, prefix, clock, 3, None) for _ in range(2))
    leases = [await one.acquire("key-a"), await two.acquire("key-a"), await one.acquire("key-a")]
    assert all(lease.shared for lease in leases)
    with pytest.raises(RateLimitedError, match=r"concurrent requests .*limit 3") as refused:
        await two.acquire("key-a")
    assert refused.value.status == 429
    assert refused.value.retry_after_s is not None
    await two.acquire("key-b")  # another key is not affected
    one.release(leases[0])
    await one.aclose()
    assert (await two.acquire("key-a")).shared


async def test_the_request_rate_is_shared_per_minute(clients: list[Redis], prefix: str) -> None:
    clock = Clock()
    clock.now = 60 * 20_000 + 10  # 10 s into a minute
    one, two = (_limits(clients, prefix, clock, 100, 4) for _ in range(2))
    for limiter in (one, two, one, two):
        one.release(await limiter.acquire("key-a"))
    with pytest.raises(RateLimitedError, match="requests per minute") as refused:
        await two.acquire("key-a")
    assert refused.value.retry_after_s == pytest.approx(50)
    clock.now += 60  # the next minute
    assert (await one.acquire("key-a")).shared


async def test_a_dead_gateways_leases_expire_within_the_ttl(
    clients: list[Redis], prefix: str
) -> None:
    clock = Clock()
    dead, alive = (_limits(clients, prefix, clock, 1, None) for _ in range(2))
    await dead.acquire("key-a")
    await dead.aclose()  # its gateway died: no release, no more renewals
    with pytest.raises(RateLimitedError):
        await alive.acquire("key-a")
    clock.now += 29
    with pytest.raises(RateLimitedError):
        await alive.acquire("key-a")
    clock.now += 2  # 31 s after the take: the lease has expired
    assert (await alive.acquire("key-a")).shared


async def test_a_live_lease_is_renewed_past_its_ttl_and_not_after_its_release(
    clients: list[Redis], prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A response longer than the lease TTL keeps its slot: the holder's renewal task
    pushes the expiry forward; once released, a renewal does not bring the lease back."""
    monkeypatch.setattr(limits_module, "_RENEW_EVERY_S", 0.0)
    clock = Clock()
    holder, other = (_limits(clients, prefix, clock, 1, None) for _ in range(2))
    renewed = asyncio.Event()
    renew = holder.renew

    async def spied_renew() -> None:
        await renew()
        renewed.set()

    monkeypatch.setattr(holder, "renew", spied_renew)
    lease = await holder.acquire("key-a")  # expires at t0 + 30 unless renewed
    clock.now += 25
    await asyncio.wait_for(renewed.wait(), timeout=10)  # the task renewed: t0 + 55
    clock.now += 25  # t0 + 50: past the first expiry
    with pytest.raises(RateLimitedError, match="concurrent"):
        await other.acquire("key-a")
    holder.release(lease)
    await holder.renew()
    await holder.aclose()
    client = clients[0]
    assert await client.zscore(f"{prefix}limits:key-a:leases", lease.lease_id) is None
    assert (await other.acquire("key-a")).shared


async def test_without_redis_each_gateway_enforces_the_limits_alone(prefix: str) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.05)
    clock = Clock()
    limits = KeyLimits(2, 3, client, key_prefix=prefix, clock=clock)
    try:
        first = await limits.acquire("key-a")
        assert not first.shared
        assert not limits.shared  # Redis is skipped for a while after a failure
        await limits.acquire("key-a")
        with pytest.raises(RateLimitedError, match="concurrent"):
            await limits.acquire("key-a")
        limits.release(first)
        await limits.acquire("key-a")  # third request this minute: still allowed
        limits.release(first)
        with pytest.raises(RateLimitedError, match="per minute"):
            await limits.acquire("key-a")
        clock.now += 6
        assert limits.shared  # Redis is tried again
    finally:
        await client.aclose()


class _LateReplies:
    """A Redis client whose scripts run in Redis but whose replies never come back in
    time: what a gateway whose event loop is too busy to read them sees."""

    def __init__(self, client: Redis) -> None:
        self._client = client

    def register_script(self, source: str) -> Any:
        script = self._client.register_script(source)

        async def late(keys: list[str], args: list[Any]) -> Any:
            await script(keys=keys, args=args)  # taken in Redis
            await asyncio.Event().wait()  # the reply is late: the deadline fires

        return late

    async def zrem(self, key: str, *members: str) -> int:
        return int(await self._client.zrem(key, *members))


async def test_a_lease_taken_after_the_deadline_is_given_back(
    clients: list[Redis], prefix: str
) -> None:
    """The take times out (so the request is admitted locally) while Redis did take the
    lease: the lease is removed anyway, instead of holding a slot until it expires."""
    client = Redis.from_url(REDIS_URL)
    clients.append(client)
    clock = Clock()
    limits = KeyLimits(1, None, _LateReplies(client), key_prefix=prefix, clock=clock)
    assert not (await limits.acquire("key-a")).shared  # the deadline fired: local
    await limits.aclose()  # the pending removal
    assert await client.zcard(f"{prefix}limits:key-a:leases") == 0
    other = _limits(clients, prefix, clock, 1, None)
    assert (await other.acquire("key-a")).shared  # the only slot is free
