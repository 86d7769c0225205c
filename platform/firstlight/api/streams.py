"""Reading a replica's stream: the serving replica, the first chunk, later chunks, and
what a failure means for the client.

Used by :class:`~firstlight.api.gateway.GatewayCore` on every locally served request.
Ray wraps a replica's exception (its ``cause`` is the original); a failure before the
first chunk is a :class:`ReplicaFailedError` (the gateway may fail over), an invalid
request is a 400, and a failure after output started becomes an OpenAI-shaped error.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from firstlight.engine.protocol import GenerationChunk, RenderedChunk
from firstlight.errors import (
    ApiError,
    BadRequestError,
    EngineDeadError,
    InvalidRequestError,
    NoCapacityError,
)
from firstlight.region.state import ServedBy

__all__ = [
    "ReplicaFailedError",
    "Stream",
    "aclose",
    "as_api_error",
    "cause",
    "first_chunk",
    "next_chunk",
    "next_rendered",
]

_log = logging.getLogger(__name__)

Stream = AsyncIterator[ServedBy | GenerationChunk | RenderedChunk]
"""What a replica yields: a :class:`ServedBy`, then the chunks (``RenderedChunk`` for a
request vLLM's OpenAI layer serves, ``GenerationChunk`` otherwise)."""


class ReplicaFailedError(Exception):
    """The local attempt failed before any output (replica died, engine dead)."""


async def first_chunk(chunks: Stream) -> tuple[str, GenerationChunk | RenderedChunk]:
    """The serving replica's id and the first output chunk."""
    served_by = "unknown"
    try:
        first = await anext(chunks, None)
        if isinstance(first, ServedBy):
            served_by = first.replica_id
            first = await anext(chunks, None)
    except InvalidRequestError as exc:
        raise BadRequestError(str(exc), param=exc.param) from exc
    except Exception as exc:
        inner = cause(exc)
        if isinstance(inner, InvalidRequestError):
            raise BadRequestError(str(inner), param=inner.param) from exc
        raise ReplicaFailedError(f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(first, GenerationChunk | RenderedChunk):
        raise ReplicaFailedError("the replica ended the stream without output")
    return served_by, first


async def next_chunk(chunks: Stream) -> GenerationChunk | None:
    """The next output chunk; ``None`` at the end of the stream."""
    async for item in chunks:
        if isinstance(item, GenerationChunk):
            return item
    return None


async def next_rendered(chunks: Stream) -> RenderedChunk | None:
    """The next chunk vLLM's OpenAI layer rendered; ``None`` at the end of the stream."""
    async for item in chunks:
        if isinstance(item, RenderedChunk):
            return item
    return None


def cause(exc: BaseException) -> BaseException:
    """Ray wraps a replica's exception; the original is its ``cause``."""
    inner = getattr(exc, "cause", None)
    return inner if isinstance(inner, BaseException) else exc


def as_api_error(exc: BaseException) -> ApiError:
    """What the client is told when a stream fails after its headers went out."""
    inner = cause(exc)
    if isinstance(inner, ApiError):
        return inner
    if isinstance(inner, InvalidRequestError):
        return BadRequestError(str(inner), param=inner.param)
    if isinstance(inner, EngineDeadError):
        return NoCapacityError(f"the replica failed mid-request: {inner}")
    return NoCapacityError(f"the request failed mid-stream: {type(inner).__name__}")


async def aclose(chunks: Stream) -> None:
    """Close a stream that may have ended already (never raises)."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # the stream is over either way
            _log.debug("closing a finished stream failed", exc_info=True)
