"""The token quota at the gateway's HTTP surface, over the fake region of
:mod:`tests.api.fake_region` (real ``GatewayCore`` and FastAPI app, real simulated
engines): the 429 a client gets, settlement to what a request used — also when the
client goes away mid-stream — and two gateways sharing one quota through the real Redis.

A stream is cut off by driving the ASGI app directly: its ``receive`` answers
``http.disconnect`` once the first content chunk was sent, as a server does when the
client closes the connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from fastapi import FastAPI
from redis.asyncio import Redis

from firstlight.api.token_quota import TokenQuota, TokenStore
from firstlight.config import PlatformConfig
from tests.api.conftest import REDIS_URL
from tests.api.fake_region import (
    MODEL,
    FakeGateway,
    fake_gateway,
    gateway_config,
    leaked_tasks,
    peer_hop,
)
from tests.api.test_gateway_app import CHAT, REFUSAL_S, assert_openai_error, chat, chat_prompt
from tests.api.test_limits import Clock

ANONYMOUS = "anonymous"
"""The identity of every request with auth off."""
PROMPT = len(chat_prompt("Hello there"))
"""Prompt tokens of :func:`chat`'s default message after the chat template."""

MakeGateway = Callable[..., Awaitable[FakeGateway]]


@pytest.fixture
async def make_gateway() -> AsyncIterator[MakeGateway]:
    """Builds gateways (``make(config, tokens=..., sleep=...)``), closes them all and
    checks that no asyncio task outlived the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(config: PlatformConfig, **options: Any) -> FakeGateway:
            return await stack.enter_async_context(fake_gateway(config, **options))

        yield make
    assert leaked_tasks() == []


def quota_config(per_minute: int, **gateway: Any) -> PlatformConfig:
    return gateway_config(gateway={"max_tokens_per_minute_per_key": per_minute, **gateway})


def quota(config: PlatformConfig, store: TokenStore | None = None) -> TokenQuota:
    """The quota ``config`` configures, on a clock 10 s into a minute that stands still
    (a test that crossed into the next minute would find its quota fresh)."""
    clock = Clock()
    clock.now = 60 * 20_000 + 10
    return TokenQuota.from_config(config.gateway, store, clock)


def used(gw: FakeGateway, identity: str = ANONYMOUS) -> int:
    return gw.core._tokens.used(identity)  # the quota the test gave the gateway


class HoldAfter:
    """An engine sleep that lets ``steps`` steps pass, then holds every step until
    :meth:`release` (a stream that has begun and then waits on its engine)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._open = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        if self.steps > 0:
            self.steps -= 1
            await asyncio.sleep(0)
            return
        await self._open.wait()

    def release(self) -> None:
        self._open.set()


async def stream_cut_after_first_chunk(app: FastAPI, payload: dict[str, Any]) -> bytes:
    """POST ``payload`` to the chat route and disconnect once a content chunk arrived;
    returns what the client received."""
    body = json.dumps(payload).encode()
    chunk_sent = asyncio.Event()
    received: list[bytes] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await chunk_sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            received.append(message.get("body", b""))
            if b'"content"' in received[-1]:
                chunk_sent.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT,
        "raw_path": CHAT.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"gw"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000),
        "server": ("gw", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=REFUSAL_S)
    return b"".join(received)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_request_over_the_token_quota_gets_429_with_retry_after(
    make_gateway: MakeGateway, stream: bool
) -> None:
    config = quota_config(2 * PROMPT + 30)
    gw = await make_gateway(config, tokens=quota(config))
    first = await gw.client.post(CHAT, json=chat(max_tokens=20))
    assert first.status_code == 200, first.text
    assert used(gw) == PROMPT + 20
    refused = await gw.client.post(CHAT, json=chat(max_tokens=11, stream=stream))
    error = assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
    assert f"limit {2 * PROMPT + 30}" in error["message"]
    assert f"reserves {PROMPT + 11}" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert len(gw.backend.served) == 1  # the refused request never reached a replica
    assert used(gw) == PROMPT + 20  # and holds nothing
    fits = await gw.client.post(CHAT, json=chat(max_tokens=10, stream=stream))
    assert fits.status_code == 200, fits.text


async def test_a_request_that_fails_before_any_output_gives_its_tokens_back(
    make_gateway: MakeGateway,
) -> None:
    config = quota_config(10_000)
    gw = await make_gateway(config, replicas={MODEL: 0}, tokens=quota(config))
    failed = await gw.client.post(CHAT, json=chat(max_tokens=500))
    assert_openai_error(failed, 503, "service_unavailable")
    assert used(gw) == 0


async def test_a_stream_cut_off_by_its_client_is_settled_to_what_it_got(
    make_gateway: MakeGateway,
) -> None:
    hold = HoldAfter(steps=3)
    config = quota_config(10_000)
    gw = await make_gateway(config, sleep=hold, tokens=quota(config))
    try:
        got = await stream_cut_after_first_chunk(gw.app, chat(max_tokens=200, stream=True))
        assert b'"content"' in got
        assert b"[DONE]" not in got  # it was cut off mid-way
        # Settled when the stream ended: the prompt and the tokens it got, not the 200
        # reserved, and not nothing.
        assert PROMPT < used(gw) < PROMPT + 200
    finally:
        hold.release()


async def test_a_peers_forward_is_not_charged_again(make_gateway: MakeGateway) -> None:
    config = quota_config(10_000)
    gw = await make_gateway(config, tokens=quota(config))
    served = await gw.client.post(CHAT, **peer_hop(chat(max_tokens=20)))
    assert served.status_code == 200, served.text
    assert used(gw, "peer:east") == 0  # the forwarding region reserved it


async def test_two_gateways_share_one_quota_through_redis(
    make_gateway: MakeGateway, prefix: str
) -> None:
    """Two gateways (of one region, or of two regions sharing a Redis with ``scope:
    global``: the same counter either way) admit one quota between them."""
    limit = 2 * PROMPT + 30
    config = quota_config(limit, token_quota={"lease_tokens": 1})
    gateways: list[FakeGateway] = []
    clients: list[Redis] = []
    try:
        for _ in range(2):
            client = Redis.from_url(REDIS_URL)
            clients.append(client)
            store = TokenStore(client, prefix)
            gateways.append(await make_gateway(config, tokens=quota(config, store)))
        one, two = gateways
        first = await one.client.post(CHAT, json=chat(max_tokens=20))
        assert first.status_code == 200, first.text
        refused = await two.client.post(CHAT, json=chat(max_tokens=11))  # alone it would fit
        assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
        fits = await two.client.post(CHAT, json=chat(max_tokens=10))
        assert fits.status_code == 200, fits.text
        assert int(await clients[0].get(store.key(ANONYMOUS, 20_000))) == limit
    finally:
        for gw in gateways:
            await gw.core._tokens.aclose()
        for client in clients:
            await client.aclose()
