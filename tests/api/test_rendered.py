"""Relaying what vLLM's OpenAI layer rendered (``firstlight.api.rendered``): bytes pass
as written, usage reaches the observation, and a replica that fails is an OpenAI error,
never a hang or a torn stream."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence

import pytest
from opentelemetry import trace

from firstlight.api.rendered import rendered_body, rendered_events
from firstlight.engine.protocol import RenderedChunk, Usage
from firstlight.errors import EngineDeadError, InvalidRequestError
from firstlight.region import ServedBy
from firstlight.telemetry import RequestObservation

pytestmark = pytest.mark.asyncio

USAGE = Usage(prompt_tokens=10, completion_tokens=3, cached_prompt_tokens=0)


def _obs() -> RequestObservation:
    return RequestObservation("chat", time.monotonic(), trace.INVALID_SPAN)


class _Replica:
    """A replica's stream: the given items, then ``fail`` (if any); records closing."""

    def __init__(self, items: Sequence[ServedBy | RenderedChunk], fail: Exception | None = None):
        self.items, self.fail, self.closed = list(items), fail, False

    async def stream(self) -> AsyncIterator[ServedBy | RenderedChunk]:
        try:
            for item in self.items:
                yield item
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


async def _collect(events: AsyncIterator[bytes]) -> bytes:
    return b"".join([piece async for piece in events])


async def test_events_pass_as_written_and_usage_is_observed() -> None:
    first = RenderedChunk("r", b'data: {"a": 1}\n\n')
    replica = _Replica(
        [
            RenderedChunk("r", b'data: {"b": 2}\n\n'),
            RenderedChunk("r", b"data: [DONE]\n\n", True, USAGE),
        ]
    )
    obs, finished = _obs(), []
    chunks = replica.stream()
    body = await _collect(rendered_events(first, chunks, obs, lambda: finished.append(1)))
    assert body == b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    assert obs.output_tokens == 3
    assert finished == [1]
    assert replica.closed


async def test_a_replica_failing_mid_stream_ends_with_an_error_event_then_done() -> None:
    replica = _Replica([], fail=EngineDeadError("the vLLM engine died"))
    obs, finished = _obs(), []
    first = RenderedChunk("r", b'data: {"a": 1}\n\n')
    body = await _collect(rendered_events(first, replica.stream(), obs, lambda: finished.append(1)))
    events = [e for e in body.decode().split("\n\n") if e]
    assert events[0] == 'data: {"a": 1}'
    assert json.loads(events[1].removeprefix("data: "))["error"]["message"]
    assert events[-1] == "data: [DONE]"
    assert obs.status == 503
    assert finished == [1]


async def test_a_json_answer_comes_after_the_first_token_marker() -> None:
    replica = _Replica([RenderedChunk("r", b'{"id": "r"}', True, USAGE)])
    obs, finished = _obs(), []
    response = await rendered_body(
        RenderedChunk("r", b""), replica.stream(), obs, lambda: finished.append(1), {"x-a": "b"}
    )
    assert response.status_code == 200
    assert bytes(response.body) == b'{"id": "r"}'
    assert response.headers["x-a"] == "b"
    assert response.headers["content-type"] == "application/json"
    assert obs.output_tokens == 3
    assert finished == [1]


async def test_a_refusal_after_the_marker_is_a_400_naming_the_field() -> None:
    replica = _Replica([], fail=InvalidRequestError("top_k: must be at least 1", param="top_k"))
    response = await rendered_body(
        RenderedChunk("r", b""), replica.stream(), _obs(), lambda: None, {}
    )
    assert response.status_code == 400
    error = json.loads(bytes(response.body))["error"]
    assert error["param"] == "top_k"
    assert replica.closed


async def test_a_stream_that_ends_without_an_answer_is_an_error_not_a_hang() -> None:
    response = await rendered_body(
        RenderedChunk("r", b""), _Replica([]).stream(), _obs(), lambda: None, {}
    )
    assert response.status_code >= 500
