"""The closed loop (``firstlight_bench.clients.closed_loop``), offline: the loop through a scripted
sender (numbering, streamed and not in turn, times on its clock, the deadline), then its
plain httpx sender against a scripted server (``httpx.MockTransport``): every answer
checked, nothing retried. The official client's sender: ``test_closed_loop_openai.py``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from firstlight_bench.clients.closed_loop import (
    HUNG,
    Answer,
    ChatRequest,
    ClosedLoop,
    HttpxSender,
    Reply,
)
from tests.conftest import FakeClock

MODEL = "sim-loop-test"
TOKENS = 3


class ScriptedSender:
    """A sender whose every request is answered by ``script``; it keeps what it was asked."""

    def __init__(self, script: Callable[[ChatRequest], Awaitable[Reply]]) -> None:
        self.script = script
        self.requests: list[ChatRequest] = []
        self.connected: list[tuple[int, float]] = []
        self.closed = False

    @asynccontextmanager
    async def connect(
        self, clients: int, deadline_s: float, clock: Callable[[], float]
    ) -> AsyncIterator[Sequence[Callable[[ChatRequest], Awaitable[Reply]]]]:
        self.connected.append((clients, deadline_s))

        async def send(request: ChatRequest) -> Reply:
            self.requests.append(request)
            return await self.script(request)

        try:
            yield [send] * clients
        finally:
            self.closed = True


async def test_the_loop_numbers_its_requests_and_times_them_on_its_clock() -> None:
    clock = FakeClock(100.0)
    headers = {
        "x-firstlight-route": "local",
        "x-firstlight-region": "r",
        "x-firstlight-replica": "a",
    }

    async def script(request: ChatRequest) -> Reply:
        clock.advance(0.25)  # the first text
        first = clock()
        clock.advance(0.5)  # the rest of the answer
        return Reply(first, 5, request.max_tokens, headers)

    sender = ScriptedSender(script)
    load = ClosedLoop(sender, MODEL, clients=2, max_tokens=TOKENS, prompt_words=4, clock=clock)
    load.start()
    assert load.origin == 100.0
    await load.wait_for(6)
    answers = await load.stop()
    assert sender.connected == [(2, load.deadline_s)]
    assert sender.closed
    assert [r.number for r in sender.requests] == list(range(len(answers)))
    assert [r.stream for r in sender.requests[:4]] == [True, False, True, False]
    assert sender.requests[3].content == "request 3: w21 w22 w23 w24"
    assert {(r.model, r.max_tokens) for r in sender.requests} == {(MODEL, TOKENS)}
    for number, answer in enumerate(answers):
        outcome = answer.outcome
        assert outcome.request_id == str(number)
        assert outcome.arrival_s == pytest.approx(0.75 * number)
        assert outcome.ttft_ms == pytest.approx(250.0)
        assert outcome.e2e_ms == pytest.approx(750.0)
        assert answer.ended_s == pytest.approx(0.75 * (number + 1))
        assert (outcome.prompt_tokens, outcome.output_tokens, outcome.replica) == (5, TOKENS, "a")
        assert (answer.stream, answer.route, answer.region) == (number % 2 == 0, "local", "r")
        assert not answer.lost
        assert not answer.hung
    assert load.now_s() == pytest.approx(0.75 * len(answers))
    assert await load.stop() == answers  # stopping twice changes nothing
    assert await ClosedLoop(sender, MODEL).stop() == []  # never started: nothing to wait for


async def test_a_request_past_the_deadline_is_hung_and_the_next_one_goes_out() -> None:
    async def script(request: ChatRequest) -> Reply:
        if request.number == 0:
            await asyncio.Event().wait()  # never answered
        return Reply(time.monotonic(), headers={"x-firstlight-route": "local"})

    load = ClosedLoop(ScriptedSender(script), MODEL, clients=1, deadline_s=0.05)
    load.start()
    await load.wait_for(2, within_s=30)
    hung, served = (await load.stop())[:2]
    assert hung.hung
    assert hung.lost
    assert hung.outcome.error == HUNG
    assert (hung.outcome.first_token_s, hung.route) == (None, None)
    assert hung.ended_s - hung.outcome.arrival_s >= 0.05
    assert not served.lost
    assert served.route == "local"


async def test_a_second_load_can_share_the_first_ones_time_base() -> None:
    clock = FakeClock(100.0)

    async def script(request: ChatRequest) -> Reply:
        clock.advance(0.5)
        return Reply(clock())

    base = ClosedLoop(ScriptedSender(script), MODEL, clients=1, clock=clock)
    base.start()
    clock.advance(10.0)
    step = ClosedLoop(ScriptedSender(script), MODEL, clients=1, clock=clock)
    step.start(origin=base.origin)
    assert step.now_s() == base.now_s() == 10.0
    await step.wait_for(1)
    await step.stop()
    await base.stop()
    assert step.answers[0].outcome.arrival_s >= 10.0


# --- plain httpx: every answer checked ----------------------------------------------


def _sse(*events: Any) -> bytes:
    return b"".join(
        f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events
    )


def _delta(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


USAGE = {"choices": [], "usage": {"completion_tokens": TOKENS, "prompt_tokens": 5}}
GOOD_STREAM = _sse(_delta("a"), _delta("b"), USAGE, "[DONE]")
GOOD_BODY = {
    "choices": [{"message": {"role": "assistant", "content": "ab"}}],
    "usage": {"completion_tokens": TOKENS},
}


async def _one_of_each(stream: bytes, body: Any, status: int = 200) -> tuple[Answer, Answer]:
    """One streamed and one non-streamed request answered with ``stream`` / ``body``."""

    def answer(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["stream"]:
            return httpx.Response(status, content=stream, headers={"x-firstlight-route": "local"})
        return httpx.Response(status, json=body)

    sender = HttpxSender("http://gw.test/r", transport=httpx.MockTransport(answer))
    load = ClosedLoop(sender, MODEL, clients=1, max_tokens=TOKENS)
    load.start()
    await load.wait_for(2)
    answers = await load.stop()
    streamed = next(a for a in answers if a.stream)
    whole = next(a for a in answers if not a.stream)
    return streamed, whole


async def test_good_answers_count_as_served() -> None:
    streamed, whole = await _one_of_each(GOOD_STREAM, GOOD_BODY)
    assert not streamed.lost
    assert not whole.lost
    assert streamed.route == "local"
    assert streamed.outcome.ttft_ms is not None
    assert whole.outcome.ttft_ms is not None
    assert (streamed.outcome.prompt_tokens, streamed.outcome.output_tokens) == (5, TOKENS)
    assert (whole.outcome.prompt_tokens, whole.outcome.output_tokens) == (0, TOKENS)


@pytest.mark.parametrize(
    ("stream", "problem"),
    [
        (_sse(_delta("a"), USAGE), "no [DONE]"),
        (_sse(_delta("a"), USAGE, "[DONE]", _delta("b")), "an event after [DONE]"),
        (_sse(_delta("a"), {"error": {"message": "boom"}}, "[DONE]"), "error event: boom"),
        (
            _sse(_delta("a"), {"choices": [], "usage": {"completion_tokens": 1}}, "[DONE]"),
            "1 completion tokens, not 3",
        ),
        (_sse(_delta("a"), {"error": "plain"}, "[DONE]"), "error event: plain"),
        (_sse(_delta("a"), "{not json", "[DONE]"), "JSONDecodeError: "),
    ],
    ids=["no-done", "after-done", "error-event", "short", "string-error", "not-json"],
)
async def test_a_stream_that_fails_a_check_is_lost(stream: bytes, problem: str) -> None:
    streamed, _ = await _one_of_each(stream, GOOD_BODY)
    assert streamed.lost
    assert streamed.outcome.error is not None
    assert streamed.outcome.error.startswith(problem)


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` as an OpenAI-compatible server (vLLM) streams it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


REAL_USAGE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": MODEL,
    "choices": [],
    "usage": {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": 5 + TOKENS},
}


def _real_stream(*texts: str) -> bytes:
    """A whole streamed chat answer: the role chunk (empty content, as vLLM sends it),
    one chunk per token text, the finish chunk, the usage chunk and ``[DONE]``."""
    return _sse(
        _chunk({"role": "assistant", "content": ""}),
        *(_chunk({"content": text}) for text in texts),
        _chunk({}, "length"),
        REAL_USAGE,
        "[DONE]",
    )


async def test_a_real_stream_with_text_is_served() -> None:
    streamed, _ = await _one_of_each(_real_stream("Hello", " there", "!"), GOOD_BODY)
    assert streamed.outcome.error is None
    assert streamed.outcome.ttft_ms is not None  # the first non-empty delta was seen


async def test_a_stream_without_text_is_lost_even_with_done_and_usage() -> None:
    """Every other check passes: 200, no error event, ``[DONE]`` last, ``max_tokens``
    completion tokens in the usage chunk, but each content delta is empty."""
    streamed, _ = await _one_of_each(_real_stream("", "", ""), GOOD_BODY)
    assert streamed.lost
    assert streamed.outcome.error == "no text in the stream"
    assert streamed.outcome.ttft_ms is None
    # Only the usage chunk and [DONE]: no choices at all.
    streamed, _ = await _one_of_each(_sse(REAL_USAGE, "[DONE]"), GOOD_BODY)
    assert streamed.outcome.error == "no text in the stream"


async def test_a_body_without_text_is_lost() -> None:
    empty = {
        "choices": [{"message": {"role": "assistant", "content": ""}}],
        "usage": {"completion_tokens": TOKENS},
    }
    _, whole = await _one_of_each(GOOD_STREAM, empty)
    assert whole.outcome.error == "no text in the answer"


async def test_a_refused_or_short_body_is_lost() -> None:
    streamed, whole = await _one_of_each(b"", {"error": {"message": "busy"}}, status=503)
    assert streamed.outcome.error is not None
    assert streamed.outcome.error.startswith("HTTP 503")
    assert streamed.route == "local"  # the refusal's headers are read
    assert whole.outcome.error is not None
    assert whole.outcome.error.startswith("HTTP 503")
    short = {"choices": [{"message": {"content": "a"}}], "usage": {"completion_tokens": 1}}
    _, whole = await _one_of_each(GOOD_STREAM, short)
    assert whole.outcome.error == "1 completion tokens, not 3"
    malformed = {"choices": [], "usage": {"completion_tokens": TOKENS}}
    _, whole = await _one_of_each(GOOD_STREAM, malformed)
    assert whole.outcome.error == "malformed body: IndexError: list index out of range"


async def test_every_client_sends_the_key() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if json.loads(request.content)["stream"]:
            return httpx.Response(200, content=GOOD_STREAM)
        return httpx.Response(200, json=GOOD_BODY)

    sender = HttpxSender("http://gw.test/r", api_key="sk-1", transport=httpx.MockTransport(answer))
    async with sender.connect(3, 10.0, FakeClock()) as sends:
        assert len(sends) == 3
        request = ChatRequest(1, MODEL, "request 1: w7", TOKENS)
        replies = [await send(request) for send in sends]
    assert [r.problem for r in replies] == [None] * 3
    assert seen == ["Bearer sk-1"] * 3


async def test_a_connection_error_is_lost_with_its_name_and_not_retried() -> None:
    calls = 0

    def refuse(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused")

    sender = HttpxSender("http://gw.test/r", transport=httpx.MockTransport(refuse))
    load = ClosedLoop(sender, MODEL, clients=1)
    load.start()
    await load.wait_for(2)
    answers = await load.stop()
    assert [a.outcome.error for a in answers[:2]] == ["ConnectError: refused"] * 2
    assert calls == len(answers)  # one call a request: plain httpx retries nothing
