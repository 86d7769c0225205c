"""ASGI plumbing of the gateway's responses: reading a bounded body, and a streaming
response that releases the request's resources when the exchange ends however it ends.

Used by :class:`~firstlight.api.gateway.GatewayCore` only.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from firstlight.errors import RequestTooLargeError

__all__ = ["ClosingStream", "closed_after", "once", "read_body"]


def once(action: Callable[[], object]) -> Callable[[], None]:
    """``action``, run at most once however often the result is called."""
    pending = [action]

    def run() -> None:
        while pending:
            pending.pop()()

    return run


async def closed_after(body: AsyncIterable[Any], done: Callable[[], None]) -> AsyncIterator[Any]:
    try:
        async for piece in body:
            yield piece
    finally:
        done()


class ClosingStream(StreamingResponse):
    """A streaming response that runs ``done`` when the ASGI exchange ends, also when the
    body was never iterated (the client left before the headers went out): the per-key
    slot and the request's telemetry are released either way."""

    def __init__(
        self, inner: StreamingResponse, body: AsyncIterable[Any], done: Callable[[], None]
    ) -> None:
        super().__init__(body, status_code=inner.status_code, headers=dict(inner.headers))
        self._done = done

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"the request body exceeds {limit} bytes")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise RequestTooLargeError(f"the request body exceeds {limit} bytes")
    return bytes(body)
