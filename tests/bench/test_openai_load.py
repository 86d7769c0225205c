"""The official-client load: offline against a scripted server (``httpx2.MockTransport``):
an answer counts only when whole, a connection dropped once is retried by the client
(its default), and one that keeps failing is lost with the client's own error."""

from __future__ import annotations

import json

import httpx2

from firstlight_bench.openai_load import OpenAILoad

MAX_TOKENS = 4


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


def _stream(tokens: int) -> httpx2.Response:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
        {
            **chunk,
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
        },
    ]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream"})


async def _run(handler: httpx2.MockTransport, count: int) -> OpenAILoad:
    async with httpx2.AsyncClient(transport=handler) as http_client:
        load = OpenAILoad(
            "http://region.test", "m", clients=1, max_tokens=MAX_TOKENS, http_client=http_client
        )
        load.start()
        await load.wait_for(count, within_s=30)
        await load.stop()
    return load


async def test_whole_answers_count_as_served_and_short_ones_as_lost() -> None:
    calls: list[bool] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        stream = json.loads(request.content).get("stream", False)
        calls.append(stream)
        tokens = MAX_TOKENS if len(calls) <= 2 else MAX_TOKENS - 1
        return _stream(tokens) if stream else _completion(tokens)

    load = await _run(httpx2.MockTransport(handler), 4)
    assert [a.stream for a in load.answers[:4]] == [True, False, True, False]
    assert [a.lost for a in load.answers[:4]] == [False, False, True, True]
    assert load.answers[2].problem == f"{MAX_TOKENS - 1} completion tokens, not {MAX_TOKENS}"
    assert load.answers[0].ttft_s is not None


async def test_a_dropped_connection_is_retried_by_the_client_and_then_lost() -> None:
    calls = 0

    def handler(request: httpx2.Request) -> httpx2.Response:
        nonlocal calls
        calls += 1
        if calls == 1 or calls >= 3:
            raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")
        return _stream(MAX_TOKENS)

    load = await _run(httpx2.MockTransport(handler), 2)
    first, second = load.answers[:2]
    assert not first.lost  # the first call dropped, the client's retry was answered
    assert second.lost
    assert second.problem is not None
    assert second.problem.startswith("APIConnectionError")
    assert calls >= 2 + 3  # the second request: its first try and the default two retries
