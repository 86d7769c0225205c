"""A peer's answer as the forwarder reads it: raced against the peer's probes, read whole,
or put together from its stream; and the non-streamed request rewritten to ask for that
stream.

:class:`~firstlight.api.forward.PeerForwarder` (:mod:`firstlight.api.forward`) sends every
forward as a stream (:func:`as_stream` for a client that asked for one JSON body), waits
for the peer's answer with :func:`answer_or_failure` (abandoned the moment the peer fails
a probe), reads a JSON answer with :func:`read_or_none`, and turns the stream back into
one ``chat.completion`` / ``text_completion`` body with :func:`collect_stream`. What a
failure here means for the request (the next peer, or this region) is the forwarder's
to decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Coroutine
from typing import Any

import httpx

from firstlight.api.responses import Kind, completion_body
from firstlight.api.sse import sse_events
from firstlight.regions.peers import Peer, while_answering

__all__ = ["answer_or_failure", "as_stream", "collect_stream", "read_or_none"]


def as_stream(body: bytes) -> bytes:
    """A non-streaming request body asking for a stream with usage instead (the body
    was validated already, so it is a JSON object)."""
    data = json.loads(body)
    data["stream"] = True
    data["stream_options"] = {"include_usage": True}
    return json.dumps(data).encode()


async def answer_or_failure(
    sending: Coroutine[Any, Any, httpx.Response], peer: Peer
) -> httpx.Response | None:
    """The peer's response to ``sending`` (an awaitable), or ``None`` as soon as the
    peer stops answering its probes (the send is cancelled then). Raises what the send
    raises (``httpx.HTTPError``, a timeout included)."""
    send = asyncio.ensure_future(sending)
    dark = asyncio.ensure_future(peer.failed().wait())
    waiting: set[asyncio.Future[Any]] = {send, dark}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled (the client left): nothing may stay open
        send.cancel()
        with contextlib.suppress(BaseException):
            await (await send).aclose()
        raise
    finally:
        dark.cancel()
    if send.done():
        return send.result()
    send.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await send
    return None


async def read_or_none(upstream: httpx.Response) -> bytes | None:
    try:
        return await upstream.aread()
    except httpx.HTTPError:
        return None
    finally:
        await upstream.aclose()


async def collect_stream(upstream: httpx.Response, kind: Kind, peer: Peer) -> dict[str, Any] | str:
    """A whole ``chat.completion`` / ``text_completion`` from the peer's server-sent
    events, or the reason it is not one (an error event, a malformed event, or no
    ``[DONE]``). Raises ``httpx.HTTPError`` when the stream breaks off or ``peer`` fails a
    probe meanwhile."""
    parts: list[str] = []
    request_id, model, created = "", "", int(time.time())
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    events = sse_events(while_answering(upstream.aiter_lines(), peer))
    while True:
        try:
            event = await anext(events)
        except StopAsyncIteration:
            break
        except ValueError as exc:
            return f"the peer sent a malformed event: {type(exc).__name__}: {exc}"
        if event is None:
            body = completion_body(
                kind, request_id, model, created, "".join(parts), finish_reason, None
            )
            if usage is not None:
                body["usage"] = usage
            return body
        try:
            if "error" in event:
                return f"the peer's stream ended in an error: {event['error'].get('message')}"
            request_id = str(event.get("id", request_id))
            model = str(event.get("model", model))
            created = int(event.get("created", created))
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                piece = choice["delta"].get("content") if kind == "chat" else choice.get("text")
                parts.append(str(piece or ""))
                finish_reason = choice.get("finish_reason") or finish_reason
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return f"the peer sent a malformed event: {type(exc).__name__}: {exc}"
    return "the peer's stream ended before [DONE]"
