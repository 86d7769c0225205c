"""Forwarding to a peer region against real loopback peers: non-streamed requests travel
as streams and are put together here, a peer that accepts but never answers costs at
most ``router.peer_timeout_s`` (or less, once it fails a probe), and an answer that broke
off before anything reached the client is a failed attempt, so the next peer serves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from firstlight.api.forward import HOP_HEADER, PeerForwarder
from firstlight.config import parse_config
from firstlight.prefix import HashScheme
from firstlight.region.decision import PeerChoice
from firstlight.regions.hop import CallerClaim, HopSigner
from firstlight.regions.peers import CircuitBreaker, Peer, PeerTable
from firstlight.regions.summary import ForwardedWork
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from tests.regions.peer_server import PeerServer

MODEL = "m"
USAGE = {
    "prompt_tokens": 7,
    "completion_tokens": 2,
    "total_tokens": 9,
    "prompt_tokens_details": {"cached_tokens": 0},
}


def _sse(*events: dict[str, Any] | str) -> bytes:
    lines = [e if isinstance(e, str) else json.dumps(e) for e in events]
    return b"".join(f"data: {line}\n\n".encode() for line in lines)


def _chunk(content: str | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content},
                                           "finish_reason": finish}]  # fmt: skip
    return {"id": "chatcmpl-peer", "object": "chat.completion.chunk", "created": 5,
            "model": MODEL, "choices": choices, **extra}  # fmt: skip


ANSWER = _sse(_chunk("Hel"), _chunk("lo", "stop"), _chunk(None, usage=USAGE), "[DONE]")


@pytest.fixture
async def peers() -> AsyncIterator[tuple[PeerServer, PeerServer]]:
    first, second = PeerServer(), PeerServer()
    await first.start()
    await second.start()
    yield first, second
    await first.close()
    await second.close()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as http:
        yield http


class RecordingWork(ForwardedWork):
    """The peer's forwarded-work record, with every change it was told of."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int]] = []

    def sent(self, request_id: str, tokens: int, blocks: int = 0) -> None:
        super().sent(request_id, tokens, blocks)
        self.calls.append(("sent", request_id, self.tokens))

    def answered(self, request_id: str) -> None:
        before = self.tokens
        super().answered(request_id)
        self.calls.append(("answered", request_id, before - self.tokens))


def _peer(region: str, server: PeerServer) -> Peer:
    return Peer(region, server.url, 10.0, 0.0, CircuitBreaker(failures=3, cooldown_s=60.0))


def _forwarder(
    client: httpx.AsyncClient, table: PeerTable, timeout_s: float
) -> tuple[PeerForwarder, GatewayTelemetry]:
    config = parse_config({"mode": "local", "models": [{"name": MODEL, "engine": "sim"}]}, "test")
    telemetry = GatewayTelemetry(config, "here", states=lambda: {}, peers=table)
    schemes = {m.name: HashScheme.for_model(m, config.hints) for m in config.models}
    return PeerForwarder("here", table, client, telemetry, timeout_s, schemes=schemes), telemetry


def _request() -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "path": "/here/v1/chat/completions",
        "root_path": "/here",
        "query_string": b"",
        "headers": [(b"authorization", b"Bearer k")],
    }
    return Request(scope)


PEER_KEY = "test-forward-peer-key"
CALLER = CallerClaim("k-identity", "salt0", "acme")

BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}
).encode()


async def _forward(
    forwarder: PeerForwarder,
    telemetry: GatewayTelemetry,
    ranked: list[Peer],
    *,
    stream: bool = False,
    body: bytes | None = None,
) -> tuple[Any, RequestObservation]:
    obs = telemetry.start("chat")
    if body is None:
        body = BODY if not stream else BODY.replace(b'"stream": false', b'"stream": true')
    response = await forwarder.forward_any(
        tuple(PeerChoice(p.region, 100.0) for p in ranked),
        body,
        _request(),
        "spill_over",
        obs,
        "chat",
        stream,
        7,
        rendered=body != BODY and not stream,
        prompt_blocks=1,
        caller=CALLER,
    )
    return response, obs


async def test_a_non_streamed_request_travels_as_a_stream_and_is_put_together(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient
) -> None:
    server, _ = peers
    server.body = ANSWER
    peer = _peer("there", server)
    peer.forwarded = RecordingWork()
    table = PeerTable([peer], client, signer=HopSigner(PEER_KEY, "here"))
    forwarder, telemetry = _forwarder(client, table, timeout_s=10.0)
    response, obs = await _forward(forwarder, telemetry, [peer])
    assert isinstance(response, JSONResponse)
    body = json.loads(bytes(response.body))
    assert body["object"] == "chat.completion"
    assert body["id"] == "chatcmpl-peer"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == USAGE
    assert response.headers["x-firstlight-route"] == "spill_over"
    sent = json.loads(server.bodies[0])
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    path, headers = server.requests[0]
    assert path == "POST /v1/chat/completions"
    assert headers[HOP_HEADER] == "here"
    # The hop is signed, vouches for the caller, and never carries the client's key.
    assert "authorization" not in headers
    hop = HopSigner(PEER_KEY, "there").verify("/v1/chat/completions", headers, server.bodies[0])
    assert hop is not None
    assert (hop.region, hop.caller) == ("here", CALLER)
    assert obs.first_token_at is not None, "the peer's first token is the request's"
    # Charged while the peer had the request and no answer had started; released once
    # it did (the charge clocks itself by the peer's answers).
    assert isinstance(peer.forwarded, RecordingWork)
    assert [(call, tokens) for call, _, tokens in peer.forwarded.calls] == [
        ("sent", 7),
        ("answered", 7),
    ]
    assert peer.forwarded.tokens == 0
    # Its cache stays charged while it decodes there, until the peer's next summary.
    assert peer.forwarded.blocks == 1


async def test_a_request_for_vllms_layer_travels_and_returns_as_it_is(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient
) -> None:
    # logprobs, n, tool calls: a JSON answer rebuilt from a stream would lose them.
    server, _ = peers
    answer = {"id": "chatcmpl-peer", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "a"}, "logprobs": {"content": []}},
        {"index": 1, "message": {"role": "assistant", "content": "b"}, "logprobs": {"content": []}},
    ]}  # fmt: skip
    server.body = json.dumps(answer).encode()
    peer = _peer("there", server)
    forwarder, telemetry = _forwarder(client, PeerTable([peer], client), timeout_s=10.0)
    sent = json.dumps({**json.loads(BODY), "n": 2, "logprobs": True}).encode()
    response, _ = await _forward(forwarder, telemetry, [peer], body=sent)
    assert json.loads(bytes(response.body)) == answer
    assert response.headers["x-firstlight-route"] == "spill_over"
    assert server.bodies[0] == sent


async def test_a_peer_that_accepts_but_never_answers_costs_at_most_the_timeout(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient
) -> None:
    dark_server, good_server = peers
    dark_server.hang = True
    good_server.body = ANSWER
    dark, good = _peer("dark", dark_server), _peer("good", good_server)
    table = PeerTable([dark, good], client)
    forwarder, telemetry = _forwarder(client, table, timeout_s=0.2)
    response, _ = await _forward(forwarder, telemetry, [dark, good])
    assert isinstance(response, JSONResponse), "the next peer served it"
    assert json.loads(bytes(response.body))["choices"][0]["message"]["content"] == "Hello"
    assert len(dark_server.requests) == 1
    assert dark.last_error is not None
    assert dark.last_error.startswith("ReadTimeout")
    assert good.last_error is None


async def test_a_forward_gives_up_on_a_peer_as_soon_as_it_fails_a_probe(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient
) -> None:
    server, _ = peers
    server.hang = True
    arrived = asyncio.Event()
    server.on_request = arrived.set
    peer = _peer("dark", server)
    table = PeerTable([peer], client, probe_timeout_s=0.2)
    forwarder, telemetry = _forwarder(client, table, timeout_s=3600.0)
    forward = asyncio.create_task(_forward(forwarder, telemetry, [peer]))
    async with asyncio.timeout(30):
        await arrived.wait()  # the forward waits for the peer's answer now
        assert not forward.done()
        await table.probe(peer)  # ... and the peer's summary does not answer either
        response, _ = await forward
    assert response is None, "no peer could take it: the caller serves it here"
    assert peer.last_error is not None


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (_sse(_chunk("Hel")), "before [DONE]"),
        (_sse(_chunk("Hel"), {"error": {"message": "replica died"}}, "[DONE]"), "replica died"),
        (b"data: {not json\n\n", "malformed"),
    ],
    ids=["broke-off", "error-event", "malformed"],
)
async def test_a_non_streamed_answer_that_failed_part_way_is_a_failed_attempt(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient, answer: bytes, reason: str
) -> None:
    bad_server, good_server = peers
    bad_server.body, good_server.body = answer, ANSWER
    bad, good = _peer("bad", bad_server), _peer("good", good_server)
    table = PeerTable([bad, good], client)
    forwarder, telemetry = _forwarder(client, table, timeout_s=10.0)
    response, _ = await _forward(forwarder, telemetry, [bad, good])
    assert isinstance(response, JSONResponse)
    assert json.loads(bytes(response.body))["choices"][0]["message"]["content"] == "Hello"
    assert bad.last_error is not None
    assert reason in bad.last_error


async def test_a_peer_refusal_reaches_a_non_streaming_client_as_it_is(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient
) -> None:
    server, _ = peers
    server.status = 429
    server.body = b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'
    peer = _peer("there", server)
    forwarder, telemetry = _forwarder(client, PeerTable([peer], client), timeout_s=10.0)
    response, obs = await _forward(forwarder, telemetry, [peer])
    assert response is not None
    assert response.status_code == 429
    assert json.loads(bytes(response.body))["error"]["message"] == "slow down"
    assert obs.status == 429


async def test_a_stream_whose_peer_goes_silent_ends_with_an_error_event(
    peers: tuple[PeerServer, PeerServer], client: httpx.AsyncClient
) -> None:
    server, _ = peers
    server.hang_after_head = True
    peer = _peer("there", server)
    forwarder, telemetry = _forwarder(client, PeerTable([peer], client), timeout_s=0.2)
    response, obs = await _forward(forwarder, telemetry, [peer], stream=True)
    assert isinstance(response, StreamingResponse)
    pieces = [p async for p in response.body_iterator]
    events = b"".join(p if isinstance(p, bytes) else str(p).encode() for p in pieces)
    assert events.endswith(b"data: [DONE]\n\n")
    assert b'"message":"peer there failed","type":"service_unavailable"' in events
    assert obs.status == 503
    assert peer.last_error is not None
