"""The per-key token quota: reservations and their settlement, leases from the shared
counter in the real Redis (two quotas stand for two gateways, of one region or of two
regions sharing a Redis), and what each ``when_unreachable`` setting does when Redis is
unreachable."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from firstlight.api.token_quota import TokenQuota, TokenStore
from firstlight.errors import NoCapacityError, RateLimitedError
from tests.api.conftest import REDIS_URL
from tests.api.test_limits import Clock

KEY = "key-a"


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
async def quotas() -> AsyncIterator[list[TokenQuota]]:
    """Quotas made by a test; their background leases and give-backs are waited for."""
    made: list[TokenQuota] = []
    yield made
    for quota in made:
        await quota.aclose()


def _shared(
    quotas: list[TokenQuota], redis: Any, prefix: str, clock: Clock, **options: Any
) -> TokenQuota:
    options.setdefault("deadline_s", 1.0)
    quota = TokenQuota(store=TokenStore(redis, prefix), clock=clock, **options)
    quotas.append(quota)
    return quota


def _unreachable_redis() -> Redis:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.05)


# --- one gateway ------------------------------------------------------------------------


async def test_off_reserves_nothing() -> None:
    assert await TokenQuota(None).reserve(KEY, 10**9, 10**9) is None


async def test_a_request_over_the_minutes_quota_is_refused_until_the_minute_ends() -> None:
    clock = Clock()
    clock.now = 60 * 20_000 + 15  # 15 s into a minute
    quota = TokenQuota(1000, clock=clock)
    first = await quota.reserve(KEY, 300, 300)
    assert first is not None
    assert first.tokens == 600
    with pytest.raises(RateLimitedError, match=r"tokens per minute .*limit 1000") as refused:
        await quota.reserve(KEY, 300, 200)  # 500 more: 1100 > 1000
    assert refused.value.status == 429
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.retry_after_s == pytest.approx(45)
    assert await quota.reserve("key-b", 300, 200) is not None  # another key is not affected
    clock.now += 45  # the next minute
    assert await quota.reserve(KEY, 300, 200) is not None


async def test_a_request_larger_than_the_whole_quota_is_refused_saying_so() -> None:
    quota = TokenQuota(1000)
    with pytest.raises(RateLimitedError, match=r"reserves 1200 tokens .*ask for fewer max_tokens"):
        await quota.reserve(KEY, 200, 1000)
    assert quota.used(KEY) == 0


async def test_settling_to_fewer_tokens_frees_the_difference_exactly_once() -> None:
    clock = Clock()
    quota = TokenQuota(1000, clock=clock)
    reservation = await quota.reserve(KEY, 100, 800)  # 900 reserved
    assert quota.used(KEY) == 900
    quota.settle(reservation, 150)  # it used 100 + 50
    assert quota.used(KEY) == 150
    quota.settle(reservation, 0)  # a second settlement changes nothing
    assert quota.used(KEY) == 150
    assert await quota.reserve(KEY, 100, 750) is not None  # 150 + 850 fits


async def test_a_capped_reservation_charges_the_overrun_at_settlement() -> None:
    quota = TokenQuota(1000, reserve_output_tokens=100)
    reservation = await quota.reserve(KEY, 100, 800)
    assert reservation is not None
    assert reservation.tokens == 200  # the prompt whole, output up to the cap
    quota.settle(reservation, 700)  # it used 600 output tokens
    assert quota.used(KEY) == 700
    with pytest.raises(RateLimitedError):
        await quota.reserve(KEY, 201, 200)  # 201 + 100 more: 1001
    assert await quota.reserve(KEY, 200, 200) is not None  # 1000


async def test_an_unknown_usage_leaves_the_reservation_standing() -> None:
    quota = TokenQuota(1000)
    reservation = await quota.reserve(KEY, 100, 400)
    quota.settle(reservation, None)  # a peer region served it
    assert quota.used(KEY) == 500


# --- gateways sharing the quota through Redis --------------------------------------------


async def test_two_gateways_share_the_quota_and_each_others_refunds(
    quotas: list[TokenQuota], redis: Redis, prefix: str
) -> None:
    clock = Clock()
    one, two = (_shared(quotas, redis, prefix, clock, per_minute=1000) for _ in range(2))
    assert one.lease_tokens == 50  # a twentieth of the quota
    big = await one.reserve(KEY, 100, 600)  # leases 700 from the counter
    assert big is not None
    assert big.source == "shared"
    await one.aclose()  # and, its lease spent, 50 more in the background: 750 taken
    with pytest.raises(RateLimitedError, match="this request reserves 400"):
        await two.reserve(KEY, 100, 300)  # the other gateway sees the 750: 250 left
    assert await two.reserve(KEY, 100, 100) is not None  # 200 of the 250 fit
    await two.aclose()
    one.settle(big, 120)  # used 120 of its 700: it keeps one lease, gives the rest back
    await one.aclose()  # the give-back in flight
    assert one.held(KEY) == one.lease_tokens
    assert await two.reserve(KEY, 100, 400) is not None  # the refund is usable there


async def test_requests_are_admitted_from_the_lease_without_asking_redis(
    quotas: list[TokenQuota], redis: Redis, prefix: str
) -> None:
    clock = Clock()
    quota = _shared(quotas, redis, prefix, clock, per_minute=10_000, lease_tokens=1000)
    store = TokenStore(redis, prefix)
    for _ in range(10):
        await quota.reserve(KEY, 10, 40)  # 500 tokens in all, in one lease of 1000
    window = int(clock.now // 60)
    assert int(await redis.get(store.key(KEY, window))) == 1000
    assert quota.held(KEY) == 500
    for _ in range(6):
        await quota.reserve(KEY, 10, 40)  # below half a lease: the next one is fetched
    await quota.aclose()
    assert int(await redis.get(store.key(KEY, window))) == 2000
    assert quota.held(KEY) == 2000 - 16 * 50


class _SlowStore(TokenStore):
    """A store whose leases are granted in Redis only when the test says: what a gateway
    sees when Redis (or the event loop reading its reply) is slower than the deadline."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        super().__init__(redis, prefix)
        self.reply = asyncio.Event()

    async def lease(self, identity: str, window: int, need: int, ask: int, quota: int) -> int:
        await self.reply.wait()
        return await super().lease(identity, window, need, ask, quota)


async def test_a_lease_granted_after_the_deadline_still_credits_the_gateway(
    redis: Redis, prefix: str
) -> None:
    clock = Clock()
    store = _SlowStore(redis, prefix)
    quota = TokenQuota(1000, lease_tokens=100, deadline_s=0.01, store=store, clock=clock)
    local = await quota.reserve(KEY, 100, 100)  # the deadline fires: decided alone
    assert local is not None
    assert local.source == "local"
    assert not quota.shared
    store.reply.set()
    await quota.aclose()  # the late lease lands
    assert int(await redis.get(store.key(KEY, int(clock.now // 60)))) == 200
    assert quota.held(KEY) == 200  # nothing leaked: the gateway holds what Redis counts


# --- Redis unreachable ------------------------------------------------------------------


async def test_without_redis_local_enforces_the_whole_quota_in_this_gateway(
    quotas: list[TokenQuota], prefix: str
) -> None:
    client = _unreachable_redis()
    clock = Clock()
    try:
        quota = _shared(quotas, client, prefix, clock, per_minute=1000)
        first = await quota.reserve(KEY, 300, 300)
        assert first is not None
        assert first.source == "local"
        assert not quota.shared  # Redis is skipped for a while after a failure
        with pytest.raises(RateLimitedError, match="limit 1000"):
            await quota.reserve(KEY, 300, 200)
        quota.settle(first, 400)
        assert await quota.reserve(KEY, 300, 300) is not None  # 400 + 600
        clock.now += 6
        assert quota.shared  # Redis is tried again
    finally:
        await client.aclose()


async def test_without_redis_open_admits_and_closed_refuses_with_503(
    quotas: list[TokenQuota], prefix: str
) -> None:
    client = _unreachable_redis()
    try:
        clock = Clock()
        opened = _shared(quotas, client, prefix, clock, per_minute=1000, when_unreachable="open")
        for _ in range(3):  # 1800 tokens: no quota while Redis is unreachable
            reservation = await opened.reserve(KEY, 300, 300)
            assert reservation is not None
            assert reservation.source == "open"
        closed = _shared(quotas, client, prefix, clock, per_minute=1000, when_unreachable="closed")
        with pytest.raises(NoCapacityError, match="when_unreachable: closed") as refused:
            await closed.reserve(KEY, 10, 10)
        assert refused.value.status == 503
        assert refused.value.retry_after_s is not None
    finally:
        await client.aclose()
