"""Reading an OpenAI-style stream of server-sent events: the project's one SSE reader.

Used by the gateway when it reads a peer region's stream (:mod:`firstlight.api.forward`,
through :mod:`firstlight.api._peer_answer`) and by the benchmark's clients (the load
driver and the fault runs' checking client), so all three read a stream the same way.
Writing events is :func:`firstlight.api.responses.sse_event`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

__all__ = ["DONE", "sse_events"]

DONE = "[DONE]"
"""The payload that ends an OpenAI stream."""


async def sse_events(lines: AsyncIterable[str]) -> AsyncIterator[dict[str, Any] | None]:
    """Each ``data:`` event of ``lines`` (an ``httpx`` response's ``aiter_lines()``) as
    its JSON object, and ``None`` for ``[DONE]``; other fields and comments are skipped.
    The value after ``data:`` loses one leading space, as the SSE specification says.

    Raises ``ValueError`` for a payload that is not a JSON object (the caller decides
    whether that ends the stream)."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].removeprefix(" ")
        if payload == DONE:
            yield None
            continue
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise ValueError(f"an SSE event that is not a JSON object: {payload[:80]!r}")
        yield event
