"""Streams that continue in another region (:mod:`firstlight.api.resume`), on two real
gateways (the FastAPI app over a real ``GatewayCore`` each) whose regions are fake
(:mod:`tests.api.fake_region`: real router state, real simulated engines), the second
reached by the first in process as its peer region.

The simulator's output depends only on its seed, the request id and the output
position, so "the text of an uninterrupted run" is exact: any token lost, repeated or
generated under another id would change it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from firstlight.api.resume import RESUME_FIELD, PeerStreamError, peer_chunks
from firstlight.regions.peers import CircuitBreaker, Peer
from tests.api.fake_region import MODEL, FakeGateway, fake_gateway, gateway_config, peer_hop
from tests.api.test_gateway_app import (
    CHAT,
    assert_openai_error,
    chat,
    chat_prompt,
    sse_data,
    uninterrupted_text,
)

WEST = "fake-west"


@pytest.fixture
async def west() -> AsyncIterator[FakeGateway]:
    async with fake_gateway(gateway_config(region=WEST)) as gw:
        yield gw


def _streamed(response: httpx.Response) -> tuple[str, str, dict[str, Any]]:
    """The stream's one id, its text and its usage; fails on an error event, a second
    id, a missing ``[DONE]`` or a token-id field that leaked to the client."""
    assert response.status_code == 200, response.text
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    assert len({c["id"] for c in chunks}) == 1, "one stream, one id"
    assert all("firstlight_token_ids" not in c for c in chunks)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    return chunks[0]["id"], text, chunks[-1]["usage"]


def _story(max_tokens: int = 8) -> dict[str, Any]:
    payload = chat("Tell me a story", max_tokens=max_tokens, stream=True)
    payload["stream_options"] = {"include_usage": True}
    return payload


async def test_a_stream_whose_region_lost_its_last_replica_continues_in_the_peer(
    west: FakeGateway,
) -> None:
    async with fake_gateway(gateway_config(replicas=1), peers=[west]) as east:
        east.backend.fail_next(MODEL, after_chunks=3)  # the only replica dies mid-stream

        response = await east.client.post(CHAT, json=_story())
        request_id, text, usage = _streamed(response)

        [(_, failed)] = east.backend.failed
        assert east.backend.replica_ids(MODEL) == []
        assert east.backend.served == [(request_id, failed)]
        # The peer continued the same stream, under an engine request id of its own.
        [(continued_id, _)] = west.backend.served
        assert continued_id != request_id
        assert [r.response_id for r in west.backend.requests] == [request_id]
        prompt = chat_prompt("Tell me a story")
        assert text == await uninterrupted_text(request_id, prompt, 8, east)
        assert usage["prompt_tokens"] == len(prompt)
        assert usage["completion_tokens"] == 8
        assert east.core.telemetry.migrations[(MODEL, "resumed_in_peer")] == 1
        assert east.core.telemetry.migrations[(MODEL, "gave_up")] == 0


async def test_a_forwarded_stream_whose_peer_breaks_off_continues_here(
    west: FakeGateway,
) -> None:
    config = gateway_config(router={"admission_wait_ms": 1000})
    async with fake_gateway(config, peers=[west]) as east:
        east.backend.set_backlog(MODEL, 1_000_000)  # east overflows to west
        west.backend.fail_next(MODEL, after_chunks=3, count=3)  # west fails every attempt

        response = await east.client.post(CHAT, json=_story())
        assert response.headers["x-firstlight-route"] == "spill_over"
        request_id, text, usage = _streamed(response)

        # West answered under east's id; its engine had west's own.
        assert west.backend.requests[0].response_id == request_id
        assert west.backend.served[0][0] != request_id
        assert [rid for rid, _ in east.backend.served] == [request_id]  # and east went on
        prompt = chat_prompt("Tell me a story")
        assert text == await uninterrupted_text(request_id, prompt, 8, east)
        assert usage == {
            "prompt_tokens": len(prompt),
            "completion_tokens": 8,
            "total_tokens": len(prompt) + 8,
            "prompt_tokens_details": usage["prompt_tokens_details"],
        }
        assert east.core.telemetry.migrations[(MODEL, "resumed")] == 1


async def test_a_stream_no_region_can_continue_ends_with_an_error_event(
    west: FakeGateway,
) -> None:
    west.backend.fail_next(MODEL, after_chunks=0, count=2)  # west has no replica left
    async with fake_gateway(gateway_config(replicas=1), peers=[west]) as east:
        east.backend.fail_next(MODEL, after_chunks=3)

        response = await east.client.post(CHAT, json=_story())
        assert response.status_code == 200
        data = sse_data(response.text)
        assert data[-1] == "[DONE]"
        events = [json.loads(d) for d in data[:-1]]
        assert events[-1]["error"]["type"] == "service_unavailable"
        assert len(west.backend.failed) == 2  # the peer was asked, and failed
        text = "".join(e["choices"][0]["delta"]["content"] for e in events[:-1])
        prompt = chat_prompt("Tell me a story")
        whole = await uninterrupted_text(events[0]["id"], prompt, 8, east)
        assert text  # output had started when the replica died
        assert whole.startswith(text)  # and what was sent stays true
        assert east.core.telemetry.migrations[(MODEL, "gave_up")] == 1


async def test_a_client_may_not_send_the_resume_field(west: FakeGateway) -> None:
    payload = {**_story(), RESUME_FIELD: {"token_ids": [1, 2]}}
    response = await west.client.post(CHAT, json=payload)
    assert_openai_error(response, 400, "invalid_request_error")
    assert response.json()["error"]["param"] == RESUME_FIELD
    assert west.backend.served == []


async def test_a_peer_continues_after_the_tokens_it_is_sent(west: FakeGateway) -> None:
    prompt = chat_prompt("Tell me a story")
    whole = await uninterrupted_text("chatcmpl-abc", prompt, 8, west)
    first = await west.client.post(CHAT, **peer_hop(_story(), request_id="chatcmpl-abc"))
    chunks = [json.loads(d) for d in sse_data(first.text)[:-1]]
    sent = [t for c in chunks[:3] for t in c["firstlight_token_ids"]]
    head = "".join(c["choices"][0]["delta"]["content"] for c in chunks[:3])

    rest = await west.client.post(
        CHAT,
        **peer_hop({**_story(), RESUME_FIELD: {"token_ids": sent}}, request_id="chatcmpl-abc"),
    )
    later = [json.loads(d) for d in sse_data(rest.text)[:-1]]
    tail = "".join(c["choices"][0]["delta"]["content"] for c in later if c["choices"])
    assert head + tail == whole
    assert later[-1]["usage"]["completion_tokens"] == 8 - len(sent)
    assert {c["id"] for c in chunks + later} == {"chatcmpl-abc"}


async def test_a_resume_that_leaves_no_output_token_is_400(west: FakeGateway) -> None:
    payload = {**_story(max_tokens=2), RESUME_FIELD: {"token_ids": [1, 2]}}
    response = await west.client.post(CHAT, **peer_hop(payload))
    assert_openai_error(response, 400, "invalid_request_error")
    assert response.json()["error"]["param"] == f"{RESUME_FIELD}.token_ids"


def _upstream(body: bytes) -> httpx.Response:
    return httpx.Response(200, stream=httpx.ByteStream(body))


def _event(payload: dict[str, Any] | str) -> bytes:
    line = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {line}\n\n".encode()


def _piece(text: str, ids: list[int] | None, finish: str | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "x",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    if ids is not None:
        chunk["firstlight_token_ids"] = ids
    return chunk


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}


async def test_peer_chunks_carry_token_ids_and_the_usage_on_the_final_chunk() -> None:
    body = b"".join(
        [
            _event(_piece("a", [7])),
            _event(_piece("b", [8], "stop")),
            _event({"id": "x", "choices": [], "usage": USAGE}),
            _event("[DONE]"),
        ]
    )
    chunks = [c async for c in peer_chunks(_upstream(body), "chat")]
    assert [(c.text, c.token_ids, c.finish_reason) for c in chunks] == [
        ("a", (7,), None),
        ("b", (8,), "stop"),
    ]
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.cached_prompt_tokens) == (5, 3)


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([_piece("a", [7])], "ended before [DONE]"),
        ([_piece("a", [7]), {"error": {"message": "boom"}}], "ended in an error: boom"),
        ([_piece("a", [7]), "{not json"], "malformed event"),
    ],
    ids=["no-done", "error-event", "malformed"],
)
async def test_peer_chunks_refuse_a_stream_that_cannot_be_continued(
    events: list[dict[str, Any] | str], reason: str
) -> None:
    body = b"".join(_event(e) for e in events)
    with pytest.raises(PeerStreamError, match=re.escape(reason)) as caught:
        _ = [c async for c in peer_chunks(_upstream(body), "chat")]
    assert caught.value.resumable  # every chunk carried its token ids


async def test_a_peer_stream_without_token_ids_is_read_but_not_resumable() -> None:
    whole = _event(_piece("a", None)) + _event(_piece("b", None, "stop")) + _event("[DONE]")
    chunks = [c async for c in peer_chunks(_upstream(whole), "chat")]
    assert "".join(c.text for c in chunks) == "ab"  # an older peer's stream still serves

    broken = _event(_piece("a", [7])) + _event(_piece("b", None))
    with pytest.raises(PeerStreamError) as caught:
        _ = [c async for c in peer_chunks(_upstream(broken), "chat")]
    assert caught.value.resumable is False


class _SilentAfterFirst(httpx.AsyncByteStream):
    """A peer's stream that sends one chunk and then nothing, its connection open."""

    def __init__(self, first: bytes) -> None:
        self.first = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        await asyncio.Event().wait()


async def test_a_peer_failing_its_probe_mid_answer_breaks_its_stream_resumably() -> None:
    peer = Peer("west", "http://127.0.0.1:9", 40.0, 0.0, CircuitBreaker(3, 5.0))
    upstream = httpx.Response(200, stream=_SilentAfterFirst(_event(_piece("a", [7]))))
    chunks = peer_chunks(upstream, "chat", peer)
    assert (await anext(chunks)).text == "a"
    peer.failed()
    waiting = asyncio.ensure_future(anext(chunks))
    peer.release_waiters()  # the peer failed a probe
    with pytest.raises(PeerStreamError, match="broke off: PeerGoneError") as caught:
        async with asyncio.timeout(10):
            await waiting
    assert caught.value.resumable  # continued elsewhere after the tokens already sent
