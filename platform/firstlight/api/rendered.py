"""Relaying a response vLLM's OpenAI layer rendered on the replica.

Called by :class:`~firstlight.api.in_region.LocalServer` for a request with fields beyond
the gateway's own subset (:mod:`firstlight.api.extended`), after its first chunk: the
server-sent events go to the client as vLLM wrote them, or the one JSON body does. Usage
from the final chunk fills the request's observation (metrics, dashboard). Such a stream
is not resumed on another replica when its replica fails (vLLM's parsers keep state the
gateway cannot rebuild): the client gets an error event, then ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi.responses import Response

from firstlight.api.responses import DONE_EVENT, error_body, error_response, sse_event
from firstlight.api.streams import Stream, aclose, as_api_error, next_rendered
from firstlight.engine.protocol import RenderedChunk
from firstlight.telemetry import RequestObservation

__all__ = ["rendered_body", "rendered_events"]


async def rendered_events(
    first: RenderedChunk,
    chunks: Stream,
    obs: RequestObservation,
    finish: Callable[[], None],
) -> AsyncIterator[bytes]:
    """The stream's events, starting with ``first``; ``finish`` runs once it ends."""
    chunk: RenderedChunk | None = first
    ended = False
    try:
        while chunk is not None:
            obs.completed(None if chunk.usage is None else chunk.usage.completion_tokens)
            if chunk.data:
                yield chunk.data
            if chunk.finished:
                ended = True
                break
            chunk = await next_rendered(chunks)
    except Exception as exc:  # after the headers went out: an error event, then DONE
        error = as_api_error(exc)
        obs.ended(error.status)
        yield sse_event(error_body(error))
    finally:
        finish()
        await aclose(chunks)
    if not ended:
        yield DONE_EVENT


async def rendered_body(
    first: RenderedChunk,
    chunks: Stream,
    obs: RequestObservation,
    finish: Callable[[], None],
    headers: dict[str, str],
) -> Response:
    """The one JSON body (the last chunk), with ``headers``; an error in OpenAI's shape
    when the replica failed before it."""
    chunk: RenderedChunk | None = first
    try:
        while chunk is not None and not chunk.finished:
            chunk = await next_rendered(chunks)
    except Exception as exc:
        return error_response(as_api_error(exc), headers)
    finally:
        finish()
        await aclose(chunks)
    if chunk is None:
        return error_response(as_api_error(RuntimeError("the replica sent no answer")), headers)
    obs.completed(None if chunk.usage is None else chunk.usage.completion_tokens)
    return Response(chunk.data, media_type="application/json", headers=headers)
