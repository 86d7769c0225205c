"""Fixtures of the API tests that talk to the real Redis on 127.0.0.1:6379."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from redis.asyncio import Redis

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A Redis key prefix of the test's own; every key under it is deleted afterwards."""
    name = f"fltest:api:{uuid4().hex[:8]}:"
    yield name
    client = Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"{name}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
