"""The one SSE reader: what it yields for the lines a stream carries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from firstlight.api.responses import sse_event
from firstlight.api.sse import sse_events


async def _lines(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def _read(*lines: str) -> list[dict[str, Any] | None]:
    return [event async for event in sse_events(_lines(*lines))]


async def test_events_then_done_with_other_fields_and_comments_skipped() -> None:
    written = sse_event({"id": "x", "choices": []}).decode().strip()
    events = await _read(
        ": keep-alive", written, "", "event: message", 'data:{"n":1}', "data: [DONE]"
    )
    assert events == [{"id": "x", "choices": []}, {"n": 1}, None]


async def test_only_one_leading_space_is_removed() -> None:
    assert await _read('data:  {"n": 2}') == [{"n": 2}]  # JSON allows the second space


@pytest.mark.parametrize(
    ("payload", "message"),
    [("[1, 2]", "not a JSON object"), ('"text"', "not a JSON object"), ("not json", "Expecting")],
)
async def test_a_payload_that_is_not_a_json_object_is_an_error(payload: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await _read(f"data: {payload}")
