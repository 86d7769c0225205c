"""The closed loop's official-client sender (``firstlight_bench.clients.closed_loop_openai``),
offline against a scripted server (``httpx2.MockTransport``: the official client is built
on ``httpx2``): an answer counts only when whole, a connection dropped once is retried by
the client (its default), and one that keeps failing is lost with the client's own error."""

from __future__ import annotations

import json

import httpx2

from firstlight_bench.clients.closed_loop import ClosedLoop
from firstlight_bench.clients.closed_loop_openai import OpenAISender

TOKENS = 4


def _completion(tokens: int) -> httpx2.Response:
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
    }
    return httpx2.Response(200, json=body)


def _stream(tokens: int, content: str = "hi") -> httpx2.Response:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]},
        {
            **chunk,
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
        },
    ]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream"})


async def _run(handler: httpx2.MockTransport, count: int) -> ClosedLoop:
    async with httpx2.AsyncClient(transport=handler) as http_client:
        sender = OpenAISender("http://region.test", http_client=http_client)
        load = ClosedLoop(sender, "m", clients=1, max_tokens=TOKENS)
        load.start()
        await load.wait_for(count, within_s=30)
        await load.stop()
    return load


async def test_whole_answers_count_as_served_and_short_ones_as_lost() -> None:
    calls: list[bool] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        stream = json.loads(request.content).get("stream", False)
        calls.append(stream)
        tokens = TOKENS if len(calls) <= 2 else TOKENS - 1
        return _stream(tokens) if stream else _completion(tokens)

    load = await _run(httpx2.MockTransport(handler), 4)
    assert [a.stream for a in load.answers[:4]] == [True, False, True, False]
    assert [a.lost for a in load.answers[:4]] == [False, False, True, True]
    assert load.answers[2].outcome.error == f"{TOKENS - 1} completion tokens, not {TOKENS}"
    assert load.answers[0].outcome.ttft_ms is not None
    assert [(a.outcome.prompt_tokens, a.outcome.output_tokens) for a in load.answers[:2]] == [
        (3, TOKENS),
        (3, TOKENS),
    ]


async def test_a_dropped_connection_is_retried_by_the_client_and_then_lost() -> None:
    calls = 0

    def handler(request: httpx2.Request) -> httpx2.Response:
        nonlocal calls
        calls += 1
        if calls == 1 or calls >= 3:
            raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")
        return _stream(TOKENS)

    load = await _run(httpx2.MockTransport(handler), 2)
    first, second = load.answers[:2]
    assert not first.lost  # the first call dropped, the client's retry was answered
    assert second.lost
    assert second.outcome.error is not None
    assert second.outcome.error.startswith("APIConnectionError")
    assert calls >= 2 + 3  # the second request: its first try and the default two retries


async def test_a_stream_counted_in_full_but_without_text_is_served_and_seen_at_its_end() -> None:
    """The official client's load checks the usage chunk only (as it always has); the
    tokens it counts were first seen when the stream ended."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        if json.loads(request.content).get("stream", False):
            return _stream(TOKENS, content="")
        return _completion(TOKENS)

    load = await _run(httpx2.MockTransport(handler), 1)
    outcome = load.answers[0].outcome
    assert outcome.completed
    assert outcome.output_tokens == TOKENS
    assert outcome.first_token_s is not None
    assert outcome.finish_s is not None
    assert outcome.first_token_s <= outcome.finish_s
